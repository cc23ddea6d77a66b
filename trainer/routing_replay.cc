#include "trainer/routing_replay.h"

#include <fmt/format.h>

#include <optional>
#include <utility>

#include "launch/check.h"

namespace rl {

namespace {

// One kind of record (Note [Routing record]) as a forward replays it.
struct RecordKind {
  const char* option;  // the flag that records and replays it, for messages
  const char* name;    // "routing" or "indexer"
  const char* layer;   // what its layers are: "MoE" or "indexer"
  std::optional<rl_algo::RoutingRecord> rl_algo::Sample::*field;
  int64_t layers;
  int64_t k;
  int64_t first;  // the first recorded position
};

// The records of samples `indices` for a forward over `positions` fed positions: [layers, rows,
// positions, k] int64 on the CPU; padding, and positions before `first`, hold 0..k-1.
// `check_id(index, layer, position, id)` throws for an id the model cannot replay.
template <class CheckId>
at::Tensor PackRecords(const rl_algo::RolloutBatch& batch, const std::vector<int64_t>& indices,
                       int64_t positions, const RecordKind& kind, CheckId check_id) {
  const int64_t layers = kind.layers;
  const int64_t k = kind.k;
  const int64_t rows = static_cast<int64_t>(indices.size());
  at::Tensor packed = at::arange(k, at::kLong).repeat({layers, rows, positions, 1});
  int64_t* out = packed.data_ptr<int64_t>();
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t index = indices[static_cast<size_t>(row)];
    const std::optional<rl_algo::RoutingRecord>& record =
        batch.samples.at(static_cast<size_t>(index)).*kind.field;
    RL_CHECK(record.has_value(), Error,
             "{}: sample {} has no {} record (rollout data recorded without {}?)", kind.option,
             index, kind.name, kind.option);
    const rl_algo::RoutingRecord& r = *record;
    RL_CHECK(r.layers == layers && r.k == k && r.first == kind.first && r.positions <= positions,
             Error,
             "{}: sample {} records {} {} layers x positions [{}, {}) x k {}; the model has {} {} "
             "layers, k {} and the first recorded position {}, the micro-batch {} positions",
             kind.option, index, r.layers, kind.layer, r.first, r.positions, r.k, layers,
             kind.layer, k, kind.first, positions);
    const int64_t recorded = r.recorded_positions();
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t p = 0; p < recorded; ++p) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t id = r.id((l * recorded + p) * k + j);
          check_id(index, l, r.first + p, id);
          out[((l * rows + row) * positions + r.first + p) * k + j] = id;
        }
      }
    }
  }
  return packed;
}

}  // namespace

LayerRouting PackRolloutIndexer(const rl_algo::RolloutBatch& batch,
                                const std::vector<int64_t>& indices, int64_t positions,
                                const model::ModelConfig& config, c10::Device device) {
  const int64_t k = config.index_topk;
  if (positions <= k) return {};
  const RecordKind kind{"--use-rollout-indexer-replay",
                        "indexer",
                        "indexer",
                        &rl_algo::Sample::indexer_topk,
                        static_cast<int64_t>(config.indexer_layers().size()),
                        k,
                        k};
  const at::Tensor packed = PackRecords(
      batch, indices, positions, kind, [](int64_t index, int64_t l, int64_t position, int64_t key) {
        RL_CHECK(key <= position, Error,
                 "--use-rollout-indexer-replay: sample {} selects key {} for position {} in "
                 "indexer layer {}: a key after its query",
                 index, key, position, l);
      });
  LayerRouting selection;
  const at::Tensor on_device = packed.to(at::kInt).to(device);  // compact until used
  for (int64_t l = 0; l < kind.layers; ++l) {
    selection.push_back(on_device[l]);  // [rows, positions, k]
  }
  return selection;
}

LayerRouting PackRolloutRouting(const rl_algo::RolloutBatch& batch,
                                const std::vector<int64_t>& indices, int64_t positions,
                                const model::ModelConfig& config, c10::Device device) {
  const int64_t experts = config.n_routed_experts;
  const RecordKind kind{"--use-rollout-routing-replay",
                        "routing",
                        "MoE",
                        &rl_algo::Sample::routed_experts,
                        static_cast<int64_t>(config.moe_layers().size()),
                        config.num_experts_per_tok,
                        0};
  const at::Tensor packed = PackRecords(
      batch, indices, positions, kind, [experts](int64_t index, int64_t l, int64_t, int64_t id) {
        RL_CHECK(id < experts, Error,
                 "--use-rollout-routing-replay: sample {} replays expert {} in MoE layer {}, but "
                 "the model has {} routed experts",
                 index, id, l, experts);
      });
  LayerRouting routing;
  const at::Tensor on_device = packed.to(at::kShort).to(device);  // compact until used
  for (int64_t l = 0; l < kind.layers; ++l) {
    routing.push_back(on_device[l].reshape({-1, kind.k}));  // [rows * positions, k]
  }
  return routing;
}

RoutingReplayScope::RoutingReplayScope(model::Decoder& decoder, const model::ModelConfig& config,
                                       ReplayInputs replay, LayerRouting* record)
    : decoder_(decoder),
      ordinal_(model::LayerOrdinals(config.moe_layers(), config.num_hidden_layers)),
      indexer_ordinal_(model::LayerOrdinals(config.indexer_layers(), config.num_hidden_layers)) {
  const LayerRouting* experts = replay.experts;
  if (record != nullptr) record->assign(config.moe_layers().size(), at::Tensor());
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
