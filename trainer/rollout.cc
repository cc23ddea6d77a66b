#include "trainer/rollout.h"

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "launch/check.h"
#include "launch/sha256.h"

namespace rl {
namespace {

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
    const auto start = std::chrono::steady_clock::now();
    weight_sync::SyncStats stats;
    hashes_.clear();
    for (const NamedTensor& w : weights) {
      hashes_[w.name] = TensorSha256(w.tensor);
      stats.num_bytes += w.tensor.nbytes();
      ++stats.num_tensors;
    }
    version_ = version;
    stats.elapsed = std::chrono::steady_clock::now() - start;
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

}  // namespace

std::unique_ptr<Rollout> MakeReplayRollout(const config::ResolvedConfig& resolved) {
  return std::make_unique<ReplayRollout>(resolved);
}

}  // namespace rl
