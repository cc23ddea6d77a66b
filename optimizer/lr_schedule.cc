#include "optimizer/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace rl::optimizer {

double LrSchedule::At(int64_t step) const {
  if (warmup_steps > 0 && step <= warmup_steps) {
    return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  if (style == LrDecayStyle::kConstant || decay_steps <= 0) return lr;
  const double progress =
      std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0,
                 1.0);
  const double ratio = style == LrDecayStyle::kLinear
                           ? 1.0 - progress
                           : 0.5 * (1.0 + std::cos(M_PI * progress));
  return min_lr + (lr - min_lr) * ratio;
}

}  // namespace rl::optimizer
