// The building blocks of the decoder, with transformers' semantics, as free functions
// over weight structs whose tensors the caller owns (Note [Caller-owned params] in params.h):
// RMSNorm, RoPE (half-rotate, partial, interleaved, YaRN), GQA attention with optional q/k norm and
// qkv bias, MLA with the DSA lightning indexer, the dense SwiGLU MLP and the MoE block with its
// softmax or sigmoid (noaux_tc) router.
//
// Numerics follow transformers: activations in the parameter dtype, RMSNorm, softmax, router and
// indexer scores in fp32 (fp64 when the model runs in fp64, for gradient checks). The DSA indexer
// runs without gradient and on detached inputs, as in the reference; its top-k only masks the
// main attention.
//
// Shapes: B batch, S new positions, T = start + S key positions, H hidden, D head dims.
//
// Thread safety: stateless; concurrent calls on distinct KV caches are safe.
#ifndef RL_TRAINER_MODEL_LAYERS_H_
#define RL_TRAINER_MODEL_LAYERS_H_

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "launch/communicator.h"
#include "trainer/model/model_config.h"

namespace rl::model {

// `t` in fp32, or unchanged when it is already fp32 or fp64.
at::Tensor AtLeastFloat(const at::Tensor& t);

// x w^T + b. On the CPU, batch-invariant (Note [Batch-invariant CPU kernels] in layers.cc): a
// row's result does not depend on how many rows `x` has.
at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {});

// How the inference-only paths of a Decoder compute (its constructor says; Note [Inference
// kernels] in decoder.h): LibTorch ops, or our fused CUDA kernels where the tensors allow.
enum class Kernels { kLibTorch, kFused };

// Linear, and with kFused on a few rows of CUDA input outside autograd our small-batch kernels
// (kernels::SmallLinear up to 2 rows, kernels::SkinnyLinear where it pays in bf16: a decode step's
// projections; Note [Decode kernels] in layers.cc).
at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Kernels impl);

// transformers' RMSNorm: normalise in fp32, cast back to x's dtype, then multiply by the weight.
// kFused (the default): when x and the weight are CUDA fp32/bf16 tensors of one dtype, one kernel
// with the same rounding steps and a kernel backward (trainer/kernels/fused_ops.h), in training
// and inference alike; LibTorch ops otherwise. kLibTorch: always the ops (the reference the
// kernel is checked against).
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                   Kernels impl = Kernels::kFused);

// cos/sin for positions [start, start + length), [length, rope_dim / 2], already multiplied by the
// YaRN attention factor and cast to `dtype` (as transformers does before applying them).
struct RopeTable {
  at::Tensor cos;
  at::Tensor sin;
};
// The inverse frequencies [rope_dim / 2] in fp32 (default or YaRN).
at::Tensor RopeInvFreq(const ModelConfig& config);
RopeTable MakeRopeTable(const ModelConfig& config, int64_t start, int64_t length,
                        at::ScalarType dtype, at::Device device);

enum class RopeLayout {
  kHalf,         // pairs (j, j + d/2): rotate_half (Qwen3, GLM-4.5)
  kInterleaved,  // pairs (2i, 2i+1); the result is left in [evens | odds] order, like transformers
};
// Rotates the first 2 * cos.size(-1) dims of the last axis of `x`, passes the rest through.
// `cos`/`sin` must broadcast against x[..., :rope_dim/2] (e.g. [S, d/2] for x [B, H, S, d]).
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     RopeLayout layout);

// Per-layer KV cache views (see KvCache in decoder.h); undefined tensors where unused.
struct LayerKv {
  at::Tensor key;        // GQA [max_batch, kv_heads, max_len, head_dim]
  at::Tensor value;      // GQA [max_batch, kv_heads, max_len, head_dim]
  // MLA: per position the normalised latent and the rotated shared key, side by side, as the
  // latent-space decode reads them (Note [MLA decode in the latent space] in layers.cc).
  at::Tensor latent_pe;  // MLA [max_batch, max_len, kv_lora_rank + qk_rope_head_dim]
  at::Tensor latent;     // MLA [max_batch, max_len, kv_lora_rank]: latent_pe's first part
  at::Tensor k_pe;       // MLA [max_batch, max_len, qk_rope_head_dim]: latent_pe's last part
  at::Tensor index_key;  // DSA [max_batch, max_len, index_head_dim] (after k_norm and RoPE)
};

