#include "trainer/rollout/engine.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "launch/check.h"
#include "trainer/kernels/fused_ops.h"
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

// `v` as an int64 tensor on `device` (row indices for index_select and index_copy_).
at::Tensor OnDevice(const std::vector<int64_t>& v, at::Device device) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(device);
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
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong);
  step_ = at::zeros({2, max_batch_}, longs.device(device_));
  token_ = step_.select(0, 0);
  position_ = step_.select(0, 1);
  const bool pinned = device_.is_cuda();
  for (HostSlot& slot : slots_) {
    slot.step = at::zeros({2, max_batch_}, longs.pinned_memory(pinned));
    // Note [Sampled tokens handed on]: on the CPU the device's side is the host memory itself.
    const auto memory = [&](at::ScalarType dtype) {
      if (pinned) return kernels::MappedHostEmpty({max_batch_}, dtype, device_);
      const at::Tensor host = at::zeros({max_batch_}, longs.dtype(dtype));
      return kernels::MappedHost{host, host};
    };
    slot.uniforms = memory(at::kDouble);
    slot.tokens = memory(at::kLong);
    slot.log_probs = memory(at::kFloat);
    if (pinned) slot.copied.emplace(device_.type());
  }
  set_cuda_graphs(true);
}

void RolloutEngine::set_latent_mla_decode(bool on) {
  decoder_->set_latent_mla_decode(on);
  set_cuda_graphs(uses_cuda_graphs());
}

void RolloutEngine::set_programmatic_launch(bool on) {
  decoder_->set_programmatic_launch(on);
  set_cuda_graphs(uses_cuda_graphs());
}

