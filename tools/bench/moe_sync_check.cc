// moe_sync_check [--device auto|cpu] [--tokens 64]: checks of the MoE block (Note [MoE block] in
// trainer/model/layers.h) on small random models of both router kinds: softmax (Qwen3-MoE),
// sigmoid noaux_tc with expert groups and a shared expert (DeepSeek-V3), and GLM-5's (MLA with
// the DSA indexer, whose decode step then selects 4 of 16 keys). Hidden 256, 16 experts, top-4,
// expert width 128, 2 MoE layers.
//
//  1. Equivalence: MoeBlock (the stacked experts through GroupedLinear) against a plain loop over
//     the experts (MoeBlockByExpertLoop, moe_reference.h), forward and the gradients of x, the
//     router, the stacked expert weights (and the shared expert), on the same routing. fp32 must
//     match exactly (the grouped path is ATen's per-group loop there, on the CPU and on CUDA); bf16
//     on CUDA (the CUTLASS grouped GEMM) within kBf16Tolerance of the largest reference value.
//  2. On CUDA only, the host synchronisation check: after a warm-up, with
//     c10::cuda::warning_state().set_sync_debug_mode(L_ERROR) (any op that waits for the device
//     throws, naming itself), a bf16 MoeBlock forward + backward (training), a no-grad forward
//     (the rollout engine's), and a Decoder::DecodeStep of the whole 2-layer model (the step the
//     engine captures in a CUDA graph). Skipped on the CPU (the JSON line says so).
//
// Prints one JSON line {"bench":"moe_sync_check","ok":...,"checks":[...]} (each check with its
// figures) and exits 1 when a check fails or anything throws (the error text is printed: a sync
// debug error names the op that synchronised).
// GPU run: tools/gpu_moe_check.sh BIN_DIR OUT_DIR.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <CLI/CLI.hpp>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "launch/device.h"
#include "launch/json.h"
#include "trainer/model/decoder.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/layers.h"
#include "trainer/model/model_config.h"
#include "trainer/model/moe_reference.h"
#include "trainer/model/params.h"

namespace {

using rl::json::Value;
using rl::model::ModelConfig;
using rl::model::MoeWeights;
using rl::model::TensorMap;

constexpr double kBf16Tolerance = 2e-2;  // of the largest |reference|: a few bf16 roundings

// Two MoE layers of each router kind (config.json text, parsed as a checkpoint's would be).
const char* const kSoftmaxConfig = R"({
  "model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
  "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 16,
  "num_experts_per_tok": 4, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "max_position_embeddings": 4096, "tie_word_embeddings": false})";
const char* const kSigmoidConfig = R"({
  "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 64,
  "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "head_dim": 16,
  "intermediate_size": 512, "moe_intermediate_size": 128, "n_routed_experts": 16,
  "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
  "routed_scaling_factor": 2.5, "norm_topk_prob": true, "first_k_dense_replace": 0,
  "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_interleave": true,
  "max_position_embeddings": 4096, "tie_word_embeddings": false})";

// GLM-5's layout (MLA, the DSA indexer in every layer, sigmoid router with a shared expert),
// index_topk 4 so that the decode step over 16 cache positions selects keys (Note [DSA decode
// over the selected keys] in trainer/model/layers.cc), 8 index heads of 64 and GLM-5's latent
// widths (kv_lora_rank 512, rope 64) so that the decode step's indexer runs by its kernel (Note
// [DSA index scores kernel] in trainer/kernels) and the attention in the latent space.
const char* const kDsaConfig = R"({
  "model_type": "glm_moe_dsa", "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
  "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32, "head_dim": 64,
  "intermediate_size": 512, "moe_intermediate_size": 128, "n_routed_experts": 16,
  "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1,
  "routed_scaling_factor": 2.5, "norm_topk_prob": true, "first_k_dense_replace": 0,
  "index_n_heads": 8, "index_head_dim": 64, "index_topk": 4, "indexer_rope_interleave": true,
  "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "rope_interleave": true,
  "max_position_embeddings": 4096, "tie_word_embeddings": false})";

struct Model {
  std::string name;
  ModelConfig config;
  TensorMap params;  // random, requiring grad (the extras not)
};

Model MakeModel(const std::string& name, const char* config_json, at::ScalarType dtype,
                at::Device device) {
  Model m{name, rl::model::ParseModelConfig(rl::json::Parse(config_json), name), {}};
  const auto specs = rl::model::ListParams(m.config);
  m.params = rl::model::AllocateParams(specs, dtype, device);
  rl::model::InitParamsRandom(specs, m.params, 3);
  for (const auto& spec : specs) {
    at::Tensor& p = m.params.at(spec.name);
    if (spec.role == rl::ParamRole::kFp32Extra) {
      // e_score_correction_bias: init gives zeros; make it steer the selection.
      p.copy_(at::randn(p.sizes(), at::make_generator<at::CPUGeneratorImpl>(5)) * 0.05);
    } else {
      p.requires_grad_(true);
    }
  }
  return m;
}

