#include "launch/communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "launch/check.h"
#include "launch/mpi_communicator.h"
#include "launch/nccl_communicator.h"

namespace rl {

std::string_view ToString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::unique_ptr<Communicator> CreateCommunicator(const MpiSession& session, c10::Device device,
                                                 CommOptions options) {
  if (device.is_cuda()) {
    return std::make_unique<NcclCommunicator>(session, device, options);
  }
  return std::make_unique<MpiCommunicator>(session, options);
}

namespace internal {

void CheckTensor(std::string_view op, const at::Tensor& tensor, c10::Device device) {
  RL_CHECK(tensor.defined(), Error, "{}: tensor is undefined", op);
  RL_CHECK(tensor.device() == device, Error, "{}: tensor is on {} but the communicator is on {}",
           op, tensor.device().str(), device.str());
  RL_CHECK(tensor.is_contiguous(), Error, "{}: tensor must be contiguous", op);
}

FlatShape CheckFlat(std::string_view op, const at::Tensor& shard, const at::Tensor& buffer,
                    int rank, int size, c10::Device device) {
  CheckTensor(op, shard, device);
  CheckTensor(op, buffer, device);
  RL_CHECK(shard.scalar_type() == buffer.scalar_type(), Error,
           "{}: shard dtype {} differs from buffer dtype {}", op,
           c10::toString(shard.scalar_type()), c10::toString(buffer.scalar_type()));
  RL_CHECK(buffer.numel() == shard.numel() * size, Error,
           "{}: buffer has {} elements but {} ranks x shard of {} = {}; pad the buffer to a "
           "multiple of the group size (Note [Flat collectives])",
           op, buffer.numel(), size, shard.numel(), shard.numel() * size);
  FlatShape shape;
  shape.shard_numel = shard.numel();
  const auto* own_slice = static_cast<const char*>(buffer.data_ptr()) +
                          rank * shape.shard_numel * static_cast<int64_t>(buffer.element_size());
  shape.in_place = shard.data_ptr() == own_slice;
  if (!shape.in_place && shape.shard_numel > 0) {
    const auto* shard_begin = static_cast<const char*>(shard.data_ptr());
    const auto* buffer_begin = static_cast<const char*>(buffer.data_ptr());
    const int64_t shard_bytes = shard.nbytes();
    const int64_t buffer_bytes = buffer.nbytes();
    RL_CHECK(
        shard_begin >= buffer_begin + buffer_bytes || buffer_begin >= shard_begin + shard_bytes,
        Error, "{}: shard overlaps the buffer but is not rank {}'s slice of it", op, rank);
  }
  return shape;
}

std::vector<int64_t> EqualBlocks(std::string_view op, const at::Tensor& send,
                                 const at::Tensor& recv, int size) {
  RL_CHECK(send.dim() >= 1 && recv.dim() >= 1 && send.size(0) == recv.size(0) &&
               send.size(0) % size == 0,
           Error,
           "{}: send and recv must have the same number of rows, a multiple of the group's {} "
           "ranks (Note [Enqueued all-to-all]); got {} and {}",
           op, size, send.dim() >= 1 ? send.size(0) : 0, recv.dim() >= 1 ? recv.size(0) : 0);
  return std::vector<int64_t>(static_cast<size_t>(size), send.size(0) / size);
}

AllToAllLayout CheckAllToAll(std::string_view op, const at::Tensor& send,
                             const std::vector<int64_t>& send_counts, const at::Tensor& recv,
                             const std::vector<int64_t>& recv_counts, int size,
                             c10::Device device) {
  CheckTensor(op, send, device);
  CheckTensor(op, recv, device);
  RL_CHECK(send.scalar_type() == recv.scalar_type(), Error,
           "{}: send dtype {} differs from recv dtype {}", op, c10::toString(send.scalar_type()),
           c10::toString(recv.scalar_type()));
  RL_CHECK(send.dim() >= 1 && recv.dim() >= 1, Error,
           "{}: send and recv need a row dimension (dim 0), got {} and {} dimensions", op,
           send.dim(), recv.dim());
  RL_CHECK(send.sizes().slice(1) == recv.sizes().slice(1), Error,
           "{}: send rows [{}] and recv rows [{}] differ in shape (Note [All-to-all])", op,
           fmt::join(send.sizes().slice(1), ", "), fmt::join(recv.sizes().slice(1), ", "));
  const auto check_counts = [&](const std::vector<int64_t>& counts, std::string_view which,
                                const at::Tensor& tensor) {
    RL_CHECK(counts.size() == static_cast<size_t>(size), Error,
             "{}: {} has {} entries but the group has {} ranks; pass one count per rank", op, which,
             counts.size(), size);
    for (int j = 0; j < size; ++j) {
      RL_CHECK(counts[j] >= 0, Error, "{}: {}[{}] is {}; counts must be non-negative", op, which, j,
               counts[j]);
    }
    const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    RL_CHECK(rows == tensor.size(0), Error,
             "{}: {} add up to {} rows but the tensor has {} (Note [All-to-all])", op, which, rows,
             tensor.size(0));
  };
  check_counts(send_counts, "send_counts", send);
  check_counts(recv_counts, "recv_counts", recv);
  if (send.nbytes() > 0 && recv.nbytes() > 0) {
    const auto* send_begin = static_cast<const char*>(send.data_ptr());
    const auto* recv_begin = static_cast<const char*>(recv.data_ptr());
    RL_CHECK(send_begin >= recv_begin + recv.nbytes() || recv_begin >= send_begin + send.nbytes(),
             Error, "{}: send and recv overlap; all-to-all is not in place", op);
  }
  AllToAllLayout layout;
  layout.row_bytes = static_cast<int64_t>(send.element_size());
  for (int64_t extent : send.sizes().slice(1)) layout.row_bytes *= extent;
  layout.send_offsets.resize(size);
  layout.recv_offsets.resize(size);
  int64_t send_offset = 0;
  int64_t recv_offset = 0;
  for (int j = 0; j < size; ++j) {
    layout.send_offsets[j] = send_offset;
    layout.recv_offsets[j] = recv_offset;
    send_offset += send_counts[j] * layout.row_bytes;
    recv_offset += recv_counts[j] * layout.row_bytes;
  }
  return layout;
}

Group WorldGroup(int world_size) {
  Group group;
  group.name = "world";
  group.world_ranks.resize(world_size);
  std::iota(group.world_ranks.begin(), group.world_ranks.end(), 0);
  return group;
}

namespace {

// splitmix64's finaliser: spreads (parent tag, split ordinal, color) over the 64-bit tags.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

SplitPlan PlanSplit(Group& parent, int parent_rank, const std::vector<int64_t>& colors_keys,
                    std::string_view name) {
  const int parent_size = static_cast<int>(parent.world_ranks.size());
  RL_CHECK(colors_keys.size() == static_cast<size_t>(2 * parent_size), Error,
           "split into '{}': {} (color, key) entries for a group of {}", name,
           colors_keys.size() / 2, parent_size);
  const int64_t ordinal = parent.splits++;
  for (int r = 0; r < parent_size; ++r) {
    RL_CHECK(colors_keys[2 * r] >= 0, Error,
             "split of '{}' into '{}': rank {} (world rank {}) passed color {}; colors must be "
             "non-negative (Note [Sub-groups])",
             parent.name, name, r, parent.world_ranks[r], colors_keys[2 * r]);
  }
  const int64_t color = colors_keys[2 * parent_rank];
  std::vector<int> members;  // parent ranks, in child rank order
  for (int r = 0; r < parent_size; ++r) {
    if (colors_keys[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return colors_keys[2 * a + 1] < colors_keys[2 * b + 1]; });
  SplitPlan plan;
  plan.group.name = std::string(name);
  const uint64_t tag = Mix(Mix(Mix(static_cast<uint64_t>(parent.tag)) + ordinal) + color);
  plan.group.tag = static_cast<int64_t>(tag == 0 ? 1 : tag);  // 0 is the world's
  for (size_t i = 0; i < members.size(); ++i) {
    plan.group.world_ranks.push_back(parent.world_ranks[members[i]]);
    if (members[i] == parent_rank) plan.rank = static_cast<int>(i);
  }
  return plan;
}

std::string Label(std::string_view backend, std::string_view op, const Group& group) {
  return fmt::format("{} {} over '{}'", backend, op, group.name);
}

std::string DescribeOp(std::string_view backend, std::string_view op, const Group& group,
                       int64_t bytes_in, int64_t bytes_out, int rank) {
  const std::string world_rank =
      group.tag == 0 ? "" : fmt::format(", world rank {}", group.world_ranks[rank]);
  return fmt::format("{} (rank {} of {}{}, {} bytes in, {} bytes out)", Label(backend, op, group),
                     rank, group.world_ranks.size(), world_rank, bytes_in, bytes_out);
}

}  // namespace internal
}  // namespace rl
