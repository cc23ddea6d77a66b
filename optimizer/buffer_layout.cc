#include "optimizer/buffer_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "launch/check.h"

namespace rl::optimizer {
namespace {
int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
}  // namespace

bool DecaysWeight(const std::string& name, const std::vector<int64_t>& shape) {
  const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  return shape.size() > 1 && !bias;
}

BufferLayout MakeBufferLayout(const std::vector<ParamSpec>& params_in_use_order,
                              int64_t dp_size) {
  RL_CHECK(dp_size >= 1, Error, "buffer layout: dp_size must be >= 1, got {}", dp_size);
  BufferLayout layout;
  layout.dp_size = dp_size;
  int64_t cursor = 0;
  for (auto it = params_in_use_order.rbegin(); it != params_in_use_order.rend(); ++it) {
    BufferEntry entry;
    entry.name = it->name;
    entry.shape = it->shape;
    entry.numel = it->numel();
    entry.offset = RoundUp(cursor, kParamAlignment);
    entry.weight_decay = DecaysWeight(it->name, it->shape);
    entry.tp_dim = it->tp_dim;
    entry.tp_start = it->tp_start;
    entry.tp_extent = it->tp_extent;
    cursor = entry.offset + entry.numel;
    layout.entries.push_back(std::move(entry));
  }
  const int64_t pad_multiple = std::lcm(dp_size, kBufferPadMultiple);
  layout.numel = RoundUp(std::max<int64_t>(cursor, 1), pad_multiple);
  return layout;
}

std::vector<ShardSegment> BufferLayout::Segments(int64_t dp_rank) const {
  const int64_t begin = shard_offset(dp_rank);
  const int64_t end = begin + shard_numel();
  std::vector<ShardSegment> segments;
  for (size_t i = 0; i < entries.size(); ++i) {
    const BufferEntry& e = entries[i];
    const int64_t lo = std::max(begin, e.offset);
    const int64_t hi = std::min(end, e.offset + e.numel);
    if (lo < hi) segments.push_back({lo - begin, lo, hi - lo, i});
  }
  return segments;
}

std::string BufferLayout::Describe() const {
  std::string out = fmt::format("numel {} dp {}\n", numel, dp_size);
  for (const BufferEntry& e : entries) {
    out += fmt::format("{} [{}] @{}\n", e.name, fmt::join(e.shape, ","), e.offset);
  }
  return out;
}

}  // namespace rl::optimizer
