#include "trainer/model/decoder.h"

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "launch/check.h"
#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/model/tensor_parallel.h"
#include "trainer/model/vocab_parallel.h"

namespace rl::model {
namespace {

// Element counts of each per-layer cache tensor (0 when unused).
std::vector<std::vector<std::vector<int64_t>>> CacheShapes(const ModelConfig& c, int64_t batch,
                                                           int64_t len) {
  std::vector<std::vector<std::vector<int64_t>>> out;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::vector<std::vector<int64_t>> shapes;
    if (c.attention_kind() == AttentionKind::kGqa) {
      // Under TP this rank's key/value heads (Note [Tensor-parallel attention]).
      const int64_t kv_heads =
          KvHeadsOf(c.num_key_value_heads, c.tensor_shard.rank, c.tensor_shard.size).count;
      shapes.push_back({batch, kv_heads, len, c.head_dim});  // key
      shapes.push_back({batch, kv_heads, len, c.head_dim});  // value
    } else {
      shapes.push_back({batch, len, c.kv_lora_rank + c.qk_rope_head_dim});  // latent, k_pe
      if (c.has_indexer() && c.indexer_types[l] == IndexerType::kFull) {
        shapes.push_back({batch, len, c.index_head_dim});  // index_key
      }
    }
    out.push_back(std::move(shapes));
  }
  return out;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const at::Tensor& Get(const TensorMap& params, const std::string& name) {
  auto it = params.find(name);
  RL_CHECK(it != params.end(), Error, "model parameter {} is missing", name);
  return it->second;
}

at::Tensor GetOptional(const TensorMap& params, const std::string& name) {
  auto it = params.find(name);
  return it == params.end() ? at::Tensor() : it->second;
}

// The parts as one tensor concatenated along dim 0, as a view, when they lie back to back in one
// storage (contiguous, same dtype and trailing dims, each starting where the previous ends);
// undefined otherwise.
at::Tensor BackToBack(const std::vector<at::Tensor>& parts) {
  int64_t rows = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const at::Tensor& p = parts[i];
    if (!p.defined() || p.dim() == 0 || !p.is_contiguous() ||
        !p.storage().is_alias_of(parts[0].storage()) ||
        p.scalar_type() != parts[0].scalar_type() ||
        p.sizes().slice(1) != parts[0].sizes().slice(1)) {
      return at::Tensor();
    }
    if (i > 0 && p.storage_offset() !=
                     parts[i - 1].storage_offset() + parts[i - 1].numel()) {
      return at::Tensor();
    }
    rows += p.size(0);
  }
  std::vector<int64_t> sizes = parts[0].sizes().vec();
  sizes[0] = rows;
  return parts[0].as_strided(sizes, parts[0].strides());
}

MlpWeights GetMlp(const TensorMap& params, const std::string& prefix) {
  return {Get(params, prefix + "gate_proj.weight"), Get(params, prefix + "up_proj.weight"),
          Get(params, prefix + "down_proj.weight")};
}

// Note [Indexer replay]
// The DSA attention of a layer attends to the keys its lightning indexer selects (IndexerTopk in
// layers.h: the index_topk best of the visible keys, or every key while there are at most
// index_topk). Training can replay the rollout engine's selection instead of computing its own:
// the selection is handed to MlaAttention as a sharing layer's would be (IndexerType::kShared
// reads `topk`), so the attention is computed exactly over the replayed keys, and layers sharing
// the indexer see the replayed selection too. The indexer's own weights are not trained by the
// policy loss either way (its top-k has no gradient).
//
// Note [Decode steps without cuDNN attention]
// SDPA does not pick its cuDNN backend while a CUDA graph is being captured, but may pick it for
// the same call run eagerly (seen for MLA's head dim 256 at GLM-4.7-Flash widths: graph replays
// and eager steps then generated different tokens). A device-position decode step therefore turns
// the cuDNN backend off for its duration, so that a replayed step and an eager one run the same
// kernels and compute the same bits (decode_bench --compare-eager checks it); the speed of the
// step did not change (164.8 vs 164.0 ms per Generate of 64 x 32 tokens on the H200). The switch is
// process-wide, restored on return; the engine's thread is the only one computing while it decodes.
class CudnnAttentionOff {
 public:
  CudnnAttentionOff() : was_on_(at::globalContext().userEnabledCuDNNSDP()) {
    at::globalContext().setSDPUseCuDNN(false);
  }
  ~CudnnAttentionOff() { at::globalContext().setSDPUseCuDNN(was_on_); }
  CudnnAttentionOff(const CudnnAttentionOff&) = delete;
  CudnnAttentionOff& operator=(const CudnnAttentionOff&) = delete;