struct GqaWeights {
  at::Tensor q_proj, q_bias, k_proj, k_bias, v_proj, v_bias;  // biases undefined when absent
  at::Tensor q_norm, k_norm;                                  // undefined without q/k norm
  at::Tensor o_proj, o_bias;
  // Optional: the q, k and v rows as one matrix (and their biases as one vector, when they have
  // biases), used instead of the three projections when defined: one GEMM instead of three.
  at::Tensor qkv_proj, qkv_bias;
};

struct IndexerWeights {
  at::Tensor wq_b;           // [index_heads * index_head_dim, q_lora_rank]; per head [rope | nope]
  at::Tensor wk;             // [index_head_dim, hidden]
  at::Tensor k_norm_weight;  // LayerNorm(index_head_dim, eps 1e-6)
  at::Tensor k_norm_bias;
  at::Tensor weights_proj;  // [index_heads, hidden]
};

struct MlaWeights {
  at::Tensor q_a_proj, q_a_bias, q_a_norm, q_b_proj;  // with q_lora_rank
  at::Tensor q_proj;                                  // without q_lora_rank
  at::Tensor kv_a_proj, kv_a_bias, kv_a_norm, kv_b_proj;
  at::Tensor o_proj, o_bias;
  bool has_indexer = false;
  IndexerWeights indexer;
};

struct MlpWeights {
  at::Tensor gate_proj, up_proj, down_proj;
  at::Tensor gate_up_proj;  // optional: the gate rows then the up rows as one matrix
};

struct MoeWeights {
  at::Tensor router;       // mlp.gate.weight [experts, hidden]
  at::Tensor router_bias;  // e_score_correction_bias [experts] (sigmoid router only)
  at::Tensor gate_up;      // [local experts, 2 * inter, hidden]: gate rows, then up rows
  at::Tensor down;         // [local experts, hidden, inter]
  bool has_shared = false;
  MlpWeights shared;
  // The expert-parallel group (Note [Expert-parallel MoE]): null, or a group of one, when
  // gate_up and down hold every expert; otherwise EP rank r holds experts
  // [r * local, (r + 1) * local) (Note [Expert shard] in model_config.h).
  Communicator* expert_group = nullptr;
};

// What one attention call needs besides its weights.
//
// Note [Decode at a device position]
// A decode step normally takes its position on the host (`start`), which fixes the cache slot it
// writes and the number of keys it reads. With `position` defined instead (S == 1, a cache given),
// the slots come from the device: row r's new keys are written at position[r] ([B] int64 on the
// model's device; [1]: one for every row) and attention reads the first `key_length` (T) cache
// positions, those past the row's position masked out (KeyMask(): [B or 1, 1, T] bool, true for
// keys <= position[r]). The shapes and the kernels then depend only on (batch, T), not on the
// positions, so the step can be captured in a CUDA graph once and replayed at every position < T.
// The masked cache positions must hold finite values (a NaN there would survive the zero
// attention weight).
//
// Note [Ragged decode]
// The rows of a decode step need not be at one position: each row's position, RoPE angles (the
// table's row at that position: StepRope() is then [B, 1, half], a row each) and visible keys are
// its own, so rows of different prompt lengths, or admitted at different steps, decode in one
// batch (the rollout engine's continuous batching, Note [Rollout batching] in
// trainer/rollout/engine.h). T is the longest row's; a row reads only its keys up to its position
// (the decode kernels stop there; the LibTorch ops mask the rest). A row sees what it would see
// alone: the same positions, angles and keys.
struct AttentionContext {
  const ModelConfig* config = nullptr;
  // The angles of the S new positions [S, half]; with `position`, the whole table from position
  // 0 (MakeRopeTable's, covering the key_length positions), of which StepRope() takes each row's.
  const RopeTable* rope = nullptr;
  int64_t start = 0;                // position of the first query (host-side positions)
  LayerKv* cache = nullptr;         // null: no cache, keys are the S new positions
  at::Tensor position;              // [B] or [1]: Note [Decode at a device position]
  int64_t key_length = 0;           // T, with `position`
  Kernels kernels = Kernels::kLibTorch;  // the Decoder's (Note [Inference kernels]): RoPE
  // With Kernels::kFused: MLA decode steps attend in the latent space (Note [MLA decode in the
  // latent space] in layers.cc); false keeps the expanded keys and values of training.
  bool latent_mla_decode = true;
  // With Kernels::kFused: the caller adds the attention's output to the residual by
  // kernels::AddPartialsRmsNorm, so the o projection of a GQA or latent-space MLA decode step may
  // return its split-k partial sums (Note [Split-k partial sums] in trainer/kernels/fused_ops.h)
  // where they pay. Decoder::Layers sets it without tensor parallelism, whose all-reduce takes
  // whole outputs.
  bool partial_sums = false;

