// Parameter names, roles, initialisation, and checkpoint load/save against the fixtures.
#include "trainer/model/params.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <set>
#include <string>

#include "launch/json.h"
#include "launch/sha256.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/safetensors.h"
#include "trainer/model/safetensors_writer.h"
#include "trainer/model/test_fixtures.h"

namespace rl::model {
namespace {

using testing::FixtureNames;
using testing::FixturePath;
using testing::LoadFixture;
using testing::TempDir;

// name -> the view of `params` holding that checkpoint tensor (Note [Stacked experts]).
TensorMap HfViews(const ModelConfig& config, const TensorMap& params) {
  TensorMap out;
  for (const HfSlice& slice : HfLayout(ListParams(config))) {
    out.emplace(slice.hf_name, SliceOf(slice, params.at(slice.param)));
  }
  return out;
}

TEST_CASE("HfLayout names and shapes are exactly the fixtures' safetensors tensors") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    const ModelConfig config = LoadModelConfig(FixturePath(name));
    const SafetensorsFile file = SafetensorsFile::Open(FixturePath(name) + "/model.safetensors");
    std::set<std::string> in_file;
    for (const TensorInfo& t : file.tensors()) in_file.insert(t.name);
    const std::vector<ParamSpec> specs = ListParams(config);
    const TensorMap params = AllocateParams(specs, at::kFloat, at::kCPU);
    for (const ParamSpec& spec : specs) {
      INFO(spec.name);
      // The only fp32-by-design tensor is the router bias, and it is the only extra.
      const bool bias = spec.name.find("e_score_correction_bias") != std::string::npos;
      CHECK((spec.role == ParamRole::kFp32Extra) == bias);
      const bool routed = spec.name.find(".experts.") != std::string::npos &&
                          spec.name.find(".shared_experts.") == std::string::npos;
      CHECK((spec.role == ParamRole::kRoutedExpert) == routed);
      CHECK(spec.shape.size() == (routed ? 3u : spec.shape.size()));
    }
    std::set<std::string> listed;
    size_t slices = 0;
    for (const HfSlice& slice : HfLayout(specs)) {
      INFO(slice.hf_name);
      listed.insert(slice.hf_name);
      ++slices;
      const TensorInfo* info = file.Find(slice.hf_name);
      REQUIRE(info != nullptr);
      CHECK(SliceOf(slice, params.at(slice.param)).sizes() == at::IntArrayRef(info->shape));
    }
    CHECK(listed == in_file);
    CHECK(listed.size() == slices);  // no duplicates
  }
}

TEST_CASE("HfLayout puts each expert's gate, up and down rows where the grouped GEMMs read them") {
  const ModelConfig config = LoadModelConfig(FixturePath("qwen3_moe"));
  const std::vector<ParamSpec> specs = ListParams(config);
  TensorMap params = AllocateParams(specs, at::kFloat, at::kCPU);
  const std::string p = "model.layers.1.mlp.experts.";
  const at::Tensor gate_up = params.at(p + "gate_up_proj");
  const at::Tensor down = params.at(p + "down_proj");
  const int64_t inter = config.moe_intermediate_size;
  REQUIRE(gate_up.sizes() ==
          at::IntArrayRef({config.n_routed_experts, 2 * inter, config.hidden_size}));
  std::vector<HfSlice> layer;
  for (const HfSlice& slice : HfLayout(specs)) {
    if (slice.param.rfind(p, 0) == 0) layer.push_back(slice);
  }
  REQUIRE(layer.size() == static_cast<size_t>(3 * config.n_routed_experts));
  CHECK(layer[0].hf_name == p + "0.gate_proj.weight");
  CHECK(layer[1].hf_name == p + "0.up_proj.weight");
  CHECK(layer[2].hf_name == p + "0.down_proj.weight");
  CHECK(layer[3].hf_name == p + "1.gate_proj.weight");
  // Writing through the views fills the stacked rows: gate then up of expert 5, down of expert 5.
  const int64_t e = 5;
  SliceOf(layer[3 * e], gate_up).fill_(1.0);
  SliceOf(layer[3 * e + 1], gate_up).fill_(2.0);
  SliceOf(layer[3 * e + 2], down).fill_(3.0);
  CHECK(gate_up[e].narrow(0, 0, inter).eq(1.0).all().item<bool>());
  CHECK(gate_up[e].narrow(0, inter, inter).eq(2.0).all().item<bool>());
  CHECK(down[e].eq(3.0).all().item<bool>());
  CHECK(gate_up.sum().item<double>() == 3.0 * inter * config.hidden_size);
}