 private:
  bool was_on_;
};

}  // namespace

MoeWeights MoeWeightsOf(const TensorMap& params, const std::string& mlp_prefix) {
  const std::string& m = mlp_prefix;
  MoeWeights w;
  w.router = Get(params, m + "gate.weight");
  w.router_bias = GetOptional(params, m + "gate.e_score_correction_bias");
  w.gate_up = Get(params, m + "experts.gate_up_proj");
  w.down = Get(params, m + "experts.down_proj");
  w.has_shared = params.count(m + "shared_experts.gate_proj.weight") > 0;
  if (w.has_shared) w.shared = GetMlp(params, m + "shared_experts.");
  return w;
}

int64_t KvCache::NumElements(const ModelConfig& config, int64_t max_batch, int64_t max_length) {
  int64_t n = 0;
  for (const auto& layer : CacheShapes(config, max_batch, max_length)) {
    for (const auto& shape : layer) n += Numel(shape);
  }
  return n;
}

KvCache::KvCache(const ModelConfig& config, const at::Tensor& storage, int64_t max_batch,
                 int64_t max_length)
    : storage_(storage), max_batch_(max_batch), max_length_(max_length) {
  const int64_t needed = NumElements(config, max_batch, max_length);
  RL_CHECK(storage.dim() == 1 && storage.is_contiguous() && storage.numel() >= needed, Error,
           "KvCache: storage must be a contiguous 1-D tensor of at least {} elements for {} "
           "sequences of {} positions; got shape [{}]",
           needed, max_batch, max_length, fmt::join(storage.sizes(), ", "));
  int64_t offset = 0;
  auto take = [&](const std::vector<int64_t>& shape) {
    at::Tensor view = storage.narrow(0, offset, Numel(shape)).view(shape);
    offset += Numel(shape);
    return view;
  };
  for (const auto& shapes : CacheShapes(config, max_batch, max_length)) {
    LayerKv kv;
    if (config.attention_kind() == AttentionKind::kGqa) {
      kv.key = take(shapes[0]);
      kv.value = take(shapes[1]);
    } else {
      kv.latent_pe = take(shapes[0]);
      kv.latent = kv.latent_pe.narrow(-1, 0, config.kv_lora_rank);
      kv.k_pe = kv.latent_pe.narrow(-1, config.kv_lora_rank, config.qk_rope_head_dim);
      if (shapes.size() > 1) kv.index_key = take(shapes[1]);
    }
    layers_.push_back(std::move(kv));
  }
}

KvCache KvCache::Allocate(const ModelConfig& config, int64_t max_batch, int64_t max_length,
                          at::ScalarType dtype, at::Device device) {
  at::Tensor storage = at::zeros({NumElements(config, max_batch, max_length)},
                                 at::TensorOptions().dtype(dtype).device(device));
  return KvCache(config, storage, max_batch, max_length);
}

KvCache KvCache::Rows(int64_t begin, int64_t count) const {
  RL_CHECK(begin >= 0 && count >= 1 && begin + count <= max_batch_, Error,
           "KvCache::Rows: rows [{}, {}) of a cache of {}", begin, begin + count, max_batch_);
  KvCache rows = *this;
  rows.max_batch_ = count;
  for (LayerKv& kv : rows.layers_) {
    for (at::Tensor* t : {&kv.key, &kv.value, &kv.latent_pe, &kv.latent, &kv.k_pe, &kv.index_key}) {
      if (t->defined()) *t = t->narrow(0, begin, count);
    }
  }
  return rows;
}

