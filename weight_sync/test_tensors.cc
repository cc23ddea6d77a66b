#include "weight_sync/test_tensors.h"

#include <ATen/ATen.h>

namespace rl::weight_sync::testing {

std::vector<TensorDecl> SmallModelDecls() {
  constexpr int64_t kHidden = 8, kVocab = 10, kFfn = 12, kMoeFfn = 6;
  constexpr int64_t kQRows = 8, kKvRows = 4;  // 4 query heads, 2 kv heads of width 2
  const at::ScalarType bf16 = at::kBFloat16;
  std::vector<TensorDecl> d;
  d.push_back({"model.embed_tokens.weight", {kVocab, kHidden}, bf16});

  // Layer 0: GQA with q/k/v bias, dense MLP.
  const std::string l0 = "model.layers.0.";
  d.push_back({l0 + "input_layernorm.weight", {kHidden}, bf16});
  d.push_back({l0 + "self_attn.q_proj.weight", {kQRows, kHidden}, bf16});
  d.push_back({l0 + "self_attn.q_proj.bias", {kQRows}, bf16});
  d.push_back({l0 + "self_attn.v_proj.weight", {kKvRows, kHidden}, bf16});
  d.push_back({l0 + "self_attn.v_proj.bias", {kKvRows}, bf16});
  d.push_back({l0 + "self_attn.k_proj.weight", {kKvRows, kHidden}, bf16});
  d.push_back({l0 + "self_attn.k_proj.bias", {kKvRows}, bf16});
  d.push_back({l0 + "self_attn.o_proj.weight", {kHidden, kQRows}, bf16});
  d.push_back({l0 + "post_attention_layernorm.weight", {kHidden}, bf16});
  d.push_back({l0 + "mlp.gate_proj.weight", {kFfn, kHidden}, bf16});
  d.push_back({l0 + "mlp.up_proj.weight", {kFfn, kHidden}, bf16});
  d.push_back({l0 + "mlp.down_proj.weight", {kHidden, kFfn}, bf16});

  // Layer 1: MLA-style attention, MoE.
  const std::string l1 = "model.layers.1.";
  d.push_back({l1 + "input_layernorm.weight", {kHidden}, bf16});
  d.push_back({l1 + "self_attn.q_a_proj.weight", {6, kHidden}, bf16});
  d.push_back({l1 + "self_attn.q_a_layernorm.weight", {6}, bf16});
  d.push_back({l1 + "self_attn.q_b_proj.weight", {10, 6}, bf16});
  d.push_back({l1 + "self_attn.kv_a_proj_with_mqa.weight", {7, kHidden}, bf16});
  d.push_back({l1 + "self_attn.kv_a_layernorm.weight", {5}, bf16});
  d.push_back({l1 + "self_attn.kv_b_proj.weight", {12, 5}, bf16});
  d.push_back({l1 + "self_attn.o_proj.weight", {kHidden, 8}, bf16});
  d.push_back({l1 + "post_attention_layernorm.weight", {kHidden}, bf16});
  d.push_back({l1 + "mlp.gate.weight", {kNumRoutedExperts, kHidden}, bf16});
  d.push_back({l1 + "mlp.gate.e_score_correction_bias", {kNumRoutedExperts}, at::kFloat});
  d.push_back({l1 + "mlp.shared_experts.gate_proj.weight", {kMoeFfn, kHidden}, bf16});
  d.push_back({l1 + "mlp.shared_experts.up_proj.weight", {kMoeFfn, kHidden}, bf16});
  d.push_back({l1 + "mlp.shared_experts.down_proj.weight", {kHidden, kMoeFfn}, bf16});
  for (int e = 0; e < kNumRoutedExperts; ++e) {
    const std::string x = l1 + "mlp.experts." + std::to_string(e) + ".";
    d.push_back({x + "gate_proj.weight", {kMoeFfn, kHidden}, bf16});
    d.push_back({x + "up_proj.weight", {kMoeFfn, kHidden}, bf16});
    d.push_back({x + "down_proj.weight", {kHidden, kMoeFfn}, bf16});
  }
  d.push_back({"model.norm.weight", {kHidden}, bf16});
  d.push_back({"lm_head.weight", {kVocab, kHidden}, bf16});
  return d;
}

at::Tensor ExactValues(const TensorDecl& decl, int64_t index) {
  at::Tensor values = at::arange(NumBytes(decl.shape, at::kByte), at::kLong);
  values = (values + 7 * index).remainder(251) - 125;
  at::Tensor out = values.to(at::kDouble);
  if (decl.dtype == at::kFloat) out = out + 1.0 / 1024;
  return out.to(decl.dtype).reshape(decl.shape);
}

NamedTensors ExactActorTensors(const std::vector<TensorDecl>& decls, at::Device device) {
  NamedTensors out;
  for (size_t i = 0; i < decls.size(); ++i) {
    out.push_back({decls[i].name, ExactValues(decls[i], static_cast<int64_t>(i)).to(device)});
  }
  return out;
}

bool BitsEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  auto bytes = [](const at::Tensor& t) {
    return t.to(at::kCPU).contiguous().reshape({-1}).view(at::kByte);
  };
  return at::equal(bytes(a), bytes(b));
}

}  // namespace rl::weight_sync::testing
