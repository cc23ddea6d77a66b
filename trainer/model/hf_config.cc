#include "trainer/model/hf_config.h"

#include <fmt/format.h>

#include <utility>

#include "launch/check.h"

namespace rl::model {
namespace {

// The transformers class each model type is loaded as (config.json's "architectures").
struct TypeEntry {
  ModelType type;
  std::string_view architecture;
};

constexpr TypeEntry kTypes[] = {
    {ModelType::kQwen3, "Qwen3ForCausalLM"},
    {ModelType::kQwen3Moe, "Qwen3MoeForCausalLM"},
    {ModelType::kGlm4Moe, "Glm4MoeForCausalLM"},
    {ModelType::kGlm4MoeLite, "Glm4MoeLiteForCausalLM"},
    {ModelType::kDeepseekV3, "DeepseekV3ForCausalLM"},
    {ModelType::kGlmMoeDsa, "GlmMoeDsaForCausalLM"},
};

const TypeEntry& EntryFor(ModelType type) {
  for (const TypeEntry& e : kTypes) {
    if (e.type == type) return e;
  }
  throw Error("unknown ModelType");
}

// Typed access to one JSON object with error messages that name the file and the key.
class Fields {
 public:
  Fields(const json::Value& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json::Value* Find(std::string_view key) const {
    const json::Value* v = obj_.Find(key);
    return (v == nullptr || v->is_null()) ? nullptr : v;
  }
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  int64_t Int(std::string_view key) const { return AsInt(Require(key), key); }
  int64_t Int(std::string_view key, int64_t fallback) const {
    const json::Value* v = Find(key);
    return v ? AsInt(*v, key) : fallback;
  }
  std::optional<int64_t> OptInt(std::string_view key) const {
    const json::Value* v = Find(key);
    return v ? std::optional<int64_t>(AsInt(*v, key)) : std::nullopt;
  }
  double Double(std::string_view key) const { return AsDouble(Require(key), key); }
  double Double(std::string_view key, double fallback) const {
    const json::Value* v = Find(key);
    return v ? AsDouble(*v, key) : fallback;
  }
  std::optional<double> OptDouble(std::string_view key) const {
    const json::Value* v = Find(key);
    return v ? std::optional<double>(AsDouble(*v, key)) : std::nullopt;
  }
  bool Bool(std::string_view key, bool fallback) const {
    const json::Value* v = Find(key);
    if (!v) return fallback;
    RL_CHECK(v->is_bool(), CheckpointError, "{}: key \"{}{}\": expected true or false, found {}",
             source_, prefix_, key, json::KindName(v->kind()));
    return v->AsBool();
  }
  std::string String(std::string_view key) const {
    const json::Value& v = Require(key);
    RL_CHECK(v.is_string(), CheckpointError, "{}: key \"{}{}\": expected a string, found {}",
             source_, prefix_, key, json::KindName(v.kind()));
    return v.AsString();
  }
  std::vector<std::string> StringList(std::string_view key) const {
    std::vector<std::string> out;
    const json::Value* v = Find(key);
    if (!v) return out;
    RL_CHECK(v->is_array(), CheckpointError,
             "{}: key \"{}{}\": expected a list of strings, found {}", source_, prefix_, key,
             json::KindName(v->kind()));
    for (const json::Value& e : v->AsArray()) {
      RL_CHECK(e.is_string(), CheckpointError,
               "{}: key \"{}{}\": expected a list of strings, found an element of kind {}", source_,
               prefix_, key, json::KindName(e.kind()));
      out.push_back(e.AsString());
    }
    return out;
  }
  std::vector<int64_t> IntList(std::string_view key) const {
    std::vector<int64_t> out;
    const json::Value* v = Find(key);
    if (!v) return out;
    if (v->is_number()) return {AsInt(*v, key)};
    RL_CHECK(v->is_array(), CheckpointError,
             "{}: key \"{}{}\": expected a list of integers, found {}", source_, prefix_, key,
             json::KindName(v->kind()));
    for (const json::Value& e : v->AsArray()) out.push_back(AsInt(e, key));
    return out;
  }

  const std::string& source() const { return source_; }

 private:
  const json::Value& Require(std::string_view key) const {
    const json::Value* v = Find(key);
    RL_CHECK(v != nullptr, CheckpointError,
             "{}: required key \"{}{}\" is missing (or null); the checkpoint's config.json must "
             "define it",
             source_, prefix_, key);
    return *v;
  }
  int64_t AsInt(const json::Value& v, std::string_view key) const {
    RL_CHECK(v.is_number(), CheckpointError, "{}: key \"{}{}\": expected an integer, found {}",
             source_, prefix_, key, json::KindName(v.kind()));
    try {
      return v.AsInt64();
    } catch (const json::TypeError&) {
      throw CheckpointError(fmt::format("{}: key \"{}{}\": expected an integer, found {}", source_,
                                        prefix_, key, v.AsDouble()));
    }
  }
  double AsDouble(const json::Value& v, std::string_view key) const {
    RL_CHECK(v.is_number(), CheckpointError, "{}: key \"{}{}\": expected a number, found {}",
             source_, prefix_, key, json::KindName(v.kind()));
    return v.AsDouble();
  }

  const json::Value& obj_;
  std::string source_;
  std::string prefix_;
};

void ParseRope(const Fields& f, const json::Value& doc, ModelConfig& c) {
  // transformers 5: rope_parameters; real checkpoints: rope_theta + rope_scaling (null or dict).
  const json::Value* params = doc.Find("rope_parameters");
  std::string params_key = "rope_parameters";
  if (params == nullptr || params->is_null()) {
    params = doc.Find("rope_scaling");
    params_key = "rope_scaling";
  }
  static const json::Value kEmpty = json::Value::MakeObject({});
  if (params == nullptr || params->is_null()) params = &kEmpty;
  RL_CHECK(params->is_object(), CheckpointError, "{}: key \"{}\": expected an object, found {}",
           f.source(), params_key, json::KindName(params->kind()));
  Fields p(*params, f.source(), params_key + ".");

  if (p.Has("rope_theta")) {
    c.rope.theta = p.Double("rope_theta");
  } else {
    c.rope.theta = f.Double("rope_theta");
  }
  std::string type = "default";
  if (p.Has("rope_type")) {
    type = p.String("rope_type");
  } else if (p.Has("type")) {
    type = p.String("type");
  }
  const double default_partial = c.model_type == ModelType::kGlm4Moe ? 0.5 : 1.0;
  c.rope.partial_rotary_factor =
      p.Double("partial_rotary_factor", f.Double("partial_rotary_factor", default_partial));
  if (type == "default") {
    c.rope.type = RopeType::kDefault;
  } else if (type == "yarn") {
    c.rope.type = RopeType::kYarn;
    c.rope.original_max_position_embeddings =
        p.Int("original_max_position_embeddings",
              f.Int("original_max_position_embeddings", c.max_position_embeddings));
    c.rope.factor = p.Double("factor", static_cast<double>(c.max_position_embeddings) /
                                           c.rope.original_max_position_embeddings);
    // transformers: `beta_fast or 32`, `beta_slow or 1`.
    c.rope.beta_fast = p.Double("beta_fast", 32.0);
    if (c.rope.beta_fast == 0) c.rope.beta_fast = 32.0;
    c.rope.beta_slow = p.Double("beta_slow", 1.0);
    if (c.rope.beta_slow == 0) c.rope.beta_slow = 1.0;
    c.rope.mscale = p.OptDouble("mscale");
    c.rope.mscale_all_dim = p.OptDouble("mscale_all_dim");
    c.rope.attention_factor = p.OptDouble("attention_factor");
    c.rope.truncate = p.Bool("truncate", true);
  } else {
    throw CheckpointError(fmt::format(
        "{}: key \"{}.rope_type\": RoPE type \"{}\" is not supported (supported: default, yarn)",
        f.source(), params_key, type));
  }
}

std::vector<MlpType> MlpTypesFromFirstDense(int64_t first_k_dense, int64_t layers) {
  std::vector<MlpType> out;
  for (int64_t i = 0; i < layers; ++i) {
    out.push_back(i < first_k_dense ? MlpType::kDense : MlpType::kSparse);
  }
  return out;
}

void ParseMlpLayerTypes(const Fields& f, int64_t default_first_dense, ModelConfig& c) {
  std::vector<std::string> types = f.StringList("mlp_layer_types");
  if (types.empty()) {
    c.mlp_layer_types = MlpTypesFromFirstDense(f.Int("first_k_dense_replace", default_first_dense),
                                               c.num_hidden_layers);
    return;
  }
  for (const std::string& t : types) {
    RL_CHECK(t == "dense" || t == "sparse", CheckpointError,
             "{}: key \"mlp_layer_types\": unknown entry \"{}\" (expected \"dense\" or \"sparse\")",
             f.source(), t);
    c.mlp_layer_types.push_back(t == "dense" ? MlpType::kDense : MlpType::kSparse);
  }
}

void ParseSigmoidMoe(const Fields& f, ModelConfig& c) {
  c.router = RouterKind::kSigmoidNoauxTc;
  c.n_routed_experts = f.Int("n_routed_experts");
  c.num_experts_per_tok = f.Int("num_experts_per_tok");
  c.moe_intermediate_size = f.Int("moe_intermediate_size");
  c.n_shared_experts = f.Int("n_shared_experts", 1);
  c.routed_scaling_factor = f.Double("routed_scaling_factor");
  const bool deepseek = c.model_type == ModelType::kDeepseekV3;
  c.n_group = f.Int("n_group", deepseek ? 8 : 1);
  c.topk_group = f.Int("topk_group", deepseek ? 4 : 1);
  c.norm_topk_prob = f.Bool("norm_topk_prob", true);
  if (f.Has("scoring_func")) {
    const std::string s = f.String("scoring_func");
    RL_CHECK(s == "sigmoid", CheckpointError,
             "{}: key \"scoring_func\": \"{}\" is not supported for {} (expected \"sigmoid\")",
             f.source(), s, c.model_type_name);
  }
  if (f.Has("topk_method")) {
    const std::string s = f.String("topk_method");
    RL_CHECK(s == "noaux_tc", CheckpointError,
             "{}: key \"topk_method\": \"{}\" is not supported for {} (expected \"noaux_tc\")",
             f.source(), s, c.model_type_name);
  }
}

void ParseMla(const Fields& f, ModelConfig& c) {
  c.q_lora_rank = f.OptInt("q_lora_rank");
  c.kv_lora_rank = f.Int("kv_lora_rank");
  c.qk_nope_head_dim = f.Int("qk_nope_head_dim");
  c.qk_rope_head_dim = f.Int("qk_rope_head_dim");
  c.v_head_dim = f.Int("v_head_dim");
  c.head_dim = c.qk_rope_head_dim;  // as transformers' __post_init__
  c.num_key_value_heads = c.num_attention_heads;
}

void ParseIndexer(const Fields& f, ModelConfig& c) {
  c.index_n_heads = f.Int("index_n_heads", 32);
  c.index_head_dim = f.Int("index_head_dim", 128);
  c.index_topk = f.Int("index_topk", 2048);
  c.indexer_rope_interleave = true;  // GLM-5 (newest transformers semantics)
  std::vector<std::string> types = f.StringList("indexer_types");
  if (types.empty()) {
    const json::Value* pattern = f.Find("index_topk_pattern");
    if (pattern != nullptr && pattern->is_string()) {
      for (char ch : pattern->AsString()) {
        RL_CHECK(ch == 'F' || ch == 'S', CheckpointError,
                 "{}: key \"index_topk_pattern\": unknown letter '{}' (expected F or S)",
                 f.source(), ch);
        types.push_back(ch == 'F' ? "full" : "shared");
      }
    } else if (pattern != nullptr) {
      types = f.StringList("index_topk_pattern");
    } else {
      const int64_t freq = std::max<int64_t>(f.Int("index_topk_freq", 1), 1);
      const int64_t offset = f.Int("index_skip_topk_offset", 2);
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
      }
    }
  }
  for (const std::string& t : types) {
    RL_CHECK(t == "full" || t == "shared", CheckpointError,
             "{}: key \"indexer_types\": unknown entry \"{}\" (expected \"full\" or \"shared\")",
             f.source(), t);
    c.indexer_types.push_back(t == "full" ? IndexerType::kFull : IndexerType::kShared);
  }
}

void RequirePositive(const ModelConfig& c, int64_t v, std::string_view key) {
  RL_CHECK(v > 0, CheckpointError, "{}: key \"{}\" must be positive, found {}", c.source_name, key,
           v);
}

// The most layers a config.json may declare: every per-layer list is sized by it while parsing.
// The largest published models have fewer than 200.
constexpr int64_t kMaxLayers = int64_t{1} << 16;

// Note [Sizes checked before use]: the sizes every other value is derived from are checked as
// soon as they are read, before anything divides by them or sizes a list by them. Checked after
// the derivations (as they were), "num_attention_heads": 0 divided by zero in hidden_size /
// num_attention_heads (SIGFPE), "num_hidden_layers": -1 sized a vector by it (std::length_error)
// and 10^12 asked for terabytes (std::bad_alloc): a crash instead of a message naming the file and
// the key.
void CheckBaseSizes(const ModelConfig& c) {
  RequirePositive(c, c.vocab_size, "vocab_size");
  RequirePositive(c, c.hidden_size, "hidden_size");
  RequirePositive(c, c.num_hidden_layers, "num_hidden_layers");
  RL_CHECK(c.num_hidden_layers <= kMaxLayers, CheckpointError,
           "{}: key \"num_hidden_layers\" must be at most {}, found {}", c.source_name, kMaxLayers,
           c.num_hidden_layers);
  RequirePositive(c, c.num_attention_heads, "num_attention_heads");
  RequirePositive(c, c.num_key_value_heads, "num_key_value_heads");
}

// The rules between the values, once all are read. CheckBaseSizes has run.
void Validate(const ModelConfig& c) {
  const std::string& src = c.source_name;
  auto positive = [&](int64_t v, std::string_view key) { RequirePositive(c, v, key); };
  positive(c.head_dim, "head_dim");
  RL_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, CheckpointError,
           "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", src,
           c.num_attention_heads, c.num_key_value_heads);
  const int64_t rope = c.rope_dim();
  RL_CHECK(rope > 0 && rope % 2 == 0, CheckpointError,
           "{}: the rotary dimension ({}: head_dim {} x partial_rotary_factor {}) must be positive "
           "and even",
           src, rope, c.head_dim, c.rope.partial_rotary_factor);
  if (c.attention_kind() == AttentionKind::kMla) {
    positive(c.kv_lora_rank, "kv_lora_rank");
    positive(c.qk_nope_head_dim, "qk_nope_head_dim");
    positive(c.v_head_dim, "v_head_dim");
    if (c.q_lora_rank) positive(*c.q_lora_rank, "q_lora_rank");
  }
  RL_CHECK(static_cast<int64_t>(c.mlp_layer_types.size()) == c.num_hidden_layers, CheckpointError,
           "{}: key \"mlp_layer_types\" has {} entries for {} layers", src,
           c.mlp_layer_types.size(), c.num_hidden_layers);
  bool any_dense = false;
  bool any_sparse = false;
  for (MlpType t : c.mlp_layer_types) (t == MlpType::kDense ? any_dense : any_sparse) = true;
  if (any_dense) positive(c.intermediate_size, "intermediate_size");
  if (any_sparse) {
    RL_CHECK(c.is_moe(), CheckpointError, "{}: a sparse layer in a dense model", src);
    positive(c.n_routed_experts, "n_routed_experts");
    positive(c.moe_intermediate_size, "moe_intermediate_size");
    RL_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts,
             CheckpointError, "{}: num_experts_per_tok ({}) must be in [1, {}]", src,
             c.num_experts_per_tok, c.n_routed_experts);
    RL_CHECK(c.n_group > 0 && c.n_routed_experts % c.n_group == 0, CheckpointError,
             "{}: n_routed_experts ({}) must be a multiple of n_group ({})", src,
             c.n_routed_experts, c.n_group);
    RL_CHECK(c.topk_group > 0 && c.topk_group <= c.n_group, CheckpointError,
             "{}: topk_group ({}) must be in [1, n_group = {}]", src, c.topk_group, c.n_group);
    RL_CHECK(c.n_group == 1 || c.n_routed_experts / c.n_group >= 2, CheckpointError,
             "{}: group-limited routing needs at least 2 experts per group", src);
  }
  if (c.has_indexer()) {
    RL_CHECK(static_cast<int64_t>(c.indexer_types.size()) == c.num_hidden_layers, CheckpointError,
             "{}: key \"indexer_types\" has {} entries for {} layers", src, c.indexer_types.size(),
             c.num_hidden_layers);
    RL_CHECK(c.indexer_types[0] == IndexerType::kFull, CheckpointError,
             "{}: key \"indexer_types\": layer 0 must be \"full\" (a shared layer reuses the "
             "previous full layer's top-k)",
             src);
    RL_CHECK(c.q_lora_rank.has_value(), CheckpointError,
             "{}: the DSA indexer needs q_lora_rank (it reads the q latent)", src);
    positive(c.index_n_heads, "index_n_heads");
    positive(c.index_topk, "index_topk");
    RL_CHECK(c.index_head_dim >= c.qk_rope_head_dim, CheckpointError,
             "{}: index_head_dim ({}) must be at least qk_rope_head_dim ({})", src,
             c.index_head_dim, c.qk_rope_head_dim);
  }
}

