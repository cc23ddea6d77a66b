#include "trainer/rollout/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "launch/check.h"
#include "trainer/rollout/sampler.h"

namespace rl::rollout {
namespace {

using memory::RegionTag;

at::Tensor AllocateChecked(const StorageAllocator& allocator, RegionTag region_tag,
                           int64_t num_bytes, at::Device device) {
  const std::string_view tag = memory::RegionTagName(region_tag);
  at::Tensor storage = allocator(region_tag, num_bytes);
  RL_CHECK(storage.defined() && storage.dim() == 1 && storage.scalar_type() == at::kByte &&
               storage.is_contiguous() && storage.numel() >= num_bytes,
           Error,
           "rollout engine: the allocator must return a contiguous 1-D uint8 tensor of at least "
           "{} bytes for \"{}\"; got {}",
           num_bytes, tag,
           storage.defined() ? fmt::format("{} of shape [{}]", c10::toString(storage.scalar_type()),
                                           fmt::join(storage.sizes(), ", "))
                             : std::string("an undefined tensor"));
  RL_CHECK(storage.device().type() == device.type() &&
               (!device.has_index() || storage.device() == device),
           Error, "rollout engine: the allocator returned \"{}\" on {}, the engine runs on {}", tag,
           storage.device().str(), device.str());
  return storage;
}

// The cache tensors of one layer with the dimension that indexes positions.
std::vector<std::pair<at::Tensor, int64_t>> CacheTensors(model::LayerKv& kv) {
  std::vector<std::pair<at::Tensor, int64_t>> out;
  if (kv.key.defined()) out.emplace_back(kv.key, 2);              // [B, kv_heads, L, head_dim]
  if (kv.value.defined()) out.emplace_back(kv.value, 2);          // [B, kv_heads, L, head_dim]
  if (kv.latent_pe.defined()) out.emplace_back(kv.latent_pe, 1);  // [B, L, kv_lora + rope]
  if (kv.index_key.defined()) out.emplace_back(kv.index_key, 1);  // [B, L, index_head_dim]
  return out;
}

// Where the rows that go on sit after a step in which the cache rows `finished` (ascending, of
// `batch`) ended (Note [Rollout batching]): the first batch - |finished| rows stay, but for the
// finished ones among them, each taken by the next row past them that goes on.
struct RowFill {
  std::vector<int64_t> order;  // the old cache row of each new one
  std::vector<int64_t> from;   // the rows that move, from these cache rows
  std::vector<int64_t> to;     // to these
};
RowFill FillFinishedRows(const std::vector<int64_t>& finished, int64_t batch) {
  const int64_t next = batch - static_cast<int64_t>(finished.size());
  std::vector<bool> ends(static_cast<size_t>(batch), false);
  for (int64_t r : finished) ends[static_cast<size_t>(r)] = true;
  RowFill fill;
  int64_t mover = next;
  for (int64_t r = 0; r < next; ++r) {
    if (!ends[static_cast<size_t>(r)]) {
      fill.order.push_back(r);
      continue;
    }
    while (ends[static_cast<size_t>(mover)]) ++mover;
    fill.order.push_back(mover);
    fill.from.push_back(mover);
    fill.to.push_back(r);
    ++mover;
  }
  return fill;
}

// Copies rows `from` of `tensor` ([n] int64 on its device, along `row_dim`) to rows `to`, positions
// [0, length) of `position_dim` only.
void MoveRows(const at::Tensor& tensor, int64_t row_dim, int64_t position_dim,
              const at::Tensor& from, const at::Tensor& to, int64_t length) {
  const at::Tensor used = tensor.narrow(position_dim, 0, length);
  used.index_copy_(row_dim, to, used.index_select(row_dim, from));  // from and to are disjoint
}

}  // namespace

StorageAllocator PlainAllocator(at::Device device) {
  return [device](RegionTag, int64_t num_bytes) {
    return at::zeros({num_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  };
}

namespace {

// The layers a record of `records` keeps for `config`, with its k (0: nothing to record).
struct RecordShape {
  std::vector<int64_t> layers;
  int64_t k = 0;
};
RecordShape ExpertsShape(const model::ModelConfig& c, Records records) {
  RecordShape shape;
  if (!records.experts) return shape;
  shape.layers = c.moe_layers();
  shape.k = shape.layers.empty() ? 0 : c.num_experts_per_tok;
  return shape;
}
RecordShape IndexerShape(const model::ModelConfig& c, Records records, int64_t max_length) {
  RecordShape shape;
  if (!records.indexer || max_length <= c.index_topk) return shape;
  shape.layers = c.indexer_layers();
  shape.k = shape.layers.empty() ? 0 : c.index_topk;
  return shape;
}
int64_t RecordBytes(const RecordShape& shape, int64_t max_batch, int64_t max_length,
                    int64_t element_size) {
  return static_cast<int64_t>(shape.layers.size()) * max_batch * max_length * shape.k *
         element_size;
}
int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

int64_t RolloutEngine::KvStorageBytes(const model::ModelConfig& config, at::ScalarType param_dtype,
                                      int64_t max_batch, int64_t max_length, Records records) {
  const int64_t kv = model::KvCache::NumElements(config, max_batch, max_length) *
                     static_cast<int64_t>(c10::elementSize(param_dtype));
  return Aligned(kv) +
         Aligned(RecordBytes(ExpertsShape(config, records), max_batch, max_length, 2)) +
         RecordBytes(IndexerShape(config, records, max_length), max_batch, max_length, 4);
}

RolloutEngine::RolloutEngine(model::ModelConfig config, at::ScalarType param_dtype,
                             at::Device device, int64_t max_batch, int64_t max_length,
                             const StorageAllocator& allocator, Records records,
                             ExpertParallel expert, Communicator* tensor_group)
    : config_(std::move(config)),
      dtype_(param_dtype),
      device_(device),
      max_batch_(max_batch),
      max_length_(max_length),
      expert_group_(expert.group != nullptr && expert.group->size() > 1 ? expert.group : nullptr),
      tensor_group_(tensor_group != nullptr && tensor_group->size() > 1 ? tensor_group : nullptr),
      capacity_factor_(expert.capacity_factor) {
  RL_CHECK(max_batch >= 1 && max_length >= 2, ConfigError,
           "rollout engine: max_batch must be >= 1 and max_length >= 2; got {} and {}", max_batch,
           max_length);
  RL_CHECK(at::isFloatingType(param_dtype), ConfigError,
           "rollout engine: the param dtype must be floating; got {}", c10::toString(param_dtype));
  std::vector<weight_sync::TensorDecl> decls;
  for (const ParamSpec& spec : model::ListParams(config_)) {
    decls.push_back({spec.name, spec.shape, model::ParamDtype(spec, dtype_)});
  }
  layout_ = weight_sync::MakeEngineLayout(decls);
  weight_storage_ =
      AllocateChecked(allocator, RegionTag::kRolloutWeights, layout_.total_bytes, device_);
  const auto views = weight_sync::HfViews(layout_, weight_storage_);
  weights_ = model::TensorMap(views.begin(), views.end());
  // Note [Inference kernels]: fused on a GPU.
  decoder_ = std::make_unique<model::Decoder>(
      config_, weights_, device_.is_cuda() ? model::Kernels::kFused : model::Kernels::kLibTorch,
      expert.group, tensor_group);
  if (expert_group_ != nullptr) {  // Note [Fixed-capacity dispatch] in layers.h
    dispatch_.capacity = model::DispatchCapacity(config_, max_batch_, expert_group_->size(),
                                                 capacity_factor_);
    dispatch_.overflow = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device_));
  }

  const int64_t kv_elements = model::KvCache::NumElements(config_, max_batch_, max_length_);
  const int64_t kv_bytes = kv_elements * static_cast<int64_t>(c10::elementSize(dtype_));
  const int64_t storage_bytes = KvStorageBytes(config_, dtype_, max_batch_, max_length_, records);
  const at::Tensor storage =
      AllocateChecked(allocator, RegionTag::kKvCache, storage_bytes, device_);
  kv_storage_ = storage.narrow(0, 0, kv_bytes).view(dtype_);
  // Note [Engine routing record]: the records follow the KV cache in the same storage.
  int64_t offset = Aligned(kv_bytes);
  const auto carve = [&](ChoiceRecord& record, const RecordShape& shape, at::ScalarType dtype,
                         int64_t first) {
    if (shape.k == 0) return;
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t bytes = RecordBytes(shape, max_batch_, max_length_, element);
    record.data =
        storage.narrow(0, offset, bytes)
            .view(dtype)
            .view({static_cast<int64_t>(shape.layers.size()), max_batch_, max_length_, shape.k});
    record.layers = shape.layers;
    record.ordinal = model::LayerOrdinals(shape.layers, config_.num_hidden_layers);
    record.first = first;
    offset += Aligned(bytes);
  };
  carve(experts_, ExpertsShape(config_, records), at::kShort, 0);
  carve(indexer_, IndexerShape(config_, records, max_length_), at::kInt, config_.index_topk);
  if (experts_.data.defined()) {
    decoder_->set_routing_observer(
        [this](int64_t layer, const at::Tensor& ids) { Record(experts_, layer, ids); });
  }
  if (indexer_.data.defined()) {
    decoder_->set_indexer_observer([this](int64_t layer, const at::Tensor& topk) {
      // Undefined: every key selected, which happens only before position index_topk (not
      // recorded).
      if (topk.defined()) Record(indexer_, layer, topk);
    });
  }
  cache_ = std::make_unique<model::KvCache>(config_, kv_storage_, max_batch_, max_length_);
  rope_ = model::MakeRopeTable(config_, 0, max_length_, dtype_, device_);
  position_ = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device_));
  set_cuda_graphs(true);
}

