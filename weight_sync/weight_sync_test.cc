// Weight sync moves exact-by-construction values into the engine layout bit for bit, the
// update-equality check catches a planted mismatch and names it, bad tensor lists are refused
// before anything is copied, and the weight version check names both versions.
#include "weight_sync/weight_sync.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "launch/check.h"
#include "launch/sha256.h"
#include "weight_sync/test_tensors.h"

namespace rl::weight_sync {
namespace {

using testing::BitsEqual;
using testing::ExactActorTensors;
using testing::SmallModelDecls;

const at::Tensor& Get(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  throw std::logic_error("no tensor " + name);
}

// Syncs `actor` into a fresh storage on `device` and checks every tensor landed bit for bit
// (after conversion to the engine dtype), fused tensors in q,k,v / gate,up order.
void SyncAndCheckExact(const NamedTensors& actor, at::Device device, int64_t max_bucket_bytes) {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  const at::Tensor storage =
      at::zeros({layout.total_bytes}, at::TensorOptions(at::kByte).device(device));
  const SyncStats stats = Sync(actor, layout, storage, max_bucket_bytes);
  CHECK(stats.num_tensors == static_cast<int64_t>(actor.size()));
  CHECK(stats.num_buckets >= 2);
  CHECK(stats.num_expert_buckets >= 1);

  const auto hf = HfViews(layout, storage);
  for (const auto& [name, tensor] : actor) {
    INFO(name);
    const at::Tensor& view = hf.at(name);
    CHECK(view.device().type() == device.type());
    CHECK(BitsEqual(view, tensor.to(view.scalar_type())));
  }
  const auto engine = EngineViews(layout, storage);
  const std::string a0 = "model.layers.0.self_attn.";
  const at::ScalarType bf16 = at::kBFloat16;
  CHECK(BitsEqual(engine.at(a0 + "qkv_proj.weight"),
                  at::cat({Get(actor, a0 + "q_proj.weight"), Get(actor, a0 + "k_proj.weight"),
                           Get(actor, a0 + "v_proj.weight")})
                      .to(bf16)));
  CHECK(BitsEqual(engine.at(a0 + "qkv_proj.bias"),
                  at::cat({Get(actor, a0 + "q_proj.bias"), Get(actor, a0 + "k_proj.bias"),
                           Get(actor, a0 + "v_proj.bias")})
                      .to(bf16)));
  for (const std::string x : {"model.layers.0.mlp.", "model.layers.1.mlp.shared_experts.",
                              "model.layers.1.mlp.experts.3."}) {
    CHECK(BitsEqual(
        engine.at(x + "gate_up_proj.weight"),
        at::cat({Get(actor, x + "gate_proj.weight"), Get(actor, x + "up_proj.weight")}).to(bf16)));
  }
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  CHECK(engine.at(bias).scalar_type() == at::kFloat);
  CHECK(BitsEqual(engine.at(bias), Get(actor, bias)));
  CheckWeightsEqual(actor, layout, storage);  // the check agrees
}

TEST_CASE("Exact values survive bucketing and layout conversion bit for bit (CPU)") {
  const auto actor = ExactActorTensors(SmallModelDecls(), at::kCPU);
  for (int64_t limit : {1, 200, 1 << 20}) {
    INFO("max_bucket_bytes " << limit);
    SyncAndCheckExact(actor, at::kCPU, limit);
  }
}

TEST_CASE("fp32 actor tensors are converted to the engine's bf16, exactly where representable") {
  // Integers in [-125, 125] are exact in bf16, so the conversion must land them unchanged; the
  // fp32 e_score_correction_bias stays fp32 (its 1/1024 would not survive bf16).
  auto actor = ExactActorTensors(SmallModelDecls(), at::kCPU);
  for (auto& [name, tensor] : actor) tensor = tensor.to(at::kFloat);
  SyncAndCheckExact(actor, at::kCPU, 256);
}

TEST_CASE("Exact values survive a sync from pinned host and from the GPU into GPU storage") {
  if (!at::hasCUDA()) {
    WARN("SKIPPED: no CUDA device on this machine; the cross-device sync did not run");
    return;
  }
  auto pinned = ExactActorTensors(SmallModelDecls(), at::kCPU);
  for (auto& [name, tensor] : pinned) tensor = tensor.pin_memory();
  SyncAndCheckExact(pinned, at::kCUDA, 300);
  SyncAndCheckExact(ExactActorTensors(SmallModelDecls(), at::kCUDA), at::kCUDA, 300);
  // Pageable fp32 host tensors into bf16 GPU storage: a blocking, converting copy.
  auto fp32 = ExactActorTensors(SmallModelDecls(), at::kCPU);
  for (auto& [name, tensor] : fp32) tensor = tensor.to(at::kFloat);
  SyncAndCheckExact(fp32, at::kCUDA, 300);
}

TEST_CASE("The update-equality check names the one tensor flipped after a sync") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  const auto actor = ExactActorTensors(SmallModelDecls(), at::kCPU);
  const at::Tensor storage = at::zeros({layout.total_bytes}, at::kByte);
  Sync(actor, layout, storage, 512);
  CheckWeightsEqual(actor, layout, storage);

