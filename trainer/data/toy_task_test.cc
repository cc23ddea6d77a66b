// The toy task's stated properties: prompt/answer format and lengths, determinism, the uniform
// digit distribution behind the documented chance level, and the reward rule.
#include "trainer/data/toy_task.h"

#include <catch2/catch.hpp>
#include <map>

#include "trainer/data/tokenizer.h"

namespace rl::data {

TEST_CASE("toy prompts are 8 bytes and their labels the next digit", "[toy_task]") {
  const ByteTokenizer tok;
  for (const PromptExample& e : MakeToyTask(200, 3)) {
    REQUIRE(e.text.size() == 8);
    CHECK(tok.Encode(e.text).size() == 8);
    const int d = e.text[5] - '0';
    CHECK(e.text == "next(" + std::to_string(d) + ")=");
    CHECK(e.label == std::to_string((d + 1) % 10));
    CHECK(tok.Encode(e.label).size() == 1);
  }
}

TEST_CASE("MakeToyTask is deterministic and uniform over the ten prompts", "[toy_task]") {
  const auto a = MakeToyTask(5000, 11);
  const auto b = MakeToyTask(5000, 11);
  const auto c = MakeToyTask(5000, 12);
  std::map<std::string, int> counts;
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].text == b[i].text);
    differs = differs || a[i].text != c[i].text;
    ++counts[a[i].text];
  }
  CHECK(differs);
  REQUIRE(counts.size() == 10);
  // 5000 draws, p = 0.1: mean 500, sd 21; 5 sd is far outside chance.
  for (const auto& [prompt, n] : counts) CHECK(std::abs(n - 500) < 106);
  CHECK(MakeToyTask(0, 1).empty());
}

TEST_CASE("toy reward: the response up to <eos> starts with the label", "[toy_task]") {
  CHECK(ToyTaskReward("4", "4") == 1.0);
  CHECK(ToyTaskReward("4<eos>", "4") == 1.0);
  CHECK(ToyTaskReward("4x", "4") == 1.0);
  CHECK(ToyTaskReward("x4", "4") == 0.0);
  CHECK(ToyTaskReward("5", "4") == kToyTaskWrongDigitReward);
  CHECK(ToyTaskReward("<eos>4", "4") == 0.0);
  CHECK(ToyTaskReward("", "4") == 0.0);
  CHECK(ToyTaskReward("4", "") == 0.0);
  // The chance level: of the ten digit answers exactly one scores 1, the other nine 0.1.
  double total = 0;
  for (char d = '0'; d <= '9'; ++d) total += ToyTaskReward(std::string(1, d), "7");
  CHECK(total / 10 == Approx(kToyTaskChanceReward));
}

}  // namespace rl::data
