// Exact-by-construction data for all-to-all tests (Note [All-to-all], launch/communicator.h),
// shared by the MPI tests on CPU ranks and the NCCL test on GPUs.
#ifndef RL_TESTS_ALL_TO_ALL_ROWS_H_
#define RL_TESTS_ALL_TO_ALL_ROWS_H_

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "launch/communicator.h"

namespace rl::testing {

// Rows rank `src` sends to rank `dst` in the all-to-all tests: uneven, zero for some pairs, and
// none at all from rank 1.
inline int64_t RowsSent(int src, int dst) { return src == 1 ? 0 : (3 * src + 2 * dst + 1) % 5; }
inline int64_t NoRows(int, int) { return 0; }

// [rows, 1, 3]: the rows `src` sends to `dst`. Element e of row i is ((src*4 + dst)*5 + i)*3 + e,
// distinct per (src, dst, row, element) and at most 239, so exact in bf16, for groups of up to 4
// ranks sending up to 5 rows.
inline at::Tensor Rows(int src, int dst, int64_t rows, at::ScalarType type) {
  std::vector<double> values;
  for (int64_t i = 0; i < rows; ++i) {
    for (int e = 0; e < 3; ++e) values.push_back(((src * 4 + dst) * 5 + i) * 3 + e);
  }
  return at::tensor(values, at::kDouble).view({rows, 1, 3}).to(type);
}

// One all-to-all over `comm` (on `device`) with `rows_sent` rows between each pair: every block
// received must be what its source built for this rank. Built and compared on the host.
inline void ExchangeAndCheck(Communicator& comm, at::ScalarType type,
                             int64_t (*rows_sent)(int, int), c10::Device device = c10::kCPU) {
  REQUIRE(comm.size() <= 4);
  const int rank = comm.rank();
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<at::Tensor> send_blocks, want_blocks;
  for (int j = 0; j < comm.size(); ++j) {
    send_counts.push_back(rows_sent(rank, j));
    recv_counts.push_back(rows_sent(j, rank));
    send_blocks.push_back(Rows(rank, j, send_counts.back(), type));
    want_blocks.push_back(Rows(j, rank, recv_counts.back(), type));
  }
  const at::Tensor send = at::cat(send_blocks).to(device);
  const at::Tensor want = at::cat(want_blocks);
  const at::Tensor recv = at::full_like(want, -1).to(device);
  comm.AllToAll(send, send_counts, recv, recv_counts);
  CAPTURE(comm.name(), rank, c10::toString(type));
  CHECK(at::equal(recv.cpu(), want));
}

}  // namespace rl::testing

#endif  // RL_TESTS_ALL_TO_ALL_ROWS_H_
