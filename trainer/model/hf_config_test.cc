// config.json parsing: both dialects, the real full-scale values of the published configs,
// defaults, errors, and the config.json written back.
#include "trainer/model/hf_config.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "launch/check.h"
#include "launch/json.h"

namespace rl::model {
namespace {

ModelConfig Parse(const std::string& text) {
  return ParseModelConfig(json::Parse(text), "ckpt/config.json");
}

void Erase(json::Value& doc, const std::string& key) {
  json::Value::Object& members = doc.MutableObject();
  members.erase(std::remove_if(members.begin(), members.end(),
                               [&](const auto& kv) { return kv.first == key; }),
                members.end());
}

// deepseek-ai/DeepSeek-V3 config.json, real-checkpoint dialect.
const char* kDeepseekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
  "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
  "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
  "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
  "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
  "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
  "rms_norm_eps": 1e-06, "tie_word_embeddings": false, "rope_theta": 10000,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "attention_bias": false, "bos_token_id": 0, "eos_token_id": 1, "num_nextn_predict_layers": 1
})";

// GLM-5 (zai-org/GLM-5 config.json), transformers-5 dialect.
const char* kGlm5 = R"({
  "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
  "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048,
  "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 64,
  "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
  "v_head_dim": 256, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
  "scoring_func": "sigmoid", "topk_method": "noaux_tc", "first_k_dense_replace": 3,
  "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
  "rope_interleave": true, "indexer_rope_interleave": true, "index_n_heads": 32,
  "index_head_dim": 128, "index_topk": 2048, "max_position_embeddings": 202752,
  "tie_word_embeddings": false, "attention_bias": false, "pad_token_id": 154820,
  "eos_token_id": [154820, 154827, 154829]
})";

// GLM-4.5 (zai-org/GLM-4.5 config.json), real-checkpoint dialect.
const char* kGlm45 = R"({
  "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": 151552,
  "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
  "num_hidden_layers": 92, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
  "partial_rotary_factor": 0.5, "attention_bias": true, "use_qk_norm": true,
  "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1,
  "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true, "first_k_dense_replace": 3,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000, "rope_scaling": null,
  "max_position_embeddings": 131072, "tie_word_embeddings": false
})";

TEST_CASE("DeepSeek-V3's real config: YaRN, group routing, MLA") {
  const ModelConfig c = Parse(kDeepseekV3);
  CHECK(c.model_type == ModelType::kDeepseekV3);
  CHECK(c.attention_kind() == AttentionKind::kMla);
  CHECK(c.rope.type == RopeType::kYarn);
  CHECK(c.rope.factor == 40);
  CHECK(c.rope.original_max_position_embeddings == 4096);
  CHECK(c.rope_interleave);
  CHECK(c.rope_dim() == 64);
  CHECK(c.attention_scale() == Approx(0.1352338).epsilon(1e-6));  // qk_head_dim^-0.5 * mscale^2
  CHECK(c.rope_attention_factor() == 1.0);
  CHECK(c.n_group == 8);
  CHECK(c.topk_group == 4);
  CHECK(c.router == RouterKind::kSigmoidNoauxTc);
  CHECK(c.mlp_layer_types[2] == MlpType::kDense);
  CHECK(c.mlp_layer_types[3] == MlpType::kSparse);
  CHECK(c.q_lora_rank == 1536);
  CHECK(c.eos_token_ids == std::vector<int64_t>{1});
  CHECK_FALSE(c.has_indexer());
}

TEST_CASE("GLM-5's config: DSA indexer on every layer; GLM-5.2's IndexShare pattern") {
  ModelConfig c = Parse(kGlm5);
  CHECK(c.model_type == ModelType::kGlmMoeDsa);
  CHECK(c.attention_scale() == Approx(0.0625));
  CHECK(c.rope.theta == 1e6);
  CHECK(c.indexer_types.size() == 78);
  for (IndexerType t : c.indexer_types) CHECK(t == IndexerType::kFull);
  CHECK(c.eos_token_ids == std::vector<int64_t>{154820, 154827, 154829});

  json::Value doc = json::Parse(kGlm5);
  doc.Set("index_topk_freq", json::Value::Int(4));
  doc.Set("index_skip_topk_offset", json::Value::Int(3));
  c = ParseModelConfig(doc, "glm5.2/config.json");
  // Computing layers 0, 1, 2, 6, 10, ..., 74.
  std::vector<int64_t> full;
  for (int64_t i = 0; i < 78; ++i) {
    if (c.indexer_types[i] == IndexerType::kFull) full.push_back(i);
  }
  CHECK(full.front() == 0);
  CHECK(full[1] == 1);
  CHECK(full[2] == 2);
  CHECK(full[3] == 6);
  CHECK(full.back() == 74);
  CHECK(full.size() == 21);
}

