// Test-only: a small model's HF tensor list (GQA attention with q/k/v bias and a dense MLP in
// layer 0; MLA attention with MoE (router, fp32 e_score_correction_bias, shared experts, routed
// experts) in layer 1) and exact-by-construction values for it.
#ifndef RL_WEIGHT_SYNC_TEST_TENSORS_H_
#define RL_WEIGHT_SYNC_TEST_TENSORS_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "launch/named_tensors.h"
#include "weight_sync/engine_layout.h"

namespace rl::weight_sync::testing {

inline constexpr int kNumRoutedExperts = 4;

// bf16 except e_score_correction_bias (fp32). q/k/v are listed interleaved with their biases and
// layer 0's v_proj before k_proj, so fusion order does not follow list order by accident.
std::vector<TensorDecl> SmallModelDecls();

// Tensor `index` of the list: element i holds ((i + 7 * index) mod 251) - 125, an integer every
// floating dtype stores exactly; fp32 tensors add 1/1024, which bf16 cannot store. Each tensor's
// contents differ from every other same-shaped tensor's.
at::Tensor ExactValues(const TensorDecl& decl, int64_t index);

// ExactValues of every declaration, on `device`, named as declared.
NamedTensors ExactActorTensors(const std::vector<TensorDecl>& decls, at::Device device);

// Same dtype, same shape and the same bytes (on any devices).
bool BitsEqual(const at::Tensor& a, const at::Tensor& b);

}  // namespace rl::weight_sync::testing

#endif  // RL_WEIGHT_SYNC_TEST_TENSORS_H_
