// The embedded toy task: prompts with verifiable one-token answers that a tiny, randomly
// initialised byte-level model (ByteTokenizer, vocab 259, 2-4 layers, hidden 64) learns with GRPO
// in a few minutes on CPU. launch/run.sh's demo trains on it by default.
//
// Task: "next(d)=" -> the digit after d, cyclically: "next(3)=" -> "4", "next(9)=" -> "0".
// Prompts are 8 bytes (8 ByteTokenizer ids), answers one byte; run it with a max response length
// of 2-4 tokens. The 10 distinct prompts are drawn uniformly.
//
// Reward (ToyTaskReward, --rm-type toy): 1.0 when the decoded response, cut at its first
// "<eos>", starts with the label; what follows the answer is ignored, so a response length of 2-4
// does not make the task harder. ("4<eos>", "4", "4x" score 1; "x4", "" score 0.) A response that
// starts with a wrong digit scores 0.1 (shaping: a fresh model first learns to answer a digit).
//
// Chance level: a policy that answers a uniformly random digit scores 0.1 + 0.9 x 0.1 = 0.19; a
// freshly initialised model, whose first token is close to uniform over all 259 ids, scores
// about 10/259 x 0.19 = 0.007. Only the right digit scores 1, so a mean reward >= 0.9 means the
// task is learned.
//
// Thread safety: stateless.
#ifndef RL_TRAINER_DATA_TOY_TASK_H_
#define RL_TRAINER_DATA_TOY_TASK_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "trainer/data/prompt_dataset.h"

namespace rl::data {

// Reward of a response that starts with a wrong digit.
inline constexpr double kToyTaskWrongDigitReward = 0.1;
// Reward of a policy answering uniformly random digits (see above).
inline constexpr double kToyTaskChanceReward = 0.19;

// `count` examples (count >= 0), a deterministic function of `seed` on every platform. The
// prompts are plain strings (no chat template) and line is 0.
std::vector<PromptExample> MakeToyTask(int64_t count, uint64_t seed);

// See the header: 1.0 when `response` up to its first "<eos>" starts with `label` (non-empty).
double ToyTaskReward(std::string_view response, std::string_view label);

}  // namespace rl::data

#endif  // RL_TRAINER_DATA_TOY_TASK_H_