void RolloutEngine::set_latent_mla_decode(bool on) {
  decoder_->set_latent_mla_decode(on);
  set_cuda_graphs(uses_cuda_graphs());
}

void RolloutEngine::set_cuda_graphs(bool on) {
  graphs_.reset();
  if (!on || !device_.is_cuda() || !decoder_->decode_step_capturable()) return;
  graphs_ = std::make_unique<DecodeGraphs>(
      [this](const at::Tensor& tokens, int64_t key_length) {
        // The TP collectives of a step that a graph captures: enqueued, waited for below.
        const EnqueueOnlyScope enqueue(tensor_group_);
        return decoder_->DecodeStep(tokens, position_, key_length, rope_, *cache_,
                                    decode_dispatch());
      },
      max_batch_, device_, [this] {
        if (expert_group_ != nullptr) expert_group_->WaitEnqueued();
        if (tensor_group_ != nullptr) tensor_group_->WaitEnqueued();
      });
}

int64_t RolloutEngine::KeyLength(int64_t position) const {
  return std::min(max_length_, (position + kKeyBlock) / kKeyBlock * kKeyBlock);
}

void RolloutEngine::Record(ChoiceRecord& record, int64_t layer, const at::Tensor& ids) {
  const int64_t k = record.data.size(3);
  const at::Tensor into = record.data[record.ordinal.at(static_cast<size_t>(layer))];
  const at::Tensor values = ids.to(record.data.scalar_type());
  if (prefill_length_ > 0) {  // rows [0, batch), positions [0, prefill_length_)
    const int64_t batch = values.numel() / (prefill_length_ * k);
    into.narrow(0, 0, batch)
        .narrow(1, 0, prefill_length_)
        .copy_(values.reshape({batch, prefill_length_, k}));
  } else {  // a decode step: rows [0, n) at the device-side position
    const int64_t n = values.numel() / k;
    into.narrow(0, 0, n).index_copy_(1, position_, values.reshape({n, 1, k}));
  }
}

