// What one model parameter is before any storage exists: its checkpoint name, its shape and its
// role. The model lists them (trainer/model/params.h), the optimizer lays the trained ones out in
// its flat buffers, and the actor splits trained from extras by role, all from this one type.
//
// Plain data: no invariants checked here, no failure modes, not synchronised.
#ifndef RL_LAUNCH_PARAM_SPEC_H_
#define RL_LAUNCH_PARAM_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

namespace rl {

enum class ParamRole {
  kDense,         // trained, in the dense param buffer
  kRoutedExpert,  // trained, in the routed-expert param buffer
  kFp32Extra,     // fp32, not trained (MoE e_score_correction_bias)
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  ParamRole role = ParamRole::kDense;
  // Under tensor parallelism: the dim along which `shape` is this rank's slice of the whole param,
  // and where along it the slice starts (Note [Tensor shard], trainer/model/model_config.h);
  // -1 for a param every rank holds whole.
  int64_t tp_dim = -1;
  int64_t tp_start = 0;
  int64_t tp_extent = 0;  // the whole tensor's size along tp_dim
  // How many TP ranks hold these same values (1 for a slice of its own; TP for a replicated param;
  // TP / kv_heads for key/value heads fewer than TP), and whether a lower TP rank among them does:
  // the gradient norm counts such values once, on the lowest.
  int64_t tp_replicas = 1;
  bool tp_duplicate = false;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace rl

#endif  // RL_LAUNCH_PARAM_SPEC_H_