  // The new positions' angles: `rope` itself, or with `position` its rows at each row's position
  // ([B or 1, 1, half]: Note [Ragged decode]).
  const RopeTable& StepRope() const;
  // With `position`: [B or 1, 1, T] bool, true for the keys each row sees (Note [Decode at a
  // device position]).
  const at::Tensor& KeyMask() const;

 private:
  // What StepRope() and KeyMask() make with `position`, on their first call (the GQA decode
  // kernels need neither, so a step of such layers makes none: 4 kernels fewer), kept by this
  // context and its copies.
  struct StepViews {
    RopeTable rope;
    at::Tensor key_mask;
  };
  std::shared_ptr<StepViews> step_ = std::make_shared<StepViews>();
};

at::Tensor GqaAttention(const GqaWeights& w, const at::Tensor& x /*[B, S, H]*/,
                        const AttentionContext& ctx);

// Note [Decode kernels] (layers.cc): whether a decode step's GQA attention over x [B, 1, H] runs
// by the decode kernels (Kernels::kFused, a device-side position, the cache, fused q/k/v weights,
// CUDA tensors the kernels take), and that attention from the q/k/v projection's output qkv
// [B, 1, (Hq + 2 Hkv) D], writing the new keys and values to the cache: [B, 1, Hq D], before the
// o projection.
bool GqaDecodeKernelsApply(const GqaWeights& w, const AttentionContext& ctx, const at::Tensor& x);
at::Tensor GqaDecodeAttention(const GqaWeights& w, const at::Tensor& qkv,
                              const AttentionContext& ctx);
// GqaDecodeAttention with the o projection folded in, where kernels::DecodeQkvAttentionOTakes
// says it applies (else undefined): the o projection's fp32 partial sums [Hkv, B, 1, H], for
// kernels::SmallLinearAddPartialsRmsNorm (Decoder::SmallDecodeLayer at one row).
at::Tensor GqaDecodeAttentionO(const GqaWeights& w, const at::Tensor& qkv,
                               const AttentionContext& ctx);

// A decode step with a cache (one new position), Kernels::kFused and ctx.latent_mla_decode attends
// in the latent space (Note [MLA decode in the latent space] in layers.cc).
// `topk` carries the DSA selection between layers: a layer with its own indexer overwrites it, a
// shared layer reads it. It stays undefined while every key is selected (T <= index_topk), in
// which case DSA equals dense causal attention and no mask is built.
at::Tensor MlaAttention(const MlaWeights& w, IndexerType indexer_type, const at::Tensor& x,
                        const AttentionContext& ctx, at::Tensor& topk);

// The DSA lightning indexer (transformers GlmMoeDsaIndexer): [B, S, min(index_topk, T)] int64 key
// positions, or an undefined tensor when T <= index_topk. Writes the new indexer keys into
// ctx.cache when given.
at::Tensor IndexerTopk(const IndexerWeights& w, const at::Tensor& x, const at::Tensor& q_resid,
                       const AttentionContext& ctx);