at::Tensor RolloutEngine::DecodeLogits(const at::Tensor& tokens, int64_t key_length) {
  const at::Tensor logits =
      graphs_ != nullptr
          ? graphs_->Run(tokens, key_length)
          : decoder_->DecodeStep(tokens, position_, key_length, rope_, *cache_, decode_dispatch());
  // Note [Enqueued all-to-all]: the sampler reads the logits on the host next.
  if (expert_group_ != nullptr) expert_group_->WaitEnqueued();
  if (tensor_group_ != nullptr) tensor_group_->WaitEnqueued();
  return logits;
}

void RolloutEngine::LoadWeights(const model::TensorMap& params) {
  std::vector<std::string> missing;
  std::vector<std::string> mismatched;
  std::vector<std::string> unexpected;
  for (const auto& [name, view] : weights_) {
    auto it = params.find(name);
    if (it == params.end()) {
      missing.push_back(name);
    } else if (it->second.sizes() != view.sizes()) {
      mismatched.push_back(fmt::format("{} [{}] (engine [{}])", name,
                                       fmt::join(it->second.sizes(), ", "),
                                       fmt::join(view.sizes(), ", ")));
    }
  }
  for (const auto& [name, tensor] : params) {
    if (weights_.count(name) == 0) unexpected.push_back(name);
  }
  std::sort(missing.begin(), missing.end());
  std::sort(mismatched.begin(), mismatched.end());
  std::sort(unexpected.begin(), unexpected.end());
  RL_CHECK(missing.empty() && mismatched.empty() && unexpected.empty(), Error,
           "rollout engine LoadWeights: the tensors do not match the model; missing: [{}]; wrong "
           "shape: [{}]; unexpected: [{}]",
           fmt::join(missing, ", "), fmt::join(mismatched, ", "), fmt::join(unexpected, ", "));
  for (auto& [name, view] : weights_) view.copy_(params.at(name));
}

