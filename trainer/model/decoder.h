// The decoder: one configurable causal LM covering every ModelType (model_config.h), computed
// from caller-owned parameters (Note [Caller-owned params] in params.h).
//
// Two entry points:
//  - training: Logits() / TokenLogProbs() over full right-padded sequences (no attention mask is
//    needed: a real position never sees the padding to its right), with autograd through the
//    parameters when they require grad;
//  - generation: ForwardStep() appends positions to a KvCache and returns their logits; it runs
//    without autograd. Step-by-step results equal the full forward (tested).
//
// Compute dtype is the parameters' dtype (bf16 in training, fp32 in tools and tests, fp64 in
// gradient checks); RMSNorm, softmax, router and indexer scores run in fp32 or wider.
//
// The KV cache does not allocate on its own unless asked: the trainer hands it one flat tensor
// from its kv_cache memory region (which it may pause and resume; the views stay valid).
//
// Failures: a parameter set that does not match the config throws rl::Error (see CheckParams);
// tokens of the wrong shape/dtype, positions past the cache or a batch larger than the cache
// throw rl::Error with the sizes.
//
// Thread safety: a Decoder is immutable after construction (but for its routing hooks);
// concurrent forwards are safe if they use distinct KV caches, except that DecodeStep turns SDPA's
// cuDNN backend off process-wide while it runs (Note [Decode steps without cuDNN attention] in
// decoder.cc).
#ifndef RL_TRAINER_MODEL_DECODER_H_
#define RL_TRAINER_MODEL_DECODER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/model/layers.h"
#include "trainer/model/model_config.h"
#include "trainer/model/params.h"

namespace rl::model {

// Per-layer cache for max_batch sequences of up to max_length positions: K/V for GQA; for MLA the
// normalised latent and the rotated k_pe (the compressed form); for DSA also the indexer keys.
class KvCache {
 public:
  // Elements of the model's dtype that one cache of this size needs.
  static int64_t NumElements(const ModelConfig& config, int64_t max_batch, int64_t max_length);

  // Views into `storage` (1-D, at least NumElements(), contiguous); the caller owns the storage.
  KvCache(const ModelConfig& config, const at::Tensor& storage, int64_t max_batch,
          int64_t max_length);

  // Allocates its own storage (tools and tests).
  static KvCache Allocate(const ModelConfig& config, int64_t max_batch, int64_t max_length,
                          at::ScalarType dtype, at::Device device);

  int64_t max_batch() const { return max_batch_; }
  int64_t max_length() const { return max_length_; }
  LayerKv& layer(int64_t i) { return layers_.at(i); }
  // Rows [begin, begin + count) as a cache of `count` sequences, views of the same storage (a
  // prefill into some rows of a cache whose other rows hold live sequences). Its storage() is
  // still the whole cache's.
  KvCache Rows(int64_t begin, int64_t count) const;
  const at::Tensor& storage() const { return storage_; }

 private:
  at::Tensor storage_;
  int64_t max_batch_;
  int64_t max_length_;
  std::vector<LayerKv> layers_;
};

// The MoE block's weights of the layer whose MLP is at `mlp_prefix` ("model.layers.N.mlp."), as
// handles into `params`; throws rl::Error naming a missing parameter.
MoeWeights MoeWeightsOf(const TensorMap& params, const std::string& mlp_prefix);

struct TokenStats {
  at::Tensor log_probs;  // [batch, seq] log p(target | prefix), fp32 (fp64 for fp64 params)
  at::Tensor entropy;    // [batch, seq] entropy of the next-token distribution, when asked for
};

// Note [Inference kernels]
// On CUDA fp32/bf16 every Decoder computes RMSNorm and, in TokenLogProbs, the log-prob and
// entropy of the targets by our kernels (trainer/kernels/fused_ops.h), forward and backward, in
// training and in the log-prob recomputation alike. A Decoder built with Kernels::kFused (the
// rollout engine's, on a GPU) also computes RoPE by a kernel (the same bits as the ops) and the
// q/k/v and gate/up projections as one GEMM each wherever their weights lie back to back in memory
// (the engine layout puts them so: Note [Engine fusion rules] in weight_sync/engine_layout.h);
// results equal the LibTorch ops' up to rounding (one GEMM over the concatenated rows may block
// its sums differently). Its params must not require grad. Training decoders keep kLibTorch.
class Decoder {
 public:
  // Checks `params` against ListParams(config) and keeps handles to them. `expert_group`: the
  // expert-parallel group of config.expert_shard (Note [Expert-parallel MoE] in layers.h; null
  // when the model holds every expert). Every forward is then a collective over the group.
  //
  // `tensor_group`: the tensor-parallel group of config.tensor_shard (Note [Tensor shard] in
  // model_config.h), or null without TP. The layers then run tensor-parallel (Note
  // [Tensor-parallel mappings] in tensor_parallel.h), with `sequence_parallel` the residual
  // stream on 1/TP of the tokens (batch x seq must then divide by TP); Logits() returns this
  // rank's vocabulary slice [batch, seq, V_r] (VocabSlice), TokenLogProbs() the whole
  // distribution's values on every rank, and the KV-cache forwards (without sequence
  // parallelism; the cache holds this rank's key/value heads) the whole vocabulary's logits,
  // gathered. Every forward is then a collective over the group.
  Decoder(ModelConfig config, const TensorMap& params, Kernels kernels = Kernels::kLibTorch,
          Communicator* expert_group = nullptr, Communicator* tensor_group = nullptr,
          bool sequence_parallel = false);

