// SplitParams: --freeze-params is matched against the checkpoint's tensor names, and a stacked
// expert parameter (Note [Stacked experts] in trainer/model/params.h) is frozen as a whole.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "launch/check.h"
#include "launch/json.h"
#include "tests/runfiles.h"
#include "trainer/actor.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/params.h"

namespace rl {
namespace {

std::vector<ParamSpec> MoeSpecs() {
  const std::string path = rl::testing::RunfilePath("configs/models/qwen3_30b_a3b_4layer_ci.json");
  return model::ListParams(model::ParseModelConfig(json::ParseFile(path), path));
}

std::vector<std::string> Names(const std::vector<ParamSpec>& specs) {
  std::vector<std::string> out;
  for (const ParamSpec& s : specs) out.push_back(s.name);
  return out;
}

TEST_CASE("a regex over every expert of a layer freezes that layer's stacked experts") {
  const std::vector<ParamSpec> specs = MoeSpecs();
  const ParamSplit split = SplitParams(specs, R"(layers\.1\.mlp\.experts\.\d+\.)");
  const std::vector<std::string> expected = {"model.layers.1.mlp.experts.gate_up_proj",
                                             "model.layers.1.mlp.experts.down_proj"};
  CHECK(Names(split.frozen) == expected);
  CHECK(split.trained.size() + split.frozen.size() + split.extras.size() == specs.size());
}

TEST_CASE("a regex over dense checkpoint names freezes those params as before") {
  const ParamSplit split = SplitParams(MoeSpecs(), R"(layers\.0\.self_attn\.q_proj)");
  const std::vector<std::string> expected = {"model.layers.0.self_attn.q_proj.weight"};
  CHECK(Names(split.frozen) == expected);
}

TEST_CASE("a regex over some experts of a layer is a ConfigError naming --freeze-params") {
  const std::vector<ParamSpec> specs = MoeSpecs();
  // Expert 3 of 8: its gate_proj and up_proj, 2 of the 16 tensors stacked in gate_up_proj.
  CHECK_THROWS_WITH(SplitParams(specs, R"(layers\.2\.mlp\.experts\.3\.)"),
                    Catch::Contains("--freeze-params") &&
                        Catch::Contains("matches 2 of the 16 checkpoint tensors stacked in "
                                        "model.layers.2.mlp.experts.gate_up_proj"));
  CHECK_THROWS_AS(SplitParams(specs, R"(layers\.2\.mlp\.experts\.3\.)"), ConfigError);
  // Every gate_proj but no up_proj: half of each gate_up tensor.
  CHECK_THROWS_AS(SplitParams(specs, R"(experts\.\d+\.gate_proj)"), ConfigError);
}

TEST_CASE("under expert parallelism the regex sees every EP rank's experts, as at EP 1") {
  const std::string path = rl::testing::RunfilePath("configs/models/qwen3_30b_a3b_4layer_ci.json");
  model::ModelConfig config = model::ParseModelConfig(json::ParseFile(path), path);
  config.expert_shard = {0, 2};  // experts 0..3 of 8
  const std::vector<ParamSpec> specs = model::ListParams(config);
  // Experts 0..3 are all this rank holds, but half of the layer's: refused, as at EP 1.
  CHECK_THROWS_WITH(SplitParams(specs, R"(layers\.2\.mlp\.experts\.[0-3]\.)", 2),
                    Catch::Contains("matches 8 of the 16 checkpoint tensors stacked in "
                                    "model.layers.2.mlp.experts.gate_up_proj"));
  const ParamSplit split = SplitParams(specs, R"(layers\.1\.mlp\.experts\.\d+\.)", 2);
  const std::vector<std::string> expected = {"model.layers.1.mlp.experts.gate_up_proj",
                                             "model.layers.1.mlp.experts.down_proj"};
  CHECK(Names(split.frozen) == expected);
}

}  // namespace
}  // namespace rl