  // Flip one bit of the last element of k_proj.weight: a row range inside the fused qkv_proj.
  const std::string name = "model.layers.0.self_attn.k_proj.weight";
  const EngineLayout::Location where = layout.locations.at(name);
  const EngineTensor& qkv = layout.tensors[where.tensor];
  const int64_t row_bytes = NumBytes({qkv.shape[1]}, qkv.dtype);
  const int64_t last_byte = qkv.offset_bytes + (where.row_begin + where.rows) * row_bytes - 1;
  storage[last_byte].bitwise_xor_(1);
  const std::string expected = "weight update check failed: 1 of " + std::to_string(actor.size()) +
                               " tensors differ after sync: " + name;
  CHECK_THROWS_WITH(CheckWeightsEqual(actor, layout, storage), Catch::Contains(expected));

  // Bytes outside every tensor (alignment padding) are not weights; the check ignores them.
  storage[last_byte].bitwise_xor_(1);
  storage[layout.total_bytes - 1].fill_(0xff);  // lm_head ends before the last 256-byte boundary
  CheckWeightsEqual(actor, layout, storage);
}

TEST_CASE("Two flipped tensors are counted and listed") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  const auto actor = ExactActorTensors(SmallModelDecls(), at::kCPU);
  const at::Tensor storage = at::zeros({layout.total_bytes}, at::kByte);
  Sync(actor, layout, storage, 512);
  auto hf = HfViews(layout, storage);
  hf.at("model.layers.1.mlp.experts.2.up_proj.weight")[0][0].fill_(99);
  hf.at("model.layers.1.mlp.gate.e_score_correction_bias")[3].fill_(0.5);
  CHECK_THROWS_WITH(CheckWeightsEqual(actor, layout, storage),
                    Catch::Contains("2 of " + std::to_string(actor.size()) + " tensors differ") &&
                        Catch::Contains("model.layers.1.mlp.gate.e_score_correction_bias, "
                                        "model.layers.1.mlp.experts.2.up_proj.weight"));
}

TEST_CASE("Missing and unexpected names are refused before anything is copied") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  auto actor = ExactActorTensors(SmallModelDecls(), at::kCPU);
  const std::string dropped = "model.layers.1.mlp.experts.1.gate_proj.weight";
  actor.erase(std::find_if(actor.begin(), actor.end(),
                           [&](const auto& entry) { return entry.name == dropped; }));
  actor.push_back({"model.layers.1.mlp.experts.9.gate_proj.weight", at::zeros({6, 8})});
  const at::Tensor storage = at::zeros({layout.total_bytes}, at::kByte);
  const std::string missing = "1 missing from the actor's tensors: " + dropped;
  const std::string unexpected =
      "1 not in the engine layout: model.layers.1.mlp.experts.9.gate_proj.weight";
  CHECK_THROWS_WITH(Sync(actor, layout, storage, 512),
                    Catch::Contains(missing) && Catch::Contains(unexpected));
  CHECK(storage.eq(0).all().item<bool>());
  CHECK_THROWS_WITH(CheckWeightsEqual(actor, layout, storage),
                    Catch::Contains(missing) && Catch::Contains(unexpected));
}

TEST_CASE("Shape mismatches and duplicates are refused and named") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  const at::Tensor storage = at::zeros({layout.total_bytes}, at::kByte);
  auto actor = ExactActorTensors(SmallModelDecls(), at::kCPU);
  const std::string name = "model.layers.0.self_attn.v_proj.weight";
  for (auto& [n, t] : actor) {
    if (n == name) t = at::zeros({5, 8}, at::kBFloat16);
  }
  CHECK_THROWS_WITH(Sync(actor, layout, storage, 512),
                    Catch::Contains(name + " [5, 8] vs engine [4, 8]"));
  CHECK(storage.eq(0).all().item<bool>());

  auto twice = ExactActorTensors(SmallModelDecls(), at::kCPU);
  twice.push_back(twice.front());
  CHECK_THROWS_WITH(Sync(twice, layout, storage, 512),
                    Catch::Contains("1 given twice: model.embed_tokens.weight"));
}

TEST_CASE("The weight version check passes on equal versions and names both otherwise") {
  CheckWeightVersion(0, 0);  // both at the checkpoint's weights
  CheckWeightVersion(2, 2);
  CHECK_THROWS_WITH(CheckWeightVersion(3, 2),
                    Catch::Contains("weight version mismatch: actor 3, engine 2"));
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  const at::Tensor storage = at::zeros({layout.total_bytes}, at::kByte);
  CHECK_THROWS_AS(Sync(ExactActorTensors(SmallModelDecls(), at::kCPU), layout, storage, 0),
                  ConfigError);
}

}  // namespace
}  // namespace rl::weight_sync
