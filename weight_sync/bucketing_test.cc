// Bucket plans respect the byte limit, send non-expert tensors first and never split the parts
// of one engine tensor.
#include "weight_sync/bucketing.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "launch/check.h"
#include "weight_sync/test_tensors.h"

namespace rl::weight_sync {
namespace {

std::vector<std::string> Names(const Bucket& bucket) {
  std::vector<std::string> names;
  for (const NamedSize& entry : bucket.entries) names.push_back(entry.name);
  return names;
}

// Sizes of the small model's tensors, in bytes.
std::vector<NamedSize> SmallModelSizes() {
  std::vector<NamedSize> sizes;
  for (const TensorDecl& decl : testing::SmallModelDecls()) {
    sizes.push_back({decl.name, NumBytes(decl.shape, decl.dtype)});
  }
  return sizes;
}

TEST_CASE("Hand-sized tensors pack greedily, in order, and an oversized unit travels alone") {
  const at::ScalarType f32 = at::kFloat;
  // Byte sizes by construction: [n] fp32 = 4n bytes.
  const EngineLayout layout = MakeEngineLayout({
      {"a.weight", {10}, f32},            // 40
      {"b.weight", {10}, f32},            // 40
      {"c.weight", {5}, f32},             // 20
      {"m.gate_proj.weight", {15}, f32},  // 60 } fused: a 120-byte unit
      {"m.up_proj.weight", {15}, f32},    // 60 }
      {"d.weight", {25}, f32},            // 100
      {"e.weight", {30}, f32},            // 120, over the limit alone
  });
  std::vector<NamedSize> sizes;
  for (const EngineTensor& t : layout.tensors) {
    for (const Part& p : t.parts) sizes.push_back({p.hf_name, NumBytes({p.rows}, f32)});
  }
  const BucketPlan plan = PlanBuckets(sizes, layout, /*max_bucket_bytes=*/100);
  REQUIRE(plan.buckets.size() == 4);
  CHECK(Names(plan.buckets[0]) == std::vector<std::string>{"a.weight", "b.weight", "c.weight"});
  CHECK(plan.buckets[0].num_bytes == 100);
  CHECK(Names(plan.buckets[1]) ==
        std::vector<std::string>{"m.gate_proj.weight", "m.up_proj.weight"});
  CHECK(plan.buckets[1].num_bytes == 120);
  CHECK(Names(plan.buckets[2]) == std::vector<std::string>{"d.weight"});
  CHECK(Names(plan.buckets[3]) == std::vector<std::string>{"e.weight"});
  CHECK(plan.total_bytes == 40 + 40 + 20 + 120 + 100 + 120);
}

TEST_CASE("Every bucket is within the limit unless it holds a single oversized unit") {
  const EngineLayout layout = MakeEngineLayout(testing::SmallModelDecls());
  const std::vector<NamedSize> sizes = SmallModelSizes();
  for (int64_t limit : {1, 64, 100, 200, 256, 500, 1000, 4096, 1 << 20}) {
    INFO("limit " << limit);
    const BucketPlan plan = PlanBuckets(sizes, layout, limit);
    std::map<std::string, int> seen;
    int64_t total = 0;
    for (const Bucket& bucket : plan.buckets) {
      int64_t sum = 0;
      std::map<size_t, int> engine_tensors;
      for (const NamedSize& entry : bucket.entries) {
        sum += entry.num_bytes;
        seen[entry.name] += 1;
        engine_tensors[layout.locations.at(entry.name).tensor] += 1;
      }
      CHECK(sum == bucket.num_bytes);
      total += sum;
      if (bucket.num_bytes > limit) CHECK(engine_tensors.size() == 1);
    }
    CHECK(total == plan.total_bytes);
    CHECK(seen.size() == sizes.size());
    for (const auto& [name, count] : seen) CHECK(count == 1);
  }
}

TEST_CASE("Non-expert buckets come first, and no bucket mixes the two streams") {
  const EngineLayout layout = MakeEngineLayout(testing::SmallModelDecls());
  for (int64_t limit : {64, 300, 1 << 20}) {
    INFO("limit " << limit);
    const BucketPlan plan = PlanBuckets(SmallModelSizes(), layout, limit);
    bool in_expert_stream = false;
    int expert_buckets = 0;
    for (const Bucket& bucket : plan.buckets) {
      if (bucket.stream == BucketStream::kExpert) {
        in_expert_stream = true;
        ++expert_buckets;
      }
      CHECK(in_expert_stream == (bucket.stream == BucketStream::kExpert));
      for (const NamedSize& entry : bucket.entries) {
        CHECK(IsRoutedExpert(entry.name) == (bucket.stream == BucketStream::kExpert));
      }
    }
    CHECK(expert_buckets >= 1);
    // With no limit to speak of, exactly one bucket per stream.
    if (limit == (1 << 20)) CHECK(plan.buckets.size() == 2);
  }
}

TEST_CASE("All parts of a fused engine tensor share one bucket") {
  const EngineLayout layout = MakeEngineLayout(testing::SmallModelDecls());
  // At 1 and 32 bytes every weight part is over the limit on its own, so a planner that split
  // groups would put each part in a bucket of its own.
  for (int64_t limit : {1, 32, 200, 700}) {
    INFO("limit " << limit);
    const BucketPlan plan = PlanBuckets(SmallModelSizes(), layout, limit);
    std::map<std::string, size_t> bucket_of;
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
      for (const NamedSize& entry : plan.buckets[b].entries) bucket_of[entry.name] = b;
    }
    int fused = 0;
    for (const EngineTensor& tensor : layout.tensors) {
      if (tensor.parts.size() < 2) continue;
      ++fused;
      for (const Part& part : tensor.parts) {
        INFO(part.hf_name);
        CHECK(bucket_of.at(part.hf_name) == bucket_of.at(tensor.parts[0].hf_name));
      }
    }
    CHECK(fused == 8);
  }
}

TEST_CASE("Sizes come from the tensors: numel times element size") {
  const EngineLayout layout = MakeEngineLayout(testing::SmallModelDecls());
  const auto tensors = testing::ExactActorTensors(testing::SmallModelDecls(), at::kCPU);
  const BucketPlan from_tensors = PlanBuckets(tensors, layout, 300);
  const BucketPlan from_sizes = PlanBuckets(SmallModelSizes(), layout, 300);
  REQUIRE(from_tensors.buckets.size() == from_sizes.buckets.size());
  for (size_t b = 0; b < from_sizes.buckets.size(); ++b) {
    CHECK(Names(from_tensors.buckets[b]) == Names(from_sizes.buckets[b]));
    CHECK(from_tensors.buckets[b].num_bytes == from_sizes.buckets[b].num_bytes);
  }
}

TEST_CASE("Unknown or repeated names and a non-positive limit are refused") {
  const EngineLayout layout = MakeEngineLayout(testing::SmallModelDecls());
  std::vector<NamedSize> sizes = SmallModelSizes();
  sizes.push_back({"model.layers.7.mlp.gate_proj.weight", 16});
  CHECK_THROWS_WITH(PlanBuckets(sizes, layout, 100),
                    Catch::Contains("1 tensor(s) not in the engine layout: "
                                    "model.layers.7.mlp.gate_proj.weight"));
  sizes.back() = sizes.front();
  CHECK_THROWS_WITH(PlanBuckets(sizes, layout, 100),
                    Catch::Contains("given twice: model.embed_tokens.weight"));
  CHECK_THROWS_AS(PlanBuckets(SmallModelSizes(), layout, 0), ConfigError);
}

}  // namespace
}  // namespace rl::weight_sync
