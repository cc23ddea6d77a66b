// Note [Param buffer layout]: reverse order, 64-element alignment, lcm(dp, 128) padding, and
// shards that tile the buffer, for odd sizes and many params.
#include "optimizer/buffer_layout.h"

#include <catch2/catch.hpp>

#include <numeric>
#include <random>

namespace rl::optimizer {
namespace {

std::vector<ParamSpec> RandomParams(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dim(1, 97);
  std::vector<ParamSpec> params;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> shape = {dim(rng)};
    if (i % 3 != 0) shape.push_back(dim(rng));
    params.push_back({"p" + std::to_string(i) + (i % 5 == 0 ? ".bias" : ".weight"), shape});
  }
  return params;
}

TEST_CASE("entries are in reverse order of use, aligned to 64, without overlap") {
  const std::vector<ParamSpec> params = RandomParams(200, 1);
  const BufferLayout layout = MakeBufferLayout(params, 3);
  REQUIRE(layout.entries.size() == params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(layout.entries[i].name == params[params.size() - 1 - i].name);
    CHECK(layout.entries[i].offset % kParamAlignment == 0);
    if (i > 0) {
      const BufferEntry& prev = layout.entries[i - 1];
      CHECK(layout.entries[i].offset >= prev.offset + prev.numel);
      CHECK(layout.entries[i].offset < prev.offset + prev.numel + kParamAlignment);
    }
  }
  const BufferEntry& last = layout.entries.back();
  CHECK(layout.numel >= last.offset + last.numel);
}

TEST_CASE("the padded size is a multiple of lcm(dp, 128) for odd DP sizes") {
  const std::vector<ParamSpec> params = RandomParams(37, 2);
  for (int64_t dp : {1, 2, 3, 5, 6, 7, 8, 12, 96}) {
    const BufferLayout layout = MakeBufferLayout(params, dp);
    CAPTURE(dp);
    CHECK(layout.numel % dp == 0);
    CHECK(layout.numel % 128 == 0);
    CHECK(layout.numel % std::lcm(dp, int64_t{128}) == 0);
    const BufferEntry& last = layout.entries.back();
    CHECK(layout.numel - (last.offset + last.numel) < std::lcm(dp, int64_t{128}));
  }
}

TEST_CASE("shards tile the buffer and their segments cover every param element exactly once") {
  const std::vector<ParamSpec> params = RandomParams(150, 3);
  for (int64_t dp : {1, 2, 3, 7}) {
    const BufferLayout layout = MakeBufferLayout(params, dp);
    std::vector<int64_t> covered(layout.entries.size(), 0);
    for (int64_t r = 0; r < dp; ++r) {
      CHECK(layout.shard_offset(r) == r * layout.shard_numel());
      int64_t last_end = 0;
      for (const ShardSegment& s : layout.Segments(r)) {
        CHECK(s.shard_offset >= last_end);
        CHECK(s.shard_offset + s.numel <= layout.shard_numel());
        CHECK(s.buffer_offset == layout.shard_offset(r) + s.shard_offset);
        last_end = s.shard_offset + s.numel;
        covered[s.entry] += s.numel;
      }
    }
    for (size_t i = 0; i < covered.size(); ++i) {
      CAPTURE(dp, i);
      CHECK(covered[i] == layout.entries[i].numel);
    }
  }
}

TEST_CASE("weight decay skips biases and 1-D params") {
  CHECK(DecaysWeight("model.layers.0.mlp.up_proj.weight", {4, 4}));
  CHECK_FALSE(DecaysWeight("model.layers.0.input_layernorm.weight", {4}));
  CHECK_FALSE(DecaysWeight("model.layers.0.self_attn.q_proj.bias", {4}));
}

TEST_CASE("an empty buffer still has one padded shard per rank") {
  const BufferLayout layout = MakeBufferLayout({}, 2);
  CHECK(layout.entries.empty());
  CHECK(layout.numel == 128);
  CHECK(layout.Segments(1).empty());
}

}  // namespace
}  // namespace rl::optimizer