void RolloutEngine::SetMemoryHooks(std::function<void()> pause, std::function<void()> resume) {
  pause_hook_ = std::move(pause);
  resume_hook_ = std::move(resume);
}

void RolloutEngine::Sleep() {
  RL_CHECK(!asleep_, Error, "rollout engine: Sleep() called while already asleep");
  if (pause_hook_) pause_hook_();
  asleep_ = true;
}

void RolloutEngine::WakeUp() {
  RL_CHECK(asleep_, Error, "rollout engine: WakeUp() called while already awake");
  if (resume_hook_) resume_hook_();
  asleep_ = false;
}

std::vector<Generation> RolloutEngine::Generate(const std::vector<std::vector<int64_t>>& prompts,
                                                const SamplingParams& params) {
  RL_CHECK(!asleep_, Error,
           "rollout engine is asleep: call WakeUp() (and restore the weights) before Generate()");
  CheckSamplerConfig({params.temperature, params.top_p, params.top_k});
  RL_CHECK(params.max_new_tokens >= 1, ConfigError, "sampling max_new_tokens must be >= 1; got {}",
           params.max_new_tokens);
  // Prompts grouped by length (Note [Rollout batching]); std::map orders groups by length.
  std::map<size_t, std::vector<size_t>> by_length;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int64_t>& prompt = prompts[i];
    RL_CHECK(!prompt.empty(), Error, "rollout engine: prompt {} is empty", i);
    RL_CHECK(static_cast<int64_t>(prompt.size()) < max_length_, Error,
             "rollout engine: prompt {} has {} tokens, which leaves no room for a response under "
             "max_length {}; raise the engine's max_length or shorten the prompt",
             i, prompt.size(), max_length_);
    for (int64_t token : prompt) {
      RL_CHECK(token >= 0 && token < config_.vocab_size, Error,
               "rollout engine: prompt {} holds token id {}, outside the vocabulary [0, {})", i,
               token, config_.vocab_size);
    }
    by_length[prompt.size()].push_back(i);
  }
  std::vector<Generation> out(prompts.size());
  if (expert_group_ != nullptr) dispatch_.overflow.zero_();
  for (const auto& [length, rows] : by_length) {
    for (size_t begin = 0; begin < rows.size(); begin += static_cast<size_t>(max_batch_)) {
      const size_t end = std::min(rows.size(), begin + static_cast<size_t>(max_batch_));
      GenerateGroup(prompts, std::vector<size_t>(rows.begin() + begin, rows.begin() + end), params,
                    out);
    }
  }
  // Note [Expert-parallel decode]: serve the group's other engines until every one is done.
  JoinGroupStep(StepKind::kNone);
  return out;
}

