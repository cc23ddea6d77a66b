// The data-parallel rollout: which of an iteration's prompts each rank generates, and the
// exchange that gives every rank the whole rollout afterwards (docs/data-parallel-rollout.md).
//
// Note [Data-parallel rollout]
// Every rank draws the same prompt batch (the dataset's order depends on --seed only). Rank r of
// D generates the prompts of a contiguous range (PromptShare: the first B % D ranks get one prompt
// more), all --n-samples-per-prompt samples of each, so a GRPO group stays on one rank; rewards are
// computed where the samples are. AllGatherSamples then gives every rank every sample, in rank
// order, which is prompt order: the batch is the one a single rank would have generated, and
// advantages, reward statistics and metrics are those of the whole batch. Sample k of prompt p
// samples with the seed base + p * n + k (Note [Rollout seeds] in trainer/rollout/engine.h: a rank
// passes base + begin * n), never with the rank, so the tokens do not depend on the layout.
//
// Collective: AllGatherSamples must be called by every rank of `comm`, in the same order as its
// other collectives. Failures: CommError from the communicator; rl::Error when a peer's bytes do
// not decode (Note [Sample wire format]).
#ifndef RL_TRAINER_ROLLOUT_SPLIT_H_
#define RL_TRAINER_ROLLOUT_SPLIT_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "launch/communicator.h"
#include "trainer/rl/rollout_data.h"

namespace rl {

// Prompts [begin, end) of a batch of `num_prompts`, for `rank` of `size`.
struct PromptRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
PromptRange PromptShare(int64_t num_prompts, int rank, int size);

// Every rank's `local` samples, on every rank: element r holds rank r's. The bytes move through
// `comm` on `device` (the communicator's: CUDA for NCCL, the CPU for MPI).
std::vector<std::vector<rl_algo::Sample>> AllGatherSamples(
    const std::vector<rl_algo::Sample>& local, Communicator& comm, c10::Device device);

}  // namespace rl

#endif  // RL_TRAINER_ROLLOUT_SPLIT_H_
