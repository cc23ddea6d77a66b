// The verifiers on hand-written responses: one CHECK per stated rule of rewards.h.
#include "trainer/data/rewards.h"

#include <catch2/catch.hpp>

#include "launch/check.h"

namespace rl::data {

TEST_CASE("exact_match compares trimmed strings", "[rewards]") {
  CHECK(MakeRewardFn(RewardType::kExactMatch)("  Paris\n", "Paris") == 1.0);
  CHECK(MakeRewardFn(RewardType::kExactMatch)("paris", "Paris") == 0.0);
  CHECK(MakeRewardFn(RewardType::kExactMatch)("Paris.", "Paris") == 0.0);
  CHECK(MakeRewardFn(RewardType::kExactMatch)("", "") == 1.0);
}

TEST_CASE("math: answer extraction", "[rewards]") {
  CHECK(ExtractMathAnswer("so \\boxed{42}.") == std::optional<std::string>("42"));
  CHECK(ExtractMathAnswer("\\boxed{\\frac{1}{2}}") == std::optional<std::string>("\\frac{1}{2}"));
  CHECK(ExtractMathAnswer("first \\boxed{1} then \\boxed{2}") == std::optional<std::string>("2"));
  CHECK(ExtractMathAnswer("\\boxed {7}") == std::optional<std::string>("7"));
  // An unbalanced (truncated) last box falls back to the previous balanced one.
  CHECK(ExtractMathAnswer("\\boxed{3} and \\boxed{4") == std::optional<std::string>("3"));
  CHECK(ExtractMathAnswer("It costs 1,234,567 dollars, not 12.") ==
        std::optional<std::string>("12"));
  CHECK(ExtractMathAnswer("It costs 1,234,567 dollars") == std::optional<std::string>("1,234,567"));
  CHECK(ExtractMathAnswer("the temperature is -5 degrees") == std::optional<std::string>("-5"));
  CHECK(ExtractMathAnswer("5-3 = 2") == std::optional<std::string>("2"));
  CHECK(ExtractMathAnswer("x = 3 - 7") == std::optional<std::string>("7"));
  CHECK(ExtractMathAnswer("ratio 3/4") == std::optional<std::string>("3/4"));
  CHECK(ExtractMathAnswer("pi is about 3.14.") == std::optional<std::string>("3.14"));
  CHECK(ExtractMathAnswer("list 1,2,3") == std::optional<std::string>("3"));
  CHECK_FALSE(ExtractMathAnswer("no answer here").has_value());
}

TEST_CASE("math: normalisation", "[rewards]") {
  CHECK(NormalizeMathAnswer(" $1,000$. ") == "1000");
  CHECK(NormalizeMathAnswer("\\dfrac{3}{4}") == "3/4");
  CHECK(NormalizeMathAnswer("\\left( 1, 2 \\right)") == "(1,2)");
  CHECK(NormalizeMathAnswer("\xE2\x88\x92"
                            "3") == "-3");
  CHECK(ParseMathNumber("-0.50") == Approx(-0.5));
  CHECK(ParseMathNumber("1/2") == Approx(0.5));
  CHECK_FALSE(ParseMathNumber("1/0").has_value());
  CHECK_FALSE(ParseMathNumber("x+1").has_value());
  CHECK_FALSE(ParseMathNumber("1.2.3").has_value());
}

TEST_CASE("math rewards", "[rewards]") {
  CHECK(MathReward("The answer is \\boxed{42}.", "42") == 1.0);
  CHECK(MathReward("The answer is \\boxed{41}.", "42") == 0.0);
  CHECK(MathReward("\\boxed{\\frac{1}{2}}", "0.5") == 1.0);
  CHECK(MathReward("so it is 0.5", "1/2") == 1.0);
  CHECK(MathReward("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}") == 1.0);
  CHECK(MathReward("total: 1,234 apples", "1234") == 1.0);
  CHECK(MathReward("total: $1,234.00", "1234") == 1.0);
  CHECK(MathReward("we get -7", "-7") == 1.0);
  CHECK(MathReward("we get 7", "-7") == 0.0);
  CHECK(MathReward("first \\boxed{1}, finally \\boxed{2}", "2") == 1.0);
  CHECK(MathReward("\\boxed{x+1}", "x + 1") == 1.0);
  CHECK(MathReward("\\boxed{1+x}", "x+1") == 0.0);  // no algebra
  CHECK(MathReward("I don't know", "3") == 0.0);
  CHECK(MathReward("\\boxed{}", "") == 0.0);
  CHECK(MathReward("answer 72", "\\boxed{72}") == 1.0);
  CHECK(MathReward("answer 72", "72.0") == 1.0);
}

TEST_CASE("reward factory", "[rewards]") {
  CHECK(MakeRewardFn(RewardType::kMath)("\\boxed{3}", "3") == 1.0);
  CHECK(MakeRewardFn(RewardType::kToy)("4<eos>", "4") == 1.0);
}

}  // namespace rl::data
