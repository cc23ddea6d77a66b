// The rollout side of the colocated cycle, as the cycle sees it: it generates an iteration's
// samples, sleeps and wakes in two steps (weights, then KV cache) around the actor's turn, and
// receives every weight sync. Two implementations: the rollout engine (engine_rollout.h) and the
// replay of recorded rollout data (MakeReplayRollout, below).
//
// Ownership: the cycle owns its Rollout. Memory lives in regions of the process's RegionManager,
// which outlives it. Thread safety: none; the trainer's main thread drives it. Every rank calls
// the same methods in the same order (the engine's generation and checks are per rank, but the
// cycle around them is collective). Failures: CheckWeights throws rl::Error naming the
// differences; ImportState throws CheckpointError; the rest throw as their implementation says.
#ifndef RL_TRAINER_ROLLOUT_H_
#define RL_TRAINER_ROLLOUT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "launch/json.h"
#include "launch/named_tensors.h"
#include "trainer/config/validate.h"
#include "trainer/rl/rollout_data.h"
#include "weight_sync/weight_sync.h"

namespace rl {

// What each data-parallel rank's engine generated in one Generate, one entry per rank.
struct GenerationShares {
  std::vector<int64_t> samples;
  std::vector<int64_t> response_tokens;
  // How this rank's engine ran it (Note [Rollout batching] in rollout/engine.h): prefill
  // forwards, decode steps, and live rows summed over the decode steps.
  int64_t prefills = 0;
  int64_t decode_steps = 0;
  int64_t row_steps = 0;
};

class Rollout {
 public:
  virtual ~Rollout() = default;
  // This iteration's samples; the same on every rank. Collective for the engine (its ranks
  // exchange their shares).
  virtual rl_algo::RolloutBatch Generate(int64_t iteration) = 0;
  // The shares of the last Generate; empty when nothing was generated (a replay).
  virtual GenerationShares last_shares() const { return {}; }
  virtual void Sleep() {}        // release weights and KV cache
  virtual void WakeWeights() {}  // weights back (contents undefined until the sync)
  virtual void WakeKvCache() {}
  // Takes the actor's weights (backuper.Get("actor"), HF names) and their version.
  virtual weight_sync::SyncStats ReceiveWeights(const NamedTensors& weights, int64_t version) = 0;
  // CI: compares its weights with `weights` (SHA256) and its version with `version`
  // (weight_sync::CheckWeightVersion); throws rl::Error naming the differences.
  virtual void CheckWeights(const NamedTensors& weights, int64_t version) = 0;
  // What a checkpoint must carry for Generate to continue where it stopped (the prompt
  // dataset's position); null when Generate depends on the iteration alone.
  virtual json::Value ExportState() const { return json::Value(); }
  // Throws CheckpointError when `state` does not fit this rollout (another dataset or seed).
  virtual void ImportState(const json::Value& state) { (void)state; }
};

// Replays --load-debug-rollout-data: iteration i gets the i-th chunk of rollout_batch_size x
// n_samples_per_prompt samples, cycling. It holds no device memory, so Sleep and the wakes do
// nothing; every weight sync is still read and hashed (not kept), so the whole cycle, CI checks
// included, runs without an engine. Throws what ReadRolloutData throws, and ConfigError when the
// file holds fewer samples than one rollout.
std::unique_ptr<Rollout> MakeReplayRollout(const config::ResolvedConfig& resolved);

}  // namespace rl

#endif  // RL_TRAINER_ROLLOUT_H_
