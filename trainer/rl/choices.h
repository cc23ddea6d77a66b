// The RL algorithm's choice options as enums, each with its one name table.
//
// A name table is a constexpr array of {value, "name"} pairs; EnumNames(value) returns it (found
// by argument-dependent lookup), so trainer/config parses, lists (--help), validates and dumps
// the option from this table alone. Header-only and without dependencies, so that the config
// package can use it without a cycle (trainer/rl's options-from-config functions depend on the
// config). Thread safety: constants only.
#ifndef RL_TRAINER_RL_CHOICES_H_
#define RL_TRAINER_RL_CHOICES_H_

#include <utility>

namespace rl::rl_algo {

// --advantage-estimator. kPpo needs a critic, which this trainer does not have: validation
// (trainer/config/validate.h) refuses it, so the advantage code never sees it.
enum class AdvantageEstimator { kGrpo, kGspo, kReinforcePlusPlus, kReinforcePlusPlusBaseline, kPpo };
inline constexpr std::pair<AdvantageEstimator, const char*> kAdvantageEstimatorNames[] = {
    {AdvantageEstimator::kGrpo, "grpo"},
    {AdvantageEstimator::kGspo, "gspo"},
    {AdvantageEstimator::kReinforcePlusPlus, "reinforce_plus_plus"},
    {AdvantageEstimator::kReinforcePlusPlusBaseline, "reinforce_plus_plus_baseline"},
    {AdvantageEstimator::kPpo, "ppo"},
};
constexpr const auto& EnumNames(AdvantageEstimator) { return kAdvantageEstimatorNames; }

// --kl-loss-type. With r = log_probs - ref_log_probs:
//   k1 = r;  k2 = r^2 / 2;  k3 = exp(-r) - 1 + r;
//   low_var_kl = k3 with -r clamped to [-20, 20] first, and the result clamped to [-10, 10].
enum class KlType { kK1, kK2, kK3, kLowVarKl };
inline constexpr std::pair<KlType, const char*> kKlTypeNames[] = {
    {KlType::kK1, "k1"},
    {KlType::kK2, "k2"},
    {KlType::kK3, "k3"},
    {KlType::kLowVarKl, "low_var_kl"},
};
constexpr const auto& EnumNames(KlType) { return kKlTypeNames; }

}  // namespace rl::rl_algo

#endif  // RL_TRAINER_RL_CHOICES_H_
