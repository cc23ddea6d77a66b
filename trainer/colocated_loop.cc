#include "trainer/colocated_loop.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <functional>
#include <map>
#include <utility>

#include "backup/tensor_backuper.h"
#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/json.h"
#include "launch/sha256.h"
#include "trainer/actor.h"
#include "trainer/checkpoint.h"
#include "trainer/config/config.h"
#include "trainer/fault_injection.h"
#include "trainer/memory/process_memory.h"
#include "trainer/memory/region_manager.h"
#include "trainer/model/safetensors.h"

namespace rl {
namespace {

using Clock = std::chrono::steady_clock;
using memory::RegionTag;

// Carves the actor's allocations out of its regions, in order (Note [Param buffer layout] needs
// nothing more than contiguous zeroed storage per allocation).
class RegionAllocator {
 public:
  explicit RegionAllocator(memory::RegionManager& regions) : regions_(regions) {}
  at::Tensor operator()(std::string_view tag, int64_t numel, at::ScalarType dtype) {
    memory::Region& region = regions_.GetOrThrow(memory::ParseRegionTagOrThrow(tag));
    int64_t& cursor = cursors_[std::string(tag)];
    const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
    RL_CHECK(cursor + bytes <= region.num_bytes(), Error,
             "region '{}' is too small: {} bytes asked at offset {} of {}", tag, bytes, cursor,
             region.num_bytes());
    at::Tensor view = region.View(dtype, cursor, {numel});
    view.zero_();
    cursor += optimizer::AlignedAllocationBytes(bytes);
    return view;
  }

 private:
  memory::RegionManager& regions_;
  std::map<std::string, int64_t> cursors_;
};

// Times the phases of one iteration and logs time and memory after each.
class Phases {
 public:
  Phases(const memory::RegionManager& regions, const backup::TensorBackuper* backuper,
         const Rollout* rollout)
      : regions_(regions), backuper_(backuper), rollout_(rollout) {}
  template <class Fn>
  void Run(const std::string& name, Fn&& fn) {
    const auto start = Clock::now();
    fn();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    seconds_[name] += seconds;
    order_.push_back(name);
    spdlog::info("  {:<14} {:8.3f} s | gpu/device {} | host pinned {} | rss {} | {}", name,
                 seconds, memory::FormatBytes(device_bytes()),
                 memory::FormatBytes(host_pinned_bytes()),
                 memory::FormatBytes(memory::ProcessRssBytes()), regions_.Summary());
  }
  int64_t device_bytes() const {
    return regions_.total_device_bytes() + (rollout_ ? rollout_->DeviceBytes() : 0);
  }
  int64_t host_pinned_bytes() const {
    return regions_.total_host_bytes() + (backuper_ ? backuper_->HostBytes() : 0);
  }
  const std::map<std::string, double>& seconds() const { return seconds_; }
  void Reset() {
    seconds_.clear();
    order_.clear();
  }

