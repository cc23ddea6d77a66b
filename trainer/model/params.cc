#include "trainer/model/params.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/json.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/safetensors.h"
#include "trainer/model/safetensors_writer.h"

namespace rl::model {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string ShapeString(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Lists at most `limit` names, then how many more.
std::string NameList(const std::vector<std::string>& names, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    if (i) out += ", ";
    out += names[i];
  }
  if (names.size() > limit) out += fmt::format(" and {} more", names.size() - limit);
  return out;
}

// Note [Stacked experts]: the two stacked parameters of a layer end with these.
constexpr std::string_view kGateUpSuffix = ".experts.gate_up_proj";
constexpr std::string_view kDownSuffix = ".experts.down_proj";

}  // namespace

std::vector<ParamSpec> ListParams(const ModelConfig& c) {
  std::vector<ParamSpec> out;
  // Note [Tensor shard]: a param every TP rank holds whole.
  const int64_t tp = c.tensor_shard.size;
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamRole role = ParamRole::kDense) {
    out.push_back({std::move(name), std::move(shape), role});
    out.back().tp_replicas = tp;
    out.back().tp_duplicate = c.tensor_shard.rank > 0;
  };
  // `whole` shape, this rank's `slice` of it along `dim`, held by `replicas` TP ranks (key/value
  // heads fewer than TP).
  auto add_split = [&](std::string name, std::vector<int64_t> whole, int64_t dim, HeadRange slice,
                       int64_t replicas = 1) {
    const int64_t extent = whole[static_cast<size_t>(dim)];
    if (tp > 1) whole[static_cast<size_t>(dim)] = slice.count;
    add(std::move(name), std::move(whole));
    out.back().tp_replicas = replicas;
    out.back().tp_duplicate = c.tensor_shard.rank % replicas != 0;
    if (tp > 1) {
      out.back().tp_dim = dim;
      out.back().tp_start = slice.first;
      out.back().tp_extent = extent;
    }
  };
  // An even split of `count` units (heads, features) of `unit` elements each.
  auto even = [&](int64_t count, int64_t unit, std::string_view what) -> HeadRange {
    RL_CHECK(count % tp == 0, ConfigError,
             "tensor parallelism: {} {} do not divide over --tensor-model-parallel-size {}", count,
             what, tp);
    return {c.tensor_shard.rank * count / tp * unit, count / tp * unit};
  };
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  const HeadRange vocab = VocabSlice(c.vocab_size, c.tensor_shard.rank, tp);
  add_split("model.embed_tokens.weight", {c.vocab_size, h}, 0, vocab);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {h});
    const std::string a = p + "self_attn.";
    if (c.attention_kind() == AttentionKind::kGqa) {
      const int64_t d = c.head_dim;
      const int64_t kv = c.num_key_value_heads;
      const HeadRange q_rows = even(heads, d, "attention heads");
      const HeadRange kv_heads = KvHeadsOf(kv, c.tensor_shard.rank, tp);
      const HeadRange kv_rows{kv_heads.first * d, kv_heads.count * d};
      const int64_t kv_replicas = kv % tp == 0 ? 1 : tp / kv;
      add_split(a + "q_proj.weight", {heads * d, h}, 0, q_rows);
      if (c.attention_bias) add_split(a + "q_proj.bias", {heads * d}, 0, q_rows);
      add_split(a + "k_proj.weight", {kv * d, h}, 0, kv_rows, kv_replicas);
      if (c.attention_bias) add_split(a + "k_proj.bias", {kv * d}, 0, kv_rows, kv_replicas);
      add_split(a + "v_proj.weight", {kv * d, h}, 0, kv_rows, kv_replicas);
      if (c.attention_bias) add_split(a + "v_proj.bias", {kv * d}, 0, kv_rows, kv_replicas);
      if (c.use_qk_norm) {
        add(a + "q_norm.weight", {d});
        add(a + "k_norm.weight", {d});
      }
      add_split(a + "o_proj.weight", {h, heads * d}, 1, q_rows);
      // Qwen3's o_proj follows attention_bias; GLM-4.5's never has a bias.
      if (c.attention_bias && c.model_type != ModelType::kGlm4Moe) add(a + "o_proj.bias", {h});
    } else {
      const int64_t qk = c.qk_head_dim();
      if (c.q_lora_rank) {
        const int64_t r = *c.q_lora_rank;
        add(a + "q_a_proj.weight", {r, h});
        if (c.attention_bias) add(a + "q_a_proj.bias", {r});
        add(a + "q_a_layernorm.weight", {r});
        add_split(a + "q_b_proj.weight", {heads * qk, r}, 0, even(heads, qk, "attention heads"));
      } else {
        add_split(a + "q_proj.weight", {heads * qk, h}, 0, even(heads, qk, "attention heads"));
      }
      add(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h});
      if (c.attention_bias)
        add(a + "kv_a_proj_with_mqa.bias", {c.kv_lora_rank + c.qk_rope_head_dim});
      add(a + "kv_a_layernorm.weight", {c.kv_lora_rank});
      add_split(a + "kv_b_proj.weight",
                {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, 0,
                even(heads, c.qk_nope_head_dim + c.v_head_dim, "attention heads"));
      if (c.has_indexer() && c.indexer_types[l] == IndexerType::kFull) {
        // Replicated under TP (Note [Tensor-parallel attention]).
        const std::string ix = a + "indexer.";
        add(ix + "wq_b.weight", {c.index_n_heads * c.index_head_dim, *c.q_lora_rank});
        add(ix + "wk.weight", {c.index_head_dim, h});
        add(ix + "k_norm.weight", {c.index_head_dim});
        add(ix + "k_norm.bias", {c.index_head_dim});
        add(ix + "weights_proj.weight", {c.index_n_heads, h});
      }
      add_split(a + "o_proj.weight", {h, heads * c.v_head_dim}, 1,
                even(heads, c.v_head_dim, "attention heads"));
      if (c.attention_bias) add(a + "o_proj.bias", {h});
    }
    add(p + "post_attention_layernorm.weight", {h});
    const std::string m = p + "mlp.";
    if (c.mlp_layer_types[l] == MlpType::kDense) {
      const HeadRange features = even(c.intermediate_size, 1, "intermediate features");
      add_split(m + "gate_proj.weight", {c.intermediate_size, h}, 0, features);
      add_split(m + "up_proj.weight", {c.intermediate_size, h}, 0, features);
      add_split(m + "down_proj.weight", {h, c.intermediate_size}, 1, features);
      continue;
    }
    const int64_t e = c.n_routed_experts;
    const int64_t local = c.local_experts();  // Note [Expert shard]
    const int64_t im = c.moe_intermediate_size;
    add(m + "gate.weight", {e, h});
    if (c.router == RouterKind::kSigmoidNoauxTc) {
      add(m + "gate.e_score_correction_bias", {e}, ParamRole::kFp32Extra);
    }
    add(m + std::string(kGateUpSuffix.substr(1)), {local, 2 * im, h}, ParamRole::kRoutedExpert);
    add(m + std::string(kDownSuffix.substr(1)), {local, h, im}, ParamRole::kRoutedExpert);
    if (c.router == RouterKind::kSigmoidNoauxTc && c.n_shared_experts > 0) {
      const int64_t is = im * c.n_shared_experts;
      add(m + "shared_experts.gate_proj.weight", {is, h});
      add(m + "shared_experts.up_proj.weight", {is, h});
      add(m + "shared_experts.down_proj.weight", {h, is});
    }
  }
  add("model.norm.weight", {h});
  if (!c.tie_word_embeddings) add_split("lm_head.weight", {c.vocab_size, h}, 0, vocab);
  return out;
}