json::Value OptIntJson(const std::optional<int64_t>& v) {
  return v ? json::Value::Int(*v) : json::Value();
}

json::Value RopeParametersJson(const RopeConfig& r, bool with_theta) {
  json::Value p = json::Value::MakeObject({});
  if (with_theta) p.Set("rope_theta", json::Value::Double(r.theta));
  p.Set("rope_type", json::Value::String(r.type == RopeType::kYarn ? "yarn" : "default"));
  if (r.partial_rotary_factor != 1.0) {
    p.Set("partial_rotary_factor", json::Value::Double(r.partial_rotary_factor));
  }
  if (r.type == RopeType::kYarn) {
    p.Set("factor", json::Value::Double(r.factor));
    p.Set("original_max_position_embeddings", json::Value::Int(r.original_max_position_embeddings));
    p.Set("beta_fast", json::Value::Double(r.beta_fast));
    p.Set("beta_slow", json::Value::Double(r.beta_slow));
    if (r.mscale) p.Set("mscale", json::Value::Double(*r.mscale));
    if (r.mscale_all_dim) p.Set("mscale_all_dim", json::Value::Double(*r.mscale_all_dim));
    if (r.attention_factor) p.Set("attention_factor", json::Value::Double(*r.attention_factor));
    if (!r.truncate) p.Set("truncate", json::Value::Bool(false));
  }
  return p;
}

}  // namespace