TEST_CASE("GLM-4.5's real config: partial rotary, qkv bias, qk norm") {
  const ModelConfig c = Parse(kGlm45);
  CHECK(c.attention_kind() == AttentionKind::kGqa);
  CHECK(c.rope_dim() == 64);
  CHECK(c.attention_bias);
  CHECK(c.use_qk_norm);
  CHECK_FALSE(c.rope_interleave);
  CHECK(c.attention_scale() == Approx(std::pow(128.0, -0.5)));
}

TEST_CASE("Both RoPE dialects give the same config") {
  json::Value v5 = json::Parse(kDeepseekV3);
  Erase(v5, "rope_theta");
  Erase(v5, "rope_scaling");
  v5.Set("rope_parameters", json::Parse(R"({"rope_theta": 10000.0, "rope_type": "yarn",
      "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
      "mscale": 1.0, "mscale_all_dim": 1.0})"));
  const ModelConfig a = Parse(kDeepseekV3);
  const ModelConfig b = ParseModelConfig(v5, "v5/config.json");
  CHECK(b.rope.type == RopeType::kYarn);
  CHECK(b.rope.theta == a.rope.theta);
  CHECK(b.rope.factor == a.rope.factor);
  CHECK(b.rope.original_max_position_embeddings == a.rope.original_max_position_embeddings);
  CHECK(b.attention_scale() == a.attention_scale());
}

TEST_CASE("Kimi-K2.5 reads its text_config as DeepSeek-V3 with a language_model. prefix") {
  json::Value root = json::Value::MakeObject({});
  root.Set("model_type", json::Value::String("kimi_k25"));
  json::Value text = json::Parse(kDeepseekV3);
  text.Set("model_type", json::Value::String("kimi_k2"));
  root.Set("text_config", text);
  const ModelConfig c = ParseModelConfig(root, "kimi/config.json");
  CHECK(c.model_type == ModelType::kDeepseekV3);
  CHECK(c.weight_prefix == "language_model.");
  CHECK(ToHfConfigJson(c) == root);
}

TEST_CASE("Qwen3-MoE: num_experts or num_local_experts, mlp_only_layers") {
  const char* text = R"({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "moe_intermediate_size": 768, "norm_topk_prob": true, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "rope_scaling": null, "mlp_only_layers": [], "decoder_sparse_step": 1})";
  ModelConfig c = Parse(text);
  CHECK(c.router == RouterKind::kSoftmax);
  CHECK(c.n_routed_experts == 128);
  for (MlpType t : c.mlp_layer_types) CHECK(t == MlpType::kSparse);
  CHECK(c.use_qk_norm);
  json::Value doc = json::Parse(text);
  Erase(doc, "num_experts");
  doc.Set("num_local_experts", json::Value::Int(64));
  doc.Set("mlp_only_layers", json::Parse("[0, 5]"));
  c = ParseModelConfig(doc, "x");
  CHECK(c.n_routed_experts == 64);
  CHECK(c.mlp_layer_types[0] == MlpType::kDense);
  CHECK(c.mlp_layer_types[5] == MlpType::kDense);
  CHECK(c.mlp_layer_types[1] == MlpType::kSparse);
}

