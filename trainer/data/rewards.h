// Built-in verifiers that turn a decoded response and the prompt's label into a reward
// (--rm-type). Each returns 1.0 for a correct answer and 0.0 otherwise; they never throw on any
// response text (model output is arbitrary) and are stateless and thread-safe.
//
//   exact_match  the response and the label, trimmed of whitespace at both ends, are equal.
//   math         the answer is the content of the last \boxed{...} with balanced braces (also
//                "\boxed {..}"), else the last number in the response. Answer and label are
//                normalised (NormalizeMathAnswer) and compared as numbers when both parse as one
//                (integers, decimals, simple fractions a/b; relative tolerance 1e-9, so
//                "0.5" == "1/2" == "\frac{1}{2}"), else as strings. No symbolic algebra: "x+1"
//                and "1+x" differ, and so do "\sqrt{4}" and "2".
//   toy          the toy task's reward (toy_task.h): the response up to its first "<eos>" starts
//                with the label.
#ifndef RL_TRAINER_DATA_REWARDS_H_
#define RL_TRAINER_DATA_REWARDS_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rl::data {

using RewardFn = std::function<double(std::string_view response, std::string_view label)>;

// --rm-type, with its name table (EnumNames is how trainer/config finds it).
enum class RewardType { kExactMatch, kMath, kToy };
inline constexpr std::pair<RewardType, const char*> kRewardTypeNames[] = {
    {RewardType::kExactMatch, "exact_match"},
    {RewardType::kMath, "math"},
    {RewardType::kToy, "toy"},
};
constexpr const auto& EnumNames(RewardType) { return kRewardTypeNames; }

RewardFn MakeRewardFn(RewardType type);

double ExactMatchReward(std::string_view response, std::string_view label);
double MathReward(std::string_view response, std::string_view label);

// The math verifier's steps, exposed for tests and logging.
// Content of the last balanced \boxed{...}, else the last number (sign, thousands commas,
// decimals, a/b kept), else nullopt.
std::optional<std::string> ExtractMathAnswer(std::string_view response);
// Removes whitespace, '$', "\!", "\,", "\left"/"\right", a trailing '.', thousands commas in a
// number; turns \frac{a}{b}, \dfrac, \tfrac into a/b and U+2212 into '-'.
std::string NormalizeMathAnswer(std::string_view answer);
// The value of an integer, decimal or simple fraction (both parts integers or decimals, optional
// leading sign), else nullopt.
std::optional<double> ParseMathNumber(std::string_view normalized);

}  // namespace rl::data

#endif  // RL_TRAINER_DATA_REWARDS_H_
