#include "trainer/routing_replay.h"

#include <fmt/format.h>

#include <utility>

#include "launch/check.h"

namespace rl {

std::vector<int64_t> MoeLayers(const model::ModelConfig& config) {
  std::vector<int64_t> layers;
  for (size_t l = 0; l < config.mlp_layer_types.size(); ++l) {
    if (config.mlp_layer_types[l] == model::MlpType::kSparse) layers.push_back(l);
  }
  return layers;
}

std::vector<int64_t> IndexerLayers(const model::ModelConfig& config) {
  std::vector<int64_t> layers;
  for (size_t l = 0; l < config.indexer_types.size(); ++l) {
    if (config.indexer_types[l] == model::IndexerType::kFull) layers.push_back(l);
  }
  return layers;
}

namespace {

// Model layer -> position in `layers`, or -1.
std::vector<int64_t> Ordinals(const std::vector<int64_t>& layers, int64_t num_layers) {
  std::vector<int64_t> ordinal(static_cast<size_t>(num_layers), -1);
  for (size_t i = 0; i < layers.size(); ++i) ordinal.at(layers[i]) = static_cast<int64_t>(i);
  return ordinal;
}

}  // namespace

LayerRouting PackRolloutIndexer(const rl_algo::RolloutBatch& batch,
                                const std::vector<int64_t>& indices, int64_t positions,
                                const model::ModelConfig& config, c10::Device device) {
  const int64_t k = config.index_topk;
  if (positions <= k) return {};
  const int64_t layers = static_cast<int64_t>(IndexerLayers(config).size());
  const int64_t rows = static_cast<int64_t>(indices.size());
  at::Tensor packed = at::arange(k, at::kLong).repeat({layers, rows, positions, 1});
  int64_t* out = packed.data_ptr<int64_t>();
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t index = indices[static_cast<size_t>(row)];
    const rl_algo::Sample& s = batch.samples.at(static_cast<size_t>(index));
    RL_CHECK(s.indexer_topk.has_value(), Error,
             "--use-rollout-indexer-replay: sample {} has no indexer record (rollout data "
             "recorded without --use-rollout-indexer-replay?)",
             index);
    const rl_algo::RoutingRecord& r = *s.indexer_topk;
    RL_CHECK(r.layers == layers && r.k == k && r.first == k && r.positions <= positions, Error,
             "--use-rollout-indexer-replay: sample {} records {} indexer layers x positions [{}, "
             "{}) x k {}; the model has {} indexer layers and index_topk {}, the micro-batch {} "
             "positions",
             index, r.layers, r.first, r.positions, r.k, layers, k, positions);
    const int64_t recorded = r.recorded_positions();
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t p = 0; p < recorded; ++p) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t key = r.id((l * recorded + p) * k + j);
          RL_CHECK(key <= r.first + p, Error,
                   "--use-rollout-indexer-replay: sample {} selects key {} for position {} in "
                   "indexer layer {}: a key after its query",
                   index, key, r.first + p, l);
          out[((l * rows + row) * positions + r.first + p) * k + j] = key;
        }
      }
    }
  }
  LayerRouting selection;
  const at::Tensor on_device = packed.to(at::kInt).to(device);             // compact until used
  for (int64_t l = 0; l < layers; ++l) selection.push_back(on_device[l]);  // [rows, positions, k]
  return selection;
}

LayerRouting PackRolloutRouting(const rl_algo::RolloutBatch& batch,
                                const std::vector<int64_t>& indices, int64_t positions,
                                const model::ModelConfig& config, c10::Device device) {
  const int64_t layers = static_cast<int64_t>(MoeLayers(config).size());
  const int64_t k = config.num_experts_per_tok;
  const int64_t rows = static_cast<int64_t>(indices.size());
  // [layers, rows, positions, k]; padding positions replay experts 0..k-1.
  at::Tensor packed = at::arange(k, at::kLong).repeat({layers, rows, positions, 1});
  int64_t* out = packed.data_ptr<int64_t>();
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t index = indices[static_cast<size_t>(row)];
    const rl_algo::Sample& s = batch.samples.at(static_cast<size_t>(index));
    RL_CHECK(s.routed_experts.has_value(), Error,
             "--use-rollout-routing-replay: sample {} has no routing record (rollout data "
             "recorded without --use-rollout-routing-replay?)",
             index);
    const rl_algo::RoutingRecord& r = *s.routed_experts;
    RL_CHECK(r.layers == layers && r.k == k && r.first == 0 && r.positions <= positions, Error,
             "--use-rollout-routing-replay: sample {} records {} MoE layers x {} positions x k {}; "
             "the model has {} MoE layers and k {} and the micro-batch {} positions",
             index, r.layers, r.positions, r.k, layers, k, positions);
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t p = 0; p < r.positions; ++p) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t id = r.id((l * r.positions + p) * k + j);
          RL_CHECK(id < config.n_routed_experts, Error,
                   "--use-rollout-routing-replay: sample {} replays expert {} in MoE layer {}, "
                   "but the model has {} routed experts",
                   index, id, l, config.n_routed_experts);
          out[((l * rows + row) * positions + p) * k + j] = id;
        }
      }
    }
  }
  LayerRouting routing;
  const at::Tensor on_device = packed.to(at::kShort).to(device);  // compact until used
  for (int64_t l = 0; l < layers; ++l) routing.push_back(on_device[l].reshape({-1, k}));
  return routing;
}

RoutingReplayScope::RoutingReplayScope(model::Decoder& decoder, const model::ModelConfig& config,
                                       ReplayInputs replay, LayerRouting* record)
    : decoder_(decoder),
      ordinal_(Ordinals(MoeLayers(config), config.num_hidden_layers)),
      indexer_ordinal_(Ordinals(IndexerLayers(config), config.num_hidden_layers)) {
  const LayerRouting* experts = replay.experts;
  if (record != nullptr) record->assign(MoeLayers(config).size(), at::Tensor());
  if (experts != nullptr) {
    decoder_.set_routing_source([this, experts](int64_t layer) {
      const at::Tensor& ids = experts->at(static_cast<size_t>(ordinal_.at(layer)));
      return ids.scalar_type() == at::kLong ? ids : ids.to(at::kLong);
    });
  }
  if (experts != nullptr || record != nullptr) {
    decoder_.set_routing_observer([this, experts, record](int64_t layer, const at::Tensor& ids) {
      const size_t m = static_cast<size_t>(ordinal_.at(layer));
      if (record != nullptr) (*record)[m] = ids.to(at::kShort);  // compact: < 32768 experts
      if (experts != nullptr) {
        const at::Tensor differ = ids.ne((*experts)[m].to(at::kLong)).any(1).sum().reshape({1});
        differing_ = differing_.defined() ? differing_ + differ : differ;
      }
    });
  }
  // Note [Indexer replay]: an empty selection list means every key (nothing to replay).
  if (replay.indexer != nullptr && !replay.indexer->empty()) {
    const LayerRouting* indexer = replay.indexer;
    decoder_.set_indexer_source([this, indexer](int64_t layer) -> std::optional<at::Tensor> {
      return indexer->at(static_cast<size_t>(indexer_ordinal_.at(layer))).to(at::kLong);
    });
  }
}

RoutingReplayScope::~RoutingReplayScope() {
  decoder_.set_routing_source({});
  decoder_.set_routing_observer({});
  decoder_.set_indexer_source({});
}

}  // namespace rl
