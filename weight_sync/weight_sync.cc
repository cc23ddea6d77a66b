#include "weight_sync/weight_sync.h"

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "launch/check.h"
#include "launch/sha256.h"
#include "launch/names.h"

namespace rl::weight_sync {
namespace {

// The shape the layout declares for HF tensor `name` (its rows of the engine tensor).
std::vector<int64_t> HfShape(const EngineLayout& layout, const EngineLayout::Location& location) {
  std::vector<int64_t> shape = layout.tensors[location.tensor].shape;
  if (!shape.empty()) shape[0] = location.rows;
  return shape;
}

// name -> actor tensor, after checking that the actor list is exactly the layout's HF names with
// their declared shapes. Every problem is listed in one rl::Error.
std::unordered_map<std::string, const at::Tensor*> IndexActorTensorsOrThrow(
    const NamedTensors& actor_tensors, const EngineLayout& layout, const char* doing) {
  std::unordered_map<std::string, const at::Tensor*> by_name;
  std::vector<std::string> duplicate, undefined, unexpected, missing, mismatched;
  for (const auto& [name, tensor] : actor_tensors) {
    if (!by_name.emplace(name, &tensor).second) {
      duplicate.push_back(name);
      continue;
    }
    auto location = layout.locations.find(name);
    if (location == layout.locations.end()) {
      unexpected.push_back(name);
      continue;
    }
    if (!tensor.defined()) {
      undefined.push_back(name);
      continue;
    }
    const std::vector<int64_t> shape = HfShape(layout, location->second);
    if (tensor.sizes() != at::IntArrayRef(shape)) {
      mismatched.push_back(fmt::format("{} [{}] vs engine [{}]", name,
                                       fmt::join(tensor.sizes(), ", "), fmt::join(shape, ", ")));
    }
  }
  for (const EngineTensor& engine_tensor : layout.tensors) {
    for (const Part& part : engine_tensor.parts) {
      if (by_name.count(part.hf_name) == 0) missing.push_back(part.hf_name);
    }
  }
  std::vector<std::string> problems;
  auto add = [&](const std::vector<std::string>& names, const char* what) {
    if (!names.empty()) {
      problems.push_back(fmt::format("{} {}: {}", names.size(), what, FirstNames(names)));
    }
  };
  add(missing, "missing from the actor's tensors");
  add(unexpected, "not in the engine layout");
  add(mismatched, "with a shape the engine does not have");
  add(duplicate, "given twice");
  add(undefined, "undefined");
  RL_CHECK(problems.empty(), Error,
           "{}: the actor's tensors do not match the engine layout ({}); the actor and the "
           "engine must be built from the same model config",
           doing, fmt::join(problems, "; "));
  return by_name;
}

// A copy that needs no host-side wait: on one device, or from pinned host memory to a GPU without
// a dtype change (which ATen would stage through a pageable temporary).
bool CanCopyNonBlocking(const at::Tensor& src, const at::Tensor& dst) {
  if (src.device() == dst.device()) return true;
  return src.is_cpu() && !dst.is_cpu() && src.scalar_type() == dst.scalar_type() && src.is_pinned();
}

void SynchronizeDevices(const std::vector<c10::Device>& devices) {
  for (const c10::Device& device : devices) {
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device.type());
    impl->getStream(device).synchronize();
  }
}

}  // namespace

SyncStats Sync(const NamedTensors& actor_tensors, const EngineLayout& layout,
               const at::Tensor& engine_storage, int64_t max_bucket_bytes) {
  const auto start = std::chrono::steady_clock::now();
  const auto by_name = IndexActorTensorsOrThrow(actor_tensors, layout, "weight sync");
  const BucketPlan plan = PlanBuckets(actor_tensors, layout, max_bucket_bytes);
  std::unordered_map<std::string, at::Tensor> views = HfViews(layout, engine_storage);

  SyncStats stats;
  for (const Bucket& bucket : plan.buckets) {
    std::vector<c10::Device> touched;
    auto touch = [&](const c10::Device& device) {
      if (device.is_cpu()) return;
      if (std::find(touched.begin(), touched.end(), device) == touched.end()) {
        touched.push_back(device);
      }
    };
    for (const NamedSize& entry : bucket.entries) {
      const at::Tensor& src = *by_name.at(entry.name);
      at::Tensor& dst = views.at(entry.name);
      dst.copy_(src, CanCopyNonBlocking(src, dst));
      touch(src.device());
      touch(dst.device());
    }
    SynchronizeDevices(touched);  // the bucket's actor tensors may be released from here on
    stats.num_tensors += static_cast<int64_t>(bucket.entries.size());
    stats.num_bytes += bucket.num_bytes;
    stats.num_buckets += 1;
    if (bucket.stream == BucketStream::kExpert) stats.num_expert_buckets += 1;
  }
  stats.elapsed = std::chrono::steady_clock::now() - start;
  return stats;
}

void CheckWeightsEqual(const NamedTensors& actor_tensors, const EngineLayout& layout,
                       const at::Tensor& engine_storage) {
  IndexActorTensorsOrThrow(actor_tensors, layout, "weight update check");
  const std::unordered_map<std::string, at::Tensor> views = HfViews(layout, engine_storage);
  std::vector<std::string> differing;
  for (const auto& [name, actor] : actor_tensors) {
    const at::Tensor& engine = views.at(name);
    // Same dtype on both sides, so the digests compare bits (see the header's contract).
    const at::Tensor expected =
        actor.scalar_type() == engine.scalar_type() ? actor : actor.to(engine.scalar_type());
    if (TensorSha256(expected) != TensorSha256(engine)) differing.push_back(name);
  }
  RL_CHECK(differing.empty(), Error,
           "weight update check failed: {} of {} tensors differ after sync: {}", differing.size(),
           actor_tensors.size(), FirstNames(differing));
}

void CheckWeightVersion(int64_t actor, int64_t engine) {
  RL_CHECK(actor == engine, Error,
           "weight version mismatch: actor {}, engine {}; the last weight sync did not complete",
           actor, engine);
}

}  // namespace rl::weight_sync
