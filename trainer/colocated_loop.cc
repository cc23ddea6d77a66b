#include "trainer/colocated_loop.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <type_traits>
#include <utility>

#include "backup/tensor_backuper.h"
#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/json.h"
#include "trainer/actor.h"
#include "trainer/checkpoint.h"
#include "trainer/config/config.h"
#include "trainer/fault_injection.h"
#include "trainer/memory/process_memory.h"
#include "trainer/metrics_writer.h"
#include "trainer/model/safetensors.h"
#include "trainer/rollout.h"
#include "trainer/training_plan.h"

namespace rl {
namespace {

using Clock = std::chrono::steady_clock;
using memory::RegionTag;

constexpr std::array<RegionTag, 4> kActorRegions = {RegionTag::kParamBuffer, RegionTag::kGradBuffer,
                                                    RegionTag::kOptimizer, RegionTag::kExtras};

// Creates the actor's regions in `regions`, sized for it, and returns the allocator that carves
// its storage out of them, zero-filled (Note [Param buffer layout] needs nothing more).
optimizer::Allocator ActorRegions(const config::ResolvedConfig& resolved,
                                  const model::ModelConfig& model, const ParallelGroups& groups,
                                  memory::RegionManager& regions) {
  const std::map<RegionTag, int64_t> bytes =
      Actor::StorageBytes(resolved, model, groups.dp().size(), groups.expert_dp().size());
  for (RegionTag tag : kActorRegions) {
    // The param and grad buffers keep no host copy (the backuper or the rebuild restores the
    // params; grads are zeroed), the optimizer state is saved to the host on pause, the extras
    // are restored by the backuper from its pinned copy.
    const memory::HostBackup backup =
        tag == RegionTag::kOptimizer ? memory::HostBackup::kSaveOnPause : memory::HostBackup::kNone;
    regions.Create(tag, bytes.at(tag), backup);
  }
  return [&regions](RegionTag tag, int64_t numel, at::ScalarType dtype) {
    return regions.Carve(tag, numel, dtype).zero_();
  };
}

std::unique_ptr<backup::TensorBackuper> MakeBackuper(const config::Config& c, Actor& actor) {
  const backup::SourceGetter source = [&actor] { return actor.SourceTensors(); };
  if (!c.colocate.rematerialize_param_from_master_weight) {
    return std::make_unique<backup::PinnedBackuper>(source);
  }
  backup::MainCastContext context;
  context.cast_main_to_params = [&actor] { actor.optimizer().CastMainToParams(); };
  context.all_gather_params = [&actor] { actor.optimizer().AllGatherParams(); };
  context.extras = [&actor] { return actor.Extras(); };
  context.in_param_buffers = actor.ParamBufferIds();
  context.check = c.backup.check_rematerialize_param_from_master_weight.value_or(false);
  return std::make_unique<backup::RematerializeBackuper>(source, std::move(context));
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

json::Value IntList(const std::vector<int64_t>& values) {
  json::Value::Array array;
  for (int64_t v : values) array.push_back(json::Value::Int(v));
  return json::Value::MakeArray(std::move(array));
}

// Max over mean of per-rank counts: 1 is perfectly even; 0 when nothing was counted.
double Imbalance(const std::vector<int64_t>& per_rank) {
  int64_t sum = 0, most = 0;
  for (int64_t v : per_rank) {
    sum += v;
    most = std::max(most, v);
  }
  return sum == 0 ? 0.0 : static_cast<double>(most) * per_rank.size() / static_cast<double>(sum);
}

// The cycle of one rank: Init once, RunIteration per iteration, Finish once. RunIteration is the
// phase list; each phase is a method below it.
class ColocatedCycle {
 public:
  ColocatedCycle(const config::ResolvedConfig& resolved, const model::ModelConfig& model,
                 const ParallelGroups& groups, c10::Device device, memory::RegionManager& regions,
                 std::unique_ptr<Rollout> rollout)
      : resolved_(resolved),
        c_(resolved.config),
        groups_(groups),
        comm_(groups.dp()),
        world_(groups.world()),
        regions_(regions),
        rollout_(std::move(rollout)),
        train_only_data_(rollout_ ? nullptr : MakeReplayRollout(resolved)),
        actor_(resolved, model, groups, device, ActorRegions(resolved, model, groups, regions)),
        backuper_(MakeBackuper(c_, actor_)) {
    actor_.LoadInitialWeights();
  }

  // Backup #1, the reference copy, --load, the first restore (checked), sleep, the first sync.
  // Returns the first iteration to run.
  int64_t Init() {
    backuper_->Backup(backup::kActorTag);
    if (resolved_.with_ref) BackupReference();
    LoopState resumed;
    if (!c_.logging.load.empty()) {
      resumed = LoadCheckpoint(c_.logging.load, actor_, groups_);
      if (rollout_) rollout_->ImportState(resumed.rollout);
      weight_version_ = resumed.weight_version;
      backuper_->Backup(backup::kActorTag);
      // Nothing left to run: --save writes the loaded state in this job's layout (a checkpoint
      // resharded to other DP and EP sizes, Note [Resharding optimizer state]).
      if (resumed.iteration == c_.run.num_rollout && SaveDue(resumed.iteration - 1)) {
        Save(resumed.iteration - 1);
      }
    }
    backuper_->Restore(backup::kActorTag);
    if (colocated()) {
      ActorSleep();
      SyncWeights();
      rollout_->WakeKvCache();
    }
    if (world_.rank() == 0 && !c_.logging.metrics_out.empty()) {
      // A resumed run continues the file of the run it resumes.
      metrics_ =
          MetricsWriter(c_.logging.metrics_out, c_.logging.load.empty() ? MetricsFileMode::kTruncate
                                                                        : MetricsFileMode::kAppend);
    }
    RL_CHECK(resumed.iteration <= c_.run.num_rollout, ConfigError,
             "--load {}: the checkpoint is at iteration {}, beyond --num-rollout {}",
             c_.logging.load, resumed.iteration, c_.run.num_rollout);
    return resumed.iteration;
  }

  void RunIteration(int64_t iteration) {
    phase_seconds_.clear();
    spdlog::info("iteration {} / {}", iteration + 1, c_.run.num_rollout);
    SetFaultContext(world_.rank(), iteration + 1);  // Note [Fault injection]
    const rl_algo::RolloutBatch batch = Phase("rollout", [&] { return Generate(iteration); });
    if (colocated()) {
      Phase("rollout_sleep", [&] { rollout_->Sleep(); });
      Phase("actor_wake", [&] { ActorWake(); });
    }
    const std::vector<TrainingPlan> plans = actor_.PlansForAllRanks(batch);
    const TrainingPlan& plan = plans.at(comm_.rank());
    // Note [Routing replay modes]: R3 replays the engine's experts everywhere; R2 those the
    // old-logprob pass records.
    const bool r2 = c_.rl.use_routing_replay;
    const bool r3 = c_.rl.use_rollout_routing_replay;
    const bool indexer = c_.rl.use_rollout_indexer_replay;
    // The engine's records replayed by every forward (R3, indexer); R2's recorded below.
    PlanReplay replay = actor_.RolloutReplay(batch, plan, r3, indexer);
    PerMicroBatch ref_log_probs;
    if (resolved_.with_ref) {
      ref_log_probs = Phase("ref_logprobs", [&] {
        backuper_->Restore(backup::kRefTag);
        return actor_.ComputeLogProbs(batch, plan, &replay);
      });
    }
    Phase("restore_actor", [&] { backuper_->Restore(backup::kActorTag); });
    // --use-rollout-logprobs: the engine's log-probs are the old policy; no pass computes them
    // again (TIS still needs the trainer's).
    const PerMicroBatch old_log_probs =
        skip_old_logprobs() ? PerMicroBatch() : Phase("old_logprobs", [&] {
          PlanRouting recorded;  // R2: the experts this pass chose
          PerMicroBatch log_probs =
              actor_.ComputeLogProbs(batch, plan, &replay, r2 && !r3 ? &recorded : nullptr);
          if (r2 && !r3) replay.experts = std::move(recorded);
          return log_probs;
        });
    MaybeInjectFault(FaultPoint::kTrain, world_.rank(), iteration + 1);
    const TrainResult result = Phase(
        "train", [&] { return actor_.Train(batch, plan, old_log_probs, ref_log_probs, &replay); });
    CheckFirstStepKl(result);
    if (r2) CheckRoutingReplay(result);
    Phase("backup", [&] { backuper_->Backup(backup::kActorTag); });
    // The actor is awake and its params are the step's result: saved before it sleeps.
    if (SaveDue(iteration)) Phase("save", [&] { Save(iteration); });
    if (colocated()) {
      Phase("actor_sleep", [&] { ActorSleep(); });
      Phase("weight_sync", [&] { SyncWeights(); });
      Phase("kv_cache_wake", [&] { rollout_->WakeKvCache(); });
    }
    Report(iteration, batch, plans, result);
  }

  // --save-debug-rollout-data and --save-hf.
  void Finish() {
    if (!c_.data.save_debug_rollout_data.empty() && world_.rank() == 0) {
      rl_algo::WriteRolloutData(c_.data.save_debug_rollout_data, recorded_);
    }
    if (c_.logging.save_hf.empty()) return;
    if (colocated()) {
      ActorWake();
      backuper_->Restore(backup::kActorTag);
    }
    actor_.SaveHf(c_.logging.save_hf);
    if (world_.rank() == 0) {
      // The resolved config travels with the weights it produced.
      WriteFileAtomically(c_.logging.save_hf + "/trainer_config.toml", config::DumpToml(c_));
    }
  }

 private:
  // Runs `fn` as phase `name`, timed and logged with the memory after it; returns its result.
  template <class Fn>
  std::invoke_result_t<Fn> Phase(const std::string& name, Fn&& fn) {
    const auto start = Clock::now();
    if constexpr (std::is_void_v<std::invoke_result_t<Fn>>) {
      fn();
      LogPhase(name, start);
    } else {
      auto result = fn();
      LogPhase(name, start);
      return result;
    }
  }
  void LogPhase(const std::string& name, Clock::time_point start) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    phase_seconds_[name] += seconds;
    spdlog::info("  {:<14} {:8.3f} s | gpu/device {} | host pinned {} | rss {} | {}", name, seconds,
                 memory::FormatBytes(regions_.total_device_bytes()),
                 memory::FormatBytes(HostPinnedBytes()),
                 memory::FormatBytes(memory::ProcessRssBytes()), regions_.Summary());
  }
  int64_t HostPinnedBytes() const { return regions_.total_host_bytes() + backuper_->HostBytes(); }

  bool colocated() const { return rollout_ != nullptr; }
  bool skip_old_logprobs() const { return c_.rl.use_rollout_logprobs && !c_.rl.use_tis; }
  bool remat() const { return c_.colocate.rematerialize_param_from_master_weight; }

  // The reference: --ref-load, or the initial actor weights.
  void BackupReference() {
    if (!c_.model.ref_load.empty()) {
      model::TensorMap live = actor_.AllTensors();
      model::LoadParams(model::CheckpointReader::Open(c_.model.ref_load), actor_.model_config(),
                        live);
    }
    backuper_->Backup(backup::kRefTag);
  }

  rl_algo::RolloutBatch Generate(int64_t iteration) {
    rl_algo::RolloutBatch batch = (colocated() ? rollout_ : train_only_data_)->Generate(iteration);
    if (!c_.data.save_debug_rollout_data.empty()) {
      recorded_.samples.insert(recorded_.samples.end(), batch.samples.begin(), batch.samples.end());
    }
    return batch;
  }

  void ActorWake() {
    for (RegionTag tag : kActorRegions) {
      if (regions_.GetOrThrow(tag).is_paused()) regions_.Resume(tag);
    }
    actor_.optimizer().ZeroGrads();  // the grad buffer's contents are undefined after resume
  }

  // Note [Routing replay modes]: every replaying training forward used the experts it was given.
  void CheckRoutingReplay(const TrainResult& result) const {
    spdlog::info(
        "routing replay check: {} of {} (token, MoE layer) pairs used other experts than "
        "replayed",
        result.routing_differing, result.routing_replayed);
    RL_CHECK(!c_.checks.ci_test || (result.routing_differing == 0 && result.routing_replayed > 0),
             Error,
             "CI check failed: routing replay: {} of {} (token, MoE layer) pairs of the training "
             "forwards used other experts than replayed",
             result.routing_differing, result.routing_replayed);
  }

  void CheckFirstStepKl(const TrainResult& result) const {
    const double kl = result.first_step_metrics.ppo_kl;
    switch (resolved_.check_kl) {
      case config::FirstStepKlCheck::kOff:
        return;
      case config::FirstStepKlCheck::kExactlyZero:
        RL_CHECK(kl == 0.0, Error,
                 "CI check failed: the first step's ppo_kl is {} (must be exactly 0: the old "
                 "log-probs were computed from the same weights)",
                 kl);
        return;
      case config::FirstStepKlCheck::kWithinMismatch: {
        // The old policy is the engine's (--use-rollout-logprobs, with or without --use-tis):
        // the first step's ppo_kl is a mean of (rollout - train) log-prob differences. Note
        // [Log-prob mismatch] measures them against the first step's forward, or with --use-tis
        // against the old-logprob pass, which computes the same numbers; each is at most the
        // measured maximum.
        RL_CHECK(result.mismatch.has_value(), Error,
                 "CI check failed: --use-rollout-logprobs without a log-prob mismatch measure");
        const double bound = result.mismatch->abs_diff_max * (1 + 1e-9) + 1e-12;
        RL_CHECK(std::isfinite(kl) && std::abs(kl) <= bound, Error,
                 "CI check failed: with --use-rollout-logprobs the first step's ppo_kl is {}, "
                 "beyond the largest rollout/train log-prob difference {}",
                 kl, result.mismatch->abs_diff_max);
        return;
      }
    }
  }

  bool SaveDue(int64_t iteration) const {
    const bool last = iteration + 1 == c_.run.num_rollout;
    const int64_t interval = c_.logging.save_interval;
    return !c_.logging.save.empty() && (last || (interval > 0 && (iteration + 1) % interval == 0));
  }

  void Save(int64_t iteration) {
    const LoopState state{iteration + 1, weight_version_,
                          colocated() ? rollout_->ExportState() : json::Value()};
    SaveCheckpoint(c_.logging.save, state, actor_, c_, groups_);
  }

  void ActorSleep() {
    for (RegionTag tag : kActorRegions) {
      // With rematerialize the param buffer stays until the weight sync has read it.
      if (tag == RegionTag::kParamBuffer && remat()) continue;
      regions_.Pause(tag);
    }
  }

  void SyncWeights() {
    rollout_->WakeWeights();
    ++weight_version_;
    const NamedTensors weights = backuper_->Get(backup::kActorTag);
    const weight_sync::SyncStats stats = rollout_->ReceiveWeights(weights, weight_version_);
    spdlog::info("weight sync v{}: {} tensors, {} in {:.3f} s", weight_version_, stats.num_tensors,
                 memory::FormatBytes(stats.num_bytes), stats.elapsed.count());
    if (c_.weight_sync.check_weight_update_equal.value_or(false) ||
        resolved_.check_weight_version) {
      rollout_->CheckWeights(weights, weight_version_);
      spdlog::info("weight update check: {} tensors SHA256-equal, version {}", weights.size(),
                   weight_version_);
    }
    if (remat()) regions_.Pause(RegionTag::kParamBuffer);  // no copy: rebuilt on wake-up
  }

  // The iteration's log line and metrics line.
  void Report(int64_t iteration, const rl_algo::RolloutBatch& batch,
              const std::vector<TrainingPlan>& plans, const TrainResult& result) {
    std::vector<double> rewards, lengths;
    for (const rl_algo::Sample& s : batch.samples) {
      rewards.push_back(s.reward);
      lengths.push_back(static_cast<double>(s.response_length));
    }
    // Training throughput of the job: this rank's tokens times the ranks (equal shares).
    const double tokens_per_s =
        result.tokens * comm_.size() / std::max(phase_seconds_.at("train"), 1e-9);
    const std::string mismatch =
        result.mismatch ? fmt::format(" | logprob diff {:.3g} (max {:.3g})",
                                      result.mismatch->abs_diff_mean, result.mismatch->abs_diff_max)
                        : std::string();
    spdlog::info(
        "iteration {}: reward {:.4f} | response len {:.2f} | loss {:.6f} | ppo_kl {:.3g}{} | "
        "grad norm {:.4f} | {:.0f} tokens/s | gpu {} | host pinned {}",
        iteration + 1, Mean(rewards), Mean(lengths), result.metrics.loss, result.metrics.ppo_kl,
        mismatch, result.grad_norm, tokens_per_s,
        memory::FormatBytes(regions_.total_device_bytes()), memory::FormatBytes(HostPinnedBytes()));
    if (!metrics_.enabled()) return;
    json::Value line = json::Value::MakeObject({});
    line.Set("iteration", json::Value::Int(iteration + 1));
    line.Set("reward_mean", json::Value::Double(Mean(rewards)));
    line.Set("response_length_mean", json::Value::Double(Mean(lengths)));
    line.Set("loss", json::Value::Double(result.metrics.loss));
    line.Set("pg_loss", json::Value::Double(result.metrics.pg_loss));
    line.Set("kl", json::Value::Double(result.metrics.ppo_kl));
    line.Set("pg_clipfrac", json::Value::Double(result.metrics.pg_clipfrac));
    line.Set("grad_norm", json::Value::Double(result.grad_norm));
    line.Set("lr", json::Value::Double(result.lr));
    if (result.mismatch) {  // Note [Log-prob mismatch]
      line.Set("train_rollout_logprob_abs_diff",
               json::Value::Double(result.mismatch->abs_diff_mean));
      line.Set("train_rollout_logprob_abs_diff_max",
               json::Value::Double(result.mismatch->abs_diff_max));
      line.Set("train_rollout_ratio_mean", json::Value::Double(result.mismatch->ratio_mean));
    }
    line.Set("tokens_per_s", json::Value::Double(tokens_per_s));
    for (const auto& [name, seconds] : phase_seconds_) {
      line.Set("time_" + name + "_s", json::Value::Double(seconds));
    }
    // Note [Data-parallel rollout]: what each rank generated.
    const GenerationShares shares = colocated() ? rollout_->last_shares() : GenerationShares();
    if (!shares.samples.empty()) {
      line.Set("rollout_samples_per_rank", IntList(shares.samples));
      line.Set("rollout_tokens_per_rank", IntList(shares.response_tokens));
      line.Set("rollout_tokens_imbalance", json::Value::Double(Imbalance(shares.response_tokens)));
      line.Set("rollout_prefills", json::Value::Int(shares.prefills));
      line.Set("rollout_decode_steps", json::Value::Int(shares.decode_steps));
      const double steps = static_cast<double>(std::max<int64_t>(1, shares.decode_steps));
      line.Set("rollout_rows_per_decode_step",
               json::Value::Double(static_cast<double>(shares.row_steps) / steps));
    }
    // Note [Training plan]: what each rank trained on.
    const std::vector<int64_t> sample_tokens = SampleTokens(batch);
    std::vector<int64_t> train_tokens;
    for (const TrainingPlan& p : plans) train_tokens.push_back(PlanTokens(p, sample_tokens));
    line.Set("train_tokens_per_rank", IntList(train_tokens));
    line.Set("train_tokens_imbalance", json::Value::Double(Imbalance(train_tokens)));
    line.Set("gpu_bytes", json::Value::Int(regions_.total_device_bytes()));
    line.Set("host_pinned_bytes", json::Value::Int(HostPinnedBytes()));
    line.Set("rss_bytes", json::Value::Int(memory::ProcessRssBytes()));
    line.Set("weight_version", json::Value::Int(weight_version_));
    metrics_.Write(line);
  }

  const config::ResolvedConfig& resolved_;
  const config::Config& c_;
  const ParallelGroups& groups_;
  Communicator& comm_;   // the data-parallel group
  Communicator& world_;  // every rank: its rank 0 writes the files
  memory::RegionManager& regions_;
  std::unique_ptr<Rollout> rollout_;          // null with --debug-train-only
  std::unique_ptr<Rollout> train_only_data_;  // the recorded data, with --debug-train-only only
  Actor actor_;
  std::unique_ptr<backup::TensorBackuper> backuper_;
  std::map<std::string, double> phase_seconds_;  // this iteration's
  MetricsWriter metrics_;
  int64_t weight_version_ = 0;
  rl_algo::RolloutBatch recorded_;  // --save-debug-rollout-data
};

}  // namespace

void RunColocated(const config::ResolvedConfig& resolved, const model::ModelConfig& model,
                  const ParallelGroups& groups, c10::Device device, memory::RegionManager& regions,
                  std::unique_ptr<Rollout> rollout) {
  SeedDefaultGenerator(resolved.config.run.seed, groups.dp().rank());
  ColocatedCycle cycle(resolved, model, groups, device, regions, std::move(rollout));
  for (int64_t iteration = cycle.Init(); iteration < resolved.config.run.num_rollout; ++iteration) {
    cycle.RunIteration(iteration);
  }
  cycle.Finish();
}

}  // namespace rl
