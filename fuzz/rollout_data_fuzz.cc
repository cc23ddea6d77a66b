// Fuzz target: the rollout-data JSON-lines reader (trainer/rl/rollout_data.h).
//
// Input: the text of a --load-debug-rollout-data file. ParseRolloutData (ReadRolloutData without
// the file) refuses bad lines with CheckpointError. Every sample it accepts must satisfy Note
// [Rollout sample layout] (SampleProblem() == ""), and grouping the batch (GroupSizes, which
// refuses with rl::Error) must account for every sample.
#include <cstdint>
#include <numeric>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "launch/check.h"
#include "trainer/rl/rollout_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using rl::rl_algo::GroupSizes;
  using rl::rl_algo::ParseRolloutData;
  using rl::rl_algo::RolloutBatch;
  using rl::rl_algo::SampleProblem;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  RolloutBatch batch;
  try {
    batch = ParseRolloutData(text, "fuzz.jsonl");
  } catch (const rl::Error&) {
    return 0;
  }
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    const std::string problem = SampleProblem(batch.samples[i]);
    RL_FUZZ_EXPECT(problem.empty(), "sample {} was accepted but breaks the layout: {}", i, problem);
  }
  for (const int64_t n_samples_per_prompt : {1, 2}) {
    try {
      const std::vector<int64_t> sizes = GroupSizes(batch, n_samples_per_prompt);
      const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
      RL_FUZZ_EXPECT(total == static_cast<int64_t>(batch.samples.size()),
                     "group sizes add up to {}, but the batch has {} samples", total,
                     batch.samples.size());
    } catch (const rl::Error&) {
    }
  }
  return 0;
}
