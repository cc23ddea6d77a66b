// The colocated RL loop of one rank: the iteration of DESIGN.md ("One iteration"), phase by
// phase, with the actor's memory in pausable regions, the backuper (pinned or rematerialize),
// the weight sync into the rollout side, the CI checks, per-phase logs and the metrics file.
//
// The rollout side is behind `Rollout`: the rollout engine (generation) or a replay of recorded
// rollout data (--load-debug-rollout-data), which still receives every weight sync (it reads and
// hashes every tensor it is given) so the whole cycle runs. With --debug-train-only there is no
// rollout side, no sleep and no weight sync: the actor trains on the recorded data.
//
// Collective: every rank runs the same phases in the same order. Failures throw (CommError,
// rl::Error for a failed CI check); main ends the job.
#ifndef RL_TRAINER_COLOCATED_LOOP_H_
#define RL_TRAINER_COLOCATED_LOOP_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "launch/communicator.h"
#include "launch/json.h"
#include "launch/named_tensors.h"
#include "trainer/config/validate.h"
#include "trainer/model/model_config.h"
#include "trainer/rl/rollout_data.h"
#include "weight_sync/weight_sync.h"

namespace rl {

// The rollout side of the colocated cycle.
class Rollout {
 public:
  virtual ~Rollout() = default;
  // This iteration's samples; the same on every rank.
  virtual rl_algo::RolloutBatch Generate(int64_t iteration) = 0;
  virtual void Sleep() {}           // release weights and KV cache
  virtual void WakeWeights() {}     // weights back (contents undefined until the sync)
  virtual void WakeKvCache() {}
  // Takes the actor's weights (backuper.Get("actor"), HF names) and their version.
  virtual weight_sync::SyncStats ReceiveWeights(const NamedTensors& weights, int64_t version) = 0;
  // CI: compares its weights with `weights` (SHA256) and its version with `version`
  // (weight_sync::CheckWeightVersion); throws rl::Error naming the differences.
  virtual void CheckWeights(const NamedTensors& weights, int64_t version) = 0;
  virtual int64_t DeviceBytes() const { return 0; }
  // What a checkpoint must carry for Generate to continue where it stopped (the prompt
  // dataset's position); null when Generate depends on the iteration alone.
  virtual json::Value ExportState() const { return json::Value(); }
  // Throws CheckpointError when `state` does not fit this rollout (another dataset or seed).
  virtual void ImportState(const json::Value& state) { (void)state; }
};

// Replays recorded rollout data: iteration i gets the i-th chunk of rollout_batch_size x
// n_samples_per_prompt samples (cycling). Weight syncs are read and hashed, not kept.
std::unique_ptr<Rollout> MakeReplayRollout(const config::ResolvedConfig& resolved);

// Runs the job: init (or --load), the iterations up to --num-rollout with --save checkpoints,
// optional --save-hf. Returns normally on success.
void RunColocated(const config::ResolvedConfig& resolved, const model::ModelConfig& model,
                  Communicator& comm, c10::Device device, std::unique_ptr<Rollout> rollout);

}  // namespace rl

#endif  // RL_TRAINER_COLOCATED_LOOP_H_
