#include "trainer/data/toy_task.h"

#include <fmt/format.h>

#include "launch/check.h"
#include "trainer/data/tokenizer.h"

namespace rl::data {

std::vector<PromptExample> MakeToyTask(int64_t count, uint64_t seed) {
  RL_CHECK(count >= 0, Error, "MakeToyTask: negative count {}", count);
  std::vector<PromptExample> examples;
  examples.reserve(static_cast<size_t>(count));
  uint64_t state = seed;
  for (int64_t i = 0; i < count; ++i) {
    // SplitMix64, so that the sequence does not depend on the standard library.
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    const int digit = static_cast<int>((z >> 32) % 10);  // bias < 1e-9
    PromptExample e;
    e.text = fmt::format("next({})=", digit);
    e.label = std::to_string((digit + 1) % 10);
    examples.push_back(std::move(e));
  }
  return examples;
}

double ToyTaskReward(std::string_view response, std::string_view label) {
  if (label.empty()) return 0.0;
  const size_t eos = response.find(ByteTokenizer::kEosToken);
  const std::string_view answer = response.substr(0, eos);
  if (answer.substr(0, label.size()) == label) return 1.0;
  // Shaping: a wrong digit earns kToyTaskWrongDigitReward, so that a fresh model, which rarely
  // hits the right digit, first learns to answer with a digit at all.
  return !answer.empty() && answer[0] >= '0' && answer[0] <= '9' ? kToyTaskWrongDigitReward : 0.0;
}

}  // namespace rl::data