ModelConfig ParseModelConfig(const json::Value& root, std::string_view source_name) {
  const std::string source(source_name);
  RL_CHECK(root.is_object(), CheckpointError,
           "{}: expected a JSON object at the top level, found {}", source,
           json::KindName(root.kind()));
  ModelConfig c;
  c.source_name = source;
  c.hf_config = root;

  const json::Value* doc = &root;
  std::string type_name = Fields(root, source).String("model_type");
  c.model_type_name = type_name;
  if (type_name == "kimi_k25") {
    // Kimi-K2.5 nests the DeepSeek-V3 text model under text_config; its weights carry
    // "language_model.".
    const json::Value* text = root.Find("text_config");
    RL_CHECK(text != nullptr && text->is_object(), CheckpointError,
             "{}: required key \"text_config\" (the language model of kimi_k25) is missing",
             source);
    doc = text;
    c.weight_prefix = "language_model.";
    type_name = "deepseek_v3";
  } else if (type_name == "kimi_k2") {
    type_name = "deepseek_v3";
  }
  bool known = false;
  for (const TypeEntry& e : kTypes) {
    if (ModelTypeName(e.type) == type_name) {
      c.model_type = e.type;
      known = true;
    }
  }
  RL_CHECK(
      known, CheckpointError,
      "{}: key \"model_type\": \"{}\" is not supported (supported: qwen3, qwen3_moe, glm4_moe, "
      "glm4_moe_lite, deepseek_v3, kimi_k2, kimi_k25, glm_moe_dsa)",
      source, c.model_type_name);

  const Fields f(*doc, source);
  c.vocab_size = f.Int("vocab_size");
  c.hidden_size = f.Int("hidden_size");
  c.num_hidden_layers = f.Int("num_hidden_layers");
  c.num_attention_heads = f.Int("num_attention_heads");
  c.num_key_value_heads = f.Int("num_key_value_heads", c.num_attention_heads);
  c.rms_norm_eps = f.Double("rms_norm_eps");
  c.max_position_embeddings = f.Int("max_position_embeddings", 0);
  c.tie_word_embeddings = f.Bool("tie_word_embeddings", false);
  c.attention_bias = f.Bool("attention_bias", false);
  c.pad_token_id = f.OptInt("pad_token_id");
  c.bos_token_id = f.OptInt("bos_token_id");
  c.eos_token_ids = f.IntList("eos_token_id");
  CheckBaseSizes(c);  // Note [Sizes checked before use]
  const int64_t layers = c.num_hidden_layers;

  switch (c.model_type) {
    case ModelType::kQwen3:
      c.intermediate_size = f.Int("intermediate_size");
      c.head_dim = f.Int("head_dim", c.hidden_size / c.num_attention_heads);
      c.use_qk_norm = true;
      c.mlp_layer_types.assign(layers, MlpType::kDense);
      break;
    case ModelType::kQwen3Moe: {
      c.head_dim = f.Int("head_dim", c.hidden_size / c.num_attention_heads);
      c.use_qk_norm = true;
      c.router = RouterKind::kSoftmax;
      // Real configs say num_experts; transformers 5 writes num_local_experts.
      c.n_routed_experts = f.Has("num_experts") ? f.Int("num_experts") : f.Int("num_local_experts");
      c.num_experts_per_tok = f.Int("num_experts_per_tok");
      c.moe_intermediate_size = f.Int("moe_intermediate_size");
      c.norm_topk_prob = f.Bool("norm_topk_prob", false);
      const int64_t step = f.Int("decoder_sparse_step", 1);
      const std::vector<int64_t> only_mlp = f.IntList("mlp_only_layers");
      for (int64_t i = 0; i < layers; ++i) {
        bool sparse = step > 0 && (i + 1) % step == 0;
        for (int64_t j : only_mlp) sparse = sparse && j != i;
        c.mlp_layer_types.push_back(sparse ? MlpType::kSparse : MlpType::kDense);
      }
      c.intermediate_size = f.Int("intermediate_size", 0);
      break;
    }
    case ModelType::kGlm4Moe:
      c.intermediate_size = f.Int("intermediate_size");
      c.head_dim = f.Int("head_dim", c.hidden_size / c.num_attention_heads);
      c.use_qk_norm = f.Bool("use_qk_norm", false);
      ParseSigmoidMoe(f, c);
      ParseMlpLayerTypes(f, 1, c);
      break;
    case ModelType::kGlm4MoeLite:
      c.intermediate_size = f.Int("intermediate_size");
      ParseMla(f, c);
      c.rope_interleave = f.Bool("rope_interleave", true);
      ParseSigmoidMoe(f, c);
      // transformers' Glm4MoeLiteConfig defaults to [dense] + [sparse] * (L - 1) whatever
      // first_k_dense_replace says (real GLM-4.7-Flash: first_k_dense_replace = 1, the same).
      if (f.Has("mlp_layer_types")) {
        ParseMlpLayerTypes(f, 1, c);
      } else {
        c.mlp_layer_types = MlpTypesFromFirstDense(1, layers);
      }
      break;
    case ModelType::kDeepseekV3:
      c.intermediate_size = f.Int("intermediate_size");
      ParseMla(f, c);
      c.rope_interleave = f.Bool("rope_interleave", true);
      ParseSigmoidMoe(f, c);
      c.mlp_layer_types = MlpTypesFromFirstDense(f.Int("first_k_dense_replace", 3), layers);
      break;
    case ModelType::kGlmMoeDsa:
      c.intermediate_size = f.Int("intermediate_size");
      ParseMla(f, c);
      c.rope_interleave = true;  // always interleaved in the main MLA
      ParseSigmoidMoe(f, c);
      ParseMlpLayerTypes(f, 3, c);
      ParseIndexer(f, c);
      break;
  }
  ParseRope(f, *doc, c);
  Validate(c);
  return c;
}