void RolloutEngine::set_cuda_graphs(bool on) {
  graphs_.reset();
  if (!on || !device_.is_cuda() || !decoder_->decode_step_capturable()) return;
  graphs_ = std::make_unique<DecodeGraphs>(
      [this](const at::Tensor& tokens, int64_t key_length) {
        // The TP collectives of a step that a graph captures: enqueued, waited for below.
        const EnqueueOnlyScope enqueue(tensor_group_);
        return decoder_->DecodeStep(tokens, position_.narrow(0, 0, tokens.size(0)), key_length,
                                    rope_, *cache_, decode_dispatch());
      },
      token_.view({max_batch_, 1}), [this] {
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
  if (prefill_length_ > 0) {  // rows [prefill_row_, + batch), positions [0, prefill_length_)
    const int64_t batch = values.numel() / (prefill_length_ * k);
    into.narrow(0, prefill_row_, batch)
        .narrow(1, 0, prefill_length_)
        .copy_(values.reshape({batch, prefill_length_, k}));
  } else {  // a decode step: rows [0, n), each at its device-side position
    const int64_t n = values.numel() / k;
    into.narrow(0, 0, n).scatter_(1, position_.narrow(0, 0, n).view({n, 1, 1}).expand({n, 1, k}),
                                  values.reshape({n, 1, k}));
  }
}

at::Tensor RolloutEngine::DecodeLogits(int64_t live, int64_t key_length) {
  const at::Tensor logits =
      graphs_ != nullptr
          ? graphs_->Run(live, key_length)
          : decoder_->DecodeStep(token_.narrow(0, 0, live).view({live, 1}),
                                 position_.narrow(0, 0, live), key_length, rope_, *cache_,
                                 decode_dispatch());
  // Note [Enqueued all-to-all]: the host reads what the step sampled next.
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

// One Generate call's rows (Note [Rollout batching]): the prompts not yet admitted, and per live
// cache row r (row r of the KV cache) its prompt, the cache position its next token goes to (the
// tokens it has fed so far), its response limit and its next token (sampled, not yet fed).
struct RolloutEngine::Rows {
  const std::vector<std::vector<int64_t>>& prompts;
  std::vector<Generation>& out;
  SamplerConfig sampler;
  int64_t max_new_tokens = 0;
  std::unordered_set<int64_t> stop;
  std::vector<at::Generator> generators;  // one per prompt: Note [Rollout seeds]
  size_t admitted = 0;                    // prompts [0, admitted) have been admitted
  std::vector<size_t> prompt;
  std::vector<int64_t> position;
  std::vector<int64_t> limit;
  std::vector<int64_t> token;

  int64_t live() const { return static_cast<int64_t>(prompt.size()); }
  size_t queued() const { return prompts.size() - admitted; }
  // True when some row is below its length limit once the steps launched so far are read (a row
  // at `position` has fed position - prompt length of its response tokens, and the step that fed
  // the last of them samples one more).
  bool AnyGoesOn() const {
    for (size_t r = 0; r < prompt.size(); ++r) {
      const auto prompt_length = static_cast<int64_t>(prompts[prompt[r]].size());
      if (position[r] - prompt_length + 1 < limit[r]) return true;
    }
    return false;
  }
};

std::vector<Generation> RolloutEngine::Generate(const std::vector<std::vector<int64_t>>& prompts,
                                                const SamplingParams& params) {
  RL_CHECK(!asleep_, Error,
           "rollout engine is asleep: call WakeUp() (and restore the weights) before Generate()");
  CheckSamplerConfig({params.temperature, params.top_p, params.top_k});
  RL_CHECK(params.max_new_tokens >= 1, ConfigError, "sampling max_new_tokens must be >= 1; got {}",
           params.max_new_tokens);
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
  }
  std::vector<Generation> out(prompts.size());
  Rows rows{prompts, out};
  rows.sampler = {params.temperature, params.top_p, params.top_k};
  rows.max_new_tokens = params.max_new_tokens;
  rows.stop.insert(params.stop_token_ids.begin(), params.stop_token_ids.end());
  for (size_t i = 0; i < prompts.size(); ++i) {
    rows.generators.push_back(MakeGenerator(params.seed + static_cast<uint64_t>(i)));
    out[i].prompt = prompts[i];
  }
  if (expert_group_ != nullptr) dispatch_.overflow.zero_();
  stats_ = {};
  // Note [Rollout decode steps]: every cache row a decode graph may compute on holds finite
  // values; rows written since hold what the model computed.
  const int64_t rows_used = DecodeGraphs::BatchBucket(
      std::min<int64_t>(max_batch_, std::max<size_t>(1, prompts.size())), max_batch_);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    for (auto& [tensor, position_dim] : CacheTensors(cache_->layer(l))) {
      tensor.narrow(0, 0, rows_used).zero_();
    }
  }
  // Admit prompts while a quarter of the rows (or what is left of the prompts) is free.
  const int64_t admit_at = std::max<int64_t>(1, max_batch_ / kAdmitFraction);
  while (true) {
    const int64_t free = max_batch_ - rows.live();
    const int64_t queued = static_cast<int64_t>(rows.queued());
    if (queued > 0 && (rows.live() == 0 || free >= std::min(queued, admit_at))) {
      Admit(rows, std::min(free, queued));
    }
    if (rows.live() == 0) {
      if (rows.queued() == 0) break;
      continue;  // every admitted row ended at its first token
    }
    DecodeUntilRowsEnd(rows);
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

void RolloutEngine::Admit(Rows& rows, int64_t count) {
  // The admitted prompts, longest first, in prefills of lengths within a factor of 2 of their
  // longest (so padding is less than half a prefill's positions), each right-padded to that
  // longest and written into the next free cache rows.
  std::vector<size_t> admitted;
  for (int64_t i = 0; i < count; ++i) admitted.push_back(rows.admitted++);
  std::stable_sort(admitted.begin(), admitted.end(), [&](size_t a, size_t b) {
    return rows.prompts[a].size() > rows.prompts[b].size();
  });
  std::vector<int64_t> finished;
  for (size_t begin = 0; begin < admitted.size();) {
    const int64_t longest = static_cast<int64_t>(rows.prompts[admitted[begin]].size());
    size_t end = begin + 1;
    while (end < admitted.size() &&
           2 * static_cast<int64_t>(rows.prompts[admitted[end]].size()) >= longest) {
      ++end;
    }
    const int64_t first_row = rows.live();
    const int64_t batch = static_cast<int64_t>(end - begin);
    std::vector<int64_t> flat(static_cast<size_t>(batch * longest), 0);  // [batch, longest]
    std::vector<int64_t> lengths;
    for (size_t k = begin; k < end; ++k) {
      const std::vector<int64_t>& prompt = rows.prompts[admitted[k]];
      const int64_t length = static_cast<int64_t>(prompt.size());
      std::copy(prompt.begin(), prompt.end(),
                flat.begin() + static_cast<int64_t>(k - begin) * longest);
      lengths.push_back(length);
      rows.prompt.push_back(admitted[k]);
      rows.position.push_back(length);
      rows.limit.push_back(std::min(rows.max_new_tokens, max_length_ - length));
      rows.token.push_back(0);
    }
    const at::Tensor tokens =
        at::tensor(flat, at::TensorOptions().dtype(at::kLong)).view({batch, longest});
    prefill_row_ = first_row;  // Note [Engine routing record]
    prefill_length_ = longest;
    at::Tensor logits;  // [batch, vocab]: the next-token logits of the admitted rows
    try {
      JoinGroupStep(StepKind::kPrefill);  // Note [Expert-parallel decode]
      model::KvCache cache_rows = cache_->Rows(first_row, batch);
      logits = decoder_->PrefillLogits(tokens, cache_rows, 0, lengths);
    } catch (...) {
      prefill_length_ = 0;
      throw;
    }
    prefill_length_ = 0;
    ++stats_.prefills;
    HostSlot& slot = NextSlot();
    SampleToHost(rows, logits, first_row, slot, /*decode=*/false);
    TakeSampled(rows, slot, first_row, batch, {}, finished);
    begin = end;
  }
  Retire(rows, finished);
}

RolloutEngine::HostSlot& RolloutEngine::NextSlot() {
  HostSlot& slot = slots_[static_cast<size_t>(next_slot_)];
  next_slot_ = 1 - next_slot_;
  return slot;
}

void RolloutEngine::DecodeUntilRowsEnd(Rows& rows) {
  StepInFlight step = LaunchDecode(rows, /*from_device=*/false);
  std::vector<int64_t> finished;
  while (true) {
    // Note [Overlapped decode steps]: the next step goes first, on the tokens of this one.
    std::optional<StepInFlight> next;
    if (overlapped_steps_ && rows.AnyGoesOn()) next = LaunchDecode(rows, /*from_device=*/true);
    TakeSampled(rows, *step.slot, 0, step.rows, {}, finished);
    if (finished.empty()) {
      step = next.has_value() ? *next : LaunchDecode(rows, /*from_device=*/false);
      continue;
    }
    if (next.has_value()) {  // the rows that ended were fed one token past their end: drop it
      const std::vector<int64_t> ended = finished;
      for (int64_t r : ended) --rows.position[static_cast<size_t>(r)];
      stats_.overrun_row_steps += static_cast<int64_t>(ended.size());
      TakeSampled(rows, *next->slot, 0, next->rows, ended, finished);
      std::sort(finished.begin(), finished.end());
    }
    Retire(rows, finished);
    return;
  }
}

RolloutEngine::StepInFlight RolloutEngine::LaunchDecode(Rows& rows, bool from_device) {
  const int64_t live = rows.live();
  HostSlot& slot = NextSlot();
  if (!from_device) {
    // The step's tokens and positions, staged and copied in one transfer; the rows past the live
    // ones (a graph's padding rows) at position 0.
    int64_t* host = slot.step.data_ptr<int64_t>();
    std::copy(rows.token.begin(), rows.token.end(), host);
    std::copy(rows.position.begin(), rows.position.end(), host + max_batch_);
    std::fill(host + max_batch_ + live, host + 2 * max_batch_, 0);
    step_.copy_(slot.step, /*non_blocking=*/true);
  }
  const int64_t last = *std::max_element(rows.position.begin(), rows.position.end());
  JoinGroupStep(StepKind::kDecode);
  const at::Tensor logits = DecodeLogits(live, KeyLength(last));
  for (int64_t& position : rows.position) ++position;
  ++stats_.decode_steps;
  stats_.row_steps += live;
  SampleToHost(rows, logits, 0, slot, /*decode=*/true);
  return {live, &slot};
}

void RolloutEngine::SampleToHost(Rows& rows, const at::Tensor& logits, int64_t first_row,
                                 HostSlot& slot, bool decode) {
  const int64_t n = logits.size(0);
  // Note [Sampled tokens handed on]: the device reads and writes the slot through `device`.
  at::Tensor uniforms;
  if (!IsGreedy(rows.sampler)) {  // Note [Rollout seeds]: one draw from each row's generator
    const at::Tensor draws = slot.uniforms.host.narrow(0, 0, n);
    for (int64_t i = 0; i < n; ++i) {
      draws.narrow(0, i, 1).uniform_(
          0, 1, rows.generators[rows.prompt[static_cast<size_t>(first_row + i)]]);
    }
    uniforms = slot.uniforms.device.narrow(0, 0, n);
  }
  kernels::HandOn hand_on;
  hand_on.host_tokens = slot.tokens.device.narrow(0, 0, n);
  hand_on.host_log_probs = slot.log_probs.device.narrow(0, 0, n);
  if (decode) {
    hand_on.next_tokens = token_.narrow(0, 0, n);
    hand_on.positions = position_.narrow(0, 0, n);
  }
  SampleWithUniforms(logits, rows.sampler, uniforms, hand_on);
  if (slot.copied.has_value()) {
    slot.copied->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  }
}

void RolloutEngine::TakeSampled(Rows& rows, HostSlot& slot, int64_t first_row, int64_t n,
                                const std::vector<int64_t>& dropped,
                                std::vector<int64_t>& finished) {
  if (slot.copied.has_value()) slot.copied->synchronize();
  const int64_t* token_data = slot.tokens.host.data_ptr<int64_t>();
  const float* log_prob_data = slot.log_probs.host.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = first_row + i;
    if (std::binary_search(dropped.begin(), dropped.end(), row)) continue;
    const auto r = static_cast<size_t>(row);
    Generation& gen = rows.out[rows.prompt[r]];
    gen.response.push_back(token_data[i]);
    gen.log_probs.push_back(log_prob_data[i]);
    rows.token[r] = token_data[i];
    const bool stopped = rows.stop.count(token_data[i]) > 0;
    const bool full = static_cast<int64_t>(gen.response.size()) >= rows.limit[r];
    if (!stopped && full) gen.truncated = true;
    if (stopped || full) finished.push_back(row);
  }
}

void RolloutEngine::Retire(Rows& rows, const std::vector<int64_t>& finished) {
  if (finished.empty()) return;
  if (experts_.data.defined() || indexer_.data.defined()) {
    // Note [Engine routing record]: the fed positions [first, position) of each finished row.
    int64_t longest = 0;
    for (int64_t r : finished) longest = std::max(longest, rows.position[static_cast<size_t>(r)]);
    const at::Tensor finished_rows = OnDevice(finished, device_);
    const auto extract = [&](const ChoiceRecord& record, auto& (*field)(Generation&)) {
      if (!record.data.defined() || longest <= record.first) return;
      using T = typename std::remove_reference_t<decltype(field(rows.out[0]))>::value_type;
      const at::Tensor ids = record.data.narrow(2, record.first, longest - record.first)
                                 .index_select(1, finished_rows)
                                 .cpu();  // [layers, finished, positions, k]
      for (size_t f = 0; f < finished.size(); ++f) {
        const size_t r = static_cast<size_t>(finished[f]);
        const int64_t fed = rows.position[r] - record.first;
        if (fed <= 0) continue;
        const at::Tensor row =
            ids.select(1, static_cast<int64_t>(f)).narrow(1, 0, fed).contiguous();
        const T* data = row.data_ptr<T>();
        field(rows.out[rows.prompt[r]]).assign(data, data + row.numel());
      }
    };
    extract(
        experts_, +[](Generation& g) -> std::vector<int16_t>& { return g.routed_experts; });
    extract(
        indexer_, +[](Generation& g) -> std::vector<int32_t>& { return g.indexer_topk; });
  }
  const RowFill fill = FillFinishedRows(finished, rows.live());
  if (!fill.from.empty()) {
    int64_t length = 0;  // the positions the moving rows hold
    for (int64_t r : fill.from) length = std::max(length, rows.position[static_cast<size_t>(r)]);
    const at::Tensor from = OnDevice(fill.from, device_);
    const at::Tensor to = OnDevice(fill.to, device_);
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      for (auto& [tensor, position_dim] : CacheTensors(cache_->layer(l))) {
        MoveRows(tensor, 0, position_dim, from, to, length);
      }
    }
    for (ChoiceRecord* record : {&experts_, &indexer_}) {  // [layers, rows, positions, k]
      if (record->data.defined()) MoveRows(record->data, 1, 2, from, to, length);
    }
  }
  const auto reorder = [&](auto& v) {
    std::remove_reference_t<decltype(v)> next;
    for (int64_t r : fill.order) next.push_back(v[static_cast<size_t>(r)]);
    v = std::move(next);
  };
  reorder(rows.prompt);
  reorder(rows.position);
  reorder(rows.limit);
  reorder(rows.token);
}

}  // namespace rl::rollout