Decoder::Decoder(ModelConfig config, const TensorMap& params, Kernels kernels,
                 Communicator* expert_group, Communicator* tensor_group, bool sequence_parallel)
    : config_(std::move(config)),
      kernels_(kernels),
      tensor_group_(tensor_group != nullptr && tensor_group->size() > 1 ? tensor_group : nullptr),
      sequence_parallel_(tensor_group_ != nullptr && sequence_parallel),
      dtype_(at::kFloat),
      device_(at::kCPU) {
  CheckParams(ListParams(config_), params);
  RL_CHECK((tensor_group_ != nullptr ? tensor_group_->size() : 1) == config_.tensor_shard.size,
           Error, "Decoder: the model is sharded over {} tensor-parallel ranks, but the group has {}",
           config_.tensor_shard.size, tensor_group_ != nullptr ? tensor_group_->size() : 1);
  vocab_start_ =
      VocabSlice(config_.vocab_size, config_.tensor_shard.rank, config_.tensor_shard.size).first;
  const int64_t group_size = expert_group != nullptr ? expert_group->size() : 1;
  RL_CHECK(group_size == config_.expert_shard.size, Error,
           "Decoder: the model's experts are sharded over {} ranks, but the expert group has {}",
           config_.expert_shard.size, group_size);
  if (kernels_ == Kernels::kFused) {
    for (const auto& [name, param] : params) {
      RL_CHECK(!param.requires_grad(), Error,
               "a Decoder with fused inference kernels takes params without autograd; {} "
               "requires grad",
               name);
    }
  }
  // The tensor-parallel attention takes q, k and v apart (its heads' slices of each).
  const bool fuse = kernels_ == Kernels::kFused && tensor_group_ == nullptr;
  const ModelConfig& c = config_;
  embed_tokens_ = Get(params, "model.embed_tokens.weight");
  dtype_ = embed_tokens_.scalar_type();
  device_ = embed_tokens_.device();
  final_norm_ = Get(params, "model.norm.weight");
  lm_head_ = c.tie_word_embeddings ? embed_tokens_ : Get(params, "lm_head.weight");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const std::string a = p + "self_attn.";
    Layer layer;
    layer.input_norm = Get(params, p + "input_layernorm.weight");
    layer.post_norm = Get(params, p + "post_attention_layernorm.weight");
    if (c.attention_kind() == AttentionKind::kGqa) {
      GqaWeights& w = layer.gqa;
      w.q_proj = Get(params, a + "q_proj.weight");
      w.q_bias = GetOptional(params, a + "q_proj.bias");
      w.k_proj = Get(params, a + "k_proj.weight");
      w.k_bias = GetOptional(params, a + "k_proj.bias");
      w.v_proj = Get(params, a + "v_proj.weight");
      w.v_bias = GetOptional(params, a + "v_proj.bias");
      w.q_norm = GetOptional(params, a + "q_norm.weight");
      w.k_norm = GetOptional(params, a + "k_norm.weight");
      w.o_proj = Get(params, a + "o_proj.weight");
      w.o_bias = GetOptional(params, a + "o_proj.bias");
      if (fuse) {
        w.qkv_proj = BackToBack({w.q_proj, w.k_proj, w.v_proj});
        if (w.q_bias.defined()) w.qkv_bias = BackToBack({w.q_bias, w.k_bias, w.v_bias});
        if (w.q_bias.defined() != w.qkv_bias.defined()) w.qkv_proj = at::Tensor();
        fused_projections_ += w.qkv_proj.defined() ? 1 : 0;
      }
    } else {
      MlaWeights& w = layer.mla;
      if (c.q_lora_rank) {
        w.q_a_proj = Get(params, a + "q_a_proj.weight");
        w.q_a_bias = GetOptional(params, a + "q_a_proj.bias");
        w.q_a_norm = Get(params, a + "q_a_layernorm.weight");
        w.q_b_proj = Get(params, a + "q_b_proj.weight");
      } else {
        w.q_proj = Get(params, a + "q_proj.weight");
      }
      w.kv_a_proj = Get(params, a + "kv_a_proj_with_mqa.weight");
      w.kv_a_bias = GetOptional(params, a + "kv_a_proj_with_mqa.bias");
      w.kv_a_norm = Get(params, a + "kv_a_layernorm.weight");
      w.kv_b_proj = Get(params, a + "kv_b_proj.weight");
      w.o_proj = Get(params, a + "o_proj.weight");
      w.o_bias = GetOptional(params, a + "o_proj.bias");
      if (c.has_indexer()) {
        layer.indexer_type = c.indexer_types[l];
        if (layer.indexer_type == IndexerType::kFull) {
          const std::string ix = a + "indexer.";
          w.has_indexer = true;
          w.indexer = {Get(params, ix + "wq_b.weight"), Get(params, ix + "wk.weight"),
                       Get(params, ix + "k_norm.weight"), Get(params, ix + "k_norm.bias"),
                       Get(params, ix + "weights_proj.weight")};
        }
      }
    }
    layer.mlp_type = c.mlp_layer_types[l];
    const std::string m = p + "mlp.";
    if (layer.mlp_type == MlpType::kDense) {
      layer.mlp = GetMlp(params, m);
      if (fuse) {
        layer.mlp.gate_up_proj = BackToBack({layer.mlp.gate_proj, layer.mlp.up_proj});
        fused_projections_ += layer.mlp.gate_up_proj.defined() ? 1 : 0;
      }
    } else {
      layer.moe = MoeWeightsOf(params, m);
      layer.moe.expert_group = expert_group;
      if (fuse && layer.moe.has_shared) {  // the shared expert's gate/up as one GEMM
        MlpWeights& shared = layer.moe.shared;
        shared.gate_up_proj = BackToBack({shared.gate_proj, shared.up_proj});
        fused_projections_ += shared.gate_up_proj.defined() ? 1 : 0;
      }
    }
    layers_.push_back(std::move(layer));
  }
}

