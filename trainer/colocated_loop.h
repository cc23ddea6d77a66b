// The colocated RL loop of one rank, with the actor's memory in pausable regions, the backuper
// (pinned or rematerialize), the weight sync into the rollout side, the CI checks, per-phase logs
// and the metrics file (docs/colocated-cycle.md). One iteration, phase by phase: the rollout
// side generates, then sleeps; the actor's regions wake; reference log-probs (restore "ref"); the actor is restored (rebuilt
// from the masters or copied from pinned memory, SHA256-checked in CI runs); old log-probs,
// advantages and training; the actor is backed up (and saved when due) and sleeps; the weight
// sync wakes the rollout side's weights and streams the params into them; its KV cache wakes.
//
// The rollout side is a Rollout (rollout.h): the rollout engine or a replay of recorded rollout
// data. With --debug-train-only there is no rollout side (`rollout` is null), no sleep and no
// weight sync: the actor trains on the recorded data.
//
// Ownership: `regions` (the process's RegionManager, which the rollout side also uses) must
// outlive the call; the actor's regions are created in it.
// Collective: every rank runs the same phases in the same order. Failures throw (CommError,
// rl::Error for a failed CI check); main ends the job.
#ifndef RL_TRAINER_COLOCATED_LOOP_H_
#define RL_TRAINER_COLOCATED_LOOP_H_

#include <c10/core/Device.h>

#include <memory>

#include "launch/communicator.h"
#include "trainer/config/validate.h"
#include "trainer/memory/region_manager.h"
#include "trainer/model/model_config.h"
#include "trainer/parallel_groups.h"
#include "trainer/rollout.h"

namespace rl {

// Runs the job: init (or --load), the iterations up to --num-rollout with --save checkpoints,
// optional --save-hf. Returns normally on success.
// `model` holds this rank's experts (Note [Expert shard]), as `groups` lay them out.
void RunColocated(const config::ResolvedConfig& resolved, const model::ModelConfig& model,
                  const ParallelGroups& groups, c10::Device device, memory::RegionManager& regions,
                  std::unique_ptr<Rollout> rollout);

}  // namespace rl

#endif  // RL_TRAINER_COLOCATED_LOOP_H_