TEST_CASE("ListParams is in order of first use") {
  const ModelConfig config = LoadModelConfig(FixturePath("glm_moe_dsa"));
  const std::vector<ParamSpec> specs = ListParams(config);
  CHECK(specs.front().name == "model.embed_tokens.weight");
  CHECK(specs.back().name == "lm_head.weight");
  auto pos = [&](const std::string& n) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].name == n) return i;
    }
    FAIL("no " << n);
    return size_t{0};
  };
  CHECK(pos("model.layers.0.input_layernorm.weight") < pos("model.layers.0.self_attn.q_a_proj.weight"));
  CHECK(pos("model.layers.0.self_attn.indexer.wq_b.weight") <
        pos("model.layers.0.self_attn.o_proj.weight"));
  CHECK(pos("model.layers.1.mlp.gate.weight") < pos("model.layers.1.mlp.experts.gate_up_proj"));
  CHECK(pos("model.layers.1.mlp.experts.gate_up_proj") <
        pos("model.layers.1.mlp.experts.down_proj"));
  CHECK(pos("model.layers.2.mlp.shared_experts.down_proj.weight") < pos("model.norm.weight"));
}

TEST_CASE("InitParamsRandom is deterministic and follows the init rules") {
  const ModelConfig config = LoadModelConfig(FixturePath("glm4_moe"));
  const std::vector<ParamSpec> specs = ListParams(config);
  TensorMap a = AllocateParams(specs, at::kFloat, at::kCPU);
  TensorMap b = AllocateParams(specs, at::kDouble, at::kCPU);
  InitParamsRandom(specs, a, 42);
  InitParamsRandom(specs, b, 42);
  for (const ParamSpec& s : specs) {
    INFO(s.name);
    CHECK(at::equal(a.at(s.name), b.at(s.name).to(at::kFloat)));
  }
  CHECK(a.at("model.layers.1.mlp.gate.e_score_correction_bias").scalar_type() == at::kFloat);
  CHECK(at::equal(a.at("model.norm.weight"), at::ones({config.hidden_size})));
  CHECK(a.at("model.layers.0.self_attn.q_proj.bias").abs().max().item<float>() == 0);
  const double std = a.at("model.embed_tokens.weight").std().item<double>();
  CHECK(std == Approx(0.02).epsilon(0.2));
  TensorMap c = AllocateParams(specs, at::kFloat, at::kCPU);
  InitParamsRandom(specs, c, 43);
  CHECK_FALSE(at::equal(a.at("model.embed_tokens.weight"), c.at("model.embed_tokens.weight")));
}

