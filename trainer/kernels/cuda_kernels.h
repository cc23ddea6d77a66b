// CUDA kernels of our own, for the places where a profile showed eager LibTorch ops doing extra
// memory passes or launching many small kernels (README "Speed on the H200",
// docs/decode-performance.md). Raw pointers and a stream in, nothing of LibTorch:
// trainer/kernels/fused_ops.h wraps them for tensors.
//
// Dtype codes: 0 = float32, 1 = bfloat16. Every launcher enqueues its work on `stream` and returns
// the cudaError_t of the launch (0 = success); it does not synchronise.
#ifndef RL_TRAINER_KERNELS_CUDA_KERNELS_H_
#define RL_TRAINER_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace rl::kernels {

enum DtypeCode : int { kFloat32 = 0, kBFloat16 = 1 };

// While one lives on a thread (and `on`, on a GPU of compute capability 9.0 or later), the decode
// kernels that thread launches ask for programmatic dependent launch: each may start while the
// kernel ahead of it finishes (Note [Programmatic dependent launch] in kernel_util.cuh). Only for
// work in which no kernel writes weights that a later kernel of it reads: a decode step. Scopes
// nest; each restores the setting it found.
class ProgrammaticLaunch {
 public:
  explicit ProgrammaticLaunch(bool on);
  ~ProgrammaticLaunch();
  ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;
  ProgrammaticLaunch& operator=(const ProgrammaticLaunch&) = delete;

  // Whether the calling thread's launches ask for it now: false from the first launch whose
  // attribute a driver or stream refused (Refused()), which then ran the ordinary way.
  static bool On();
  static void Refused();

 private:
  bool previous_;
};

// While one lives on a thread and is off, SmallLinear and its folded forms keep every weight in
// registers; by default (on) they hold a block's weights in shared memory where they fit (Note
// [Small linear with weights in shared memory] in decode_kernels.cu). The bits are the same: the
// scope lets a test or a benchmark compare the two. Scopes nest; each restores what it found.
class SharedWeightLinear {
 public:
  explicit SharedWeightLinear(bool on);
  ~SharedWeightLinear();
  SharedWeightLinear(const SharedWeightLinear&) = delete;
  SharedWeightLinear& operator=(const SharedWeightLinear&) = delete;
  static bool On();

 private:
  bool previous_;
};

// transformers' RMSNorm of each row of x [rows, cols] (contiguous), with the rounding it has:
// r = rsqrt(mean(x^2) + eps), h = x * r in fp32, h rounded to the dtype, out = weight * h rounded
// to the dtype. x, weight and out share `dtype`; inv_rms [rows] receives r unless null.
cudaError_t RmsNorm(const void* x, const void* weight, void* out, float* inv_rms, int64_t rows,
                    int64_t cols, float eps, DtypeCode dtype, cudaStream_t stream);

// sum = x + add (each element rounded to the dtype, as LibTorch's add rounds it) and out =
// RmsNorm(sum) as above, in one kernel: the residual add and the next norm of a decoder layer.
// x, add, weight, sum and out share `dtype`; sum aliases neither x nor add.
cudaError_t AddRmsNorm(const void* x, const void* add, const void* weight, void* sum, void* out,
                       int64_t rows, int64_t cols, float eps, DtypeCode dtype,
                       cudaStream_t stream);

// AddRmsNorm with `add` given as a GEMM's fp32 partial sums over kPartialSlices slices of k,
// partials [kPartialSlices, rows, cols] (contiguous): add is their sum in slice order, rounded to
// the dtype, as the GEMM rounds its output. cols <= kAddPartialsMaxCols.
constexpr int kPartialSlices = 4;
constexpr int64_t kAddPartialsMaxCols = 2048;
cudaError_t AddPartialsRmsNorm(const void* x, const float* partials, const void* weight, void* sum,
                               void* out, int64_t rows, int64_t cols, float eps, DtypeCode dtype,
                               cudaStream_t stream);