TensorMap ShardTensorParallel(const std::vector<ParamSpec>& specs, const TensorMap& whole) {
  TensorMap out;
  for (const ParamSpec& spec : specs) {
    const auto it = whole.find(spec.name);
    RL_CHECK(it != whole.end(), Error, "ShardTensorParallel: no param {} in the whole model",
             spec.name);
    out.emplace(spec.name,
                spec.tp_dim < 0
                    ? it->second
                    : it->second.narrow(spec.tp_dim, spec.tp_start,
                                        spec.shape[static_cast<size_t>(spec.tp_dim)]));
  }
  return out;
}

std::vector<HfSlice> HfLayout(const std::vector<ParamSpec>& specs, int64_t first_expert) {
  std::unordered_map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& s : specs) by_name.emplace(s.name, &s);
  std::vector<HfSlice> out;
  for (const ParamSpec& s : specs) {
    const bool gate_up = EndsWith(s.name, kGateUpSuffix);
    const bool down = EndsWith(s.name, kDownSuffix);
    if (!gate_up && !down) {
      out.push_back({s.name, s.name});
      continue;
    }
    // "model.layers.N.mlp" + ".experts."
    const std::string stem =
        s.name.substr(0, s.name.size() - (gate_up ? kGateUpSuffix.size() : kDownSuffix.size()));
    const std::string gate_up_name = stem + std::string(kGateUpSuffix);
    const std::string down_name = stem + std::string(kDownSuffix);
    const ParamSpec* gu = by_name.count(gate_up_name) ? by_name.at(gate_up_name) : nullptr;
    const ParamSpec* dn = by_name.count(down_name) ? by_name.at(down_name) : nullptr;
    // A layer's experts are listed once, at the first of its two parameters in `specs`.
    if (down && gu != nullptr) continue;
    const int64_t experts = s.shape.at(0);
    for (int64_t e = 0; e < experts; ++e) {
      const std::string ex = fmt::format("{}.experts.{}.", stem, first_expert + e);
      if (gu != nullptr) {
        const int64_t inter = gu->shape.at(1) / 2;
        out.push_back({ex + "gate_proj.weight", gu->name, e, 0, inter});
        out.push_back({ex + "up_proj.weight", gu->name, e, inter, inter});
      }
      if (dn != nullptr) out.push_back({ex + "down_proj.weight", dn->name, e, 0, dn->shape.at(1)});
    }
  }
  return out;
}