  const ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  at::Device device() const { return device_; }

  // tokens [batch, seq] int64 -> logits [batch, seq, vocab] in the param dtype; causal.
  at::Tensor Logits(const at::Tensor& tokens) const;

  // Per-position log-prob of `targets` [batch, seq] (typically the tokens shifted by one) under
  // the logits of `tokens` divided by `temperature` (the rollout's: Note [Rollout log-probs] in
  // trainer/rollout/sampler.h), and, when `with_entropy`, the entropy of each position's
  // distribution (three more passes over the [batch, seq, vocab] fp32 log-probs; left undefined
  // otherwise).
  TokenStats TokenLogProbs(const at::Tensor& tokens, const at::Tensor& targets,
                           bool with_entropy = true, double temperature = 1.0) const;

  // Appends tokens [batch, new] at positions [start_position, start_position + new) of rows
  // [0, batch) of `cache` and returns their logits [batch, new, vocab]. Positions before
  // start_position must have been written by earlier steps. No autograd.
  at::Tensor ForwardStep(const at::Tensor& tokens, KvCache& cache, int64_t start_position) const;

  // ForwardStep that returns only the logits of the last new position, [batch, vocab]: a
  // generation's prefill, which samples from those alone, so the LM head runs over one position
  // per row instead of every prompt position (whose [batch, new, vocab] logits, in bf16, take
  // 2.5 GB for 64 prompts of 128 tokens and a 151,936-word vocabulary). With `lengths` (one per
  // row, each in [1, new]), row r's tokens are its first lengths[r] (the rest padding after them,
  // which causal attention keeps from every real position) and its logits are those of its last
  // real position; the padding's cache entries lie past the row's tokens.
  at::Tensor PrefillLogits(const at::Tensor& tokens, KvCache& cache, int64_t start_position,
                           const std::vector<int64_t>& lengths = {}) const;

  // One decode step whose positions live on the device (Notes [Decode at a device position] and
  // [Ragged decode] in layers.h): appends tokens [batch, 1] at `position` ([batch] int64 on the
  // model's device, row r's at position[r]; or [1], one for every row) to rows [0, batch) of
  // `cache`, row r attending to cache positions [0, key_length) up to its position, and returns
  // the logits [batch, vocab]. `rope` is the table of every cache position
  // (MakeRopeTable(config, 0, cache.max_length(), ...)). The caller keeps positions < key_length
  // (not checked: that would read the device) and cache positions up to key_length finite. No
  // autograd; no host synchronisation where decode_step_capturable(). `dispatch`: the MoE
  // layers' fixed-capacity exchange over the expert group (Note [Fixed-capacity dispatch] in
  // layers.h), or null for the exact one.
  at::Tensor DecodeStep(const at::Tensor& tokens, const at::Tensor& position, int64_t key_length,
                        const RopeTable& rope, KvCache& cache,
                        const ExpertDispatch* dispatch = nullptr) const;

  // True when DecodeStep never waits for the device, so it can be captured in a CUDA graph: every
  // dense model, and MoE models whose blocks are sync-free (MoeBlockSyncFree: bf16 on CUDA) and
  // either hold every expert or are given a fixed-capacity dispatch; under TP with the group's
  // collectives enqueue-only (EnqueueOnlyScope in launch/communicator.h).
  bool decode_step_capturable() const;

  // With Kernels::kFused, MLA decode steps attend in the latent space (the default; Note [MLA
  // decode in the latent space] in layers.cc) or, when off, over expanded keys and values as
  // training does: slower, with a smaller train/rollout log-prob mismatch.
  void set_latent_mla_decode(bool on) { latent_mla_decode_ = on; }

  // On a GPU, DecodeStep launches our kernels with programmatic dependent launch (the default):
  // each may start while the kernel ahead of it finishes, the same bits sooner (Note
  // [Programmatic dependent launch] in trainer/kernels/kernel_util.cuh). Off: launched one
  // after another, as everywhere else.
  void set_programmatic_launch(bool on) { programmatic_launch_ = on; }