// Note [Expert-parallel decode]
// Under expert parallelism every forward is a collective over the expert group (Note
// [Expert-parallel MoE] in trainer/model/layers.h), but the engines of a group hold different
// prompts, so they need different numbers and kinds of forwards (prefills of other lengths, rows
// that stop at other steps). The prefill uses the exact exchange; a decode step uses the
// fixed-capacity one (Note [Fixed-capacity dispatch]), so that it can be captured in a CUDA graph;
// the two do not pair up, so the engines agree on the kind of every forward. Before each of its
// forwards an engine joins a two-value all-reduce (max) over the group: the kind of the forward it
// wants to run (prefill 2, decode 1, none 0) and its decode overflow flag. The largest kind runs:
// an engine that wants it runs its forward; the others run an idle step of that kind
// (Decoder::IdleStep: each MoE layer serves the rows sent to its experts, with no tokens of its
// own) and ask again. So every engine makes the same sequence of collectives, prefills go first
// (each prefilling engine progresses at once), decode steps run together, and the group leaves
// Generate together when no engine wants anything. The all-reduce reads its result on the host,
// one wait per step, outside the captured decode step. A flag set by any engine's decode step
// (the capacity was too small) reaches every engine there, and every engine throws the same
// error, so no engine is left waiting in a collective. The decode step's all-to-alls are only
// enqueued; the engine waits for them under the group's timeout (Communicator::WaitEnqueued)
// before it reads the logits on the host.
void RolloutEngine::JoinGroupStep(StepKind mine) {
  if (expert_group_ == nullptr) return;
  const at::TensorOptions floats = at::TensorOptions().dtype(at::kFloat).device(device_);
  while (true) {
    // [kind, overflow flag x (group rank + 1)]: the max names the last rank that overflowed.
    const at::Tensor proposal =
        at::cat({at::full({1}, static_cast<int>(mine), floats),
                 dispatch_.overflow.to(at::kFloat) * (expert_group_->rank() + 1)});
    expert_group_->AllReduce(proposal, ReduceOp::kMax);
    const at::Tensor agreed = proposal.cpu();
    const auto kind = static_cast<StepKind>(static_cast<int>(agreed[0].item<float>()));
    const int overflowed = static_cast<int>(agreed[1].item<float>());
    RL_CHECK(overflowed == 0, Error,
             "expert-parallel decode: a decode step of rank {} of the '{}' group sent one rank "
             "more rows than the dispatch capacity of {} rows (--rollout-ep-capacity-factor {} "
             "over a batch of {}); raise the factor, or set it to 0 for the worst case, which "
             "never overflows",
             overflowed - 1, expert_group_->name(), dispatch_.capacity, capacity_factor_,
             max_batch_);
    if (kind == mine) return;
    decoder_->IdleStep(kind == StepKind::kDecode ? &dispatch_ : nullptr);
  }
}