TEST_CASE("A missing or mistyped key names the file and the key") {
  json::Value doc = json::Parse(kGlm45);
  Erase(doc, "hidden_size");
  CHECK_THROWS_MATCHES(ParseModelConfig(doc, "ckpt/config.json"), CheckpointError,
                       Catch::Message(
                           "ckpt/config.json: required key \"hidden_size\" is missing (or null); "
                           "the checkpoint's config.json must define it"));
  doc = json::Parse(kGlm45);
  doc.Set("num_attention_heads", json::Value::String("96"));
  CHECK_THROWS_WITH(ParseModelConfig(doc, "ckpt/config.json"),
                    Catch::Contains("ckpt/config.json: key \"num_attention_heads\": expected an "
                                    "integer, found string"));
  doc = json::Parse(kDeepseekV3);
  doc.Set("rope_scaling", json::Parse(R"({"type": "dynamic", "factor": 2.0})"));
  CHECK_THROWS_WITH(ParseModelConfig(doc, "ckpt/config.json"),
                    Catch::Contains("rope_scaling.rope_type\": RoPE type \"dynamic\" is not supported"));
  doc = json::Parse(kGlm45);
  doc.Set("model_type", json::Value::String("llama"));
  CHECK_THROWS_WITH(ParseModelConfig(doc, "ckpt/config.json"),
                    Catch::Contains("\"model_type\": \"llama\" is not supported"));
  doc = json::Parse(kGlm5);
  doc.Set("indexer_types", json::Parse(R"(["shared"])"));
  CHECK_THROWS_AS(ParseModelConfig(doc, "ckpt/config.json"), CheckpointError);
  CHECK_THROWS_WITH(LoadModelConfig("/nonexistent/dir"), Catch::Contains("/nonexistent/dir/config.json"));
}

// Note [Sizes checked before use]: each was a crash (SIGFPE, std::length_error,
// std::bad_alloc), in every model type, before it was a message naming the file and the key.
TEST_CASE("Sizes that others are derived from are checked before they are used") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"num_attention_heads",
       "ckpt/config.json: key \"num_attention_heads\" must be positive, "
       "found 0"},
      {"num_hidden_layers",
       "ckpt/config.json: key \"num_hidden_layers\" must be positive, "
       "found -1"},
      {"num_hidden_layers",
       "ckpt/config.json: key \"num_hidden_layers\" must be at most 65536, "
       "found 1000000000000"},
      {"num_key_value_heads",
       "ckpt/config.json: key \"num_key_value_heads\" must be positive, "
       "found 0"},
      {"hidden_size", "ckpt/config.json: key \"hidden_size\" must be positive, found -8"},
  };
  const std::vector<int64_t> values = {0, -1, 1'000'000'000'000, 0, -8};
  const char* qwen3 = R"({"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 10000})";
  for (const char* text : {qwen3, kDeepseekV3, kGlm5, kGlm45}) {
    for (size_t i = 0; i < cases.size(); ++i) {
      json::Value doc = json::Parse(text);
      doc.Set(cases[i].first, json::Value::Int(values[i]));
      INFO(text);
      CHECK_THROWS_MATCHES(ParseModelConfig(doc, "ckpt/config.json"), CheckpointError,
                           Catch::Message(cases[i].second));
    }
  }
}

TEST_CASE("ToHfConfigJson round-trips configs parsed from and built without a document") {
  for (const char* text : {kDeepseekV3, kGlm5, kGlm45}) {
    const ModelConfig a = Parse(text);
    const json::Value written = ToHfConfigJson(a);
    const ModelConfig b = ParseModelConfig(json::Parse(json::Dump(written, 2)), "written");
    CHECK(json::Dump(ToHfConfigJson(b)) == json::Dump(written));
    // Built in code (no stored document): synthesised in the transformers-5 dialect.
    ModelConfig bare = a;
    bare.hf_config = json::Value();
    const ModelConfig c = ParseModelConfig(ToHfConfigJson(bare), "synth");
    CHECK(c.model_type == a.model_type);
    CHECK(c.attention_scale() == a.attention_scale());
    CHECK(c.rope_dim() == a.rope_dim());
    CHECK(c.mlp_layer_types == a.mlp_layer_types);
    CHECK(c.indexer_types == a.indexer_types);
    CHECK(c.n_group == a.n_group);
    CHECK(c.attention_bias == a.attention_bias);
    CHECK(c.q_lora_rank == a.q_lora_rank);
  }
}

}  // namespace
}  // namespace rl::model