void Decoder::CheckTokens(const at::Tensor& tokens) const {
  RL_CHECK(tokens.dim() == 2 && tokens.scalar_type() == at::kLong, Error,
           "decoder input must be int64 tokens of shape [batch, seq]; got {} of {} dims",
           c10::toString(tokens.scalar_type()), tokens.dim());
}

at::Tensor Decoder::Hidden(const at::Tensor& tokens, KvCache* cache, int64_t start) const {
  CheckTokens(tokens);
  const int64_t batch = tokens.size(0);
  const int64_t seq = tokens.size(1);
  if (cache != nullptr) {
    RL_CHECK(batch <= cache->max_batch() && start >= 0 && start + seq <= cache->max_length(), Error,
             "ForwardStep: batch {} at positions [{}, {}) does not fit a KV cache of {} sequences "
             "of {} positions",
             batch, start, start + seq, cache->max_batch(), cache->max_length());
  } else {
    RL_CHECK(start == 0, Error, "a forward without a KV cache starts at position 0");
  }
  const RopeTable rope = MakeRopeTable(config_, start, seq, dtype_, device_);
  AttentionContext ctx;
  ctx.config = &config_;
  ctx.rope = &rope;
  ctx.start = start;
  if (tensor_group_ == nullptr) {
    return Layers(at::embedding(embed_tokens_, tokens.to(device_)), ctx, cache);
  }
  RL_CHECK(cache == nullptr || !sequence_parallel_, Error,
           "a KV-cache forward runs without sequence parallelism");
  return Layers(VocabParallelEmbedding(embed_tokens_, tokens.to(device_), vocab_start_,
                                       *tensor_group_, sequence_parallel_),
                ctx, cache, nullptr, batch);
}

at::Tensor Decoder::WholeLogits(const at::Tensor& hidden) const {
  const at::Tensor slice = Linear(hidden, lm_head_, {}, kernels_);  // [..., V_r] under TP
  if (tensor_group_ == nullptr) return slice;
  std::vector<int64_t> shape = hidden.sizes().vec();
  shape.back() = config_.vocab_size;
  return GatherVocabParallel(slice.reshape({-1, slice.size(-1)}), config_.vocab_size,
                             *tensor_group_)
      .view(shape);
}

