// The MoE block's definition as a plain loop over the experts, the reference that the grouped
// MoeBlock (Note [MoE block] in layers.h) is checked against, on the CPU by
// //trainer/model:moe_test and on the GPU by tools/bench/moe_sync_check.
//
// Same routing (Route) and the same combination as MoeBlock; each expert's (token, slot) rows go
// through two Linear calls (layers.h: at::linear, batch-invariant on the CPU as MoeBlock's). The
// rows go to and come back from the experts by index_select / index_copy, each row exactly once, so
// the gradients sum in the same order as MoeBlock's. Reads the routing on the host (one loop
// iteration per expert): for checks, not for speed.
// Thread safety: stateless.
#ifndef RL_TRAINER_MODEL_MOE_REFERENCE_H_
#define RL_TRAINER_MODEL_MOE_REFERENCE_H_

#include <ATen/ATen.h>

#include "trainer/model/layers.h"
#include "trainer/model/model_config.h"

namespace rl::model {

// x [..., H] -> [..., H], shared experts included.
at::Tensor MoeBlockByExpertLoop(const MoeWeights& w, const ModelConfig& config,
                                const at::Tensor& x);

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_MOE_REFERENCE_H_