TEST_CASE("Save then load gives SHA256-identical tensors and the same config") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    const std::string dir = TempDir("roundtrip_" + name);
    // Small shards, so the index path is exercised too.
    SaveHfCheckpoint(dir, m.config, m.params, /*max_shard_bytes=*/64 * 1024);
    CHECK(std::filesystem::exists(dir + "/model.safetensors.index.json"));
    const ModelConfig reloaded_config = LoadModelConfig(dir);
    CHECK(json::Dump(ToHfConfigJson(reloaded_config)) == json::Dump(ToHfConfigJson(m.config)));
    TensorMap reloaded = AllocateParams(ListParams(reloaded_config), at::kFloat, at::kCPU);
    LoadParams(CheckpointReader::Open(dir), reloaded_config, reloaded);
    for (const auto& [param, t] : m.params) {
      INFO(param);
      CHECK(TensorSha256(reloaded.at(param)) == TensorSha256(t));
    }
    // The files hold the checkpoint's own (per-expert) names, with the original bytes.
    const CheckpointReader original = CheckpointReader::Open(FixturePath(name));
    const CheckpointReader saved = CheckpointReader::Open(dir);
    const TensorMap views = HfViews(reloaded_config, reloaded);
    CHECK(saved.names().size() == original.names().size());
    for (const std::string& tensor : original.names()) {
      INFO(tensor);
      REQUIRE(saved.Find(tensor) != nullptr);
      CHECK(TensorSha256(original.Get(tensor)) == TensorSha256(saved.Get(tensor)));
      CHECK(TensorSha256(original.Get(tensor)) == TensorSha256(views.at(tensor)));
    }
    // Saving the reloaded (stacked) params again writes byte-identical files.
    const std::string again = TempDir("roundtrip_again_" + name);
    SaveHfCheckpoint(again, reloaded_config, reloaded, /*max_shard_bytes=*/64 * 1024);
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string file = entry.path().filename().string();
      INFO(file);
      CHECK(FileSha256(entry.path().string()) == FileSha256(again + "/" + file));
    }
  }
}

TEST_CASE("A config built in code is saved with a synthesised config.json of the same model") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    m.config.hf_config = json::Value();  // as if built in code
    const std::string dir = TempDir("synth_" + name);
    SaveHfCheckpoint(dir, m.config, m.params);
    const ModelConfig reloaded = LoadModelConfig(dir);
    const std::vector<ParamSpec> a = ListParams(m.config);
    const std::vector<ParamSpec> b = ListParams(reloaded);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].name == b[i].name);
      CHECK(a[i].shape == b[i].shape);
    }
    CHECK(reloaded.attention_scale() == m.config.attention_scale());
    CHECK(reloaded.rope_attention_factor() == m.config.rope_attention_factor());
    CHECK(reloaded.rope_dim() == m.config.rope_dim());
    CHECK(reloaded.rope.theta == m.config.rope.theta);
    CHECK(reloaded.rms_norm_eps == m.config.rms_norm_eps);
    CHECK(reloaded.norm_topk_prob == m.config.norm_topk_prob);
    CHECK(reloaded.routed_scaling_factor == m.config.routed_scaling_factor);
    CHECK(reloaded.rope_interleave == m.config.rope_interleave);
    CHECK(reloaded.index_topk == m.config.index_topk);
  }
}

TEST_CASE("LoadParams names missing, unexpected and wrongly shaped tensors") {
  testing::LoadedModel m = LoadFixture("qwen3_moe");
  const std::vector<ParamSpec> specs = ListParams(m.config);
  NamedTensors tensors;
  for (const auto& [name, view] : HfViews(m.config, m.params)) {
    if (name == "model.layers.2.mlp.experts.5.down_proj.weight") continue;  // missing
    at::Tensor t = view;
    if (name == "model.norm.weight") t = at::zeros({7});  // wrong shape
    tensors.push_back({name, t});
  }
  tensors.push_back({"model.layers.1.self_attn.surprise.weight", at::zeros({2})});
  tensors.push_back({"model.layers.3.mtp_only.weight", at::zeros({2})});  // MTP layer: ignored
  const std::string dir = TempDir("bad_ckpt");
  WriteCheckpointShards(dir, tensors, int64_t{1} << 30);
  TensorMap params = AllocateParams(specs, at::kFloat, at::kCPU);
  try {
    LoadParams(CheckpointReader::Open(dir), m.config, params);
    FAIL("expected CheckpointError");
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("missing 1: model.layers.2.mlp.experts.5.down_proj.weight"));
    CHECK_THAT(msg, Catch::Contains("unexpected 1: model.layers.1.self_attn.surprise.weight"));
    CHECK_THAT(msg, Catch::Contains("model.norm.weight (checkpoint shape [7], model expects [32])"));
    CHECK_THAT(msg, Catch::Contains(dir));
  }
}

