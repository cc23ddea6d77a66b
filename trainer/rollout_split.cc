#include "trainer/rollout_split.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "launch/check.h"

namespace rl {

PromptRange PromptShare(int64_t num_prompts, int rank, int size) {
  RL_CHECK(num_prompts >= 0 && size >= 1 && rank >= 0 && rank < size, Error,
           "PromptShare: {} prompts, rank {} of {}", num_prompts, rank, size);
  const int64_t base = num_prompts / size;
  const int64_t extra = num_prompts % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

std::vector<std::vector<rl_algo::Sample>> AllGatherSamples(
    const std::vector<rl_algo::Sample>& local, Communicator& comm, c10::Device device) {
  const int size = comm.size();
  if (size == 1) return {local};
  const std::string bytes = rl_algo::EncodeSamples(local);
  // The byte counts first, so that every rank sends a buffer of the largest count.
  const auto on_device = at::TensorOptions().device(device);
  at::Tensor counts = at::empty({size}, on_device.dtype(at::kLong));
  comm.AllGather(at::full({1}, static_cast<int64_t>(bytes.size()), on_device.dtype(at::kLong)),
                 counts);
  const at::Tensor counts_host = counts.cpu();
  const int64_t* count = counts_host.data_ptr<int64_t>();
  const int64_t longest = *std::max_element(count, count + size);

  at::Tensor send = at::zeros({longest}, at::kByte);
  std::memcpy(send.data_ptr(), bytes.data(), bytes.size());
  at::Tensor gathered = at::empty({size * longest}, on_device.dtype(at::kByte));
  comm.AllGather(send.to(device), gathered);
  const at::Tensor host = gathered.cpu();
  const char* data = static_cast<const char*>(host.data_ptr());

  std::vector<std::vector<rl_algo::Sample>> out;
  for (int r = 0; r < size; ++r) {
    out.push_back(rl_algo::DecodeSamples(std::string_view(data + r * longest, count[r]),
                                         fmt::format("the rollout samples of rank {}", r)));
  }
  return out;
}

}  // namespace rl