at::Tensor Decoder::Layers(at::Tensor x, AttentionContext ctx, KvCache* cache,
                           const ExpertDispatch* dispatch, int64_t batch) const {
  ctx.kernels = kernels_;
  ctx.latent_mla_decode = latent_mla_decode_;
  const bool partial_sums = tensor_group_ == nullptr;  // blocks may leave their sums to add_norm
  ctx.partial_sums = partial_sums;
  // x += pending (a block's output, when defined) and the next norm of x; one kernel where the
  // engine's kernels apply (Note [Decode kernels] in layers.cc), the same bits. `pending` may be
  // the block's split-k partial sums (Note [Split-k partial sums] in fused_ops.h).
  const auto add_norm = [&](at::Tensor& x, const at::Tensor& pending, const at::Tensor& weight) {
    if (kernels::ArePartialSums(pending, x)) {
      kernels::AddNormed out =
          kernels::AddPartialsRmsNorm(x, pending, weight, config_.rms_norm_eps);
      x = std::move(out.sum);
      return std::move(out.normed);
    }
    if (pending.defined() && kernels_ == Kernels::kFused && kernels::Supported(x) &&
        !x.requires_grad() && !pending.requires_grad() && pending.sizes() == x.sizes() &&
        pending.scalar_type() == x.scalar_type() && weight.scalar_type() == x.scalar_type()) {
      kernels::AddNormed out = kernels::AddRmsNorm(x, pending, weight, config_.rms_norm_eps);
      x = std::move(out.sum);
      return std::move(out.normed);
    }
    if (pending.defined()) x = x + pending;
    return RmsNorm(x, weight, config_.rms_norm_eps);
  };
  at::Tensor topk;     // DSA selection of the last full indexer layer
  at::Tensor pending;  // the last block's output, not yet added to x
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    ctx.cache = cache != nullptr ? &cache->layer(static_cast<int64_t>(l)) : nullptr;
    if (SmallDecodeLayer(layer, ctx, x, pending)) continue;
    at::Tensor h = add_norm(x, pending, layer.input_norm);
    if (config_.attention_kind() == AttentionKind::kGqa) {
      h = tensor_group_ != nullptr  // Note [Tensor-parallel attention]
              ? TensorParallelGqaAttention(layer.gqa, h, ctx, *tensor_group_, sequence_parallel_,
                                           batch)
              : GqaAttention(layer.gqa, h, ctx);
    } else {
      IndexerType indexer = layer.indexer_type;
      if (indexer == IndexerType::kFull && indexer_source_) {  // Note [Indexer replay]
        std::optional<at::Tensor> replay = indexer_source_(static_cast<int64_t>(l));
        if (replay.has_value()) {
          RL_CHECK(cache == nullptr, Error,
                   "indexer replay: layer {} would skip writing its indexer keys to the KV cache",
                   l);
          topk = *replay;
          indexer = IndexerType::kShared;  // reads `topk` instead of computing it
        }
      }
      h = tensor_group_ != nullptr
              ? TensorParallelMlaAttention(layer.mla, indexer, h, ctx, *tensor_group_,
                                           sequence_parallel_, batch, topk)
              : MlaAttention(layer.mla, indexer, h, ctx, topk);
      if (layer.indexer_type == IndexerType::kFull && indexer_observer_) {
        indexer_observer_(static_cast<int64_t>(l), topk);
      }
    }
    h = add_norm(x, h, layer.post_norm);
    if (layer.mlp_type == MlpType::kDense) {
      h = tensor_group_ != nullptr
              ? TensorParallelMlp(layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj, h,
                                  *tensor_group_, sequence_parallel_)
              : DenseMlp(layer.mlp, h, kernels_, partial_sums);
    } else {
      at::Tensor chosen;
      at::Tensor replay =
          routing_source_ ? routing_source_(static_cast<int64_t>(l)) : at::Tensor();
      // Under sequence parallelism this rank routes its rows of the flattened tokens: it replays
      // those, and the observer sees every rank's choices, gathered.
      const int64_t rows = h.dim() == 2 ? h.size(0) : 0;
      if (replay.defined() && sequence_parallel_) {
        replay = replay.narrow(0, tensor_group_->rank() * rows, rows);
      }
      h = MoeBlock(layer.moe, config_, h, routing_observer_ ? &chosen : nullptr, replay, dispatch,
                   kernels_);
      if (routing_observer_) {
        if (sequence_parallel_) chosen = GatherFromSequenceParallel(chosen, *tensor_group_);
        routing_observer_(static_cast<int64_t>(l), chosen);
      }
    }
    pending = std::move(h);
  }
  return add_norm(x, pending, final_norm_);
}