void RolloutEngine::GenerateGroup(const std::vector<std::vector<int64_t>>& prompts,
                                  const std::vector<size_t>& rows, const SamplingParams& params,
                                  std::vector<Generation>& out) {
  const SamplerConfig sampler{params.temperature, params.top_p, params.top_k};
  const bool greedy = IsGreedy(sampler);
  const int64_t batch = static_cast<int64_t>(rows.size());
  const int64_t prompt_length = static_cast<int64_t>(prompts[rows[0]].size());
  const int64_t limit = std::min(params.max_new_tokens, max_length_ - prompt_length);
  const std::unordered_set<int64_t> stop(params.stop_token_ids.begin(),
                                         params.stop_token_ids.end());

  std::vector<at::Generator> generators;  // Note [Rollout seeds]
  std::vector<int64_t> flat;              // [batch, prompt_length]
  for (size_t row : rows) {
    generators.push_back(MakeGenerator(params.seed + static_cast<uint64_t>(row)));
    flat.insert(flat.end(), prompts[row].begin(), prompts[row].end());
    out[row].prompt = prompts[row];
  }
  // Note [Rollout decode steps]: the positions the decode steps may mask hold finite values, in
  // every row a decode graph may compute on.
  const int64_t rows_used = DecodeGraphs::BatchBucket(batch, max_batch_);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    for (auto& [tensor, position_dim] : CacheTensors(cache_->layer(l))) {
      tensor.narrow(0, 0, rows_used)
          .narrow(position_dim, prompt_length, max_length_ - prompt_length)
          .zero_();
    }
  }
  const at::Tensor prompt_tokens =
      at::tensor(flat, at::TensorOptions().dtype(at::kLong)).view({batch, prompt_length});
  // [live, vocab]: the next-token logits of each live row.
  prefill_length_ = prompt_length;  // Note [Engine routing record]
  at::Tensor logits;
  try {
    JoinGroupStep(StepKind::kPrefill);  // Note [Expert-parallel decode]
    logits = decoder_->PrefillLogits(prompt_tokens, *cache_, 0);
  } catch (...) {
    prefill_length_ = 0;
    throw;
  }
  prefill_length_ = 0;

  std::vector<int64_t> live(static_cast<size_t>(batch));  // indices into rows, in cache-row order
  for (int64_t j = 0; j < batch; ++j) live[static_cast<size_t>(j)] = j;
  int64_t position = prompt_length;
  for (int64_t step = 0; step < limit; ++step) {
    at::Tensor uniforms;
    if (!greedy) {
      std::vector<at::Tensor> draws;
      for (int64_t j : live) {
        draws.push_back(at::rand({1}, generators[static_cast<size_t>(j)],
                                 at::TensorOptions().dtype(at::kDouble)));
      }
      uniforms = at::cat(draws);
    }
    const SampledTokens sampled = SampleWithUniforms(logits, sampler, uniforms);
    const at::Tensor tokens = sampled.tokens.to(at::kCPU).contiguous();
    const at::Tensor log_probs = sampled.log_probs.to(at::kCPU).contiguous();
    const int64_t* token_data = tokens.data_ptr<int64_t>();
    const float* log_prob_data = log_probs.data_ptr<float>();

    std::vector<int64_t> finished;  // cache rows (indices into `live`) that end at this step
    for (size_t r = 0; r < live.size(); ++r) {
      Generation& gen = out[rows[static_cast<size_t>(live[r])]];
      gen.response.push_back(token_data[r]);
      gen.log_probs.push_back(log_prob_data[r]);
      const bool stopped = stop.count(token_data[r]) > 0;
      const bool full = static_cast<int64_t>(gen.response.size()) >= limit;
      if (!stopped && full) gen.truncated = true;
      if (stopped || full) finished.push_back(static_cast<int64_t>(r));
    }
    if (!finished.empty() && (experts_.data.defined() || indexer_.data.defined())) {
      // Note [Engine routing record]: the fed positions [first, position) of each finished row.
      const at::Tensor finished_rows =
          at::tensor(finished, at::TensorOptions().dtype(at::kLong)).to(device_);
      const auto extract = [&](const ChoiceRecord& record, auto& (*field)(Generation&)) {
        if (!record.data.defined() || position <= record.first) return;
        using T = typename std::remove_reference_t<decltype(field(out[0]))>::value_type;
        const at::Tensor ids = record.data.narrow(2, record.first, position - record.first)
                                   .index_select(1, finished_rows)
                                   .cpu()
                                   .contiguous();  // [layers, finished, positions, k]
        for (size_t f = 0; f < finished.size(); ++f) {
          const at::Tensor row = ids.select(1, static_cast<int64_t>(f)).contiguous();
          const T* data = row.data_ptr<T>();
          field(out[rows[static_cast<size_t>(live[static_cast<size_t>(finished[f])])]])
              .assign(data, data + row.numel());
        }
      };
      extract(
          experts_, +[](Generation& g) -> std::vector<int16_t>& { return g.routed_experts; });
      extract(
          indexer_, +[](Generation& g) -> std::vector<int32_t>& { return g.indexer_topk; });
    }
    if (finished.size() == live.size()) break;
    // The next step's tokens are the sampled ones of the rows that go on, still on the device.
    at::Tensor step_tokens = sampled.tokens;
    if (!finished.empty()) {
      const RowFill fill = FillFinishedRows(finished, static_cast<int64_t>(live.size()));
      const auto on_device = [&](const std::vector<int64_t>& v) {
        return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device_);
      };
      if (!fill.from.empty()) {
        const at::Tensor from = on_device(fill.from);
        const at::Tensor to = on_device(fill.to);
        for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
          for (auto& [tensor, position_dim] : CacheTensors(cache_->layer(l))) {
            MoveRows(tensor, 0, position_dim, from, to, position);
          }
        }
        for (ChoiceRecord* record : {&experts_, &indexer_}) {  // [layers, rows, positions, k]
          if (record->data.defined()) MoveRows(record->data, 1, 2, from, to, position);
        }
      }
      step_tokens = step_tokens.index_select(0, on_device(fill.order));
      std::vector<int64_t> next_live;
      for (int64_t r : fill.order) next_live.push_back(live[static_cast<size_t>(r)]);
      live = std::move(next_live);
    }
    step_tokens = step_tokens.reshape({-1, 1});
    position_.fill_(position);
    JoinGroupStep(StepKind::kDecode);
    logits = DecodeLogits(step_tokens, KeyLength(position));
    ++position;
  }
}

}  // namespace rl::rollout