 private:
  const memory::RegionManager& regions_;
  const backup::TensorBackuper* backuper_;
  const Rollout* rollout_;
  std::map<std::string, double> seconds_;
  std::vector<std::string> order_;
};

// Replays recorded data; every weight sync is read and hashed (DESIGN step 9 without an engine).
class ReplayRollout final : public Rollout {
 public:
  explicit ReplayRollout(const config::ResolvedConfig& resolved)
      : data_(rl_algo::ReadRolloutData(resolved.config.data.load_debug_rollout_data)),
        chunk_(resolved.config.rollout.rollout_batch_size *
               resolved.config.rollout.n_samples_per_prompt) {
    RL_CHECK(static_cast<int64_t>(data_.samples.size()) >= chunk_, ConfigError,
             "--load-debug-rollout-data {} has {} samples, fewer than one rollout ({} = "
             "--rollout-batch-size x --n-samples-per-prompt)",
             resolved.config.data.load_debug_rollout_data, data_.samples.size(), chunk_);
  }
  rl_algo::RolloutBatch Generate(int64_t iteration) override {
    const int64_t chunks = static_cast<int64_t>(data_.samples.size()) / chunk_;
    const int64_t begin = (iteration % chunks) * chunk_;
    rl_algo::RolloutBatch batch;
    batch.samples.assign(data_.samples.begin() + begin, data_.samples.begin() + begin + chunk_);
    return batch;
  }
  weight_sync::SyncStats ReceiveWeights(const NamedTensors& weights, int64_t version) override {
    const auto start = Clock::now();
    weight_sync::SyncStats stats;
    hashes_.clear();
    for (const NamedTensor& w : weights) {
      hashes_[w.name] = TensorSha256(w.tensor);
      stats.num_bytes += w.tensor.nbytes();
      ++stats.num_tensors;
    }
    version_ = version;
    stats.elapsed = Clock::now() - start;
    return stats;
  }
  void CheckWeights(const NamedTensors& weights, int64_t version) override {
    weight_sync::CheckWeightVersion(version, version_);
    std::vector<std::string> differ;
    for (const NamedTensor& w : weights) {
      const auto it = hashes_.find(w.name);
      if (it == hashes_.end() || it->second != TensorSha256(w.tensor)) differ.push_back(w.name);
    }
    RL_CHECK(differ.empty() && hashes_.size() == weights.size(), Error,
             "weight update check failed: {} of {} tensors differ after the sync (first: {})",
             differ.size(), weights.size(), differ.empty() ? "-" : differ.front());
  }

