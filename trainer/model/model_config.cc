#include "trainer/model/model_config.h"

#include <cmath>

#include "launch/check.h"

namespace rl::model {
namespace {

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

std::string_view ModelTypeName(ModelType type) {
  switch (type) {
    case ModelType::kQwen3:
      return "qwen3";
    case ModelType::kQwen3Moe:
      return "qwen3_moe";
    case ModelType::kGlm4Moe:
      return "glm4_moe";
    case ModelType::kGlm4MoeLite:
      return "glm4_moe_lite";
    case ModelType::kDeepseekV3:
      return "deepseek_v3";
    case ModelType::kGlmMoeDsa:
      return "glm_moe_dsa";
  }
  throw Error("unknown ModelType");
}

AttentionKind ModelConfig::attention_kind() const {
  switch (model_type) {
    case ModelType::kGlm4MoeLite:
    case ModelType::kDeepseekV3:
    case ModelType::kGlmMoeDsa:
      return AttentionKind::kMla;
    default:
      return AttentionKind::kGqa;
  }
}

int64_t ModelConfig::rope_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

double ModelConfig::attention_scale() const {
  if (attention_kind() == AttentionKind::kGqa) return std::pow(static_cast<double>(head_dim), -0.5);
  double scale = std::pow(static_cast<double>(qk_head_dim()), -0.5);
  // transformers' yarn_apply_mscale: any non-default RoPE with a truthy mscale_all_dim.
  if (rope.type != RopeType::kDefault && rope.mscale_all_dim && *rope.mscale_all_dim != 0) {
    const double m = YarnGetMscale(rope.factor, *rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double ModelConfig::rope_attention_factor() const {
  if (rope.type != RopeType::kYarn) return 1.0;
  if (rope.attention_factor) return *rope.attention_factor;
  if (rope.mscale && *rope.mscale != 0 && rope.mscale_all_dim && *rope.mscale_all_dim != 0) {
    return YarnGetMscale(rope.factor, *rope.mscale) /
           YarnGetMscale(rope.factor, *rope.mscale_all_dim);
  }
  return YarnGetMscale(rope.factor, 1.0);
}

std::vector<int64_t> ModelConfig::moe_layers() const {
  std::vector<int64_t> layers;
  for (size_t l = 0; l < mlp_layer_types.size(); ++l) {
    if (mlp_layer_types[l] == MlpType::kSparse) layers.push_back(static_cast<int64_t>(l));
  }
  return layers;
}

std::vector<int64_t> ModelConfig::indexer_layers() const {
  std::vector<int64_t> layers;
  for (size_t l = 0; l < indexer_types.size(); ++l) {
    if (indexer_types[l] == IndexerType::kFull) layers.push_back(static_cast<int64_t>(l));
  }
  return layers;
}

std::vector<int64_t> LayerOrdinals(const std::vector<int64_t>& layers, int64_t num_layers) {
  std::vector<int64_t> ordinal(static_cast<size_t>(num_layers), -1);
  for (size_t i = 0; i < layers.size(); ++i) ordinal.at(layers[i]) = static_cast<int64_t>(i);
  return ordinal;
}

HeadRange KvHeadsOf(int64_t kv_heads, int64_t rank, int64_t tp_size) {
  if (kv_heads % tp_size == 0) return {rank * kv_heads / tp_size, kv_heads / tp_size};
  RL_CHECK(tp_size % kv_heads == 0, ConfigError,
           "tensor parallelism: {} key/value heads neither divide nor are divided by the TP size "
           "{}",
           kv_heads, tp_size);
  return {rank * kv_heads / tp_size, 1};
}

HeadRange VocabSlice(int64_t vocab, int64_t rank, int64_t tp_size) {
  const int64_t each = vocab / tp_size;
  return {rank * each, rank == tp_size - 1 ? vocab - rank * each : each};
}

}  // namespace rl::model