at::Tensor SliceOf(const HfSlice& slice, const at::Tensor& param) {
  if (slice.expert < 0) return param;
  return param.select(0, slice.expert).narrow(0, slice.row_begin, slice.rows);
}

at::ScalarType ParamDtype(const ParamSpec& spec, at::ScalarType dtype) {
  if (spec.role == ParamRole::kFp32Extra) {
    return dtype == at::kDouble ? at::kDouble : at::kFloat;
  }
  return dtype;
}

TensorMap AllocateParams(const std::vector<ParamSpec>& specs, at::ScalarType dtype,
                         at::Device device) {
  TensorMap out;
  out.reserve(specs.size());
  for (const ParamSpec& s : specs) {
    out.emplace(s.name,
                at::zeros(s.shape, at::TensorOptions().dtype(ParamDtype(s, dtype)).device(device)));
  }
  return out;
}

namespace {

// The values InitParamsRandom gives the whole param `s`, drawn from `gen` for matrices.
at::Tensor InitialValues(const ParamSpec& s, at::Generator& gen) {
  const bool norm_weight = EndsWith(s.name, "norm.weight");
  const bool bias = EndsWith(s.name, ".bias") || EndsWith(s.name, "e_score_correction_bias");
  if (norm_weight) return at::ones(s.shape, at::kFloat);
  if (bias || s.shape.size() < 2) return at::zeros(s.shape, at::kFloat);
  at::Tensor values = at::empty(s.shape, at::kFloat);
  values.normal_(0.0, 0.02, gen);
  return values;
}

at::Tensor& TensorFor(TensorMap& params, const std::string& name) {
  auto it = params.find(name);
  RL_CHECK(it != params.end(), Error, "InitParamsRandom: no tensor for parameter {}", name);
  return it->second;
}

}  // namespace

