// The engine layout fuses exactly what Note [Engine fusion rules] says, lays tensors out as Note
// [Engine storage layout] says, and its HF views and engine views alias the same bytes.
#include "weight_sync/engine_layout.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "launch/check.h"
#include "weight_sync/test_tensors.h"

namespace rl::weight_sync {
namespace {

using testing::BitsEqual;
using testing::ExactActorTensors;
using testing::SmallModelDecls;

const EngineTensor& Find(const EngineLayout& layout, const std::string& name) {
  for (const EngineTensor& tensor : layout.tensors) {
    if (tensor.name == name) return tensor;
  }
  FAIL("no engine tensor " << name);
  throw std::logic_error("unreachable");
}

bool Has(const EngineLayout& layout, const std::string& name) {
  for (const EngineTensor& tensor : layout.tensors) {
    if (tensor.name == name) return true;
  }
  return false;
}

TEST_CASE("q/k/v (weight and bias) and gate/up fuse in q,k,v and gate,up row order") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  const std::string a0 = "model.layers.0.self_attn.";

  const EngineTensor& qkv = Find(layout, a0 + "qkv_proj.weight");
  CHECK(qkv.shape == std::vector<int64_t>{16, 8});
  CHECK(qkv.dtype == at::kBFloat16);
  REQUIRE(qkv.parts.size() == 3);
  CHECK(qkv.parts[0].hf_name == a0 + "q_proj.weight");
  CHECK(qkv.parts[1].hf_name == a0 + "k_proj.weight");  // listed after v_proj, fused before it
  CHECK(qkv.parts[2].hf_name == a0 + "v_proj.weight");
  CHECK((qkv.parts[1].row_begin == 8 && qkv.parts[1].rows == 4));
  CHECK((qkv.parts[2].row_begin == 12 && qkv.parts[2].rows == 4));

  const EngineTensor& qkv_bias = Find(layout, a0 + "qkv_proj.bias");
  CHECK(qkv_bias.shape == std::vector<int64_t>{16});
  CHECK(qkv_bias.parts[2].hf_name == a0 + "v_proj.bias");

  for (const std::string x : {"model.layers.0.mlp.", "model.layers.1.mlp.shared_experts.",
                              "model.layers.1.mlp.experts.0.", "model.layers.1.mlp.experts.3."}) {
    const EngineTensor& gate_up = Find(layout, x + "gate_up_proj.weight");
    REQUIRE(gate_up.parts.size() == 2);
    CHECK(gate_up.parts[0].hf_name == x + "gate_proj.weight");
    CHECK(gate_up.parts[1].hf_name == x + "up_proj.weight");
    CHECK(gate_up.parts[1].row_begin == gate_up.parts[0].rows);
    CHECK(gate_up.shape[0] == gate_up.parts[0].rows + gate_up.parts[1].rows);
    CHECK(!Has(layout, x + "gate_proj.weight"));
    CHECK(Has(layout, x + "down_proj.weight"));
  }
  // q,k,v weight and bias (6 tensors) and six gate/up pairs (12) fold into 8 engine tensors.
  CHECK(layout.tensors.size() == SmallModelDecls().size() - 18 + 8);
  CHECK(layout.locations.size() == SmallModelDecls().size());
}

TEST_CASE("Everything else maps 1:1, e_score_correction_bias stays fp32, MLA is not fused") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  const EngineTensor& bias = Find(layout, "model.layers.1.mlp.gate.e_score_correction_bias");
  CHECK(bias.dtype == at::kFloat);
  CHECK(bias.shape == std::vector<int64_t>{testing::kNumRoutedExperts});
  REQUIRE(bias.parts.size() == 1);
  CHECK(bias.parts[0].hf_name == bias.name);
  for (const char* name : {"model.layers.1.self_attn.q_a_proj.weight",
                           "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                           "model.layers.1.mlp.gate.weight", "lm_head.weight"}) {
    CHECK(Has(layout, name));
  }
}

TEST_CASE("Only routed experts are expert tensors") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  for (const EngineTensor& tensor : layout.tensors) {
    const bool routed = tensor.name.find("mlp.experts.") != std::string::npos;
    CHECK(tensor.expert == routed);
  }
  CHECK(Find(layout, "model.layers.1.mlp.experts.2.gate_up_proj.weight").expert);
  CHECK(!Find(layout, "model.layers.1.mlp.shared_experts.gate_up_proj.weight").expert);
  CHECK(IsRoutedExpert("model.layers.1.mlp.experts.2.down_proj.weight"));
  CHECK(!IsRoutedExpert("model.layers.1.mlp.shared_experts.down_proj.weight"));
}