// The gradient of RmsNorm given grad_out [rows, cols] (contiguous, `dtype`) and the forward's
// inv_rms: with g = grad_out * weight rounded to the dtype (what the weight product passes back),
// grad_x = r g - x r^3 mean(g x) (rounded to the dtype), and the weight's gradient as fp32
// partial sums over row chunks, grad_weight_partial [chunks, cols] (sum it over dim 0):
// sum over the chunk's rows of grad_out * h.
cudaError_t RmsNormBackward(const void* x, const void* weight, const float* inv_rms,
                            const void* grad_out, int64_t rows, int64_t cols, DtypeCode dtype,
                            void* grad_x, float* grad_weight_partial, int64_t chunks,
                            cudaStream_t stream);

// Rotary embedding of x [B, S, H, D] (any element strides) into out [B, S, H, D] (contiguous), with
// the rows of cos/sin (contiguous, x's dtype; row b s of [B, S, half] where cos_stride_b is S, row
// s of [S, half] where it is 0: a position per row, or one for the batch) by position s: the
// pairs (j, j + half) (interleaved: (2j, 2j + 1)) become (x1 cos - x2 sin, x2 cos + x1 sin) in
// dims [0, 2 half), each product and each sum rounded to the dtype as separate LibTorch ops round
// them; dims from 2 half on are copied.
cudaError_t Rope(const void* x, int64_t stride_b, int64_t stride_s, int64_t stride_h,
                 int64_t stride_d, const void* cos, const void* sin, int64_t cos_stride_b,
                 void* out, int64_t batch, int64_t seq, int64_t heads, int64_t dim, int64_t half,
                 bool interleaved, DtypeCode dtype, cudaStream_t stream);

// Per row of logits [rows, vocab] (contiguous, `dtype`): lse = logsumexp in fp32,
// log_probs[r] = logits[r, targets[r]] - lse[r], and when `entropy` is not null the entropy of
// softmax(logits[r]). One read of the logits.
cudaError_t TokenLogProbsForward(const void* logits, const int64_t* targets, int64_t rows,
                                 int64_t vocab, DtypeCode dtype, float* log_probs, float* lse,
                                 float* entropy, cudaStream_t stream);

// The gradient of TokenLogProbsForward's outputs with respect to the logits, written as `dtype`
// into grad_logits [rows, vocab]: with p = exp(logit - lse),
//   grad = g_lp[r] * (onehot(targets[r]) - p) + g_h[r] * p * (lse[r] - entropy[r] - logit).
// grad_log_probs or grad_entropy may be null (zero); entropy is needed with grad_entropy.
cudaError_t TokenLogProbsBackward(const void* logits, const int64_t* targets, const float* lse,
                                  const float* entropy, const float* grad_log_probs,
                                  const float* grad_entropy, int64_t rows, int64_t vocab,
                                  DtypeCode dtype, void* grad_logits, cudaStream_t stream);

// The decode step (decode_kernels.cu; Note [Decode kernels] in trainer/model/layers.cc).

constexpr int64_t kSmallLinearMaxRows = 2;  // past 2 rows cuBLAS is faster (fused_kernels_bench)

// y [rows, n_out] = x [rows, k_in] w^T + bias for rows <= kSmallLinearMaxRows (the projections of
// a decode step of a few rows, where a GEMM library's tiles are mostly idle): x, w [n_out, k_in]
// and y contiguous and 16-byte aligned, k_in a multiple of 16 bytes' elements, bias [n_out] or
// null; fp32 sums, rounded once.
cudaError_t SmallLinear(const void* x, const void* w, const void* bias, void* y, int64_t rows,
                        int64_t n_out, int64_t k_in, DtypeCode dtype, cudaStream_t stream);