 private:
  rl_algo::RolloutBatch data_;
  int64_t chunk_;
  std::map<std::string, std::string> hashes_;
  int64_t version_ = 0;
};

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

}  // namespace

std::unique_ptr<Rollout> MakeReplayRollout(const config::ResolvedConfig& resolved) {
  return std::make_unique<ReplayRollout>(resolved);
}

void RunColocated(const config::ResolvedConfig& resolved, const model::ModelConfig& model,
                  Communicator& comm, c10::Device device, std::unique_ptr<Rollout> rollout) {
  const config::Config& c = resolved.config;
  const bool colocated = rollout != nullptr;
  const bool remat = c.colocate.rematerialize_param_from_master_weight;

  SeedDefaultGenerator(c.run.seed, comm.rank());

  // ---- Memory regions and the actor ----
  memory::RegionManager regions;
  const std::map<std::string, int64_t> bytes = Actor::StorageBytes(resolved, model, comm.size());
  const memory::FreshPages fresh =
      c.checks.ci_test ? memory::FreshPages::kPoison : memory::FreshPages::kAsMapped;
  auto create = [&](RegionTag tag, memory::HostBackup backup) {
    const int64_t size = std::max<int64_t>(
        bytes.at(std::string(memory::RegionTagName(tag))), optimizer::kAllocationAlignmentBytes);
    regions.Create(tag, size, device, backup, fresh);
  };
  // The param and grad buffers keep no host copy (the backuper or the rebuild restores the
  // params; grads are zeroed), the optimizer state is saved to the host on pause, the extras are
  // restored by the backuper from its pinned copy.
  create(RegionTag::kParamBuffer, memory::HostBackup::kNone);
  create(RegionTag::kGradBuffer, memory::HostBackup::kNone);
  create(RegionTag::kOptimizer, memory::HostBackup::kSaveOnPause);
  create(RegionTag::kExtras, memory::HostBackup::kNone);
  RegionAllocator allocator(regions);
  Actor actor(resolved, model, comm, device, std::ref(allocator));
  actor.LoadInitialWeights();

  // ---- The backuper ----
  const backup::SourceGetter source = [&actor] { return actor.SourceTensors(); };
  std::unique_ptr<backup::TensorBackuper> backuper;
  if (remat) {
    backup::MainCastContext context;
    context.cast_main_to_params = [&actor] { actor.optimizer().CastMainToParams(); };
    context.all_gather_params = [&actor] { actor.optimizer().AllGatherParams(); };
    context.extras = [&actor] { return actor.Extras(); };
    context.in_param_buffers = actor.ParamBufferIds();
    context.check = c.backup.check_rematerialize_param_from_master_weight.value_or(false);
    backuper = std::make_unique<backup::RematerializeBackuper>(source, std::move(context));
  } else {
    backuper = std::make_unique<backup::PinnedBackuper>(source);
  }
  Phases phases(regions, backuper.get(), rollout.get());

  const std::vector<RegionTag> actor_tags = {RegionTag::kParamBuffer, RegionTag::kGradBuffer,
                                             RegionTag::kOptimizer, RegionTag::kExtras};
  auto actor_sleep = [&] {
    for (RegionTag tag : actor_tags) {
      // With rematerialize the param buffer stays until the weight sync has read it.
      if (tag == RegionTag::kParamBuffer && remat) continue;
      regions.Pause(tag);
    }
  };
  auto actor_wake = [&] {
    for (RegionTag tag : actor_tags) {
      if (regions.GetOrThrow(tag).is_paused()) regions.Resume(tag);
    }
    actor.optimizer().ZeroGrads();  // the grad buffer's contents are undefined after resume
  };
  int64_t weight_version = 0;
  const bool check_sync = c.weight_sync.check_weight_update_equal.value_or(false);
  auto weight_sync = [&] {
    rollout->WakeWeights();
    ++weight_version;
    const NamedTensors weights = backuper->Get(backup::kActorTag);
    const weight_sync::SyncStats stats = rollout->ReceiveWeights(weights, weight_version);
    spdlog::info("weight sync v{}: {} tensors, {} in {:.3f} s", weight_version, stats.num_tensors,
                 memory::FormatBytes(stats.num_bytes), stats.elapsed.count());
    if (check_sync || resolved.check_weight_version) {
      rollout->CheckWeights(weights, weight_version);
      spdlog::info("weight update check: {} tensors SHA256-equal, version {}", weights.size(),
                   weight_version);
    }
    if (remat) regions.Pause(RegionTag::kParamBuffer);  // no copy: rebuilt on wake-up
    rollout->WakeKvCache();
  };

  // ---- Init (reference §1.3): backup #1, reference copy, restore (check), sleep, first sync ----
  backuper->Backup(backup::kActorTag);
  if (resolved.with_ref) {
    if (!c.model.ref_load.empty()) {
      model::TensorMap live = actor.AllTensors();
      model::LoadParams(model::CheckpointReader::Open(c.model.ref_load), model, live);
    }
    backuper->Backup("ref");  // the reference: --ref-load, or the initial actor weights
  }
  LoopState resumed;
  if (!c.logging.load.empty()) {
    resumed = LoadCheckpoint(c.logging.load, actor, comm);
    if (rollout) rollout->ImportState(resumed.rollout);
    weight_version = resumed.weight_version;
    backuper->Backup(backup::kActorTag);
  }
  backuper->Restore(backup::kActorTag);
  if (colocated) {
    actor_sleep();
    weight_sync();
  }

  std::ofstream metrics;
  if (comm.rank() == 0 && !c.logging.metrics_out.empty()) {
    // A resumed run continues the file of the run it resumes.
    metrics.open(c.logging.metrics_out, c.logging.load.empty() ? std::ios::trunc : std::ios::app);
    RL_CHECK(metrics.good(), ConfigError, "--metrics-out {}: cannot open for writing",
             c.logging.metrics_out);
  }
  std::unique_ptr<Rollout> replay_for_training;
  if (!colocated) replay_for_training = MakeReplayRollout(resolved);
  rl_algo::RolloutBatch recorded;

  RL_CHECK(resumed.iteration <= c.run.num_rollout, ConfigError,
           "--load {}: the checkpoint is at iteration {}, beyond --num-rollout {}",
           c.logging.load, resumed.iteration, c.run.num_rollout);
  for (int64_t iteration = resumed.iteration; iteration < c.run.num_rollout; ++iteration) {
    phases.Reset();
    spdlog::info("iteration {} / {}", iteration + 1, c.run.num_rollout);
    rl_algo::RolloutBatch batch;
    phases.Run("rollout", [&] {
      batch = colocated ? rollout->Generate(iteration) : replay_for_training->Generate(iteration);
    });
    if (!c.data.save_debug_rollout_data.empty()) {
      recorded.samples.insert(recorded.samples.end(), batch.samples.begin(), batch.samples.end());
    }
    if (colocated) {
      phases.Run("rollout_sleep", [&] { rollout->Sleep(); });
      phases.Run("actor_wake", actor_wake);
    }
    const TrainingPlan plan = actor.PlanFor(batch);
    PerMicroBatch ref_log_probs;
    if (resolved.with_ref) {
      phases.Run("ref_logprobs", [&] {
        backuper->Restore("ref");
        ref_log_probs = actor.ComputeLogProbs(batch, plan);
      });
    }
    phases.Run("restore_actor", [&] { backuper->Restore(backup::kActorTag); });
    PerMicroBatch old_log_probs;
    phases.Run("old_logprobs", [&] { old_log_probs = actor.ComputeLogProbs(batch, plan); });
    TrainResult result;
    MaybeInjectFault(FaultPoint::kTrain, comm.rank(), iteration + 1);
    phases.Run("train", [&] { result = actor.Train(batch, plan, old_log_probs, ref_log_probs); });
    if (resolved.check_kl) {
      RL_CHECK(result.first_step_metrics.ppo_kl == 0.0, Error,
               "CI check failed: the first step's ppo_kl is {} (must be exactly 0: the old "
               "log-probs were computed from the same weights)",
               result.first_step_metrics.ppo_kl);
    }
    phases.Run("backup", [&] { backuper->Backup(backup::kActorTag); });
    const bool last = iteration + 1 == c.run.num_rollout;
    const int64_t interval = c.logging.save_interval;
    if (!c.logging.save.empty() && (last || (interval > 0 && (iteration + 1) % interval == 0))) {
      // The actor is awake and its params are the step's result: saved before it sleeps.
      phases.Run("save", [&] {
        const LoopState state{iteration + 1, weight_version,
                              colocated ? rollout->ExportState() : json::Value()};
        SaveCheckpoint(c.logging.save, state, actor, c, comm);
      });
    }
    if (colocated) {
      phases.Run("actor_sleep", actor_sleep);
      phases.Run("weight_sync", weight_sync);
    }

    std::vector<double> rewards, lengths;
    for (const rl_algo::Sample& s : batch.samples) {
      rewards.push_back(s.reward);
      lengths.push_back(static_cast<double>(s.response_length));
    }
    // Training throughput of the job: this rank's tokens times the ranks (equal shares).
    const double tokens_per_s =
        result.tokens * comm.size() / std::max(phases.seconds().at("train"), 1e-9);
    spdlog::info(
        "iteration {}: reward {:.4f} | response len {:.2f} | loss {:.6f} | ppo_kl {:.3g} | "
        "grad norm {:.4f} | {:.0f} tokens/s | gpu {} | host pinned {}",
        iteration + 1, Mean(rewards), Mean(lengths), result.metrics.loss, result.metrics.ppo_kl,
        result.grad_norm, tokens_per_s,
        memory::FormatBytes(phases.device_bytes()),
        memory::FormatBytes(phases.host_pinned_bytes()));
    if (metrics.is_open()) {
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
      line.Set("tokens_per_s", json::Value::Double(tokens_per_s));
      for (const auto& [name, seconds] : phases.seconds()) {
        line.Set("time_" + name + "_s", json::Value::Double(seconds));
      }
      line.Set("gpu_bytes", json::Value::Int(phases.device_bytes()));
      line.Set("host_pinned_bytes", json::Value::Int(phases.host_pinned_bytes()));
      line.Set("rss_bytes", json::Value::Int(memory::ProcessRssBytes()));
      line.Set("weight_version", json::Value::Int(weight_version));
      metrics << json::Dump(line) << "\n";
      metrics.flush();
    }
  }

  if (!c.data.save_debug_rollout_data.empty() && comm.rank() == 0) {
    rl_algo::WriteRolloutData(c.data.save_debug_rollout_data, recorded);
  }
  if (!c.logging.save_hf.empty()) {
    if (colocated) {
      actor_wake();
      backuper->Restore(backup::kActorTag);
    }
    actor.SaveHf(c.logging.save_hf);
    if (comm.rank() == 0) {
      // The resolved config travels with the weights it produced.
      WriteFileAtomically(c.logging.save_hf + "/trainer_config.toml", config::DumpToml(c));
    }
  }
}

}  // namespace rl