TEST_CASE("A group is fused only when all parts exist with one dtype and equal trailing dims") {
  const at::ScalarType bf16 = at::kBFloat16;
  const std::string a = "model.layers.0.self_attn.";
  SECTION("a missing part") {
    const EngineLayout layout = MakeEngineLayout(
        {{a + "q_proj.weight", {4, 8}, bf16}, {a + "k_proj.weight", {2, 8}, bf16}});
    CHECK(layout.tensors.size() == 2);
    CHECK(!Has(layout, a + "qkv_proj.weight"));
  }
  SECTION("different dtypes") {
    const EngineLayout layout = MakeEngineLayout(
        {{"m.gate_proj.weight", {4, 8}, bf16}, {"m.up_proj.weight", {4, 8}, at::kFloat}});
    CHECK(layout.tensors.size() == 2);
  }
  SECTION("different trailing dims") {
    const EngineLayout layout = MakeEngineLayout(
        {{"m.gate_proj.weight", {4, 8}, bf16}, {"m.up_proj.weight", {4, 6}, bf16}});
    CHECK(layout.tensors.size() == 2);
  }
  SECTION("all parts agree") {
    const EngineLayout layout = MakeEngineLayout(
        {{"m.gate_proj.weight", {4, 8}, bf16}, {"m.up_proj.weight", {3, 8}, bf16}});
    REQUIRE(layout.tensors.size() == 1);
    CHECK(layout.tensors[0].name == "m.gate_up_proj.weight");
    CHECK(layout.tensors[0].shape == std::vector<int64_t>{7, 8});
  }
}

TEST_CASE("Offsets are 256-byte aligned, in HF list order, and tensors do not overlap") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  int64_t end = 0;
  for (const EngineTensor& tensor : layout.tensors) {
    CHECK(tensor.offset_bytes % kEngineAlignmentBytes == 0);
    CHECK(tensor.offset_bytes >= end);
    CHECK(tensor.offset_bytes < end + kEngineAlignmentBytes);  // no more padding than needed
    end = tensor.offset_bytes + NumBytes(tensor.shape, tensor.dtype);
  }
  CHECK(layout.total_bytes % kEngineAlignmentBytes == 0);
  CHECK(layout.total_bytes >= end);
  CHECK(layout.total_bytes < end + kEngineAlignmentBytes);
  CHECK(layout.tensors.front().name == "model.embed_tokens.weight");
  CHECK(layout.tensors.back().name == "lm_head.weight");
}

TEST_CASE("Exact values written through HF views read back bit for bit, fused as q,k,v") {
  const std::vector<TensorDecl> decls = SmallModelDecls();
  const EngineLayout layout = MakeEngineLayout(decls);
  const at::Tensor storage = at::zeros({layout.total_bytes}, at::kByte);
  auto hf = HfViews(layout, storage);
  REQUIRE(hf.size() == decls.size());
  const auto actor = ExactActorTensors(decls, at::kCPU);
  for (const auto& [name, tensor] : actor) {
    REQUIRE(hf.at(name).is_contiguous());
    hf.at(name).copy_(tensor);
  }
  // Fresh views of the same storage see the values.
  const auto hf_again = HfViews(layout, storage);
  for (const auto& [name, tensor] : actor) {
    INFO(name);
    CHECK(BitsEqual(hf_again.at(name), tensor));
  }
  const auto engine = EngineViews(layout, storage);
  REQUIRE(engine.size() == layout.tensors.size());
  auto actor_of = [&](const std::string& name) {
    for (const auto& [n, t] : actor) {
      if (n == name) return t;
    }
    FAIL("no actor tensor " << name);
    return at::Tensor();
  };
  const std::string a0 = "model.layers.0.self_attn.";
  CHECK(BitsEqual(engine.at(a0 + "qkv_proj.weight"),
                  at::cat({actor_of(a0 + "q_proj.weight"), actor_of(a0 + "k_proj.weight"),
                           actor_of(a0 + "v_proj.weight")})));
  CHECK(BitsEqual(engine.at(a0 + "qkv_proj.bias"),
                  at::cat({actor_of(a0 + "q_proj.bias"), actor_of(a0 + "k_proj.bias"),
                           actor_of(a0 + "v_proj.bias")})));
  const std::string e1 = "model.layers.1.mlp.experts.1.";
  CHECK(BitsEqual(engine.at(e1 + "gate_up_proj.weight"),
                  at::cat({actor_of(e1 + "gate_proj.weight"), actor_of(e1 + "up_proj.weight")})));
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  CHECK(BitsEqual(engine.at(bias), actor_of(bias)));
  CHECK(engine.at(bias).scalar_type() == at::kFloat);
}

TEST_CASE("Views keep the storage alive") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  at::Tensor view;
  {
    at::Tensor storage = at::full({layout.total_bytes}, 0x3f, at::kByte);
    view = HfViews(layout, storage).at("lm_head.weight");
  }
  // 0x3f3f as bf16 is 0.74609375.
  CHECK(view.to(at::kFloat).eq(0.74609375).all().item<bool>());
}

TEST_CASE("Bad storage and bad HF lists are refused") {
  const EngineLayout layout = MakeEngineLayout(SmallModelDecls());
  CHECK_THROWS_AS(HfViews(layout, at::zeros({layout.total_bytes - 1}, at::kByte)), Error);
  CHECK_THROWS_AS(EngineViews(layout, at::zeros({layout.total_bytes / 4}, at::kFloat)), Error);
  CHECK_THROWS_WITH(
      MakeEngineLayout({{"a.weight", {2}, at::kFloat}, {"a.weight", {2}, at::kFloat}}),
      Catch::Contains("a.weight appears twice"));
  CHECK_THROWS_WITH(MakeEngineLayout({{"m.gate_proj.weight", {2, 4}, at::kFloat},
                                      {"m.up_proj.weight", {2, 4}, at::kFloat},
                                      {"m.gate_up_proj.weight", {4, 4}, at::kFloat}}),
                    Catch::Contains("m.gate_up_proj.weight collides"));
}

}  // namespace
}  // namespace rl::weight_sync
