// The bucket plan of a weight sync: which actor tensors travel together.
//
// The reference system moves weights in buckets of at most --update-weight-buffer-size bytes:
// routed-expert and non-expert tensors in separate bucket streams, non-expert buckets first, and
// "atomic update units" never split across buckets. Here an atomic unit is the set of HF tensors
// that make up one engine tensor (all parts of a fused qkv_proj or gate_up_proj, Note [Engine
// fusion rules]), so an engine tensor is never half-updated between two buckets.
//
// Packing is greedy and keeps the order of the input: units in the order of their first tensor,
// the tensors of one unit in input order; a bucket is closed when the next unit would take it past
// max_bucket_bytes. A unit larger than the limit gets a bucket of its own. Byte counts are the
// actor tensors' (numel * element size of the tensor as given), i.e. what one bucket moves.
//
// Failures: PlanBuckets throws rl::ConfigError for max_bucket_bytes <= 0 and rl::Error naming
// the tensors that the layout does not know or that appear twice.
// Thread safety: pure functions.
#ifndef RL_WEIGHT_SYNC_BUCKETING_H_
#define RL_WEIGHT_SYNC_BUCKETING_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "launch/named_tensors.h"
#include "weight_sync/engine_layout.h"

namespace rl::weight_sync {

enum class BucketStream {
  kNonExpert,  // everything but routed experts; sent first
  kExpert,     // routed experts (IsRoutedExpert)
};

struct NamedSize {
  std::string name;
  int64_t num_bytes = 0;
};

struct Bucket {
  BucketStream stream = BucketStream::kNonExpert;
  int64_t num_bytes = 0;  // sum of entries' num_bytes
  std::vector<NamedSize> entries;
};

// All non-expert buckets, then all expert buckets.
struct BucketPlan {
  std::vector<Bucket> buckets;
  int64_t total_bytes = 0;
};

BucketPlan PlanBuckets(const std::vector<NamedSize>& tensors, const EngineLayout& layout,
                       int64_t max_bucket_bytes);

// Same, sized from the tensors themselves (numel * element_size()).
BucketPlan PlanBuckets(const NamedTensors& tensors, const EngineLayout& layout,
                       int64_t max_bucket_bytes);

}  // namespace rl::weight_sync

#endif  // RL_WEIGHT_SYNC_BUCKETING_H_
