// Learning-rate schedules of the reference (Megatron): constant, linear or cosine decay after a
// linear warm-up from 0.
#ifndef RL_OPTIMIZER_LR_SCHEDULE_H_
#define RL_OPTIMIZER_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

namespace rl::optimizer {

enum class LrDecayStyle { kConstant, kLinear, kCosine };
// "constant", "linear", "cosine"; throws rl::Error otherwise.
LrDecayStyle ParseLrDecayStyle(const std::string& name);

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
