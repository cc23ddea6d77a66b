// The training actor of one rank: the policy model computing from the ZeRO-1 optimizer's param
// buffers, and one rollout's training (old log-probs, advantages, micro-batches, optimizer steps).
//
// Ownership: the optimizer owns the trained params (views into its flat buffers); the actor owns
// the fp32 extras (MoE e_score_correction_bias, not trained) and the frozen params
// (--freeze-params, not in any buffer). The Decoder computes from all three through handles, so
// every in-place write to the buffers (step, rebuild, restore) is seen.
//
// Data split: each optimizer step covers --global-batch-size consecutive samples of the rollout,
// split over the DP ranks in equal counts, by default into sets of close token sums
// (--balance-data; --no-balance-data deals them strided, sample i to rank i % dp, the reference's
// default), and trained in micro-batches of --micro-batch-size samples or, with
// --use-dynamic-batch-size, of at most --max-tokens-per-gpu padded tokens, right-padded (Note
// [Training plan] in trainer/training_plan.h).
//
// Every public method that computes is collective over the DP communicator (Train's steps, the
// metric and token-count all-reduces, and with --normalize-advantages one all-reduce of the
// whitening statistics per Train call) and must be called on every rank in the same order.
#ifndef RL_TRAINER_ACTOR_H_
#define RL_TRAINER_ACTOR_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "backup/tensor_backuper.h"
#include "launch/communicator.h"
#include "optimizer/distributed_optimizer.h"
#include "trainer/config/validate.h"
#include "trainer/model/decoder.h"
#include "trainer/model/model_config.h"
#include "trainer/model/params.h"
#include "trainer/model/tensor_parallel.h"
#include "trainer/parallel_groups.h"
#include "trainer/rl/losses.h"
#include "trainer/rl/rollout_data.h"
#include "trainer/routing_replay.h"
#include "trainer/training_plan.h"

namespace rl {

// Per micro-batch [mb, max_response_len] response-aligned tensors, in plan order.
using PerMicroBatch = std::vector<at::Tensor>;
// Per micro-batch, in plan order, the choices of each layer (Note [Routing replay modes]).
using PlanRouting = std::vector<LayerRouting>;
// What the forwards of a plan replay: expert ids and DSA indexer selections (empty: none).
struct PlanReplay {
  PlanRouting experts;
  PlanRouting indexer;
  ReplayInputs For(size_t micro_batch) const {
    return {experts.empty() ? nullptr : &experts.at(micro_batch),
            indexer.empty() ? nullptr : &indexer.at(micro_batch)};
  }
};

struct TrainResult {
  rl_algo::LossMetrics metrics;             // of the last step
  rl_algo::LossMetrics first_step_metrics;  // of the first step (the CI check of its ppo_kl)
  double grad_norm = 0;
  double lr = 0;
  int64_t steps = 0;
  int64_t tokens = 0;  // tokens this rank trained on (prompt + response)
  // Note [Log-prob mismatch] in trainer/rl/losses.h; absent when some sample has no engine
  // log-probs.
  std::optional<rl_algo::LogProbMismatch> mismatch;
  // With routing replay, over all ranks: the (token, MoE layer) pairs the training forwards
  // replayed, and how many of them used other experts than replayed (must be 0).
  int64_t routing_replayed = 0;
  int64_t routing_differing = 0;
};

// How the model's parameters divide: trained (in the optimizer's buffers), fp32 extras, frozen.
// The freeze regex is matched against the checkpoint names (model::HfLayout), so a stacked expert
// parameter is frozen when every expert tensor it holds matches; a regex that matches only some of
// them is a ConfigError naming --freeze-params (a parameter is trained or frozen as a whole).
// `expert_ranks`: the EP size `specs` are sharded for (Note [Expert shard]); the regex is matched
// against every EP rank's expert names, so the split is the same at every EP size and on every
// rank.
struct ParamSplit {
  std::vector<ParamSpec> trained;  // in order of first use
  std::vector<ParamSpec> extras;
  std::vector<ParamSpec> frozen;
};
ParamSplit SplitParams(const std::vector<ParamSpec>& specs, const std::string& freeze_regex,
                       int64_t expert_ranks = 1);

class Actor {
 public:
  // Bytes the actor asks its allocator for, per region tag (param_buffer, grad_buffer,
  // optimizer, extras), so that the caller can size its memory regions first.
  // `expert_dp_size`: the expert data-parallel group's size (0: dp_size).
  static std::map<RegionTag, int64_t> StorageBytes(const config::ResolvedConfig& resolved,
                                                   const model::ModelConfig& model, int dp_size,
                                                   int expert_dp_size = 0);

