// Weight sync: copies the actor's weights (HF-named tensors) into the rollout engine's storage,
// bucket by bucket, converted to the engine's layout; and the checks that the copy landed.
//
// Flow (docs/colocated-cycle.md, step 9): the tensors are planned into buckets (bucketing.h: non-expert stream first, fused groups
// kept together) and each bucket is copied into the engine storage through the HF views of the
// engine layout (engine_layout.h). The caller numbers the syncs (the actor's weight version) and
// gives the engine the new number only once Sync has returned, so a sync that fails part-way
// leaves the engine at its old version with partly new weights, and CheckWeightVersion fails
// until a sync succeeds.
//
// Copies: `copy_` into the engine's HF view of each tensor, so dtype conversion (e.g. an fp32
// actor tensor into a bf16 engine tensor) and cross-device copies (pinned host or another GPU to
// the engine's GPU) go through ATen. Same-device copies and copies from pinned host memory
// without a dtype change are issued non-blocking; every device a bucket touched is synchronised
// once at the end of the bucket, so the actor tensors of a bucket may be released after it. No
// NCCL: actor and engine share the process.
//
// Update-equality check (CheckWeightsEqual, --check-weight-update-equal): SHA-256
// (rl::TensorSha256, Note [Tensor digest scheme]) of each actor tensor against the engine's HF
// view of it, tensor by tensor. The comparison is exact. Where the engine holds a different dtype
// than the actor, the actor tensor is first converted to the engine dtype (the conversion the sync
// does), so the check then says "the engine holds exactly the engine-dtype rounding of the actor
// tensor", not that the actor's own bits are in the engine.
//
// Failures: every function throws rl::Error naming the tensors concerned: names missing from the
// actor list, names the engine layout does not know, duplicates, shape mismatches, undefined
// tensors (all found before anything is copied), and for the checks the count and first names of
// the tensors that differ. Sync / PlanBuckets throw rl::ConfigError for max_bucket_bytes <= 0.
// Thread safety: the functions are stateless; callers must not run two syncs into one storage at
// once.
#ifndef RL_WEIGHT_SYNC_WEIGHT_SYNC_H_
#define RL_WEIGHT_SYNC_WEIGHT_SYNC_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "launch/named_tensors.h"
#include "weight_sync/bucketing.h"
#include "weight_sync/engine_layout.h"

namespace rl::weight_sync {

struct SyncStats {
  int64_t num_tensors = 0;
  int64_t num_bytes = 0;  // bytes of the actor tensors read
  int64_t num_buckets = 0;
  int64_t num_expert_buckets = 0;            // of num_buckets
  std::chrono::duration<double> elapsed{0};  // planning + copies + synchronisation
};

// Copies every actor tensor into `engine_storage` laid out as `layout`. The actor list must hold
// exactly the HF names of the layout with their declared shapes (any dtype and device). Throws
// before copying anything if it does not.
SyncStats Sync(const NamedTensors& actor_tensors, const EngineLayout& layout,
               const at::Tensor& engine_storage, int64_t max_bucket_bytes);

// The update-equality check; see the contract above. Throws rl::Error
// "weight update check failed: 2 of 57 tensors differ after sync: a, b".
void CheckWeightsEqual(const NamedTensors& actor_tensors, const EngineLayout& layout,
                       const at::Tensor& engine_storage);

// The weight version is the number of syncs the actor has sent (0: the checkpoint's weights);
// the receiving side stores the number of the last sync it received in full. Throws rl::Error
// "weight version mismatch: actor N, engine M; ..." when they differ.
void CheckWeightVersion(int64_t actor, int64_t engine);

}  // namespace rl::weight_sync

#endif  // RL_WEIGHT_SYNC_WEIGHT_SYNC_H_
