// Trainer checkpoints (--save, --save-interval, --load): everything a run needs to continue
// exactly where it stopped, written so that a crash never leaves a checkpoint that loads.
//
// Note [Checkpoint layout]
// --save ROOT writes, for iteration N, the directory ROOT/iter_000000N/:
//   config.json, model.safetensors (or shards + index), and the tokenizer files copied from
//       --hf-checkpoint: the actor as a Hugging Face checkpoint (`transformers` loads it);
//   optimizer/rank_0000R.safetensors, one per rank R of the job: the fp32 masters and Adam
//       moments of its shard ("dense.master", "dense.exp_avg", ...) and its CPU RNG state
//       ("rng.cpu"); the metadata holds the step, the DP rank and size, the TP rank and size and
//       each buffer's layout (under TP a shard of the rank's slices of the params);
//   trainer_state.json: format and version, the iteration completed, the weight version, the DP,
//       EP and TP sizes, the seed and the rollout side's state (the prompt dataset's position);
//   trainer_config.toml: the resolved config that produced it;
//   manifest.sha256: "<sha256>  <path>" for every file above (`sha256sum -c` reads it), written
//       last.
// Then ROOT/latest, one line "iter_000000N", is replaced atomically.
//
// Crash safety: the files go into ROOT/iter_000000N.partial/, each written atomically; after the
// manifest the directory is renamed to its final name and only then does `latest` move. A crash
// at any point leaves `latest` naming the previous complete checkpoint; a leftover .partial
// directory is never loaded and is removed by the next save of that iteration.
//
// Note [Re-saving]
// Saving an iteration that ROOT already holds (a resumed job with nothing left to run saves the
// loaded state again) replaces the old directory, which `latest` may name already. Two renames
// (the old one aside, the new one in) would leave, after a crash between them, `latest` naming a
// directory that is not there. So the new directory and the old one are exchanged in one step
// (renameat2 with RENAME_EXCHANGE: after a crash the final name holds one complete checkpoint or
// the other), and the old one, now under the .partial name, is removed. Where the file system
// cannot exchange, the old directory is renamed to iter_000000N.old first, and loading through
// `latest` falls back to it when iter_000000N has no manifest, so a crash between the renames
// still loads the earlier save of that iteration.
//
// Loading verifies, before anything is read, that the manifest lists the files the loader needs
// and that each file this rank reads has the recorded SHA256; a missing manifest, a missing file
// or a digest that differs is a CheckpointError naming the file. A job of other DP, EP or TP
// sizes reads every saved shard and reshards the optimizer state (Note [Resharding optimizer
// state] in optimizer/distributed_optimizer.h); a job of the same sizes reads only its own shard.
// Either way, another buffer layout (another model, --freeze-params) is refused with what
// differs. Nothing left to run after a load (--num-rollout equal to the saved iteration) with
// --save set saves the loaded state again, in this job's layout.
//
// Randomness: every random draw of a run derives from (--seed, iteration, prompt) (Note [Rollout
// seeds]), so the iteration and the dataset position restore it; torch's CPU generator state is
// saved per rank as well, for any draw that does not.
//
// The directory must be on a file system every rank sees (rank 0 writes the shared files, each
// rank its own optimizer shard).
// Failures: CheckpointError for every file problem; CommError from the collectives.
#ifndef RL_TRAINER_CHECKPOINT_H_
#define RL_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>

#include "launch/communicator.h"
#include "launch/json.h"
#include "trainer/actor.h"
#include "trainer/config/config.h"
#include "trainer/parallel_groups.h"

namespace rl {

// What the loop carries through a checkpoint besides the actor.
struct LoopState {
  int64_t iteration = 0;       // iterations completed
  int64_t weight_version = 0;  // weight syncs done before this iteration's sync
  json::Value rollout;         // the rollout side's state; null when it has none
};

// Writes the checkpoint of `state.iteration` under `root` and moves `latest` to it. Collective.
// Returns the checkpoint's directory.
std::string SaveCheckpoint(const std::string& root, const LoopState& state, Actor& actor,
                           const config::Config& config, const ParallelGroups& groups);

// `path`: a checkpoint directory or a --save root (the checkpoint its `latest` names). Verifies,
// then loads the actor's weights, this rank's optimizer shard and its CPU RNG state, and rebuilds
// the params from the masters. Collective (the param all-gather).
LoopState LoadCheckpoint(const std::string& path, Actor& actor, const ParallelGroups& groups);

// Seeds torch's default CPU generator from (--seed, rank) at start-up: every run begins from the
// same per-rank state, which checkpoints then carry (torch seeds it from /dev/urandom otherwise).
void SeedDefaultGenerator(int64_t seed, int rank);

// The checkpoint directory `path` names: itself when it holds a manifest, else the one named by
// its `latest`. Throws CheckpointError when it is neither.
std::string ResolveCheckpointDir(const std::string& path);

// The manifest of checkpoint `dir`: relative path -> SHA256. Throws CheckpointError naming the
// manifest (absent, or a malformed line with its number).
std::map<std::string, std::string> ReadManifest(const std::string& dir);

}  // namespace rl

#endif  // RL_TRAINER_CHECKPOINT_H_