// y [rows, n_out] = x [rows, k_in] w^T + bias for rows <= kSkinnyLinearMaxRows on tensor cores,
// bf16 (linear_kernels.cu, Note [Skinny linear kernel]): x, w [n_out, k_in] and y contiguous and
// 16-byte aligned, k_in a multiple of 32, bias [n_out] or null; fp32 sums, rounded once.
constexpr int64_t kSkinnyLinearMaxRows = 64;
cudaError_t SkinnyLinear(const void* x, const void* w, const void* bias, void* y, int64_t rows,
                         int64_t n_out, int64_t k_in, cudaStream_t stream);

// The gated MLP's gate/up projection and its activation in one kernel, for up to 64 bf16 rows on
// tensor cores (linear_kernels.cu, Note [Gate/up projection with SiluMul on tensor cores]):
// out [rows, inner] = SiluMul(x [rows, k_in] w^T) for w [2 inner, k_in] (the gate's rows, then the
// up's), each product rounded to bf16 before the activation as a GEMM and SiluMul round them. x,
// w and out contiguous and 16-byte aligned. GateUpSiluMmaFits says where it takes a shape: an
// sm_90 device, k_in a multiple of 64, inner even.
bool GateUpSiluMmaFits(int64_t rows, int64_t inner, int64_t k_in);
cudaError_t GateUpSiluMma(const void* x, const void* w, void* out, int64_t rows, int64_t inner,
                          int64_t k_in, cudaStream_t stream);

// The inputs the next two stage in shared memory: rows x k_in elements of at most this many bytes.
constexpr int64_t kSmallLinearMaxStagedBytes = 96 * 1024;
// A block's weights, norm weight and staged input, where SmallLinear holds them in shared memory
// (SharedWeightLinear): at most this many bytes, so that two blocks fit an SM of the H200 (less
// where the device gives less).
constexpr int64_t kPrefetchMaxSharedBytes = 112 * 1024;
// Whether SmallLinear of these sizes holds its weights in shared memory now: `staged` for the
// folded forms, the norm's weight for SmallLinearAddRmsNorm (null otherwise). For tests.
bool SmallLinearSharesWeights(int64_t rows, int64_t n_out, int64_t k_in, const void* norm_weight,
                              bool staged, DtypeCode dtype);

// SmallLinear of RmsNorm(x + add) (of x alone when add is null), with the norm's weight [k_in]
// and eps: the residual add and the norm of a decoder layer folded into the next projection. Each
// block normalises the rows itself (bit for bit AddRmsNorm's result); sum [rows, k_in] receives
// x + add (not written without add).
cudaError_t SmallLinearAddRmsNorm(const void* x, const void* add, const void* norm_weight,
                                  float eps, void* sum, const void* w, const void* bias, void* y,
                                  int64_t rows, int64_t n_out, int64_t k_in, DtypeCode dtype,
                                  cudaStream_t stream);

// SmallLinearAddRmsNorm of bf16 x with add given as `slices` (1 to kMaxOPartialSlices) fp32
// partial sums [slices, rows, k_in] (DecodeQkvAttentionO's o.partials; 16-byte aligned, k_in a
// multiple of 4): add is their sum in slice order rounded to bf16.
cudaError_t SmallLinearAddPartialsRmsNorm(const void* x, const float* partials, int slices,
                                          const void* norm_weight, float eps, void* sum,
                                          const void* w, const void* bias, void* y, int64_t rows,
                                          int64_t n_out, int64_t k_in, DtypeCode dtype,
                                          cudaStream_t stream);

// SmallLinear of SiluMul(gate_up) for gate_up [rows, 2 inner]: the gated MLP's activation folded
// into its down projection (w [n_out, inner]); bit for bit SiluMul's values as the input.
cudaError_t SmallLinearSiluMul(const void* gate_up, const void* w, const void* bias, void* y,
                               int64_t rows, int64_t n_out, int64_t inner, DtypeCode dtype,
                               cudaStream_t stream);