void InitParamsRandom(const std::vector<ParamSpec>& specs, TensorMap& params, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::NoGradGuard no_grad;
  for (const ParamSpec& s : specs) TensorFor(params, s.name).copy_(InitialValues(s, gen));
}

void InitParamsRandom(const ModelConfig& config, TensorMap& params, uint64_t seed) {
  ModelConfig whole = config;
  whole.expert_shard = {};
  whole.tensor_shard = {};
  std::unordered_map<std::string, ParamSpec> local;
  for (ParamSpec& s : ListParams(config)) local.emplace(s.name, std::move(s));
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::NoGradGuard no_grad;
  // Every whole param is drawn, so that the generator advances as for the whole model and each
  // slice equals those values of the whole model's (Note [Expert shard], Note [Tensor shard]).
  for (const ParamSpec& w : ListParams(whole)) {
    const ParamSpec& s = local.at(w.name);
    at::Tensor values = InitialValues(w, gen);
    if (s.role == ParamRole::kRoutedExpert) {
      values = values.narrow(0, config.first_local_expert(), s.shape[0]);
    }
    if (s.tp_dim >= 0) {
      values = values.narrow(s.tp_dim, s.tp_start, s.shape[static_cast<size_t>(s.tp_dim)]);
    }
    TensorFor(params, s.name).copy_(values);
  }
}

void CheckParams(const std::vector<ParamSpec>& specs, const TensorMap& params) {
  std::vector<std::string> missing, mismatched, unexpected;
  std::unordered_set<std::string> known;
  std::optional<at::ScalarType> dtype;
  std::optional<at::Device> device;
  for (const ParamSpec& s : specs) {
    known.insert(s.name);
    auto it = params.find(s.name);
    if (it == params.end() || !it->second.defined()) {
      missing.push_back(s.name);
      continue;
    }
    const at::Tensor& t = it->second;
    if (t.sizes() != at::IntArrayRef(s.shape)) {
      mismatched.push_back(fmt::format("{} (shape {}, expected {})", s.name, ShapeString(t.sizes()),
                                       ShapeString(s.shape)));
      continue;
    }
    if (!device) device = t.device();
    if (t.device() != *device) {
      mismatched.push_back(
          fmt::format("{} (on {}, others on {})", s.name, t.device().str(), device->str()));
    }
    if (s.role == ParamRole::kFp32Extra) {
      if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) {
        mismatched.push_back(
            fmt::format("{} (dtype {}, expected float32)", s.name, c10::toString(t.scalar_type())));
      }
      continue;
    }
    if (!dtype) dtype = t.scalar_type();
    if (t.scalar_type() != *dtype || !at::isFloatingType(t.scalar_type())) {
      mismatched.push_back(fmt::format("{} (dtype {}, expected {} like the other params)", s.name,
                                       c10::toString(t.scalar_type()), c10::toString(*dtype)));
    }
  }
  for (const auto& [name, t] : params) {
    if (!known.count(name)) unexpected.push_back(name);
  }
  std::sort(unexpected.begin(), unexpected.end());
  if (missing.empty() && mismatched.empty() && unexpected.empty()) return;
  std::string msg = "model parameters do not match the architecture:";
  if (!missing.empty()) msg += fmt::format(" missing {}: {};", missing.size(), NameList(missing));
  if (!unexpected.empty()) {
    msg += fmt::format(" unexpected {}: {};", unexpected.size(), NameList(unexpected));
  }
  if (!mismatched.empty()) {
    msg += fmt::format(" mismatched {}: {};", mismatched.size(), NameList(mismatched));
  }
  throw Error(msg);
}

}  // namespace rl::model