ModelConfig LoadModelConfig(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/config.json";
  return ParseModelConfig(json::ParseFile(path), path);
}

json::Value ToHfConfigJson(const ModelConfig& c) {
  if (!c.weight_prefix.empty()) return c.hf_config;  // nested (kimi_k25): written back verbatim
  json::Value out = c.hf_config.is_object() ? c.hf_config : json::Value::MakeObject({});
  using V = json::Value;
  const TypeEntry& entry = EntryFor(c.model_type);
  const bool keep_name = !c.model_type_name.empty();
  out.Set("model_type",
          V::String(keep_name ? c.model_type_name : std::string(ModelTypeName(c.model_type))));
  if (out.Find("architectures") == nullptr) {
    out.Set("architectures", V::MakeArray({V::String(std::string(entry.architecture))}));
  }
  out.Set("vocab_size", V::Int(c.vocab_size));
  out.Set("hidden_size", V::Int(c.hidden_size));
  if (c.intermediate_size > 0) out.Set("intermediate_size", V::Int(c.intermediate_size));
  out.Set("num_hidden_layers", V::Int(c.num_hidden_layers));
  out.Set("num_attention_heads", V::Int(c.num_attention_heads));
  out.Set("num_key_value_heads", V::Int(c.num_key_value_heads));
  out.Set("rms_norm_eps", V::Double(c.rms_norm_eps));
  if (c.max_position_embeddings > 0) {
    out.Set("max_position_embeddings", V::Int(c.max_position_embeddings));
  }
  out.Set("tie_word_embeddings", V::Bool(c.tie_word_embeddings));
  out.Set("attention_bias", V::Bool(c.attention_bias));
  out.Set("hidden_act", V::String("silu"));
  if (c.pad_token_id) out.Set("pad_token_id", V::Int(*c.pad_token_id));
  if (c.bos_token_id) out.Set("bos_token_id", V::Int(*c.bos_token_id));
  if (c.eos_token_ids.size() == 1) {
    out.Set("eos_token_id", V::Int(c.eos_token_ids[0]));
  } else if (!c.eos_token_ids.empty()) {
    V::Array ids;
    for (int64_t id : c.eos_token_ids) ids.push_back(V::Int(id));
    out.Set("eos_token_id", V::MakeArray(std::move(ids)));
  }

  // RoPE, in the dialect of the stored document (transformers 5 when synthesised).
  if (c.hf_config.Find("rope_parameters") != nullptr || !c.hf_config.is_object()) {
    out.Set("rope_parameters", RopeParametersJson(c.rope, /*with_theta=*/true));
  } else {
    out.Set("rope_theta", V::Double(c.rope.theta));
    if (c.rope.type == RopeType::kYarn) {
      V scaling = RopeParametersJson(c.rope, /*with_theta=*/false);
      scaling.Set("type", V::String("yarn"));
      out.Set("rope_scaling", std::move(scaling));
    } else {
      out.Set("rope_scaling", V());
    }
    if (c.rope.partial_rotary_factor != 1.0 || c.hf_config.Find("partial_rotary_factor")) {
      out.Set("partial_rotary_factor", V::Double(c.rope.partial_rotary_factor));
    }
  }

  if (c.attention_kind() == AttentionKind::kGqa) {
    out.Set("head_dim", V::Int(c.head_dim));
    if (c.model_type == ModelType::kGlm4Moe) out.Set("use_qk_norm", V::Bool(c.use_qk_norm));
  } else {
    out.Set("q_lora_rank", OptIntJson(c.q_lora_rank));
    out.Set("kv_lora_rank", V::Int(c.kv_lora_rank));
    out.Set("qk_nope_head_dim", V::Int(c.qk_nope_head_dim));
    out.Set("qk_rope_head_dim", V::Int(c.qk_rope_head_dim));
    out.Set("v_head_dim", V::Int(c.v_head_dim));
    if (c.model_type != ModelType::kGlmMoeDsa)
      out.Set("rope_interleave", V::Bool(c.rope_interleave));
  }

  if (c.router == RouterKind::kSoftmax) {
    out.Set("num_experts", V::Int(c.n_routed_experts));
    out.Set("num_experts_per_tok", V::Int(c.num_experts_per_tok));
    out.Set("moe_intermediate_size", V::Int(c.moe_intermediate_size));
    out.Set("norm_topk_prob", V::Bool(c.norm_topk_prob));
    out.Set("decoder_sparse_step", V::Int(1));
    V::Array only;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (c.mlp_layer_types[i] == MlpType::kDense) only.push_back(V::Int(i));
    }
    out.Set("mlp_only_layers", V::MakeArray(std::move(only)));
  } else if (c.router == RouterKind::kSigmoidNoauxTc) {
    out.Set("n_routed_experts", V::Int(c.n_routed_experts));
    out.Set("num_experts_per_tok", V::Int(c.num_experts_per_tok));
    out.Set("moe_intermediate_size", V::Int(c.moe_intermediate_size));
    out.Set("n_shared_experts", V::Int(c.n_shared_experts));
    out.Set("n_group", V::Int(c.n_group));
    out.Set("topk_group", V::Int(c.topk_group));
    out.Set("routed_scaling_factor", V::Double(c.routed_scaling_factor));
    out.Set("norm_topk_prob", V::Bool(c.norm_topk_prob));
    int64_t first_dense = 0;
    while (first_dense < c.num_hidden_layers && c.mlp_layer_types[first_dense] == MlpType::kDense) {
      ++first_dense;
    }
    out.Set("first_k_dense_replace", V::Int(first_dense));
    if (c.model_type == ModelType::kGlm4MoeLite || c.model_type == ModelType::kGlmMoeDsa) {
      V::Array types;
      for (MlpType t : c.mlp_layer_types) {
        types.push_back(V::String(t == MlpType::kDense ? "dense" : "sparse"));
      }
      out.Set("mlp_layer_types", V::MakeArray(std::move(types)));
    }
  }
  if (c.has_indexer()) {
    out.Set("index_n_heads", V::Int(c.index_n_heads));
    out.Set("index_head_dim", V::Int(c.index_head_dim));
    out.Set("index_topk", V::Int(c.index_topk));
    V::Array types;
    for (IndexerType t : c.indexer_types) {
      types.push_back(V::String(t == IndexerType::kFull ? "full" : "shared"));
    }
    out.Set("indexer_types", V::MakeArray(std::move(types)));
  }
  return out;
}

}  // namespace rl::model