// out [rows, inner] = silu(gate) * up for gate_up [rows, 2 inner] (gate, then up, per row), with
// the roundings of at::silu and the product as separate LibTorch ops.
cudaError_t SiluMul(const void* gate_up, void* out, int64_t rows, int64_t inner, DtypeCode dtype,
                    cudaStream_t stream);

constexpr int64_t kMaxHeadDim = 256;

// The layout DecodeQkvPrep reads and writes. Strides count elements.
struct QkvPrepShape {
  int64_t q_heads = 0, kv_heads = 0, dim = 0;  // dim <= kMaxHeadDim
  int64_t half = 0;                            // RoPE pairs (2 half <= dim)
  bool interleaved = false;                    // pairs (2j, 2j + 1) rather than (j, j + half)
  int64_t qkv_stride = 0;                      // between rows of qkv
  int64_t k_stride_b = 0, k_stride_h = 0, k_stride_t = 0;  // the key cache [B, Hkv, T, dim]
  int64_t v_stride_b = 0, v_stride_h = 0, v_stride_t = 0;  // the value cache
  float eps = 0;
  // Row b's position is p = position[b position_stride] (0 where the whole batch shares one, else
  // each row has its own: Note [Ragged decode] in trainer/model/layers.h), and its cos / sin start
  // at cos + p half: the rows of a contiguous RoPE table [positions, half].
  int64_t position_stride = 0;
};

// One decode position of GQA attention before the attention itself: per row b of qkv (the q, k
// and v heads of one token, head after head, `dim` each), the q and k heads normalised by
// RmsNorm with q_norm / k_norm [dim] (skipped where null), rotated by its position's row of the
// RoPE table cos / sin [positions, half] like Rope, and then q written to q_out [batch, q_heads,
// dim] (contiguous) and k and v to the caches at the row's position (on the device, below the
// table's and the caches' lengths; shape.position_stride says whether rows share it). Bit for bit
// what RmsNorm, Rope and copies compute.
cudaError_t DecodeQkvPrep(const void* qkv, const void* q_norm, const void* k_norm,
                          const void* cos, const void* sin, const int64_t* position, void* q_out,
                          void* k_cache, void* v_cache, int64_t batch, const QkvPrepShape& shape,
                          DtypeCode dtype, cudaStream_t stream);

// How DecodeAttention splits the keys: `splits` blocks of `chunk` keys per (row, key/value head).
struct DecodeAttentionShape {
  int64_t q_heads = 0, kv_heads = 0;
  int64_t k_stride_b = 0, k_stride_h = 0, k_stride_t = 0;  // the key cache [B, Hkv, T, dim]
  int64_t v_stride_b = 0, v_stride_h = 0, v_stride_t = 0;
  int64_t key_length = 0;       // the cache positions a step may read
  int64_t position_stride = 0;  // row b's position is position[b position_stride]
  int64_t chunk = 0;
  int splits = 1;
  float scale = 1;
  // bf16 caches whose rows are 16-byte aligned: the tensor-core kernel (Note [Tensor-core decode
  // attention] in decode_kernels.cu), whose softmax weights pass to the second product as two
  // bf16 parts (about 16 bits); fp32 weights in the other kernel.
  bool tensor_cores = false;
};

// True when DecodeAttention takes this head layout: dim 64, 128 or 256, and q_heads a multiple
// of kv_heads.
bool DecodeAttentionSupports(int64_t q_heads, int64_t kv_heads, int64_t dim);

// Whether DecodeAttention (DecodeQkvAttention with `prep`) of `batch` rows in the split `p` takes
// bf16 blocks of one tile a warp (Note [One tile a warp for a grid of more than a wave] in
// decode_kernels.cu): on tensor cores, where they run the grid in fewer waves than the usual form.
bool DecodeAttentionTakesOneTile(int64_t batch, int64_t dim, const DecodeAttentionShape& p,
                                 bool prep);