namespace rl::model {
namespace {

// Layers at or past num_hidden_layers are MTP (next-n prediction) layers, which the policy does
// not use; transformers ignores them too.
// The global expert id in a per-expert checkpoint name ("model.layers.N.mlp.experts.J.<...>"),
// or -1.
int64_t ExpertIdOf(const std::string& name) {
  constexpr std::string_view kExperts = ".mlp.experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return -1;
  const size_t begin = at + kExperts.size();
  const size_t dot = name.find('.', begin);
  if (dot == std::string::npos || dot == begin) return -1;
  int64_t id = 0;
  for (size_t i = begin; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    id = id * 10 + (name[i] - '0');
  }
  return id;
}

bool IsIgnoredCheckpointTensor(const std::string& name, const ModelConfig& config) {
  if (!config.weight_prefix.empty() && !StartsWith(name, config.weight_prefix)) {
    return true;  // Kimi-K2.5's vision tower and projector
  }
  const std::string n = name.substr(config.weight_prefix.size());
  if (EndsWith(n, "rotary_emb.inv_freq")) return true;
  const int64_t expert = ExpertIdOf(n);  // another EP rank's expert (Note [Expert shard])
  if (expert >= 0 && expert < config.n_routed_experts &&
      (expert < config.first_local_expert() ||
       expert >= config.first_local_expert() + config.local_experts())) {
    return true;
  }
  if (config.tie_word_embeddings && n == "lm_head.weight") return true;
  if (StartsWith(n, "model.layers.")) {
    const size_t begin = std::string_view("model.layers.").size();
    const size_t dot = n.find('.', begin);
    try {
      if (std::stoll(n.substr(begin, dot - begin)) >= config.num_hidden_layers) return true;
    } catch (const std::exception&) {
    }
  }
  return false;
}

// DeepSeek FP8 block quantisation: W = W8 * scale_inv[i / 128, j / 128] (128x128 blocks).
at::Tensor DequantizeFp8(const at::Tensor& w8, const at::Tensor& scale_inv) {
  const int64_t rows = w8.size(0);
  const int64_t cols = w8.size(1);
  const int64_t block_rows = (rows + scale_inv.size(0) - 1) / scale_inv.size(0);
  const int64_t block_cols = (cols + scale_inv.size(1) - 1) / scale_inv.size(1);
  at::Tensor scale = scale_inv.to(at::kFloat)
                         .repeat_interleave(block_rows, 0)
                         .narrow(0, 0, rows)
                         .repeat_interleave(block_cols, 1)
                         .narrow(1, 0, cols);
  return w8.to(at::kFloat) * scale;
}

}  // namespace

void LoadParams(const CheckpointReader& reader, const ModelConfig& config, TensorMap& params) {
  const std::string& prefix = config.weight_prefix;
  std::unordered_set<std::string> consumed;
  std::vector<std::string> missing, mismatched, unexpected;
  at::NoGradGuard no_grad;

  // One source tensor for `name` (without prefix), or undefined.
  auto source = [&](const std::string& name) -> at::Tensor {
    const std::string full = prefix + name;
    if (reader.Find(full) == nullptr) return at::Tensor();
    consumed.insert(full);
    at::Tensor t = reader.Get(full);
    const bool fp8 = t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kFloat8_e5m2;
    const std::string scale_name = full + "_scale_inv";
    if (fp8 && reader.Find(scale_name) != nullptr) {
      consumed.insert(scale_name);
      t = DequantizeFp8(t, reader.Get(scale_name));
    }
    return t;
  };

  // A stacked expert parameter stored whole (transformers v5 names) is copied at once; any other
  // parameter tensor by tensor of its HfLayout.
  std::vector<ParamSpec> specs;
  for (const ParamSpec& s : ListParams(config)) {
    if (params.count(s.name)) specs.push_back(s);
  }
  std::unordered_set<std::string> whole;
  for (const ParamSpec& s : specs) {
    if (s.role != ParamRole::kRoutedExpert) continue;
    // Every expert of the layer; this shard's rows of it (Note [Expert shard]).
    std::vector<int64_t> all_experts = s.shape;
    all_experts[0] = config.n_routed_experts;
    for (const std::string& stored : {prefix + s.name, prefix + s.name + ".weight"}) {
      const TensorInfo* info = reader.Find(stored);
      if (info != nullptr && info->shape == all_experts) {
        consumed.insert(stored);
        params.at(s.name).copy_(
            reader.Get(stored).narrow(0, config.first_local_expert(), config.local_experts()));
        whole.insert(s.name);
        break;
      }
    }
  }
  std::unordered_map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& s : specs) by_name.emplace(s.name, &s);
  std::vector<HfSlice> slices = HfLayout(specs, config.first_local_expert());
  std::sort(slices.begin(), slices.end(),
            [](const HfSlice& a, const HfSlice& b) { return a.hf_name < b.hf_name; });
  for (const HfSlice& slice : slices) {
    if (whole.count(slice.param)) continue;
    at::Tensor dst = SliceOf(slice, params.at(slice.param));
    at::Tensor src = source(slice.hf_name);
    if (!src.defined()) {
      missing.push_back(prefix + slice.hf_name);
      continue;
    }
    // Note [Tensor shard]: this rank's slice of the whole tensor (one of another size is
    // reported with its shape below).
    const ParamSpec& spec = *by_name.at(slice.param);
    if (spec.tp_dim >= 0 && src.dim() == dst.dim() && src.size(spec.tp_dim) == spec.tp_extent) {
      src = src.narrow(spec.tp_dim, spec.tp_start, dst.size(spec.tp_dim));
    }
    if (src.sizes() != dst.sizes()) {
      mismatched.push_back(fmt::format("{} (checkpoint shape {}, model expects {})",
                                       prefix + slice.hf_name, ShapeString(src.sizes()),
                                       ShapeString(dst.sizes())));
      continue;
    }
    dst.copy_(src);
  }
  if (specs.size() != params.size()) {
    std::unordered_set<std::string> known;
    for (const ParamSpec& s : specs) known.insert(s.name);
    for (const auto& [name, t] : params) {
      if (!known.count(name)) missing.push_back(prefix + name);  // not of this architecture
    }
  }
  for (const std::string& name : reader.names()) {
    if (!consumed.count(name) && !IsIgnoredCheckpointTensor(name, config)) {
      unexpected.push_back(name);
    }
  }
  if (missing.empty() && mismatched.empty() && unexpected.empty()) return;
  std::string msg =
      fmt::format("{}: checkpoint does not match the {} architecture of {}:", reader.dir(),
                  ModelTypeName(config.model_type), config.source_name);
  if (!missing.empty()) msg += fmt::format(" missing {}: {};", missing.size(), NameList(missing));
  if (!unexpected.empty()) {
    msg += fmt::format(" unexpected {}: {};", unexpected.size(), NameList(unexpected));
  }
  if (!mismatched.empty()) {
    msg += fmt::format(" wrong shape {}: {};", mismatched.size(), NameList(mismatched));
  }
  throw CheckpointError(msg);
}

