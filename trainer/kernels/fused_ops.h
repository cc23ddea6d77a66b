// Tensor entry points of our CUDA kernels (trainer/kernels/cuda_kernels.h): where they apply
// (Supported), RMSNorm (with its gradient), the RoPE the rollout engine decodes with, the token
// log-prob / entropy of the training loss with its gradient, and the decode step's fused kernels.
//
// Failures: tensors on another device or of another dtype than the kernels take throw rl::Error
// (callers ask Supported first); a failed launch throws rl::CudaError.
// Thread safety: stateless; the work goes to the calling thread's current CUDA stream.
#ifndef RL_TRAINER_KERNELS_FUSED_OPS_H_
#define RL_TRAINER_KERNELS_FUSED_OPS_H_

#include <ATen/ATen.h>

namespace rl::kernels {

// True when `t` is on a CUDA device and fp32 or bf16.
bool Supported(const at::Tensor& t);

// transformers' RMSNorm over the last dim in one kernel (cuda_kernels.h RmsNorm): x [..., cols],
// weight [cols], both Supported and of one dtype. Differentiable in x and the weight: the backward
// is one kernel for x's gradient and one for the weight's (partial sums over row chunks).
at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotary embedding of x [B, S, H, D] with cos/sin [S, half], [1, S, half] or [B, S, half] (a
// position per row; x's dtype) in one kernel, no autograd; the same bits as layers.h ApplyRope of
// x.transpose(1, 2) (each product and sum rounded like the LibTorch ops). Returns a contiguous
// [B, S, H, D].
at::Tensor RopeInference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         bool interleaved);

// Per position: log_softmax(logits)[target] and the entropy of softmax(logits), both fp32, from
// one read of the logits [..., vocab] (Supported) with targets [...] int64 on the same device.
// Differentiable with respect to the logits: the backward writes the logits' gradient in one
// pass from the logits and the saved per-row log-sum-exp, without the fp32 [..., vocab] copies
// that log_softmax(logits.float()) keeps for its backward.
struct TokenLogProbStats {
  at::Tensor log_probs;  // [...] fp32
  at::Tensor entropy;    // [...] fp32
};
TokenLogProbStats TokenLogProbs(const at::Tensor& logits, const at::Tensor& targets);

// The two passes of TokenLogProbs without autograd, for the vocabulary-parallel log-probs (Note
// [Vocabulary-parallel log-probs] in trainer/model/vocab_parallel.h), which combine the per-row
// statistics of every shard. Rows: logits [N, V] (Supported, contiguous), targets [N] int64 on
// the same device.
// Forward: log_softmax(rows)[target], the log-sum-exp and the entropy of each row, fp32 [N];
// targets must lie in [0, V).
struct RowLogProbStats {
  at::Tensor log_probs;
  at::Tensor lse;
  at::Tensor entropy;
};
RowLogProbStats TokenLogProbsRows(const at::Tensor& rows, const at::Tensor& targets);
// Backward, in the rows' dtype: with p = exp(row - lse), g_lp * (onehot(target) - p) +
// g_h * p * (lse - entropy - row), for the `lse` and `entropy` [N] fp32 of the whole
// distribution; a target outside [0, V) adds no one-hot term. Either gradient may be undefined
// (and the entropy with its gradient).
at::Tensor TokenLogProbsRowsGrad(const at::Tensor& rows, const at::Tensor& targets,
                                 const at::Tensor& lse, const at::Tensor& entropy,
                                 const at::Tensor& grad_log_probs,
                                 const at::Tensor& grad_entropy);

// The decode step's kernels (Note [Decode kernels] in trainer/model/layers.cc), without
// autograd: inputs must not require grad. Each throws rl::Error on tensors they do not take.

// sum = x + add and RmsNorm(sum, weight) in one kernel, bit for bit what the add and
// FusedRmsNorm give: x and add [..., cols] of one shape, weight [cols], all of one Supported
// dtype.
struct AddNormed {
  at::Tensor sum;
  at::Tensor normed;
};
AddNormed AddRmsNorm(const at::Tensor& x, const at::Tensor& add, const at::Tensor& weight,
                     double eps);

// Note [Split-k partial sums]
// cuBLAS runs a projection of 33 to 64 rows with few output features and a long k (Qwen3-0.6B's
// o projection [1024, 2048] and down projection [1024, 3072]) as one GEMM of few tiles, the down
// projection with a split-k reduction kernel after it: 6.2 and 8.3 us on an H100, 0.68 and 0.76
// TB/s. The same GEMM as a batch over kPartialSlices (4) slices of k, each slice writing its
// fp32 partial sums, runs more blocks: 4.6 and 5.4 us (tools/bench/lt_gemm_bench, "k in 4
// slices"). The partial sums' addition goes to the kernel after, the residual add and the next
// norm, which reads the projection's output anyway (AddPartialsRmsNorm): so the reduction kernel
// goes too. The decoder takes them for the o projection of GQA and latent-space MLA decode steps
// and for the dense MLP's down projection (AttentionContext::partial_sums in
// trainer/model/layers.h). SplitKPartialsPay says where this applies (bf16, no autograd, 33 to 64
// rows, at most 2048 features, k at least kSplitKMinDepth in slices of whole 16-byte pieces, no
// bias); SplitKPartials gives the partial sums [kPartialSlices, ..., n] of Linear(x, w); added in
// slice order and rounded they are Linear(x, w) up to the order of its sums.
constexpr int64_t kSplitKMinDepth = 2048;
bool SplitKPartialsPay(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
at::Tensor SplitKPartials(const at::Tensor& x, const at::Tensor& w);

// True where `pending` is the partial sums of SplitKPartials for an addend of x's shape.
bool ArePartialSums(const at::Tensor& pending, const at::Tensor& x);

// AddRmsNorm(x, add, weight, eps) with add given as SplitKPartials's partial sums
// [kPartialSlices, ...x's shape] (ArePartialSums): add is their sum in slice order rounded to x's
// dtype, bit for bit AddRmsNorm of that add.
AddNormed AddPartialsRmsNorm(const at::Tensor& x, const at::Tensor& partials,
                             const at::Tensor& weight, double eps);

// x [..., k] w^T + b as at::linear computes it up to the order of its sums, for at most
// kSmallLinearMaxRows (2) rows of x, by our kernel: SmallLinearTakes says whether it applies
// (Supported x of w's dtype, no autograd, w [n, k] contiguous, 16-byte aligned rows, b undefined
// or [n] of the dtype).
bool SmallLinearTakes(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
at::Tensor SmallLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

// The same for 3 to kSkinnyLinearMaxRows (64) rows of bf16 x on tensor cores, k a multiple of 32
// (Note [Skinny linear kernel] in linear_kernels.cu).
// SkinnyLinearPays: where it beat cuBLAS on the H200 (fused_kernels_bench): up to 32 rows of
// projections of up to 2048 features (Qwen3-0.6B's o and down: 1.1x to 1.6x alone, 1.3x to 1.9x
// by programmatic launch); wider ones past 8 rows, and 64 rows, are cuBLAS's.
constexpr int64_t kSkinnyLinearPaysMaxRows = 32;
constexpr int64_t kSkinnyLinearPaysMaxFeatures = 2048;
bool SkinnyLinearTakes(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
bool SkinnyLinearPays(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
at::Tensor SkinnyLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

// SiluMul(Linear(x, w)) for a gated MLP's gate/up weight w [2 inner, k] (the gate's rows, then the
// up's) and kGateUpSiluMmaMinRows to 64 rows of bf16 x, by one kernel on tensor cores (Note
// [Gate/up projection with SiluMul on tensor cores] in linear_kernels.cu): each product rounded
// to bf16 before the activation, as the two ops round it (its sums in cuBLAS's order at
// Qwen3-0.6B's shape, maybe in another elsewhere). GateUpSiluMmaTakes says whether it applies
// (GateUpSiluMmaFits in cuda_kernels.h on top of LinearFits's conditions, no bias).
constexpr int64_t kGateUpSiluMmaMinRows = kSkinnyLinearPaysMaxRows + 1;
bool GateUpSiluMmaTakes(const at::Tensor& x, const at::Tensor& w);
at::Tensor GateUpSiluMma(const at::Tensor& x, const at::Tensor& w);

// The projections with their input staged by the kernel (cuda_kernels.h), for a decode layer of
// one or two rows, bit for bit the unfolded kernels: SmallLinearStagedTakes says whether they
// apply to an input x whose staged rows have k elements (x [..., k] for the norm, gate_up
// [..., 2 k] for the activation) against w [n, k].
bool SmallLinearStagedTakes(const at::Tensor& x, int64_t k, const at::Tensor& w,
                            const at::Tensor& b);
// Linear(RmsNorm(x + add, norm_weight, eps), w, b) (`out`) and x + add (`sum`; x itself when add
// is undefined): AddRmsNorm folded into the projection after it.
struct SummedLinear {
  at::Tensor sum;
  at::Tensor out;
};
SummedLinear SmallLinearAddRmsNorm(const at::Tensor& x, const at::Tensor& add,
                                   const at::Tensor& norm_weight, double eps, const at::Tensor& w,
                                   const at::Tensor& b);
// SmallLinearAddRmsNorm with add given as fp32 partial sums [slices, ...x's shape] (those of
// DecodeQkvAttentionO): add is their sum in slice order, rounded to x's dtype.
SummedLinear SmallLinearAddPartialsRmsNorm(const at::Tensor& x, const at::Tensor& partials,
                                           const at::Tensor& norm_weight, double eps,
                                           const at::Tensor& w, const at::Tensor& b);
// Linear(SiluMul(gate_up), w, b): the activation folded into the down projection.
at::Tensor SmallLinearSiluMul(const at::Tensor& gate_up, const at::Tensor& w, const at::Tensor& b);

// silu(gate_up[..., :inner]) * gate_up[..., inner:] for gate_up [..., 2 inner] (Supported), in
// one kernel, bit for bit what at::silu and the product give.
at::Tensor SiluMul(const at::Tensor& gate_up);

// The key and value cache tensors of one layer ([B, kv_heads, T, dim] views) and the device-side
// positions a decode step writes and reads: [1] int64 for the whole batch, or [B], one per row
// (Note [Ragged decode] in trainer/model/layers.h).
struct DecodeCache {
  at::Tensor key;
  at::Tensor value;
  at::Tensor position;
};

// DecodeQkvPrep (cuda_kernels.h): q/k norms (q_norm and k_norm both defined, or both not), RoPE
// by the row of the table cos/sin [positions, half] (MakeRopeTable's, from position 0) at each
// row's position, which the caller keeps below the table's length as below the caches', and the
// cache writes of qkv [B, 1, (Hq + 2 Hkv) dim] (rows contiguous); returns q [B, Hq, dim].
at::Tensor DecodeQkvPrep(const at::Tensor& qkv, const at::Tensor& q_norm, const at::Tensor& k_norm,
                         double eps, const at::Tensor& cos, const at::Tensor& sin,
                         bool interleaved, int64_t q_heads, int64_t kv_heads, int64_t dim,
                         const DecodeCache& cache);

// True when DecodeAttention takes q_heads query heads against `cache` (Supported caches,
// DecodeAttentionSupports and aligned rows).
bool DecodeAttentionTakes(int64_t q_heads, const DecodeCache& cache);

// Attention of q [B, Hq, dim] (contiguous, of the caches' dtype) over cache positions
// [0, position] of rows [0, B) (each row's own position where they have one), which lie within
// the first key_length positions: [B, Hq * dim].
// `blocks_per_sm`: PlanDecodeAttention's (0: its default). bf16 caches with 16-byte aligned rows
// take the tensor-core kernel unless `tensor_cores` is false (for benchmarks).
at::Tensor DecodeAttention(const at::Tensor& q, const DecodeCache& cache, int64_t key_length,
                           double scale, int blocks_per_sm = 0, bool tensor_cores = true);

// DecodeQkvPrep and DecodeAttention in one kernel (cuda_kernels.h), bit for bit the two: the
// arguments of both (the RoPE table covering the key_length positions); returns DecodeAttention's
// output (q is not returned). DecodeQkvAttentionTakes says whether it applies:
// DecodeAttentionTakes, with 1, 2, 4 or 8 query heads per key/value head.
bool DecodeQkvAttentionTakes(int64_t q_heads, const DecodeCache& cache);
at::Tensor DecodeQkvAttention(const at::Tensor& qkv, const at::Tensor& q_norm,
                              const at::Tensor& k_norm, double eps, const at::Tensor& cos,
                              const at::Tensor& sin, bool interleaved, int64_t q_heads,
                              int64_t kv_heads, int64_t dim, const DecodeCache& cache,
                              int64_t key_length, double scale);

// DecodeQkvAttention with the o projection o_proj [hidden, q_heads dim] (bf16, no bias) folded in
// (DecodeQkvAttentionO in cuda_kernels.h): returns the o projection's fp32 partial sums
// [kv_heads, B, 1, hidden], one per key/value head's group of query heads, for
// SmallLinearAddPartialsRmsNorm. Added in head order they are Linear(DecodeQkvAttention(...),
// o_proj) up to the order of the sums. DecodeQkvAttentionOTakes says whether it applies (over at
// most kAttentionOMaxKeys keys: where DecodeQkvAttention would split them no more finely).
bool DecodeQkvAttentionOTakes(int64_t q_heads, const DecodeCache& cache, int64_t key_length,
                              const at::Tensor& o_proj, const at::Tensor& o_bias);
at::Tensor DecodeQkvAttentionO(const at::Tensor& qkv, const at::Tensor& q_norm,
                               const at::Tensor& k_norm, double eps, const at::Tensor& cos,
                               const at::Tensor& sin, bool interleaved, int64_t q_heads,
                               int64_t kv_heads, int64_t dim, const DecodeCache& cache,
                               int64_t key_length, double scale, const at::Tensor& o_proj);

// The DSA indexer's scores of one decode step (Note [DSA index scores kernel] in dsa_kernels.cu):
// for q [B, H, D] (bf16), weights [B, H] (fp32, the head weights with their H^-0.5), the index
// key cache rows `keys` [>= B, >= key_length, D] (bf16, unit stride along D) and the positions
// `position` ([1] or [B] int64): [B, key_length] fp32, sum_h weights relu(scale q . k) for the
// keys up to each row's position and -inf past it; the ops' scores up to the order of fp32 sums.
// DsaIndexScoresTakes: CUDA tensors of those dtypes, 8, 16 or 32 heads of 64 or 128 dims, keys
// rows 16-byte aligned.
bool DsaIndexScoresTakes(const at::Tensor& q, const at::Tensor& keys);
at::Tensor DsaIndexScores(const at::Tensor& q, const at::Tensor& weights, const at::Tensor& keys,
                          const at::Tensor& position, int64_t key_length, double scale);

// A MoE router's experts and weights per token in one kernel (Note [Router kernel] in
// moe_kernels.cu), from its fp32 logits [T, E] on CUDA: ids [T, k] int64, weights [T, k]
// fp32, the rule of Route's ops (trainer/model/layers.h) with `sigmoid` false (softmax) or true
// (noaux_tc with `bias` [E] fp32 or undefined, `groups` / `topk_group`, times `scale`).
// RouterTopKTakes: such logits and a layout RouterTopKSupports.
struct RouterChoice {
  at::Tensor ids;
  at::Tensor weights;
};
bool RouterTopKTakes(const at::Tensor& logits, int64_t k, int64_t groups, int64_t topk_group);
RouterChoice RouterTopK(const at::Tensor& logits, const at::Tensor& bias, bool sigmoid, int64_t k,
                        int64_t groups, int64_t topk_group, bool normalize, double scale);

// The MoE block's pairs sorted by expert in one kernel (Note [Sort by expert kernel] in
// moe_kernels.cu), bit for bit the ops: order = argsort(ids, stable), sorted_ids =
// ids[order], ends = searchsorted(sorted_ids, arange(experts), right) as int32, inverse[order] =
// arange. SortByExpertTakes: ids [pairs] int64 on CUDA, in [0, experts) (not checked: that would
// wait for the device), within SortByExpertSupports.
struct ExpertOrder {
  at::Tensor order, sorted_ids, ends, inverse;
};
bool SortByExpertTakes(const at::Tensor& ids, int64_t experts);
ExpertOrder SortByExpert(const at::Tensor& ids, int64_t experts);

// The MoE block's output from its experts' rows in one kernel (Note [Combine kernel] in
// moe_kernels.cu): rows [T * k, H] (the experts' order), inverse [T * k] (each pair's row),
// weights [T, k] fp32, shared [T, H] or undefined -> [T, H] of the rows' dtype, the ops' result up
// to the order of the slots' sum. CombineExpertsTakes: Supported rows, no autograd.
bool CombineExpertsTakes(const at::Tensor& rows, const at::Tensor& weights,
                         const at::Tensor& shared);
at::Tensor CombineExperts(const at::Tensor& rows, const at::Tensor& inverse,
                          const at::Tensor& weights, const at::Tensor& shared);

// Pinned host memory mapped into the device's address space (cudaHostAllocMapped): `host`, a
// CPU tensor, and `device`, a tensor on `device` over the same bytes, which kernels read and write
// across the bus, with no copy engine between them. The memory lives while either tensor does.
// The host reads what a kernel wrote once an event recorded after the kernel has completed.
struct MappedHost {
  at::Tensor host;
  at::Tensor device;
};
MappedHost MappedHostEmpty(at::IntArrayRef sizes, at::ScalarType dtype, at::Device device);

// HandOnTargets (cuda_kernels.h) as tensors, each contiguous [n] on the sampling's CUDA device or
// undefined: host_tokens (int64) and host_log_probs (fp32), the `device` tensors of MappedHost
// buffers, take the tokens and log-probs; next_tokens (int64) takes the tokens and positions
// (int64, defined with next_tokens) are advanced by one.
struct HandOn {
  at::Tensor host_tokens;
  at::Tensor host_log_probs;
  at::Tensor next_tokens;
  at::Tensor positions;
};
// HandOnSampled (cuda_kernels.h): tokens [n] int64 and log_probs [n] fp32, sampled otherwise, to
// `to`'s targets in one kernel.
void HandOnSampled(const at::Tensor& tokens, const at::Tensor& log_probs, const HandOn& to);

// SampleRows (cuda_kernels.h): a decode step's tokens [B] int64 and their log-probs [B] fp32 from
// logits [B, V] drawn from the whole vocabulary, in one kernel. SampleRowsTakes: Supported
// logits of two dims with unit stride along V, V and the row stride multiples of a 16-byte
// vector, 16-byte aligned. `uniforms` [B] (any dtype and device; ignored when greedy).
bool SampleRowsTakes(const at::Tensor& logits);
struct SampledRows {
  at::Tensor tokens;     // [B] int64
  at::Tensor log_probs;  // [B] fp32
};
// `hand_on`: where the kernel also writes each row's token (HandOnTargets).
SampledRows SampleRows(const at::Tensor& logits, double temperature, bool greedy,
                       const at::Tensor& uniforms, const HandOn& hand_on = {});

}  // namespace rl::kernels

#endif  // RL_TRAINER_KERNELS_FUSED_OPS_H_
