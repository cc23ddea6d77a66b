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
    RL_CHECK(r.layers == layers && r.k == k && r.positions <= positions, Error,
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
  const at::Tensor on_device = packed.to(device);
  for (int64_t l = 0; l < layers; ++l) routing.push_back(on_device[l].reshape({-1, k}));
  return routing;
}

rl_algo::RoutingRecord MakeRoutingRecord(const std::vector<int16_t>& ids, int64_t layers,
                                         int64_t k, int64_t num_experts) {
  rl_algo::RoutingRecord r;
  r.layers = layers;
  r.k = k;
  r.positions = static_cast<int64_t>(ids.size()) / (layers * k);
  r.id_bytes = rl_algo::RoutingRecord::IdBytesFor(num_experts);
  r.ids.resize(ids.size() * static_cast<size_t>(r.id_bytes));
  for (size_t i = 0; i < ids.size(); ++i) r.set_id(static_cast<int64_t>(i), ids[i]);
  return r;
}

RoutingReplayScope::RoutingReplayScope(model::Decoder& decoder,
                                       const std::vector<int64_t>& moe_layers,
                                       const LayerRouting* replay, LayerRouting* record)
    : decoder_(decoder) {
  for (size_t m = 0; m < moe_layers.size(); ++m) {
    if (ordinal_.size() <= static_cast<size_t>(moe_layers[m])) ordinal_.resize(moe_layers[m] + 1, -1);
    ordinal_[static_cast<size_t>(moe_layers[m])] = static_cast<int64_t>(m);
  }
  if (record != nullptr) record->assign(moe_layers.size(), at::Tensor());
  if (replay != nullptr) {
    decoder_.set_routing_source([this, replay](int64_t layer) {
      const at::Tensor& ids =
          replay->at(static_cast<size_t>(ordinal_.at(static_cast<size_t>(layer))));
      return ids.scalar_type() == at::kLong ? ids : ids.to(at::kLong);
    });
  }
  if (replay != nullptr || record != nullptr) {
    decoder_.set_routing_observer([this, replay, record](int64_t layer, const at::Tensor& ids) {
      const size_t m = static_cast<size_t>(ordinal_.at(static_cast<size_t>(layer)));
      if (record != nullptr) (*record)[m] = ids.to(at::kShort);  // compact: < 32768 experts
      if (replay != nullptr) {
        const at::Tensor differ = ids.ne((*replay)[m]).any(1).sum().reshape({1});
        differing_ = differing_.defined() ? differing_ + differ : differ;
      }
    });
  }
}

RoutingReplayScope::~RoutingReplayScope() {
  decoder_.set_routing_source({});
  decoder_.set_routing_observer({});
}

}  // namespace rl