namespace {

// config.json of the whole model beside its weights of `dtype`.
void WriteHfConfig(const std::string& dir, const ModelConfig& config, at::ScalarType dtype) {
  json::Value hf = ToHfConfigJson(config);
  const char* dtype_name = dtype == at::kBFloat16 ? "bfloat16"
                           : dtype == at::kHalf   ? "float16"
                           : dtype == at::kDouble ? "float64"
                                                  : "float32";
  if (config.weight_prefix.empty()) {
    hf.Set(hf.Find("torch_dtype") != nullptr ? "torch_dtype" : "dtype",
           json::Value::String(dtype_name));
  }
  WriteFileAtomically(dir + "/config.json", json::Dump(hf, 2) + "\n");
}

// Note [Expert-parallel saves]: one file of the checkpoint, the slices it holds and who writes it.
struct PlannedFile {
  std::string name;
  int64_t ep_rank = -1;  // -1: the dense tensors
  std::vector<HfSlice> slices;
};

// Every file of the checkpoint the EP ranks write together, alike on every rank: the dense
// tensors, then each EP rank's experts, each group split greedily into files of at most
// `max_shard_bytes` of data, numbered in that order.
std::vector<PlannedFile> PlanHfFiles(const ModelConfig& config, const TensorMap& params,
                                     int64_t max_shard_bytes) {
  const std::vector<ParamSpec> specs = ListParams(config);
  std::vector<PlannedFile> files;
  const auto add_group = [&](int64_t ep_rank, const std::vector<HfSlice>& slices) {
    int64_t bytes = 0;
    bool open = false;
    for (const HfSlice& slice : slices) {
      const at::Tensor t = SliceOf(slice, params.at(slice.param));
      const int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
      if (!open || (!files.back().slices.empty() && bytes + size > max_shard_bytes)) {
        files.push_back({"", ep_rank, {}});
        bytes = 0;
        open = true;
      }
      files.back().slices.push_back(slice);
      bytes += size;
    }
  };
  std::vector<HfSlice> dense;
  for (const HfSlice& slice : HfLayout(specs)) {
    if (slice.expert < 0) dense.push_back(slice);
  }
  add_group(-1, dense);
  for (int64_t rank = 0; rank < config.expert_shard.size; ++rank) {
    std::vector<HfSlice> experts;
    for (const HfSlice& slice : HfLayout(specs, rank * config.local_experts())) {
      if (slice.expert >= 0) experts.push_back(slice);
    }
    add_group(rank, experts);
  }
  for (size_t i = 0; i < files.size(); ++i) {
    files[i].name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, files.size());
  }
  return files;
}

}  // namespace