// The split of `key_length` keys (the most a step may see) for a batch (strides left zero) and
// the kernel (`tensor_cores`: the caller has checked that the cache takes it): the keys of each
// (row, head group) are split until the grid has about `blocks_per_sm` blocks per multiprocessor
// (0: the default, chosen by tools/bench/fused_kernels_bench), each split at least one iteration
// of every warp of the kernel's block (on tensor cores four: 256 keys).
DecodeAttentionShape PlanDecodeAttention(int64_t batch, int64_t q_heads, int64_t kv_heads,
                                         int64_t key_length, float scale, int blocks_per_sm = 0,
                                         bool tensor_cores = false);

// softmax(q k^T scale) v for one query position per row: q [batch, q_heads, dim] (contiguous),
// query head h reading key/value head h / (q_heads / kv_heads) at cache positions
// [0, position[b shape.position_stride]] (on the device); out [batch, q_heads, dim] (contiguous).
// fp32 scores, softmax and sums. The keys of a (row, head) are split into shape.splits blocks; with
// several, each block writes partial_out [batch, q_heads, splits, dim] and partial_stats [batch,
// q_heads, splits, 2] (fp32 scratch, unused with one split) and the last block of a row and head
// merges them in split order, so the result does not depend on the blocks' timing. The merge counts
// blocks in a counter array of the module, which each merge leaves zeroed: two launches must not
// run concurrently (one stream). q, the caches' rows and out must be aligned to dim / 32
// elements.
cudaError_t DecodeAttention(const void* q, const void* k, const void* v, const int64_t* position,
                            void* out, float* partial_out, float* partial_stats, int64_t batch,
                            int64_t dim, const DecodeAttentionShape& shape, DtypeCode dtype,
                            cudaStream_t stream);

// DecodeQkvPrep's inputs, for DecodeQkvAttention.
struct QkvPrepInputs {
  const void* qkv = nullptr;
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  QkvPrepShape shape;
};

// True when DecodeQkvAttention takes this head layout: DecodeAttentionSupports, with q_heads /
// kv_heads of 1, 2, 4 or 8 (so that one block of a split reads each key/value head).
bool DecodeQkvAttentionSupports(int64_t q_heads, int64_t kv_heads, int64_t dim);

// DecodeQkvPrep and then DecodeAttention in one kernel, bit for bit the two (without writing q):
// each block normalises and rotates its query heads itself, and the block whose split holds the
// position also the step's key and value heads, which it writes to the caches before it reads
// them. prep.shape's strides are those of k_cache and v_cache; the rest as for the two.
cudaError_t DecodeQkvAttention(const QkvPrepInputs& prep, const int64_t* position, void* k_cache,
                               void* v_cache, void* out, float* partial_out,
                               float* partial_stats, int64_t batch,
                               const DecodeAttentionShape& shape, DtypeCode dtype,
                               cudaStream_t stream);

// The o projection folded into DecodeQkvAttentionO: w [hidden, q_heads dim] bf16 with contiguous
// rows; partials [kv_heads, batch, hidden] fp32 receives each head group's share of the o
// projection of the attention's output (added in head order it is the projection, up to the
// order of the sums).
struct OProjection {
  const void* w = nullptr;
  float* partials = nullptr;
  int64_t hidden = 0;
  int64_t batch = 0;
};
// The blocks of a cluster of DecodeQkvAttentionO, which split the keys of one (row, key/value
// head) and the o projection's output features.
constexpr int kAttentionOCluster = 8;
// The most keys DecodeQkvAttentionO is taken for: a split of at least 256 keys each on tensor
// cores (PlanDecodeAttention) gives DecodeQkvAttention no more than the cluster's splits there,
// and past it the cluster's 8 would run fewer blocks over longer splits.
constexpr int64_t kAttentionOMaxKeys = int64_t{kAttentionOCluster} * 256;
// The most partial sums (key/value heads) SmallLinearAddPartialsRmsNorm adds.
constexpr int kMaxOPartialSlices = 8;
// The most bytes of the o projection's weights a DecodeQkvAttentionO block holds in shared memory.
constexpr int64_t kOSliceMaxBytes = 80 * 1024;