TEST_CASE("LoadParams reads transformers-v5 fused experts and converts dtypes") {
  testing::LoadedModel m = LoadFixture("deepseek_v3");
  NamedTensors tensors;
  const ModelConfig& c = m.config;
  // The stacked params are transformers v5's fused expert tensors, names and layout.
  for (const ParamSpec& s : ListParams(c)) tensors.push_back({s.name, m.params.at(s.name)});
  const std::string dir = TempDir("fused_ckpt");
  WriteCheckpointShards(dir, tensors, int64_t{1} << 30);
  TensorMap params = AllocateParams(ListParams(c), at::kDouble, at::kCPU);
  LoadParams(CheckpointReader::Open(dir), c, params);
  for (const auto& [name, t] : m.params) {
    INFO(name);
    CHECK(at::equal(params.at(name), t.to(at::kDouble)));
  }
}

// Note [Expert shard]: the 8-expert fixtures, split over 2 EP ranks of 4 experts each.
const std::vector<std::string> kEightExpertFixtures = {"qwen3_moe", "glm4_moe"};
constexpr int64_t kShards = 2;

ModelConfig ShardOf(const ModelConfig& whole, int64_t rank) {
  ModelConfig c = whole;
  c.expert_shard = {rank, kShards};
  return c;
}

// `whole` with its stacked experts narrowed to the experts of `shard`.
TensorMap RowsOfShard(const ModelConfig& shard, const TensorMap& whole) {
  TensorMap out;
  for (const ParamSpec& s : ListParams(shard)) {
    const at::Tensor& t = whole.at(s.name);
    out.emplace(s.name, s.role == ParamRole::kRoutedExpert
                            ? t.narrow(0, shard.first_local_expert(), shard.local_experts())
                            : t);
  }
  return out;
}

void CheckSameTensors(const TensorMap& got, const TensorMap& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(at::equal(got.at(name), t));
  }
}

TEST_CASE("InitParamsRandom under an expert shard gives the whole model's rows of its experts") {
  for (const std::string& fixture : kEightExpertFixtures) {
    const ModelConfig whole_config = LoadModelConfig(FixturePath(fixture));
    REQUIRE(whole_config.n_routed_experts == 8);
    const std::vector<ParamSpec> whole_specs = ListParams(whole_config);
    TensorMap whole = AllocateParams(whole_specs, at::kFloat, at::kCPU);
    InitParamsRandom(whole_specs, whole, 42);
    for (int64_t rank = 0; rank < kShards; ++rank) {
      INFO(fixture << ", shard " << rank << " of " << kShards);
      const ModelConfig config = ShardOf(whole_config, rank);
      REQUIRE(config.first_local_expert() == rank * 4);
      const std::vector<ParamSpec> specs = ListParams(config);
      TensorMap shard = AllocateParams(specs, at::kFloat, at::kCPU);
      InitParamsRandom(config, shard, 42);
      CheckSameTensors(shard, RowsOfShard(config, whole));
    }
  }
}

TEST_CASE("InitParamsRandom under a tensor shard gives the whole model's slices") {
  for (const std::string& fixture : FixtureNames()) {
    const ModelConfig whole_config = LoadModelConfig(FixturePath(fixture));
    const std::vector<ParamSpec> whole_specs = ListParams(whole_config);
    TensorMap whole = AllocateParams(whole_specs, at::kFloat, at::kCPU);
    InitParamsRandom(whole_specs, whole, 42);
    for (int64_t rank = 0; rank < 2; ++rank) {
      INFO(fixture << ", TP rank " << rank << " of 2");
      ModelConfig config = whole_config;
      config.tensor_shard = {rank, 2};
      const std::vector<ParamSpec> specs = ListParams(config);
      TensorMap shard = AllocateParams(specs, at::kFloat, at::kCPU);
      InitParamsRandom(config, shard, 42);
      CheckSameTensors(shard, ShardTensorParallel(specs, whole));
    }
  }
}

