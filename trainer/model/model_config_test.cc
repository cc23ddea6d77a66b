// The values derived from a ModelConfig built in code: type names, attention kind, RoPE width and
// the YaRN factors (the same values on parsed configs are checked in hf_config_test.cc).
#include "trainer/model/model_config.h"

#include <catch2/catch.hpp>

#include <cmath>

namespace rl::model {
namespace {

TEST_CASE("ModelTypeName gives the config.json spelling") {
  CHECK(ModelTypeName(ModelType::kQwen3Moe) == "qwen3_moe");
  CHECK(ModelTypeName(ModelType::kGlm4MoeLite) == "glm4_moe_lite");
  CHECK(ModelTypeName(ModelType::kGlmMoeDsa) == "glm_moe_dsa");
}

TEST_CASE("GQA: the RoPE width and the softmax scale come from head_dim") {
  ModelConfig c;
  c.model_type = ModelType::kGlm4Moe;
  c.head_dim = 128;
  c.rope.partial_rotary_factor = 0.5;
  CHECK(c.attention_kind() == AttentionKind::kGqa);
  CHECK(c.rope_dim() == 64);
  CHECK(c.attention_scale() == std::pow(128.0, -0.5));
  CHECK(c.rope_attention_factor() == 1.0);
}

TEST_CASE("MLA with YaRN: the mscale^2 softmax correction and the cos/sin factor") {
  ModelConfig c;
  c.model_type = ModelType::kDeepseekV3;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.rope.type = RopeType::kYarn;
  c.rope.factor = 40;
  c.rope.mscale = 1.0;
  c.rope.mscale_all_dim = 1.0;
  const double m = 0.1 * std::log(40.0) + 1.0;
  CHECK(c.attention_kind() == AttentionKind::kMla);
  CHECK(c.attention_scale() == Approx(std::pow(192.0, -0.5) * m * m));
  CHECK(c.rope_attention_factor() == 1.0);  // mscale / mscale_all_dim
  c.rope.mscale.reset();
  CHECK(c.rope_attention_factor() == Approx(m));
}

}  // namespace
}  // namespace rl::model