// True when DecodeQkvAttentionO takes this layout: DecodeQkvAttentionSupports with heads of 128
// dims, 1, 2 or 4 query heads per key/value head, at most kMaxOPartialSlices key/value heads,
// and a hidden size (a multiple of 4 kAttentionOCluster) whose slice of the o projection per
// block (hidden / kAttentionOCluster rows) fits kOSliceMaxBytes.
bool DecodeQkvAttentionOSupports(int64_t q_heads, int64_t kv_heads, int64_t dim, int64_t hidden);

// DecodeQkvAttention of bf16 caches (tensor cores) with the o projection folded in (Note [The o
// projection in the attention's clusters] in decode_kernels.cu): the cache writes as
// DecodeQkvAttention's, and o.partials instead of the attention's output. shape as for
// DecodeQkvAttention; its splits are the cluster's (kAttentionOCluster), whatever it says.
cudaError_t DecodeQkvAttentionO(const QkvPrepInputs& prep, const int64_t* position, void* k_cache,
                                void* v_cache, const OProjection& o, DecodeAttentionShape shape,
                                cudaStream_t stream);

// The DSA indexer's scores for one decode position per row (Note [DSA index scores kernel] in
// dsa_kernels.cu): out[b, t] = sum_h weights[b, h] relu(scale (q[b, h] . keys[b, t])) (fp32 sums)
// for t <= position[b * position_stride], -inf for the other t < key_length. q [batch, heads,
// dim] bf16 contiguous, weights [batch, heads] fp32 contiguous, keys bf16 with unit stride along
// dim, row b's key t at b * key_stride_b + t * key_stride_t (both multiples of 8, 16-byte aligned
// start), out fp32 with row stride out_stride. No atomics: the same inputs give the same bits.
struct DsaIndexShape {
  int64_t batch = 0, heads = 0, dim = 0, key_length = 0;
  int64_t key_stride_b = 0, key_stride_t = 0, position_stride = 0, out_stride = 0;
  float scale = 1.0f;
};
// True when DsaIndexScores takes this many heads of this dim: 8, 16 or 32 heads of 64 or 128.
bool DsaIndexScoresSupports(int64_t heads, int64_t dim);
cudaError_t DsaIndexScores(const void* q, const float* weights, const void* keys,
                           const int64_t* position, float* out, const DsaIndexShape& shape,
                           cudaStream_t stream);

// A MoE router's choice per token (Note [Router kernel] in moe_kernels.cu): from logits
// [tokens, experts] fp32 (contiguous), ids [tokens, k] int64 (in descending order of the choice)
// and weights [tokens, k] fp32. Softmax: chosen by softmax(logits), weighted by it (divided by
// the chosen weights' sum with `normalize`). Sigmoid (noaux_tc): s = sigmoid(logits), chosen by
// s + bias (bias [experts] fp32, or null) within the best topk_group of `groups` expert groups
// (a group's score: its two best choices summed), weighted by s (divided by the chosen sum +
// 1e-20 with `normalize`) times `scale`. RouterTopKSupports: up to 512 experts, 16 choices and 8
// groups that divide the experts and hold k experts.
constexpr int kMaxRouterLanes = 16;  // experts per lane: 512 in all
constexpr int kMaxRouterK = 16;
constexpr int kMaxRouterGroups = 8;
struct RouterShape {
  int64_t tokens = 0, experts = 0, k = 0, groups = 1, topk_group = 1;
  bool sigmoid = false, normalize = false;
  float scale = 1.0f;
};
bool RouterTopKSupports(int64_t experts, int64_t k, int64_t groups, int64_t topk_group);
cudaError_t RouterTopK(const float* logits, const float* bias, int64_t* ids, float* weights,
                       const RouterShape& shape, cudaStream_t stream);