  // `model` holds this rank's experts (model.expert_shard, Note [Expert shard]) and slices
  // (model.tensor_shard, Note [Tensor shard]), and `groups` has the matching groups; forwards are
  // collectives over the EP or TP group. Under TP the ranks of a TP group train on the same
  // samples (their DP rank's), with sequence parallelism when --sequence-parallel or the model is
  // MoE.
  Actor(const config::ResolvedConfig& resolved, model::ModelConfig model,
        const ParallelGroups& groups, c10::Device device, const optimizer::Allocator& allocate);

  // Fills the params from --hf-checkpoint or randomly (--init random, --seed), then the masters.
  void LoadInitialWeights();

  const model::ModelConfig& model_config() const { return model_; }
  optimizer::DistributedOptimizer& optimizer() { return *optimizer_; }
  c10::Device device() const { return device_; }

  // Every model tensor in ListParams order (params, extras, frozen): the backuper's source.
  NamedTensors SourceTensors() const;
  NamedTensors Extras() const;
  // Identities of the tensors that live in the optimizer's param buffers.
  std::unordered_set<const void*> ParamBufferIds() const;
  // Every model tensor by name, this rank's experts only (the backuper's, the engine's).
  model::TensorMap AllTensors() const;
  // Writes the weights into `dir` as a Hugging Face checkpoint of the whole model (config.json
  // included, every expert): rank 0 alone, under expert parallelism the ranks together (Note
  // [Expert-parallel saves] in trainer/model/params.h), under tensor parallelism rank 0 after
  // gathering the slices over TP. Collective over the world.
  void WriteHfCheckpoint(const std::string& dir) const;
  // The trained params, in use order, of this model with its experts spread over `ep_size` ranks
  // and its slices those of `tensor_shard` (what the optimizer of such a job lays out; for
  // resharding checkpoints).
  std::vector<ParamSpec> TrainedParams(int64_t ep_size,
                                       model::ModelConfig::TensorShard tensor_shard) const;

  // Log-probs [mb, T] of the plan's samples under the current weights, no autograd. MoE routing
  // replays `replay` when given and is recorded into `record` when given.
  PerMicroBatch ComputeLogProbs(const rl_algo::RolloutBatch& batch, const TrainingPlan& plan,
                                const PlanReplay* replay = nullptr,
                                PlanRouting* record = nullptr) const;
  // The rollout engine's records of the plan's samples, packed per micro-batch: expert ids (R3)
  // and indexer selections, each when asked for.
  PlanReplay RolloutReplay(const rl_algo::RolloutBatch& batch, const TrainingPlan& plan,
                           bool experts, bool indexer) const;
  // Every DP rank's plan for `batch` (Note [Training plan]), from the config's batch options,
  // indexed by rank: the same on every rank, with no communication, so that the caller can report
  // each rank's share, e.g. PlanTokens(plans[r], SampleTokens(batch)). This rank's is [dp_rank].
  std::vector<TrainingPlan> PlansForAllRanks(const rl_algo::RolloutBatch& batch) const;

  // Trains on one rollout. `old_log_probs` and `ref_log_probs` come from ComputeLogProbs with the
  // same plan (ref may be empty when there is no reference model). The advantages of every
  // micro-batch are computed before the first step, so that --normalize-advantages whitens over
  // the whole rollout (all DP ranks' trainable tokens), not over one micro-batch.
  // `replay`, when given, is the routing the training forwards replay (Note [Routing replay
  // modes]).
  TrainResult Train(const rl_algo::RolloutBatch& batch, const TrainingPlan& plan,
                    const PerMicroBatch& old_log_probs, const PerMicroBatch& ref_log_probs,
                    const PlanReplay* replay = nullptr);

  // WriteHfCheckpoint, logged, with a barrier at the end (--save-hf). Collective.
  void SaveHf(const std::string& dir) const;

 private:
  // Under TP: every param whole, its slices gathered from the TP group. Collective over it.
  model::TensorMap GatherTensorParallel(const model::TensorMap& local) const;

  const config::ResolvedConfig& resolved_;
  model::ModelConfig model_;
  const ParallelGroups& groups_;
  Communicator& comm_;  // groups_.dp()
  c10::Device device_;
  at::ScalarType dtype_;
  std::vector<ParamSpec> specs_;
  std::unique_ptr<optimizer::DistributedOptimizer> optimizer_;
  model::TensorMap extras_;
  model::TensorMap frozen_;
  std::unique_ptr<model::Decoder> decoder_;
  // Under TP: the partial gradients summed before each step (Note [Tensor-parallel gradients]).
  std::unique_ptr<model::TensorParallelGrads> tp_grads_;
  // Under sequence parallelism the micro-batch's positions (batch x seq) must divide by TP:
  // sequences are right-padded to a multiple of this.
  int64_t seq_multiple_ = 1;
  rl_algo::LossOptions loss_options_;
};

}  // namespace rl

#endif  // RL_TRAINER_ACTOR_H_
