#include "weight_sync/bucketing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_map>

#include "launch/check.h"
#include "launch/names.h"

namespace rl::weight_sync {
namespace {

// One atomic unit: the tensors of one engine tensor present in the input.
struct Unit {
  BucketStream stream = BucketStream::kNonExpert;
  int64_t num_bytes = 0;
  std::vector<NamedSize> entries;
};

void Pack(const std::vector<Unit>& units, BucketStream stream, int64_t max_bucket_bytes,
          std::vector<Bucket>& out) {
  Bucket current;
  current.stream = stream;
  auto flush = [&] {
    if (!current.entries.empty()) out.push_back(std::move(current));
    current = Bucket();
    current.stream = stream;
  };
  for (const Unit& unit : units) {
    if (unit.stream != stream) continue;
    if (!current.entries.empty() && current.num_bytes + unit.num_bytes > max_bucket_bytes) flush();
    current.entries.insert(current.entries.end(), unit.entries.begin(), unit.entries.end());
    current.num_bytes += unit.num_bytes;
    if (current.num_bytes > max_bucket_bytes) flush();  // an oversized unit travels alone
  }
  flush();
}

}  // namespace

BucketPlan PlanBuckets(const std::vector<NamedSize>& tensors, const EngineLayout& layout,
                       int64_t max_bucket_bytes) {
  RL_CHECK(max_bucket_bytes > 0, ConfigError,
           "max_bucket_bytes (the weight-sync bucket size) must be positive, got {}",
           max_bucket_bytes);
  std::vector<std::string> unknown;
  std::vector<std::string> duplicate;
  std::unordered_map<size_t, size_t> unit_of_tensor;  // engine tensor index -> units index
  std::unordered_map<std::string, bool> seen;
  std::vector<Unit> units;
  BucketPlan plan;
  for (const NamedSize& tensor : tensors) {
    RL_CHECK(tensor.num_bytes >= 0, Error, "tensor {} has a negative size ({} bytes)", tensor.name,
             tensor.num_bytes);
    if (!seen.emplace(tensor.name, true).second) {
      duplicate.push_back(tensor.name);
      continue;
    }
    auto location = layout.locations.find(tensor.name);
    if (location == layout.locations.end()) {
      unknown.push_back(tensor.name);
      continue;
    }
    const size_t engine_index = location->second.tensor;
    auto [it, inserted] = unit_of_tensor.emplace(engine_index, units.size());
    if (inserted) {
      Unit unit;
      unit.stream =
          layout.tensors[engine_index].expert ? BucketStream::kExpert : BucketStream::kNonExpert;
      units.push_back(std::move(unit));
    }
    Unit& unit = units[it->second];
    unit.entries.push_back(tensor);
    unit.num_bytes += tensor.num_bytes;
    plan.total_bytes += tensor.num_bytes;
  }
  RL_CHECK(duplicate.empty(), Error, "weight sync: {} tensor(s) given twice: {}", duplicate.size(),
           FirstNames(duplicate));
  RL_CHECK(unknown.empty(), Error,
           "weight sync: {} tensor(s) not in the engine layout: {}; the actor and the engine "
           "disagree on the model",
           unknown.size(), FirstNames(unknown));
  Pack(units, BucketStream::kNonExpert, max_bucket_bytes, plan.buckets);
  Pack(units, BucketStream::kExpert, max_bucket_bytes, plan.buckets);
  return plan;
}

BucketPlan PlanBuckets(const NamedTensors& tensors, const EngineLayout& layout,
                       int64_t max_bucket_bytes) {
  std::vector<NamedSize> sizes;
  sizes.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    RL_CHECK(tensor.defined(), Error, "weight sync: tensor {} is undefined", name);
    sizes.push_back({name, tensor.numel() * static_cast<int64_t>(tensor.element_size())});
  }
  return PlanBuckets(sizes, layout, max_bucket_bytes);
}

}  // namespace rl::weight_sync