// Layer 0's MoE weights, as the Decoder gathers them.
// The tensors whose gradients are compared, and their names.
std::vector<std::pair<std::string, at::Tensor>> Differentiable(const MoeWeights& w,
                                                               const at::Tensor& x) {
  std::vector<std::pair<std::string, at::Tensor>> out = {
      {"x", x}, {"router", w.router}, {"gate_up", w.gate_up}, {"down", w.down}};
  if (w.has_shared) {
    out.push_back({"shared_gate", w.shared.gate_proj});
    out.push_back({"shared_up", w.shared.up_proj});
    out.push_back({"shared_down", w.shared.down_proj});
  }
  return out;
}

// Forward and gradients of sum(out * probe) by `block`: [out, grads...].
template <typename Block>
std::vector<at::Tensor> ForwardBackward(const Block& block, const MoeWeights& w,
                                        const at::Tensor& x, const at::Tensor& probe) {
  const at::Tensor out = block(x);
  std::vector<at::Tensor> inputs;
  for (const auto& [name, t] : Differentiable(w, x)) inputs.push_back(t);
  std::vector<at::Tensor> result = {out.detach()};
  for (const at::Tensor& g : torch::autograd::grad({(out.to(at::kFloat) * probe).sum()}, inputs)) {
    result.push_back(g);
  }
  return result;
}

double MaxAbs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// Check 1 for one model and dtype.
Value Equivalence(const Model& m, at::ScalarType dtype, at::Device device, int64_t tokens,
                  bool& ok) {
  const MoeWeights w = rl::model::MoeWeightsOf(m.params, "model.layers.0.mlp.");
  const int64_t hidden = m.config.hidden_size;
  at::Tensor x = at::randn({tokens, hidden}, at::make_generator<at::CPUGeneratorImpl>(1))
                     .to(device, dtype)
                     .requires_grad_(true);
  const at::Tensor probe =
      at::randn({tokens, hidden}, at::make_generator<at::CPUGeneratorImpl>(2)).to(device);
  const auto grouped = ForwardBackward(
      [&](const at::Tensor& in) { return rl::model::MoeBlock(w, m.config, in); }, w, x, probe);
  const auto loop = ForwardBackward(
      [&](const at::Tensor& in) { return rl::model::MoeBlockByExpertLoop(w, m.config, in); }, w, x,
      probe);
  const bool exact = dtype == at::kFloat;
  std::vector<std::string> names = {"out"};
  for (const auto& [name, t] : Differentiable(w, x)) names.push_back("grad_" + name);
  Value diffs = Value::MakeObject({});
  bool all = true;
  for (size_t i = 0; i < names.size(); ++i) {
    const double diff = MaxAbs(grouped[i].to(at::kFloat) - loop[i].to(at::kFloat));
    const double scale = MaxAbs(loop[i].to(at::kFloat));
    const bool pass = exact ? diff == 0 : diff <= kBf16Tolerance * scale;
    all = all && pass;
    diffs.Set(names[i], Value::Double(scale > 0 ? diff / scale : diff));
  }
  ok = ok && all;
  Value check = Value::MakeObject({});
  check.Set("check", Value::String("grouped_vs_per_expert"));
  check.Set("model", Value::String(m.name));
  check.Set("dtype", Value::String(c10::toString(dtype)));
  check.Set("rule", Value::String(exact ? "exact" : "max|diff| <= 0.02 max|ref|"));
  check.Set("relative_max_diff", std::move(diffs));
  check.Set("ok", Value::Bool(all));
  return check;
}

// Turns the sync debug mode to L_ERROR for its lifetime.
struct SyncErrors {
  SyncErrors() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~SyncErrors() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
};