// With Kernels::kFused on CUDA, outside autograd, silu(gate) * up runs as one kernel (the same
// bits; Note [Decode kernels] in layers.cc).
// `partial_sums`: as AttentionContext::partial_sums, for the down projection.
at::Tensor DenseMlp(const MlpWeights& w, const at::Tensor& x, Kernels impl = Kernels::kLibTorch,
                    bool partial_sums = false);

struct Routing {
  at::Tensor indices;  // [tokens, k] int64
  at::Tensor weights;  // [tokens, k] fp32 (fp64 in an fp64 model), differentiable in the router
};
// Note [Routing replay]
// `replay`, when defined ([T, k] int64 expert ids on x's device), selects the experts instead of
// the router's top-k: the weights are still the router's (softmax or sigmoid scores of its logits
// over the replayed experts, normalised as usual), so the router keeps its gradient. Replaying
// the ids a forward chose, in the order it reports them, reproduces that forward bit for bit.
// Ids must lie in [0, n_routed_experts) (not checked on the host: that would wait for the device).
// With Kernels::kFused (an inference decoder) on CUDA in bf16, the logits come from one bf16 GEMM
// with fp32 output (no fp32 copies of x and the router; the same products, summed in another
// order) and, without replay, the choice from one kernel (Note [Router kernel] in
// trainer/kernels/moe_kernels.cu): the same experts up to exact ties, ids in descending order.
Routing Route(const MoeWeights& w, const ModelConfig& config, const at::Tensor& x /*[T, H]*/,
              const at::Tensor& replay = {}, Kernels impl = Kernels::kLibTorch);

// Rows of `x` [R, K] grouped by expert times each expert's weight: rows [ends[e-1], ends[e]) of
// the result [R, N] are x[rows] w[e]^T, for `w` [E, N, K] and `ends` [E] int32 (cumulative row
// counts, on x's device). On CUDA at::_grouped_mm where it takes the tensors (bf16/fp16/fp32,
// strides of 16 bytes; bf16 on Hopper is one CUTLASS kernel that never reads `ends` on the host,
// other dtypes run ATen's exact per-group loop); otherwise, and always on the CPU, a loop of
// Linear over the groups with one host read of `ends` (batch-invariant on the CPU: Note
// [Batch-invariant CPU kernels] in layers.cc). Differentiable in x and w. Rows of x past
// ends[E - 1] belong to no group: their result rows are unspecified (zeros on the CPU).
at::Tensor GroupedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ends);

