// Learning-rate schedules of the reference (Megatron): constant, linear or cosine decay after a
// linear warm-up from 0.
#ifndef RL_OPTIMIZER_LR_SCHEDULE_H_
#define RL_OPTIMIZER_LR_SCHEDULE_H_

#include <cstdint>
#include <utility>

namespace rl::optimizer {

// --lr-decay-style, with its name table (EnumNames is how trainer/config finds it).
enum class LrDecayStyle { kConstant, kLinear, kCosine };
inline constexpr std::pair<LrDecayStyle, const char*> kLrDecayStyleNames[] = {
    {LrDecayStyle::kConstant, "constant"},
    {LrDecayStyle::kLinear, "linear"},
    {LrDecayStyle::kCosine, "cosine"},
};
constexpr const auto& EnumNames(LrDecayStyle) { return kLrDecayStyleNames; }

struct LrSchedule {
  double lr = 1e-6;       // peak
  double min_lr = 0.0;    // end of decay
  LrDecayStyle style = LrDecayStyle::kConstant;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // steps of decay after warm-up

  // The learning rate of optimizer step `step` (1-based).
  double At(int64_t step) const;
};

}  // namespace rl::optimizer

#endif  // RL_OPTIMIZER_LR_SCHEDULE_H_