// Check 2 for one bf16 CUDA model: every MoE path under L_ERROR after a warm-up.
Value SyncFree(const Model& m, int64_t tokens, bool& ok) {
  const at::Device device = m.params.begin()->second.device();
  const MoeWeights w = rl::model::MoeWeightsOf(m.params, "model.layers.0.mlp.");
  const at::Tensor x = at::randn({tokens, m.config.hidden_size}, at::TensorOptions().device(device))
                           .to(at::kBFloat16)
                           .requires_grad_(true);
  const at::Tensor probe = at::randn({tokens, m.config.hidden_size}, x.options()).to(at::kFloat);
  const auto train = [&] {
    return ForwardBackward(
        [&](const at::Tensor& in) { return rl::model::MoeBlock(w, m.config, in); }, w, x, probe);
  };
  const auto infer = [&] {
    at::NoGradGuard no_grad;
    return rl::model::MoeBlock(w, m.config, x.detach());
  };

  // The whole model's decode step: a Decoder over detached params, 4 rows prefilled with 8
  // tokens, then the step at device position 8 over 16 cache positions.
  TensorMap detached;
  for (const auto& [name, p] : m.params) detached[name] = p.detach();
  const rl::model::Decoder decoder(m.config, detached, rl::model::Kernels::kFused);
  const int64_t rows = 4, prompt = 8, max_length = 16;
  rl::model::KvCache cache =
      rl::model::KvCache::Allocate(m.config, rows, max_length, at::kBFloat16, device);
  const rl::model::RopeTable rope =
      rl::model::MakeRopeTable(m.config, 0, max_length, at::kBFloat16, device);
  const auto ids = [&](int64_t n) {
    return at::randint(m.config.vocab_size, {rows, n},
                       at::TensorOptions().dtype(at::kLong).device(device));
  };
  const at::Tensor position =
      at::full({1}, prompt, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor step_tokens = ids(1);
  const auto decode = [&] {
    at::NoGradGuard no_grad;
    return decoder.DecodeStep(step_tokens, position, max_length, rope, cache);
  };
  {
    at::NoGradGuard no_grad;
    decoder.ForwardStep(ids(prompt), cache, 0);
  }

  train();  // warm-up: first calls may query the device (cuBLAS handles, kernel attributes)
  infer();
  decode();
  at::Tensor outputs;
  {
    SyncErrors errors;
    const auto trained = train();
    const at::Tensor inferred = infer();
    const at::Tensor logits = decode();
    outputs = at::stack({trained[0].sum().to(at::kFloat), inferred.sum().to(at::kFloat),
                         logits.sum().to(at::kFloat), trained[1].sum().to(at::kFloat)});
  }
  const bool finite = at::isfinite(outputs).all().item<bool>();
  const bool capturable = decoder.decode_step_capturable();
  const bool all = finite && capturable && rl::model::MoeBlockSyncFree(w);
  ok = ok && all;
  Value check = Value::MakeObject({});
  check.Set("check", Value::String("sync_free"));
  check.Set("model", Value::String(m.name));
  check.Set("ran",
            Value::String("MoeBlock forward+backward, no-grad forward, Decoder::DecodeStep"));
  check.Set("moe_block_sync_free", Value::Bool(rl::model::MoeBlockSyncFree(w)));
  check.Set("decode_step_capturable", Value::Bool(capturable));
  check.Set("finite", Value::Bool(finite));
  check.Set("ok", Value::Bool(all));
  return check;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MoE block checks: grouped vs per-expert experts, and no host synchronisation."};
  std::string device_name = "auto";
  int64_t tokens = 64;
  app.add_option("--device", device_name, "auto (the GPU when there is one) or cpu")
      ->check(CLI::IsMember({"cpu", "auto"}));
  app.add_option("--tokens", tokens, "tokens through the MoE block");
  CLI11_PARSE(app, argc, argv);

  Value line = Value::MakeObject({});
  line.Set("bench", Value::String("moe_sync_check"));
  bool ok = true;
  try {
    const at::Device device =
        rl::BindDevice(0, device_name == "cpu" ? rl::DevicePreference::kCpu
                                               : rl::DevicePreference::kCudaIfAvailable);
    line.Set("device", Value::String(device.str()));
    std::vector<at::ScalarType> dtypes = {at::kFloat};
    if (device.is_cuda()) dtypes.push_back(at::kBFloat16);
    Value::Array checks;
    const std::vector<std::pair<std::string, const char*>> kinds = {
        {"qwen3_moe_softmax", kSoftmaxConfig},
        {"deepseek_v3_sigmoid_groups_shared", kSigmoidConfig},
        {"glm5_dsa_sigmoid_shared", kDsaConfig}};
    for (const auto& [name, config_json] : kinds) {
      for (const at::ScalarType dtype : dtypes) {
        checks.push_back(
            Equivalence(MakeModel(name, config_json, dtype, device), dtype, device, tokens, ok));
      }
      if (device.is_cuda()) {
        checks.push_back(SyncFree(MakeModel(name, config_json, at::kBFloat16, device), tokens, ok));
      }
    }
    line.Set("sync_check", Value::String(device.is_cuda() ? "ran (sync debug mode L_ERROR)"
                                                          : "skipped: no CUDA device"));
    line.Set("checks", Value::MakeArray(std::move(checks)));
  } catch (const std::exception& e) {
    ok = false;
    std::fprintf(stderr, "moe_sync_check: %s\n", e.what());
    line.Set("error", Value::String(std::string(e.what()).substr(0, 2000)));
  }
  line.Set("ok", Value::Bool(ok));
  std::printf("%s\n", rl::json::Dump(line).c_str());
  return ok ? 0 : 1;
}