void SaveHfCheckpoint(const std::string& dir, const ModelConfig& config, const TensorMap& params,
                      int64_t max_shard_bytes) {
  const std::vector<ParamSpec> specs = ListParams(config);
  CheckParams(specs, params);
  NamedTensors tensors;
  for (const HfSlice& slice : HfLayout(specs, config.first_local_expert())) {
    tensors.push_back(
        {config.weight_prefix + slice.hf_name, SliceOf(slice, params.at(slice.param)).detach()});
  }
  WriteCheckpointShards(dir, tensors, max_shard_bytes);
  WriteHfConfig(dir, config, params.at("model.embed_tokens.weight").scalar_type());
}

void SaveHfCheckpointPart(const std::string& dir, const ModelConfig& config,
                          const TensorMap& params, bool write_dense, bool write_experts,
                          int64_t max_shard_bytes) {
  CheckParams(ListParams(config), params);
  MakeDirectories(dir);
  for (const PlannedFile& file : PlanHfFiles(config, params, max_shard_bytes)) {
    const bool mine =
        file.ep_rank < 0 ? write_dense : write_experts && file.ep_rank == config.expert_shard.rank;
    if (!mine) continue;
    NamedTensors tensors;
    for (const HfSlice& slice : file.slices) {
      tensors.push_back(
          {config.weight_prefix + slice.hf_name, SliceOf(slice, params.at(slice.param)).detach()});
    }
    WriteSafetensors(JoinPath(dir, file.name), tensors, {{"format", "pt"}});
  }
}

void FinishHfCheckpointParts(const std::string& dir, const ModelConfig& config,
                             const TensorMap& params, int64_t max_shard_bytes) {
  std::vector<std::pair<std::string, std::string>> weight_map;
  int64_t total_bytes = 0;
  for (const PlannedFile& file : PlanHfFiles(config, params, max_shard_bytes)) {
    for (const HfSlice& slice : file.slices) {
      const at::Tensor t = SliceOf(slice, params.at(slice.param));
      total_bytes += t.numel() * static_cast<int64_t>(t.element_size());
      weight_map.emplace_back(config.weight_prefix + slice.hf_name, file.name);
    }
  }
  WriteShardIndex(dir, weight_map, total_bytes);
  ModelConfig whole = config;
  whole.expert_shard = {};
  WriteHfConfig(dir, whole, params.at("model.embed_tokens.weight").scalar_type());
}

}  // namespace rl::model