bool Decoder::SmallDecodeLayer(const Layer& layer, const AttentionContext& ctx, at::Tensor& x,
                               at::Tensor& pending) const {
  const GqaWeights& w = layer.gqa;
  const MlpWeights& mlp = layer.mlp;
  const int64_t hidden = config_.hidden_size;
  if (kernels_ != Kernels::kFused || tensor_group_ != nullptr ||
      config_.attention_kind() != AttentionKind::kGqa || layer.mlp_type != MlpType::kDense ||
      !mlp.gate_up_proj.defined() || (pending.defined() && pending.sizes() != x.sizes()) ||
      !GqaDecodeKernelsApply(w, ctx, x) ||
      !kernels::SmallLinearStagedTakes(x, hidden, w.qkv_proj, w.qkv_bias) ||
      !kernels::SmallLinearStagedTakes(x, hidden, mlp.gate_up_proj, {}) ||
      !kernels::SmallLinearStagedTakes(x, mlp.down_proj.size(1), mlp.down_proj, {})) {
    return false;
  }
  const double eps = config_.rms_norm_eps;
  const kernels::SummedLinear qkv =
      kernels::SmallLinearAddRmsNorm(x, pending, layer.input_norm, eps, w.qkv_proj, w.qkv_bias);
  // At one row the o projection is folded into the attention, as partial sums that the gate/up
  // projection adds (Note [The o projection in the attention's clusters] in decode_kernels.cu).
  const at::Tensor o_partials =
      x.size(0) == 1 ? GqaDecodeAttentionO(w, qkv.out, ctx) : at::Tensor();
  const kernels::SummedLinear gate_up =
      o_partials.defined()
          ? kernels::SmallLinearAddPartialsRmsNorm(qkv.sum, o_partials, layer.post_norm, eps,
                                                   mlp.gate_up_proj, {})
          : kernels::SmallLinearAddRmsNorm(
                qkv.sum, Linear(GqaDecodeAttention(w, qkv.out, ctx), w.o_proj, w.o_bias, kernels_),
                layer.post_norm, eps, mlp.gate_up_proj, {});
  pending = kernels::SmallLinearSiluMul(gate_up.out, mlp.down_proj, {});
  x = gate_up.sum;
  return true;
}

at::Tensor Decoder::Logits(const at::Tensor& tokens) const {
  if (tensor_group_ == nullptr) return Linear(Hidden(tokens, nullptr, 0), lm_head_);
  return VocabParallelLmHead(Hidden(tokens, nullptr, 0), lm_head_, *tensor_group_,
                             sequence_parallel_)
      .view({tokens.size(0), tokens.size(1), lm_head_.size(0)});
}

TokenStats Decoder::TokenLogProbs(const at::Tensor& tokens, const at::Tensor& targets,
                                  bool with_entropy, double temperature) const {
  RL_CHECK(targets.sizes() == tokens.sizes(), Error,
           "TokenLogProbs: targets [{}] must have the shape of tokens [{}]",
           fmt::join(targets.sizes(), ", "), fmt::join(tokens.sizes(), ", "));
  RL_CHECK(temperature > 0, Error, "TokenLogProbs: the temperature must be > 0; got {}",
           temperature);
  at::Tensor logits = Logits(tokens);  // [B, S, V]
  // In place, as the reference does: the [B, S, V] logits are not copied (the lm_head's backward
  // needs its input and weight, not this output).
  if (temperature != 1.0) logits.div_(temperature);
  const at::Tensor ids = targets.to(device_).to(at::kLong);
  TokenStats out;
  if (tensor_group_ != nullptr) {  // Note [Vocabulary-parallel log-probs]
    const VocabParallelStats stats = VocabParallelLogProbs(
        logits.view({-1, logits.size(-1)}), ids.reshape({-1}), vocab_start_, *tensor_group_);
    out.log_probs = stats.log_probs.view(ids.sizes());
    if (with_entropy) out.entropy = stats.entropy.view(ids.sizes());
    return out;
  }
  if (kernels::Supported(logits)) {  // Note [Inference kernels]: on CUDA, always
    kernels::TokenLogProbStats stats = kernels::TokenLogProbs(logits, ids);
    out.log_probs = std::move(stats.log_probs);
    if (with_entropy) out.entropy = std::move(stats.entropy);
    return out;
  }
  at::Tensor log_probs = at::log_softmax(AtLeastFloat(logits), -1);  // [B, S, V]
  out.log_probs = log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1);
  if (with_entropy) out.entropy = -(log_probs.exp() * log_probs).sum(-1);
  return out;
}

at::Tensor Decoder::ForwardStep(const at::Tensor& tokens, KvCache& cache,
                                int64_t start_position) const {
  at::NoGradGuard no_grad;
  return WholeLogits(Hidden(tokens, &cache, start_position));
}

