// Routing replay in training (Note [Routing replay] in trainer/model/layers.h): the expert ids a
// forward must use, per micro-batch and MoE layer, and the scope that hands them to a Decoder.
//
// Note [Routing replay modes]
// --use-routing-replay (R2): the old-logprob pass records the experts each MoE layer chose for
// every micro-batch; the training forwards of the same micro-batches replay them, so the policy
// ratio compares the same expert mix. --use-rollout-routing-replay (R3, implies R2): the rollout
// engine records its choice for every fed position of every sample (Note [Routing record] in
// rollout_data.h); the reference, old-logprob and training forwards all replay it, so training
// computes the log-probs of exactly the experts that generated the tokens. In both, the gate
// weights come from the training router's logits over the replayed experts, so the router keeps
// its gradient. Padding positions of a micro-batch replay experts 0..k-1 (their outputs are
// masked). With --ci-test, every replaying forward also checks that each MoE layer used the ids it
// was given (RoutingReplayScope::differing_tokens must stay 0).
//
// Thread safety: none; the trainer's main thread. Failures: rl::Error / ConfigError naming the
// sample and what is wrong.
#ifndef RL_TRAINER_ROUTING_REPLAY_H_
#define RL_TRAINER_ROUTING_REPLAY_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "trainer/model/decoder.h"
#include "trainer/model/model_config.h"
#include "trainer/rl/rollout_data.h"

namespace rl {

// One micro-batch's choices per layer (model order): expert ids [rows * positions, k] int16, or
// indexer key positions [rows, positions, index_topk] int32, on the model's device (widened to
// int64 when a forward uses them); tokens in [rows, positions] row-major order (a Decoder's
// flattening).
using LayerRouting = std::vector<at::Tensor>;

// The routing records of samples `indices` packed for a forward over `positions` fed positions
// (the micro-batch's longest sample less one), as expert ids. Throws rl::Error when a sample has
// no record or one that does not fit the model (layers, k, an id >= n_routed_experts).
LayerRouting PackRolloutRouting(const rl_algo::RolloutBatch& batch,
                                const std::vector<int64_t>& indices, int64_t positions,
                                const model::ModelConfig& config, c10::Device device);

// The indexer records of samples `indices` for a forward over `positions` fed positions (Note
// [Indexer replay] in trainer/model/decoder.cc): per indexer layer [rows, positions, index_topk]
// key positions, or an empty vector when positions <= index_topk (every key is selected, nothing
// to replay). Positions before index_topk and padding replay keys 0..index_topk-1, which select
// every visible key. Throws rl::Error like PackRolloutRouting.
LayerRouting PackRolloutIndexer(const rl_algo::RolloutBatch& batch,
                                const std::vector<int64_t>& indices, int64_t positions,
                                const model::ModelConfig& config, c10::Device device);

// A record of the engine's choices ([layers, positions - first, k], Generation::routed_experts
// or indexer_topk) in a sample's compact form (ids below `limit`: experts, or positions).
template <class T>
rl_algo::RoutingRecord MakeRoutingRecord(const std::vector<T>& ids, int64_t layers,
                                         int64_t positions, int64_t first, int64_t k,
                                         int64_t limit) {
  rl_algo::RoutingRecord r;
  r.layers = layers;
  r.positions = positions;
  r.first = first;
  r.k = k;
  r.id_bytes = rl_algo::RoutingRecord::IdBytesFor(limit);
  r.ids.resize(ids.size() * static_cast<size_t>(r.id_bytes));
  for (size_t i = 0; i < ids.size(); ++i) r.set_id(static_cast<int64_t>(i), ids[i]);
  return r;
}

// What a forward replays: expert ids and indexer selections of one micro-batch (null: none).
struct ReplayInputs {
  const LayerRouting* experts = nullptr;
  const LayerRouting* indexer = nullptr;
};

// For its lifetime, `decoder` replays `replay` and records each MoE layer's chosen ids into
// `record` (when not null); counts the tokens whose used expert ids differ from the replayed
// ones. Clears the decoder's hooks on exit.
class RoutingReplayScope {
 public:
  RoutingReplayScope(model::Decoder& decoder, const model::ModelConfig& config, ReplayInputs replay,
                     LayerRouting* record);
  ~RoutingReplayScope();
  RoutingReplayScope(const RoutingReplayScope&) = delete;
  RoutingReplayScope& operator=(const RoutingReplayScope&) = delete;

  // [1] int64 on the device: tokens x layers where the forward used other ids than replayed.
  const at::Tensor& differing_tokens() const { return differing_; }

 private:
  model::Decoder& decoder_;
  std::vector<int64_t> ordinal_;          // model layer -> MoE ordinal, or -1
  std::vector<int64_t> indexer_ordinal_;  // model layer -> indexer ordinal, or -1
  at::Tensor differing_;
};

}  // namespace rl

#endif  // RL_TRAINER_ROUTING_REPLAY_H_