// The MoE block's (token, slot) pairs sorted by expert (Note [Sort by expert kernel] in
// moe_kernels.cu), from ids [pairs] int64 in [0, experts): order [pairs] (the stable argsort),
// sorted_ids [pairs] (ids in that order), ends [experts] int32 (each expert's end in the sorted
// rows: the inclusive counts' sum) and inverse [pairs] (the sorted row of each pair), bit for bit
// the ops'. One block: SortByExpertSupports, up to 8192 pairs and 4096 experts.
constexpr int64_t kMaxSortPairs = 8192;
constexpr int64_t kMaxSortExperts = 4096;
bool SortByExpertSupports(int64_t pairs, int64_t experts);
cudaError_t SortByExpert(const int64_t* ids, int64_t pairs, int64_t experts, int64_t* order,
                         int64_t* sorted_ids, int32_t* ends, int64_t* inverse, cudaStream_t stream);

// The MoE block's output per token (Note [Combine kernel] in moe_kernels.cu): out[t] = cast(sum_j
// rows[inverse[t k + j]] weights[t k + j]) (+ shared[t] when given), rows [pairs, hidden] in
// the experts' sorted order, weights [tokens, k] fp32, shared and out [tokens, hidden], all
// contiguous, of `dtype` but the weights. The ops' result up to the order of the slots' sum.
cudaError_t CombineExperts(const void* rows, const int64_t* inverse, const float* weights,
                           const void* shared, void* out, int64_t tokens, int64_t k, int64_t hidden,
                           DtypeCode dtype, cudaStream_t stream);

// Where a decode step's sampled tokens and log-probs go besides `tokens` and `log_probs` (Note
// [Sampled tokens handed on] in trainer/rollout/engine.h): host_tokens[r] = the token and
// host_log_probs[r] = its log-prob (device pointers to mapped host memory, written across the
// bus), and next_tokens[r] = the token with positions[r] += 1. Null pointers are skipped;
// next_tokens and positions are null together.
struct HandOnTargets {
  int64_t* host_tokens = nullptr;
  float* host_log_probs = nullptr;
  int64_t* next_tokens = nullptr;
  int64_t* positions = nullptr;
};

// One token per row of logits [rows, vocab] (row stride `stride`; vocab and stride multiples of
// 16 bytes' elements, the rows 16-byte aligned) from the whole vocabulary (Note [Sampling kernel]
// in sample_kernels.cu): greedy, the first largest logit; else the first token in id order whose
// cumulative softmax(logits / temperature) (fp64) exceeds uniforms[row] (fp64 in [0, 1), readable
// by the device). tokens [rows] int64 and log_probs [rows] fp32 (log_softmax(logits /
// temperature) at the token; temperature 0 counts as 1). A cluster of 8, 4 or 2 blocks per row
// (the same bits), fewer than 2^28 rows. Vocabularies whose step totals per block
// (SampleRowsSharedBytes) exceed kSampleMaxSharedBytes are not taken: 10.5M words in bf16, 5.2M in
// fp32. Each row's token and log-prob also go to `hand_on`'s targets.
cudaError_t SampleRows(const void* logits, int64_t rows, int64_t vocab, int64_t stride,
                       double temperature, bool greedy, const double* uniforms, int64_t* tokens,
                       float* log_probs, const HandOnTargets& hand_on, DtypeCode dtype,
                       cudaStream_t stream);
constexpr int64_t kSampleMaxSharedBytes = 40 * 1024;
int64_t SampleRowsSharedBytes(int64_t vocab, DtypeCode dtype);

// Tokens [rows] and their log-probs, sampled otherwise, to `to`'s targets, in one kernel.
cudaError_t HandOnSampled(const int64_t* tokens, const float* log_probs, int64_t rows,
                          const HandOnTargets& to, cudaStream_t stream);

}  // namespace rl::kernels

#endif  // RL_TRAINER_KERNELS_CUDA_KERNELS_H_