TEST_CASE("LoadParams of a per-expert checkpoint into a shard reads exactly its experts' rows") {
  for (const std::string& fixture : kEightExpertFixtures) {
    INFO(fixture);
    const ModelConfig whole_config = LoadModelConfig(FixturePath(fixture));
    const std::vector<ParamSpec> whole_specs = ListParams(whole_config);
    TensorMap whole = AllocateParams(whole_specs, at::kFloat, at::kCPU);
    InitParamsRandom(whole_specs, whole, 7);
    const std::string dir = TempDir("per_expert_" + fixture);
    SaveHfCheckpoint(dir, whole_config, whole);
    const ModelConfig config = ShardOf(whole_config, 1);
    TensorMap shard = AllocateParams(ListParams(config), at::kFloat, at::kCPU);
    // Experts 0..3 are in the file and belong to the other rank: not "unexpected".
    REQUIRE_NOTHROW(LoadParams(CheckpointReader::Open(dir), config, shard));
    CheckSameTensors(shard, RowsOfShard(config, whole));
  }
}

TEST_CASE("LoadParams of transformers-v5 fused experts into a shard reads exactly its rows") {
  for (const std::string& fixture : kEightExpertFixtures) {
    INFO(fixture);
    const ModelConfig whole_config = LoadModelConfig(FixturePath(fixture));
    const std::vector<ParamSpec> whole_specs = ListParams(whole_config);
    TensorMap whole = AllocateParams(whole_specs, at::kFloat, at::kCPU);
    InitParamsRandom(whole_specs, whole, 9);
    // The whole model's stacked params are the fused tensors [8, 2I, H] and [8, H, I].
    NamedTensors tensors;
    for (const ParamSpec& s : whole_specs) tensors.push_back({s.name, whole.at(s.name)});
    const std::string dir = TempDir("fused_shard_" + fixture);
    WriteCheckpointShards(dir, tensors, int64_t{1} << 30);
    const ModelConfig config = ShardOf(whole_config, 1);
    TensorMap shard = AllocateParams(ListParams(config), at::kFloat, at::kCPU);
    REQUIRE_NOTHROW(LoadParams(CheckpointReader::Open(dir), config, shard));
    CheckSameTensors(shard, RowsOfShard(config, whole));
  }
}

TEST_CASE("HfLayout names a shard's local experts by their global ids") {
  const ModelConfig config = ShardOf(LoadModelConfig(FixturePath("qwen3_moe")), 1);
  const std::string p = "model.layers.1.mlp.experts.";
  std::vector<std::string> names;
  for (const HfSlice& slice : HfLayout(ListParams(config), config.first_local_expert())) {
    if (slice.param.rfind(p, 0) == 0) names.push_back(slice.hf_name);
  }
  REQUIRE(names.size() == 3 * 4u);
  CHECK(names.front() == p + "4.gate_proj.weight");
  CHECK(names[3] == p + "5.gate_proj.weight");
  CHECK(names.back() == p + "7.down_proj.weight");
}

TEST_CASE("CheckParams accepts the fixture params and rejects a foreign dtype") {
  testing::LoadedModel m = LoadFixture("glm_moe_dsa_shared");
  const std::vector<ParamSpec> specs = ListParams(m.config);
  CHECK_NOTHROW(CheckParams(specs, m.params));
  TensorMap params = m.params;
  params["model.layers.0.input_layernorm.weight"] =
      params.at("model.layers.0.input_layernorm.weight").to(at::kBFloat16);
  CHECK_THROWS_WITH(CheckParams(specs, params),
                    Catch::Contains("model.layers.0.input_layernorm.weight (dtype BFloat16"));
}

}  // namespace
}  // namespace rl::model
