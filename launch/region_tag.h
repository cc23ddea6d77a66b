// The tags of the pausable memory regions (trainer/memory/region.h) and the alignment of what is
// carved out of them, in the lowest layer so that every package that asks for storage (the
// optimizer's buffers, the actor's extras, the rollout engine's weights and KV cache) names its
// region by this enum and sizes its requests with the same rounding the region manager carves
// with: no tag travels as a string, and the two sides cannot disagree about sizes.
//
// Plain constants: no state, no failure modes.
#ifndef RL_LAUNCH_REGION_TAG_H_
#define RL_LAUNCH_REGION_TAG_H_

#include <array>
#include <cstdint>
#include <string_view>

namespace rl {

// The regions the trainer knows; each is created at most once per process.
enum class RegionTag {
  kParamBuffer,     // bf16 params (no backup; rematerialized from masters)
  kGradBuffer,      // fp32 grads (no backup; zeroed before use)
  kOptimizer,       // fp32 masters and Adam moments (saved on pause)
  kExtras,          // tensors with no master (restored by the backuper)
  kRolloutWeights,  // the rollout engine's weights
  kKvCache,         // the rollout engine's KV cache
};

inline constexpr std::array<RegionTag, 6> kAllRegionTags = {
    RegionTag::kParamBuffer, RegionTag::kGradBuffer,     RegionTag::kOptimizer,
    RegionTag::kExtras,      RegionTag::kRolloutWeights, RegionTag::kKvCache,
};

// Carve offsets are multiples of this: every tensor carved starts aligned for any dtype and for
// vectorised kernels.
inline constexpr int64_t kAllocationAlignmentBytes = 256;
// `bytes` rounded up to kAllocationAlignmentBytes: what one allocation of that size occupies.
constexpr int64_t AlignedAllocationBytes(int64_t bytes) {
  return (bytes + kAllocationAlignmentBytes - 1) / kAllocationAlignmentBytes *
         kAllocationAlignmentBytes;
}

// The name in logs and memory plans.
constexpr std::string_view RegionTagName(RegionTag tag) {
  switch (tag) {
    case RegionTag::kParamBuffer: return "param_buffer";
    case RegionTag::kGradBuffer: return "grad_buffer";
    case RegionTag::kOptimizer: return "optimizer";
    case RegionTag::kExtras: return "extras";
    case RegionTag::kRolloutWeights: return "rollout_weights";
    case RegionTag::kKvCache: return "kv_cache";
  }
  return "?";
}

}  // namespace rl

#endif  // RL_LAUNCH_REGION_TAG_H_