at::Tensor Decoder::PrefillLogits(const at::Tensor& tokens, KvCache& cache, int64_t start_position,
                                  const std::vector<int64_t>& lengths) const {
  at::NoGradGuard no_grad;
  const int64_t batch = tokens.size(0);
  const int64_t seq = tokens.size(1);
  RL_CHECK(lengths.empty() || static_cast<int64_t>(lengths.size()) == batch, Error,
           "PrefillLogits: {} lengths for {} rows", lengths.size(), batch);
  for (int64_t length : lengths) {
    RL_CHECK(length >= 1 && length <= seq, Error,
             "PrefillLogits: a row length of {} outside [1, {}]", length, seq);
  }
  const at::Tensor hidden = Hidden(tokens, &cache, start_position);  // [B, S, H]
  if (lengths.empty()) return WholeLogits(hidden.select(1, seq - 1).contiguous());
  const at::Tensor last = (at::tensor(lengths, at::kLong) - 1).to(hidden.device());
  return WholeLogits(
      hidden.gather(1, last.view({batch, 1, 1}).expand({batch, 1, hidden.size(2)})).squeeze(1));
}

at::Tensor Decoder::DecodeStep(const at::Tensor& tokens, const at::Tensor& position,
                              int64_t key_length, const RopeTable& rope, KvCache& cache,
                              const ExpertDispatch* dispatch) const {
  RL_CHECK(!sequence_parallel_, Error, "a KV-cache forward runs without sequence parallelism");
  at::NoGradGuard no_grad;
  CheckTokens(tokens);
  RL_CHECK(tokens.size(1) == 1 && tokens.size(0) <= cache.max_batch() && key_length >= 1 &&
               key_length <= cache.max_length(),
           Error,
           "DecodeStep: tokens [{}] over {} keys do not fit one new position of a KV cache of {} "
           "sequences of {} positions",
           fmt::join(tokens.sizes(), ", "), key_length, cache.max_batch(), cache.max_length());
  const int64_t batch = tokens.size(0);
  RL_CHECK((position.numel() == 1 || position.numel() == batch) &&
               position.scalar_type() == at::kLong && position.device() == device_ &&
               rope.cos.size(0) >= key_length,
           Error,
           "DecodeStep: the positions must be one int64, or one per row ({}), on {}, and the RoPE "
           "table must cover the {} keys; got {} {} on {} and a table of {} positions",
           batch, device_.str(), key_length, position.numel(),
           c10::toString(position.scalar_type()), position.device().str(), rope.cos.size(0));
  const CudnnAttentionOff cudnn_off;  // Note [Decode steps without cuDNN attention]
  // Note [Programmatic dependent launch] (trainer/kernels/kernel_util.cuh): no kernel of a decode
  // step writes a weight.
  const kernels::ProgrammaticLaunch programmatic(programmatic_launch_ && device_.is_cuda());
  const at::Tensor index = position.reshape({-1});  // [1] or [B]: Note [Ragged decode]
  AttentionContext ctx;
  ctx.config = &config_;
  ctx.rope = &rope;
  ctx.position = index;
  ctx.key_length = key_length;
  const at::Tensor ids = tokens.to(device_);
  const at::Tensor x = tensor_group_ == nullptr
                           ? at::embedding(embed_tokens_, ids)
                           : VocabParallelEmbedding(embed_tokens_, ids, vocab_start_,
                                                    *tensor_group_, /*sequence_parallel=*/false);
  return WholeLogits(Layers(x, ctx, &cache, dispatch, tokens.size(0))).select(1, 0);
}

void Decoder::IdleStep(const ExpertDispatch* dispatch) const {
  for (const Layer& layer : layers_) {
    if (layer.mlp_type != MlpType::kDense) ExpertGroupIdle(layer.moe, config_, dispatch);
  }
}

bool Decoder::decode_step_capturable() const {
  // Under TP when the caller enqueues the group's collectives (EnqueueOnlyScope).
  // Under expert parallelism only with a fixed-capacity dispatch (the caller's part).
  for (const Layer& layer : layers_) {
    if (layer.mlp_type != MlpType::kDense && !MoeBlockSyncFree(layer.moe)) return false;
  }
  return true;
}

}  // namespace rl::model