  // Under expert parallelism: this rank's part of a forward in which it has no tokens, serving
  // the other ranks' rows to its experts in every MoE layer (ExpertGroupIdle), through
  // `dispatch` when the forward it joins uses one. No-op otherwise.
  void IdleStep(const ExpertDispatch* dispatch = nullptr) const;

  // Called by every MoE layer of every forward with the layer's index and its routing's expert
  // ids [tokens, k] int64 (on the device; tokens in [batch, seq] row-major order). For tools that
  // measure routing; an empty function (the default) turns it off. Not thread-safe.
  using RoutingObserver = std::function<void(int64_t layer, const at::Tensor& expert_ids)>;
  void set_routing_observer(RoutingObserver observer) { routing_observer_ = std::move(observer); }

  // Note [Routing replay] (layers.h): called by every MoE layer of every forward with the layer's
  // index; a defined result ([tokens, k] int64 expert ids on the device, tokens in [batch, seq]
  // row-major order) replaces the router's choice in that layer, an undefined one leaves it. The
  // observer then reports the replayed ids. An empty function (the default) turns it off.
  using RoutingSource = std::function<at::Tensor(int64_t layer)>;
  void set_routing_source(RoutingSource source) { routing_source_ = std::move(source); }

  // DSA indexer replay (Note [Indexer replay] in decoder.cc), the same way: the observer gets
  // each layer with its own indexer and its key selection ([batch, seq, k] int64 key positions,
  // or undefined when every key is selected); a source that returns a value (a selection, or an
  // undefined tensor for "every key") replaces that layer's indexer, nullopt leaves it. Replay is
  // for forwards without a KV cache (training); with one it throws.
  using IndexerObserver = std::function<void(int64_t layer, const at::Tensor& topk)>;
  using IndexerSource = std::function<std::optional<at::Tensor>(int64_t layer)>;
  void set_indexer_observer(IndexerObserver observer) { indexer_observer_ = std::move(observer); }
  void set_indexer_source(IndexerSource source) { indexer_source_ = std::move(source); }

  // How many q/k/v and gate/up groups this Decoder computes as one GEMM (Note [Inference
  // kernels]; 0 unless built with Kernels::kFused on back-to-back weights).
  int64_t fused_projections() const { return fused_projections_; }

  // The final-norm hidden states [batch, seq, hidden]; cache may be null (then start == 0).
  at::Tensor Hidden(const at::Tensor& tokens, KvCache* cache, int64_t start_position) const;

 private:
  struct Layer {
    at::Tensor input_norm;
    at::Tensor post_norm;
    GqaWeights gqa;
    MlaWeights mla;
    IndexerType indexer_type = IndexerType::kNone;
    MlpType mlp_type = MlpType::kDense;
    MlpWeights mlp;
    MoeWeights moe;
  };

  void CheckTokens(const at::Tensor& tokens) const;
  // Note [Decode kernels] (layers.cc): a dense GQA layer of a decode step of one or two rows with
  // its norms folded into the projections after them and the activation into the down
  // projection: x += pending, then pending = the attention and MLP blocks' output with x
  // updated in between. False (nothing done) where the kernels do not apply.
  bool SmallDecodeLayer(const Layer& layer, const AttentionContext& ctx, at::Tensor& x,
                        at::Tensor& pending) const;
  // The layers and the final norm over embedded tokens x [batch, seq, hidden]; `ctx` without
  // its per-layer cache, which comes from `cache` when given.
  // `batch`: the batch size, which the tensor-parallel attention needs under sequence
  // parallelism (x is then this rank's [batch * seq / TP, hidden] token rows).
  at::Tensor Layers(at::Tensor x, AttentionContext ctx, KvCache* cache,
                    const ExpertDispatch* dispatch = nullptr, int64_t batch = 0) const;
  // The logits over the whole vocabulary of hidden states [..., hidden]: under TP this rank's
  // slice gathered from the group (GatherVocabParallel), for sampling.
  at::Tensor WholeLogits(const at::Tensor& hidden) const;

  ModelConfig config_;
  Kernels kernels_;
  bool latent_mla_decode_ = true;
  bool programmatic_launch_ = true;
  Communicator* tensor_group_ = nullptr;  // null without TP
  bool sequence_parallel_ = false;
  int64_t vocab_start_ = 0;  // the first vocabulary id of this rank's embedding and LM head rows
  int64_t fused_projections_ = 0;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor embed_tokens_;
  at::Tensor final_norm_;
  at::Tensor lm_head_;
  std::vector<Layer> layers_;
  RoutingObserver routing_observer_;
  RoutingSource routing_source_;
  IndexerObserver indexer_observer_;
  IndexerSource indexer_source_;
};

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_DECODER_H_