// Note [MoE block]
// The routed experts run on stacked weights (Note [Stacked experts] in params.h): the T x k
// (token, slot) pairs are sorted by expert (a stable sort, so each expert sees its tokens in
// token order), the rows gathered, both projections done by GroupedLinear with the cumulative
// counts from a searchsorted over the sorted ids, and the results put back in (token, slot) order
// and summed with the router weights in fp32. The gathers' backwards are gathers by the inverse
// permutation (and a sum over each token's k slots), not atomic scatter-adds. Every shape depends
// only on T, nothing is read on the host (bf16 on CUDA) and no result depends on the order of
// atomic additions, so the block is deterministic, runs inside a CUDA graph and never waits for
// the device.
// `chosen`, when given, receives the routing's expert ids [T, k] int64; `replay`, when defined,
// replaces the router's choice (Note [Routing replay]).
//
// Note [Expert-parallel MoE]
// With an expert group of P ranks, each holding E / P experts, the sorted rows go to the ranks
// of their experts and come back:
//  1. the rows sorted by (global) expert are already grouped by destination rank; the per-expert
//     counts [P, E / P] go to their ranks first (one all-to-all of P * E / P integers), and both
//     count tables are read on the host (one wait for the device, as Megatron's dropless
//     dispatcher: the row all-to-all needs its split sizes on the host);
//  2. an all-to-all moves the rows; they arrive grouped by source rank, then by expert, and are
//     regrouped by local expert (a stable sort on the device by each row's expert, which the
//     count table gives);
//  3. the local experts run by one grouped GEMM per projection, the rows are put back in arrival
//     order and the reverse all-to-all returns them to their tokens' ranks.
// Both all-to-alls are differentiable (the backward sends the gradient the reverse way), and every
// rank of the group calls them in every forward and backward, also with no rows to send, so the
// collectives pair up. A row meets the same expert weights and, on the CPU, the same
// batch-invariant GEMMs as with every expert local, so the forward's values do not depend on P;
// the expert weights' gradients sum the group's rows in one GEMM instead of per rank.
// MoeBlock with an expert group is a collective over it: every rank must call it the same number
// of times (ExpertGroupIdle joins a step with no tokens).
//
// Note [Fixed-capacity dispatch]
// The exchange above reads its split sizes on the host, so a forward that uses it cannot be
// captured in a CUDA graph. An ExpertDispatch replaces it, in inference, by exchanges of a fixed
// size, as DeepEP's low-latency mode does for decode: every rank sends every rank of the group a
// block of `capacity` row slots, whatever its tokens chose.
//  1. A sorted row's slot is its destination rank's block, at its place among the rows for that
//     rank (rows sorted by global expert are grouped by rank); a row whose place is past the
//     capacity does not fit: it sets `overflow` and gets a spare slot that is not sent, and its
//     expert output is taken as zero.
//  2. One all-to-all moves each slot's local expert id (`local` experts for an empty slot),
//     another the rows (Note [Enqueued all-to-all] in launch/communicator.h: enqueued only).
//  3. The receiver sorts its slots by expert id (a stable sort on the device; empty slots last),
//     runs the grouped GEMMs over the filled ones, puts the results back in slot order and a third
//     all-to-all returns them; each row reads its slot.
// Every shape depends only on the group size and the capacity, and nothing is read on the host,
// so a bf16 forward on a Hopper GPU can be captured (the slots not filled hold whatever the buffers
// held; no filled row reads them). A row meets the same weights and, on the CPU, the same
// batch-invariant GEMMs as with the exact exchange, so the results are the same bits when nothing
// overflows (//tests:moe_ep_test). No autograd. The caller reads `overflow` (int32 [1], 1 once
// some row did not fit since it was last zeroed) when it reads the step's results.
// DispatchCapacity(config, max_tokens, group size, 0) is the most rows a forward of max_tokens
// tokens can send one rank (each token at most min(k, local experts)), which never overflows.
struct ExpertDispatch {
  int64_t capacity = 0;  // row slots per (source, destination) pair of ranks, >= 1
  at::Tensor overflow;   // [1] int32 on the model's device
};
// The capacity for forwards of up to `max_tokens` tokens over a group of `group_size` ranks:
// `factor` times the mean max_tokens * k / group_size rows per rank, rounded up, at most the
// worst case; factor 0 gives the worst case.
int64_t DispatchCapacity(const ModelConfig& config, int64_t max_tokens, int64_t group_size,
                         double factor);

// `dispatch`, when given, uses the fixed-capacity exchange (Note [Fixed-capacity dispatch]) over
// w.expert_group (which must be set; a group of one works too); no autograd then.
// `impl` routes as Route does.
at::Tensor MoeBlock(const MoeWeights& w, const ModelConfig& config, const at::Tensor& x,
                    at::Tensor* chosen = nullptr, const at::Tensor& replay = {},
                    const ExpertDispatch* dispatch = nullptr, Kernels impl = Kernels::kLibTorch);

// A MoE block's part of a forward with no tokens on this rank: it serves the rows the other
// ranks of w.expert_group send to its experts (Note [Expert-parallel MoE]), through `dispatch`
// when the other ranks use it. No autograd.
void ExpertGroupIdle(const MoeWeights& w, const ModelConfig& config,
                     const ExpertDispatch* dispatch = nullptr);

// True when MoeBlock on `w` never waits for the device: bf16 CUDA weights whose widths
// at::_grouped_mm takes (its CUTLASS kernel needs a Hopper or newer GPU).
bool MoeBlockSyncFree(const MoeWeights& w);

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_LAYERS_H_
