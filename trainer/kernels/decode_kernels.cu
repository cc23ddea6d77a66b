// The decode-step kernels of cuda_kernels.h: SmallLinear (with its staged inputs), SiluMul,
// DecodeQkvPrep and DecodeAttention.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

constexpr int kDecodeWarps = 4;        // warps per block of the decode kernels
constexpr int kMaxGroup = 8;           // query heads per DecodeAttention block
constexpr int kKeysPerIteration = 4;   // keys a warp takes at once (8: slower at batch 64)
// Iterations of keys and values a DecodeAttention warp has in flight, in shared memory (one, in
// registers, took 22.6 us at batch 64 where 4 take 21.3 us: tools/bench/fused_kernels_bench).
constexpr int kStages = 4;
// DecodeAttention splits the keys until the grid has about this many blocks per SM: 1 was the
// fastest at batch 64 (by 27% with 8 query heads per key/value head; 2 splits them in two) and
// as fast as any at batch 1 (tools/bench/fused_kernels_bench).
constexpr int kBlocksPerSm = 1;

template <typename T>
__global__ void SiluMulKernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows,
                              int64_t inner) {
  PrecedingKernelsDone();
  const int64_t total = rows * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / inner;
    const int64_t j = i - r * inner;
    out[i] = SiluTimes<T>(ToFloat(gate_up[r * 2 * inner + j]),
                          ToFloat(gate_up[r * 2 * inner + inner + j]));
  }
}

// One head of a row of qkv as DecodeQkvPrep writes it, into dst, by one warp: a value head as it
// is; a query or key head normalised by `norm` (unless null) and rotated by cos / sin. Lane l
// holds the head's elements l, l + 32, ... (as RmsNormKernel's block of kThreads holds one element
// per thread). `normed` is the warp's scratch of kMaxHeadDim floats. A lane loads every element it
// needs (the head's, the norm's weights, cos and sin) before it uses the first, so that the head
// costs one memory round trip rather than one for each phase and RoPE element; `after_loads()`
// runs between the two (Note [The shallow ring filled after the preparation's loads]).
// kHeadDim: the head's elements where the caller knows them when compiling (p.dim then equals it:
// the attention's preparation, whose kernel DecodeQkvAttention picks by p.dim), so that a lane
// loads, squares and sums only those: at 128 dims 4 elements and 4 warp sums a lane, not
// kMaxHeadDim's 8, with the same bits (the sums past the head were zeros). 0 for any p.dim up to
// kMaxHeadDim.
struct NoWork {
  __device__ void operator()() const {}
};
template <typename T, int kHeadDim = 0, typename AfterLoads = NoWork>
__device__ void PrepHead(const T* __restrict__ in, bool value, const T* __restrict__ norm,
                         const T* __restrict__ cos, const T* __restrict__ sin,
                         const QkvPrepShape& p, float* __restrict__ normed, T* __restrict__ dst,
                         const AfterLoads& after_loads = {}) {
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= kMaxHeadDim, "whole lanes of a head");
  constexpr int kPerLane = (kHeadDim > 0 ? kHeadDim : kMaxHeadDim) / 32;
  const int64_t dim = kHeadDim > 0 ? kHeadDim : p.dim;
  const int lane = threadIdx.x % 32;
  const bool normalise = !value && norm != nullptr;
  const bool rotate = !value && p.half > 0;
  // Element j's value, norm weight, and the cos and sin of its RoPE pair r, loaded from indices
  // clamped into range so that no load waits on a branch: elements past the head (or past the
  // RoPE pairs) load index 0 and are discarded.
  T raw_x[kPerLane], raw_weight[kPerLane], raw_cos[kPerLane], raw_sin[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    const int64_t in_head = j < dim ? j : 0;
    const int64_t r = j < p.half ? j : j < 2 * p.half ? j - p.half : 0;
    raw_x[i] = in[in_head];
    if (normalise) raw_weight[i] = norm[in_head];
    if (rotate) {
      raw_cos[i] = cos[r];
      raw_sin[i] = sin[r];
    }
  }
  after_loads();
  if (value) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = lane + 32 * i;
      if (j < dim) dst[j] = raw_x[i];  // the bits as they are, NaNs' too
    }
    return;
  }
  float x[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) x[i] = lane + 32 * i < dim ? ToFloat(raw_x[i]) : 0.0f;
  if (normalise) {
    // RmsNormKernel's sum of squares bit for bit: its warp i sums elements [32 i, 32 i + 32)
    // (the same butterfly as here), then lanes 0-7 of one warp hold the 8 warp sums (zeros past
    // the row) and a butterfly adds them; offsets 16 and 8 add zeros there, 4, 2, 1 remain.
    float sums[kWarps];
    for (int i = 0; i < kWarps; ++i) sums[i] = i < kPerLane ? WarpSum(x[i] * x[i]) : 0.0f;
    for (int offset = 4; offset > 0; offset /= 2) {
      float next[kWarps];
      for (int i = 0; i < kWarps; ++i) next[i] = sums[i] + sums[i ^ offset];
      for (int i = 0; i < kWarps; ++i) sums[i] = next[i];
    }
    const float inv = rsqrtf(sums[0] / static_cast<float>(dim) + p.eps);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (lane + 32 * i < dim) x[i] = ToFloat(RmsNormed<T>(x[i], inv, ToFloat(raw_weight[i])));
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < dim) normed[j] = x[i];
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j >= dim) continue;
    if (j >= 2 * p.half) {
      dst[j] = FromFloat<T>(x[i]);
      continue;
    }
    // RopeKernel's pairs and arithmetic, on the normed values.
    const int64_t r = j < p.half ? j : j - p.half;
    const float x1 = normed[p.interleaved ? 2 * r : r];
    const float x2 = normed[p.interleaved ? 2 * r + 1 : r + p.half];
    dst[j] = Rotated<T>(j < p.half, x1, x2, ToFloat(raw_cos[i]), ToFloat(raw_sin[i]));
  }
  __syncwarp();  // `normed` may be the warp's next head's
}

// Where a decode step writes key/value head kv_head of row b: the key (or, with `value`, the
// value) cache at position pos.
template <typename T>
__device__ __forceinline__ T* StepCacheRow(T* k_cache, T* v_cache, const QkvPrepShape& p,
                                           int64_t b, int64_t kv_head, int64_t pos, bool value) {
  return value ? v_cache + b * p.v_stride_b + kv_head * p.v_stride_h + pos * p.v_stride_t
               : k_cache + b * p.k_stride_b + kv_head * p.k_stride_h + pos * p.k_stride_t;
}

// One warp per (row, head) of the q, k and v heads of qkv.
template <typename T>
__global__ void DecodeQkvPrepKernel(const T* __restrict__ qkv, const T* __restrict__ q_norm,
                                    const T* __restrict__ k_norm, const T* __restrict__ cos,
                                    const T* __restrict__ sin,
                                    const int64_t* __restrict__ position, T* __restrict__ q_out,
                                    T* __restrict__ k_cache, T* __restrict__ v_cache,
                                    int64_t batch, QkvPrepShape p) {
  __shared__ float normed[kDecodeWarps][kMaxHeadDim];
  PrecedingKernelsDone();
  const int warp = threadIdx.x / 32;
  const int64_t heads = p.q_heads + 2 * p.kv_heads;
  const int64_t index = blockIdx.x * static_cast<int64_t>(kDecodeWarps) + warp;
  if (index >= batch * heads) return;
  const int64_t b = index / heads;
  const int64_t head = index % heads;
  const int64_t pos = position[b * p.position_stride];
  const bool is_q = head < p.q_heads;
  const bool value = head >= p.q_heads + p.kv_heads;
  const int64_t kv_head = head - p.q_heads - (value ? p.kv_heads : 0);
  T* dst = is_q ? q_out + (b * p.q_heads + head) * p.dim
                : StepCacheRow(k_cache, v_cache, p, b, kv_head, pos, value);
  PrepHead(qkv + b * p.qkv_stride + head * p.dim, value, is_q ? q_norm : k_norm,
           cos + pos * p.half, sin + pos * p.half, p, normed[warp], dst);
}

// kVec consecutive elements of T, loaded as one vector (aligned to their size, which
// DecodeAttention's caller checks).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <typename T, int kVec>
__device__ __forceinline__ Pack<T, kVec> LoadPack(const T* __restrict__ src) {
  return *reinterpret_cast<const Pack<T, kVec>*>(src);
}

template <typename T, int kVec>
__device__ __forceinline__ void LoadRow(const T* __restrict__ src, float (&dst)[kVec]) {
  const Pack<T, kVec> pack = LoadPack<T, kVec>(src);
#pragma unroll
  for (int e = 0; e < kVec; ++e) dst[e] = ToFloat(pack.v[e]);
}

// A warp's ring of kRing stages in shared memory, filled by cp.async one iteration ahead per
// stage, one group of copies per iteration (empty past the keys), so that waiting for all but the
// newest kRing - 1 groups waits for the current iteration's. `copy(t0, stage)` issues the copies
// of the iteration at t0 into `stage`. A ring is filled up front with its first kRing - 1
// iterations, or (kFillAll) with kRing, each stage then taking the iteration kRing after its own
// once read.

// The iterations t0, t0 + stride, ... into stages 0 to kRing - 2 (kRing - 1 with kFillAll), those
// that start before `limit`, a group of copies per stage.
template <int kRing, bool kFillAll, typename Copy>
__device__ __forceinline__ void FillRing(int64_t t0, int64_t stride, int64_t limit,
                                         const Copy& copy) {
#pragma unroll
  for (int stage = 0; stage < (kFillAll ? kRing : kRing - 1); ++stage) {
    if (t0 + stage * stride < limit) copy(t0 + stage * stride, stage);
    CommitCopies();
  }
}

// Note [The step's key and value in the ring]
// A DecodeQkvAttention block (kPrep) computes the step's key and value itself (PrepareHeads) and
// writes them to the caches for later steps. Its own ring does not read them back from there: the
// copies read only the rows before the position (the copy lambdas stop at `copy_end`), which
// earlier steps wrote, and the warp whose tile holds the position puts the two rows into it from
// shared memory once the tile's copies have landed. So no copy waits for anything this step
// writes, and StartRing issues a ring filled up front (kFillAll) before PrecedingKernelsDone():
// under programmatic launch the cache streams in while the q/k/v projection ahead finishes, and
// the tile that holds the position costs no memory round trip after the preparation (a shallow
// ring's fill comes later: Note [The shallow ring filled after the preparation's loads]). The
// rows summed are the same, so are the bits. Rows past the position are not copied; they get no
// weight (and the tensor-core kernel zeroes its values there).

// Note [The shallow ring filled after the preparation's loads]
// A ring of one tile ahead (!kFillAll: the tensor-core kernel's shallow form, for grids of more
// blocks than the deep one takes, and the CUDA-core kernel) is not filled before the wait, as a
// ring filled up front is (Note [The step's key and value in the ring]), but by each warp right
// after it has issued the loads of its first head's preparation and before it uses them (PrepHead's
// `after_loads`); a warp with no head to prepare fills it at once. At batch 64 the first wave's
// first tiles are about 8 MiB of copies (264 blocks of 4 warps, 8 KiB a tile); issued before the
// wait they reach the memory system before the preparation's few loads, which every block waits for
// before its key loop (the likely reason it pays; not measured apart). After those loads the
// copies still land while the preparation computes. The rows copied and their sums are unchanged:
// the same bits. On an H100 (docs/decode-performance.md, "The shallow ring filled after the
// preparation's loads"): 1.013x and 1.008x at batch 64, 1.017x and 1.019x at 16, 1.018x at 33;
// the fill after the whole preparation instead was 0.981x at batch 64.

// The start of a DecodeQkvAttention block (kPrep): a ring filled up front (kFillAll) and
// `more_copies()` (the o projection's weights, in a group of their own after the ring's), then
// PrecedingKernelsDone() and the block's preparation `prepare(fill)`, which calls `fill()` once in
// each warp to fill a shallow ring (Note [The shallow ring filled after the preparation's loads]).
// Returns false, having prepared nothing, for a split past the position (no part in the merge of
// the keys).
template <int kRing, bool kFillAll, typename Copy, typename Prepare, typename MoreCopies>
__device__ __forceinline__ bool StartRing(int64_t begin, int64_t t0, int64_t stride,
                                          int64_t copy_end, int64_t pos, const Copy& copy,
                                          const Prepare& prepare, const MoreCopies& more_copies) {
  if constexpr (kFillAll) FillRing<kRing, kFillAll>(t0, stride, copy_end, copy);
  more_copies();
  PrecedingKernelsDone();
  if (begin > pos) return false;
  prepare([&] {
    if constexpr (!kFillAll) FillRing<kRing, kFillAll>(t0, stride, copy_end, copy);
  });
  return true;
}

// At the iteration t0, held in `stage`: unless it is the first of a ring filled with all kRing
// (kFillAll), the stage read the iteration before is refilled with the iteration kRing - 1 ahead
// (if it starts before `end`); then this iteration's copies are waited for (this thread's; a warp
// reading other lanes' copies syncs after).
template <int kRing, bool kFillAll, typename Copy>
__device__ __forceinline__ void AdvanceRing(int64_t t0, int64_t first, int64_t stride, int64_t end,
                                            int stage, const Copy& copy) {
  if (!kFillAll || t0 != first) {
    const int64_t ahead = t0 + (kRing - 1) * stride;
    if (ahead < end) copy(ahead, stage == 0 ? kRing - 1 : stage - 1);
    CommitCopies();
  }
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kRing - 1) : "memory");
}

// Per (row, group of kGroup query heads) a counter of the splits that have written their partial
// results; the last one merges them and sets it back to 0 (so every launch finds zeros).
constexpr int64_t kMaxMergeSlots = int64_t{1} << 16;
__device__ unsigned int g_split_counters[kMaxMergeSlots];

// The first phase of a decode attention block with kPrep: what DecodeQkvPrepKernel would compute
// for it, from `prep` (whose pointers are T's): its query heads into `prepared_q`, and, in the
// split that holds the position, the step's key and value heads into `step_rows` (for the ring,
// Note [The step's key and value in the ring]) and from there to the caches. Each warp calls
// `fill()` once: after its first head's loads, or at once without a head. Ends with a barrier, so
// that the block reads all of them after.
template <typename T, int kDim, int kGroup, int kBlockWarps, typename Fill>
__device__ void PrepareHeads(const QkvPrepInputs& prep, T* k_cache, T* v_cache, int64_t b,
                             int64_t first_head, int64_t kv_head, int64_t pos, bool holds_position,
                             T (&prepared_q)[kGroup][kDim], T (&step_rows)[2][kDim],
                             float (&normed)[kBlockWarps][kMaxHeadDim], const Fill& fill) {
  const QkvPrepShape& s = prep.shape;
  const auto typed = [](const void* t) { return static_cast<const T*>(t); };
  const int warp = threadIdx.x / 32;
  const int heads = holds_position ? kGroup + 2 : kGroup;  // the step's key and value heads
  if (warp >= heads) fill();
  for (int h = warp; h < heads; h += kBlockWarps) {
    const bool is_q = h < kGroup;
    const bool value = h == kGroup + 1;
    const int64_t head = is_q ? first_head + h : s.q_heads + kv_head + (value ? s.kv_heads : 0);
    T* dst = is_q ? prepared_q[h] : step_rows[value];
    const auto after_loads = [&] {
      if (h == warp) fill();
    };
    PrepHead<T, kDim>(typed(prep.qkv) + b * s.qkv_stride + head * s.dim, value,
                      typed(is_q ? prep.q_norm : prep.k_norm), typed(prep.cos) + pos * s.half,
                      typed(prep.sin) + pos * s.half, s, normed[warp], dst, after_loads);
    if (!is_q) {
      __syncwarp();
      T* row = StepCacheRow(k_cache, v_cache, s, b, kv_head, pos, value);
      for (int j = threadIdx.x % 32; j < kDim; j += 32) row[j] = dst[j];
    }
  }
  __syncthreads();  // the query heads and the step's rows, before they are read
}

// Parts of an attention's softmax merged at head g, dim d: the largest of their maxima, and their
// sums and unnormalised outputs rescaled to it, in part order, skipping a part that saw no key (sum
// 0). The parts are a block's warps, or (with one head and one dim) a cluster's blocks.
struct Merged {
  float max, sum, out;
};
template <int kDim, int kGroup, int kParts>
__device__ __forceinline__ Merged MergeParts(const float (&part_out)[kParts][kGroup][kDim],
                                             const float (&part_max)[kParts][kGroup],
                                             const float (&part_sum)[kParts][kGroup], int g,
                                             int d) {
  float m = -FLT_MAX;
  for (int p = 0; p < kParts; ++p) m = fmaxf(m, part_max[p][g]);
  float sum = 0.0f, o = 0.0f;
  for (int p = 0; p < kParts; ++p) {
    if (part_sum[p][g] == 0.0f) continue;
    const float scale = expf(part_max[p][g] - m);
    sum += part_sum[p][g] * scale;
    o += part_out[p][g][d] * scale;
  }
  return {m, sum, o};
}

// The end of a decode attention block: the warps' unnormalised outputs warp_out [w][g][d], maxima
// and sums merged in warp order, then written normalised (one split) or as the split's partial
// results, the last split of the (row, head group) to finish merging the splits in split order.
template <typename T, int kDim, int kGroup, int kBlockWarps>
__device__ void MergeWarpsAndSplits(const float (&warp_out)[kBlockWarps][kGroup][kDim],
                                    const float (&warp_max)[kBlockWarps][kGroup],
                                    const float (&warp_sum)[kBlockWarps][kGroup], int64_t b,
                                    int64_t first_head, int split, int64_t pos,
                                    T* __restrict__ out, float* __restrict__ partial_out,
                                    float* __restrict__ partial_stats,
                                    const DecodeAttentionShape& p) {
  __shared__ bool merge;
  __syncthreads();
  // Merge the warps: thread i takes (g, d) = (i / kDim, i % kDim), and so on.
  for (int i = threadIdx.x; i < kGroup * kDim; i += blockDim.x) {
    const int g = i / kDim;
    const int d = i % kDim;
    const Merged warps =
        MergeParts<kDim, kGroup, kBlockWarps>(warp_out, warp_max, warp_sum, g, d);
    const int64_t row = b * p.q_heads + first_head + g;  // [B, Hq]
    if (p.splits == 1) {
      out[row * kDim + d] = FromFloat<T>(warps.out / warps.sum);
    } else {
      partial_out[(row * p.splits + split) * kDim + d] = warps.out;
      if (d == 0) {
        partial_stats[(row * p.splits + split) * 2] = warps.max;
        partial_stats[(row * p.splits + split) * 2 + 1] = warps.sum;
      }
    }
  }
  if (p.splits == 1) return;

  // The last split to finish merges (threadFenceReduction in CUDA's samples).
  const int64_t used = pos / p.chunk + 1 < p.splits ? pos / p.chunk + 1 : p.splits;
  __threadfence();  // this block's partial results are visible before it counts itself
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int* counter = &g_split_counters[b * gridDim.y + blockIdx.y];
    merge = atomicAdd(counter, 1u) + 1 == static_cast<unsigned int>(used);
    if (merge) *counter = 0;
  }
  __syncthreads();
  if (!merge) return;
  __threadfence();
  for (int i = threadIdx.x; i < kGroup * kDim; i += blockDim.x) {
    const int g = i / kDim;
    const int d = i % kDim;
    const int64_t row = b * p.q_heads + first_head + g;
    const float* stats = partial_stats + row * p.splits * 2;
    float m = -FLT_MAX;
    for (int64_t s = 0; s < used; ++s) m = fmaxf(m, __ldcg(stats + 2 * s));
    float sum = 0.0f, o = 0.0f;
    for (int64_t s = 0; s < used; ++s) {
      const float scale = expf(__ldcg(stats + 2 * s) - m);
      sum += __ldcg(stats + 2 * s + 1) * scale;
      o += __ldcg(partial_out + (row * p.splits + s) * kDim + d) * scale;
    }
    out[row * kDim + d] = FromFloat<T>(o / sum);
  }
}

// Block (split, head group, row): kGroup query heads that share one key/value head, against keys
// [split * chunk, min(split * chunk + chunk, position + 1)). Warp w takes keys
// begin + w * kKeysPerIteration + i * kDecodeWarps * kKeysPerIteration, each with an online
// softmax, their keys and values copied kStages - 1 iterations ahead into a ring of the warp's in
// shared memory; the warps are merged in shared memory. Lane l holds dims [l kVec, l kVec + kVec).
// With one split the block writes the normalised output. With more, it writes its unnormalised
// output, max and sum, and the last split of its (row, head group) to finish merges the splits
// in split order (so the result does not depend on which is last). A split past the position
// does nothing.
// With kPrep (kGroup the query heads of a key/value head, so a block is the only one of its split
// to read that head), the block first computes what DecodeQkvPrepKernel would, from `prep`: its
// query heads into shared memory (q is not read), and, in the split that holds the position, the
// key and value heads of the step, which it writes to the caches and puts into its ring itself
// (Note [The step's key and value in the ring]).
template <typename T, int kVec, int kGroup, bool kPrep>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    DecodeAttentionKernel(const T* __restrict__ q, QkvPrepInputs prep, T* k, T* v,
                          const int64_t* __restrict__ position, T* __restrict__ out,
                          float* __restrict__ partial_out, float* __restrict__ partial_stats,
                          DecodeAttentionShape p) {
  constexpr int kDim = 32 * kVec;
  __shared__ __align__(16) T prepared_q[kPrep ? kGroup : 1][kDim];
  __shared__ __align__(16) T step_rows[kPrep ? 2 : 1][kDim];
  __shared__ float normed[kPrep ? kDecodeWarps : 1][kMaxHeadDim];
  __shared__ float warp_out[kDecodeWarps][kGroup][kDim];
  __shared__ float warp_max[kDecodeWarps][kGroup];
  __shared__ float warp_sum[kDecodeWarps][kGroup];
  if constexpr (!kPrep) PrecedingKernelsDone();  // with kPrep: in StartRing
  const int split = blockIdx.x;
  const int64_t first_head = blockIdx.y * static_cast<int64_t>(kGroup);  // query heads
  const int64_t kv_head = first_head / (p.q_heads / p.kv_heads);
  const int64_t b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t begin = split * p.chunk;
  const int64_t chunk_end = begin + p.chunk < p.key_length ? begin + p.chunk : p.key_length;
  const int64_t pos = position[b * p.position_stride];
  const int64_t end = chunk_end < pos + 1 ? chunk_end : pos + 1;  // past the block's keys
  const int64_t copy_end = kPrep && pos < end ? pos : end;        // past the rows its copies read
  constexpr int64_t kStride = kDecodeWarps * kKeysPerIteration;
  const T* k_base = k + b * p.k_stride_b + kv_head * p.k_stride_h + lane * kVec;
  const T* v_base = v + b * p.v_stride_b + kv_head * p.v_stride_h + lane * kVec;
  // The warp's ring [kStages][keys, values][kKeysPerIteration][kDim]; a lane copies and reads only
  // its own kVec dims of each.
  extern __shared__ __align__(16) unsigned char ring_bytes[];
  T* ring = reinterpret_cast<T*>(ring_bytes) + warp * (kStages * 2 * kKeysPerIteration * kDim) +
            lane * kVec;
  const auto slot = [&](int stage, int values, int u) {
    return ring + ((stage * 2 + values) * kKeysPerIteration + u) * kDim;
  };
  // The keys [t0, t0 + kKeysPerIteration) of an iteration into `stage`, those before copy_end
  // (the ones past the position get no weight).
  const auto copy = [&](int64_t t0, int stage) {
#pragma unroll
    for (int u = 0; u < kKeysPerIteration; ++u) {
      if (t0 + u >= copy_end) break;
      CopyAsync<kVec * sizeof(T)>(slot(stage, 0, u), k_base + (t0 + u) * p.k_stride_t);
      CopyAsync<kVec * sizeof(T)>(slot(stage, 1, u), v_base + (t0 + u) * p.v_stride_t);
    }
  };
  const int64_t first = begin + warp * kKeysPerIteration;
  int64_t t0 = first;
  if constexpr (kPrep) {
    const auto prepare = [&](const auto& fill) {
      PrepareHeads<T, kDim, kGroup, kDecodeWarps>(prep, k, v, b, first_head, kv_head, pos,
                                                  pos < chunk_end, prepared_q, step_rows, normed,
                                                  fill);
    };
    if (!StartRing<kStages, false>(begin, t0, kStride, copy_end, pos, copy, prepare, [] {})) {
      return;
    }
  } else {
    FillRing<kStages, false>(t0, kStride, copy_end, copy);
  }
  float query[kGroup][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    LoadRow<T, kVec>(kPrep ? prepared_q[g] + lane * kVec
                           : q + ((b * p.q_heads + first_head + g) * kDim + lane * kVec),
                     query[g]);
  }
  float running_max[kGroup], running_sum[kGroup], acc[kGroup][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    running_max[g] = -FLT_MAX;
    running_sum[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[g][e] = 0.0f;
  }
  for (int stage = 0; t0 < end; t0 += kStride, stage = stage + 1 == kStages ? 0 : stage + 1) {
    AdvanceRing<kStages, false>(t0, first, kStride, end, stage, copy);
    if (kPrep && t0 <= pos && pos < t0 + kKeysPerIteration) {  // the step's rows, this lane's dims
#pragma unroll
      for (int values = 0; values < 2; ++values) {
        *reinterpret_cast<Pack<T, kVec>*>(slot(stage, values, pos - t0)) =
            LoadPack<T, kVec>(step_rows[values] + lane * kVec);
      }
    }
    float key[kKeysPerIteration][kVec], value[kKeysPerIteration][kVec];
#pragma unroll
    for (int u = 0; u < kKeysPerIteration; ++u) {
      LoadRow<T, kVec>(slot(stage, 0, u), key[u]);
      LoadRow<T, kVec>(slot(stage, 1, u), value[u]);
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float scores[kKeysPerIteration];
      float step_max = running_max[g];
#pragma unroll
      for (int u = 0; u < kKeysPerIteration; ++u) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot += query[g][e] * key[u][e];
        dot = WarpSum(dot);
        scores[u] = t0 + u < end ? dot * p.scale : -FLT_MAX;
        step_max = fmaxf(step_max, scores[u]);
      }
      const float correction = expf(running_max[g] - step_max);
      running_sum[g] *= correction;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[g][e] *= correction;
#pragma unroll
      for (int u = 0; u < kKeysPerIteration; ++u) {
        if (t0 + u >= end) break;  // a key past the position (whose value may be anything)
        const float weight = expf(scores[u] - step_max);
        running_sum[g] += weight;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][e] += weight * value[u][e];
      }
      running_max[g] = step_max;
    }
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy in flight at the exit
  if (begin > pos) return;  // a split past the position: no part in the merge
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) warp_out[warp][g][lane * kVec + e] = acc[g][e];
    if (lane == 0) {
      warp_max[warp][g] = running_max[g];
      warp_sum[warp][g] = running_sum[g];
    }
  }
  MergeWarpsAndSplits<T, kDim, kGroup, kDecodeWarps>(warp_out, warp_max, warp_sum, b, first_head,
                                                    split, pos, out, partial_out, partial_stats,
                                                    p);
}

// Note [Tensor-core decode attention]
// DecodeAttentionKernel sums each key's dot product with each query head by a 5-step butterfly
// over the warp: with 8 query heads per key/value head those shuffles bound it (37 us at batch 64
// where SDPA took 24: tools/bench/fused_kernels_bench). For bf16 caches this kernel puts both
// products on the tensor cores instead (m16n8k16 mma, fp32 sums): 9.8 us there. (With 2 query
// heads per key/value head both kernels read the cache at about 2.4 TB/s.) The block is the same
// (split, head group, row) with kMmaWarps warps; warp w takes the tiles of 16 keys
// begin + 16 (w + kMmaWarps j), copied into a ring of kMmaStages tiles in shared memory by
// cp.async. Per tile:
//   S^T [16 keys, 8 heads] = K Q^T: K from the ring (ldmatrix), the query heads (padded with
//     zeros to 8) held in registers;
//   an online softmax per head: the tile's maximum over its 16 keys takes 3 shuffles; keys past
//     the position get weight 0 (their cached values may be anything, so their rows of V are
//     zeroed in the ring first);
//   O^T [dim, 8 heads] += V^T P^T: V from the ring (ldmatrix .trans), P^T through shared memory
//     as two bf16 parts, the rounded weights and the rest, each an mma: the fp32 weights to about
//     16 bits, at no measured cost (one part, as flash attention rounds P, gave the dense model's
//     train/rollout log-prob mismatch on the H200 within run-to-run noise of this).
// The warps and splits are merged as in DecodeAttentionKernel (MergeWarpsAndSplits), in a fixed
// order: graphs and eager steps give the same bits.
constexpr int kMmaWarps = 4;
constexpr int kTileKeys = 16;
constexpr int kMmaStages = 2;
// Note [Deep ring for a small grid]
// With kMmaStages a warp has one tile in flight while it computes another: at batch 64 (512
// blocks, several an SM) deeper rings were slower, and so was copying both stages before the
// preparation (docs/decode-performance.md). A grid of a few blocks (a step of 1 to 4 rows of
// Qwen3-0.6B's shape: 8 to 32) leaves the device's bandwidth to them, and a warp's 2 to 4 tiles of
// a split of 256 keys would each wait a memory round trip (at batch 16, 128 blocks, one an SM, a
// ring of 4 was slower). Where the grid has at most a kMmaDeepGridShare-th as many blocks as the
// device has SMs, a block has kMmaDeepWarps warps with rings of kMmaDeepStages tiles, all copied
// up front (kFillAll): a split of up to 256 keys is in flight at once, before the wait, and each
// warp sums at most two of its tiles (4 warps of 4 tiles each were about 2% slower at batch 1).
// The form needs its ring within kMmaDeepMaxBytes and its static arrays within 48 KiB: heads of up
// to 128 dims, and up to 4 query heads of 128 dims per block. The warps take other keys than in
// the shallow form, so the sums' order and the bits differ between the two forms (a decode step of
// a given batch always takes the same one).
constexpr int kMmaDeepWarps = 8;
constexpr int kMmaDeepStages = 2;
constexpr int kMmaDeepGridShare = 4;
constexpr int kMmaDeepMaxBytes = 160 * 1024;
constexpr int kRowPad = 8;  // elements after a staged key row: ldmatrix's 8 rows, 8 bank groups
// Note [One tile a warp for a grid of more than a wave]
// A block of the shallow form takes about 81 KiB of shared memory (its rings, static arrays and the
// 1 KiB an SM reserves a block), so two fit an SM, and from 34 rows of Qwen3-0.6B's shape (8 head
// groups: 272 blocks, against 264 places on 132 SMs) the grid runs in two waves. Each block pays a
// fixed cost besides its keys (the position, the preparation of its heads, the merge: about half of
// a block at batch 64, docs/decode-performance.md, "Where a batch-64 attention's time goes"), and
// the second wave pays it again while little of the cache streams. Where a ring of one tile a warp
// (kSplitTile: the same 4 warps and the same keys each, so the same sums and bits, in 46 KiB a
// block) runs the grid in fewer waves, the blocks take it: by the occupancy query four fit an SM
// against two, so 64 rows run in one wave. (Three an SM, as heads of 128 dims in groups of 8 would
// take, still make two waves of 512 blocks, and were slower: docs/decode-performance.md.) A warp
// then waits for each tile's copies; to keep some of them in flight meanwhile, the tile's keys and
// values are copied as two groups: the next tile's keys once the scores are summed, its values once
// the values are, so that each waits behind the other half's arithmetic. On an H100
// (`decode_ab.sh`, Qwen3-0.6B shape, prompt 128, 128 new tokens; the same bits in every run) a
// batch-64 step took 1.672 against 1.729 ms (1.034x) and a batch-40 step 1.497 against 1.583 ms
// (1.057x); in an earlier call the attention took 22.3 against 24.5 us a layer (`decode_bench
// --profile`), one tile a warp copied as one group gave 1.020x at batch 64, and the form at batch
// 16, where the shallow form runs in one wave, 0.962x. The form was measured with the whole
// carveout preferred as shared memory (as it is launched); without it, the form copied as one group
// was as fast.

// Note [The o projection in the attention's clusters]
// At one row the o projection, a kernel of its own between the attention and the gate/up
// projection, cost 4.7 us of a 25.6 us layer of Qwen3-0.6B's shape on an H100, though it reads
// 4 MB (docs/decode-performance.md, "What the o projection costs at one row, by ablation"): its
// place in the chain, not its reads. So DecodeQkvAttentionO folds it into the attention: the keys
// of a (row, key/value head) are split over a cluster of R blocks (R = the attention's splits),
// each of which copies, before its wait, the o projection's weights of a 1/R slice of the output
// features over the head group's kGroup * kDim input columns into shared memory. Once its keys are
// summed (its warps merged as in MergeWarpsAndSplits), each block reads the R blocks' maxima,
// sums and unnormalised outputs from their shared memory, merges them in rank order (every block
// alike, so all hold the same head output, rounded to bf16 as the attention's output is), and
// sums its features' products with that output, a thread per feature in the order of the columns.
// It writes fp32 partial sums [kv_heads, batch, hidden]: the o projection of one head group each,
// which the gate/up projection's staging adds in head order and rounds (SmallLinearAddRmsNorm with
// partials) before the residual add. A split past the position has no keys but still sums its
// slice. So the attention's output never goes to memory, and the kernel behind is the gate/up
// projection. The sums are the o projection's in another order (by head group, then added), so
// the bits differ from the unfolded kernels by rounding; graphs and eager steps run the same
// kernels and stay equal. On H100s (Qwen3-0.6B's shape, `decode_ab.sh`) a batch-1 step was
// 1.020x, 1.021x and 1.026x faster (1.109x with a 1900-token prompt, within the noise with 1024);
// the attention then ends 1.05 us later a layer, about half of what the o kernel took
// (docs/decode-performance.md, "The o projection in the attention's clusters"). At two rows, a
// slice copied per row, it was 0.854x, so only one row folds; clusters of 4 blocks (twice the
// slice a block) were 0.950x, blocks of 2 warps 0.874x, of 8 no faster. Up to kAttentionOMaxKeys
// keys, where DecodeQkvAttention splits the keys no more finely.
template <int kGroup, int kDim>
struct ClusterMerge {
  float out[kGroup][kDim];
  float max[kGroup];
  float sum[kGroup];
  alignas(16) __nv_bfloat16 head[kGroup * kDim];
};

// The o projection's row stride in shared memory: a slice's rows padded by 16 bytes, so that the 8
// threads of a quarter warp read 16-byte pieces of 8 rows from 8 different bank groups.
constexpr int64_t ORowElements(int64_t group, int64_t dim) { return group * dim + 8; }
template <int kGroup, int kDim>
constexpr int kORow = ORowElements(kGroup, kDim);

// The end of a DecodeQkvAttentionO block (Note [The o projection in the attention's clusters]):
// the warps merged into `merge`, the cluster's blocks merged into merge.head, then this block's
// slice of the o projection (`o_weights` [features][kORow], copied at the start) into
// o.partials[kv_head, b, rank * features + f].
template <int kDim, int kGroup, int kBlockWarps>
__device__ void MergeClusterAndProject(const float (&warp_out)[kBlockWarps][kGroup][kDim],
                                       const float (&warp_max)[kBlockWarps][kGroup],
                                       const float (&warp_sum)[kBlockWarps][kGroup],
                                       ClusterMerge<kGroup, kDim>& merge,
                                       const __nv_bfloat16* o_weights, const OProjection& o,
                                       int64_t features, int64_t kv_head, int64_t b) {
  namespace cg = cooperative_groups;
  __syncthreads();
  for (int i = threadIdx.x; i < kGroup * kDim; i += blockDim.x) {
    const int g = i / kDim;
    const int d = i % kDim;
    const Merged warps = MergeParts<kDim, kGroup, kBlockWarps>(warp_out, warp_max, warp_sum, g, d);
    merge.out[g][d] = warps.out;
    if (d == 0) {
      merge.max[g] = warps.max;
      merge.sum[g] = warps.sum;
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's merge.out, max and sum are written
  constexpr int kRanks = kAttentionOCluster;
  for (int i = threadIdx.x; i < kGroup * kDim; i += blockDim.x) {
    const int g = i / kDim;
    const int d = i % kDim;
    // Every block's numbers loaded first, so that the remote loads go out at once.
    float block_max[kRanks][1], block_sum[kRanks][1], block_out[kRanks][1][1];
#pragma unroll
    for (int r = 0; r < kRanks; ++r) {
      block_max[r][0] = *cluster.map_shared_rank(&merge.max[g], r);
      block_sum[r][0] = *cluster.map_shared_rank(&merge.sum[g], r);
      block_out[r][0][0] = *cluster.map_shared_rank(&merge.out[g][d], r);
    }
    const Merged blocks = MergeParts<1, 1, kRanks>(block_out, block_max, block_sum, 0, 0);
    merge.head[i] = FromFloat<__nv_bfloat16>(blocks.out / blocks.sum);
  }
  // This block has read the others; they may leave once every block has (the wait at the end).
  cg::cluster_group::arrival_token read_all = cluster.barrier_arrive();
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // this thread's copies of the slice
  __syncthreads();  // every thread's copies, and merge.head
  // A thread per feature: the products of each of a vector's 8 columns summed apart (8 chains of
  // fma a quarter as long as one), then the 8 sums added in order.
  constexpr int kVec = 8;
  constexpr int kIn = kGroup * kDim;
  const int64_t first = static_cast<int64_t>(cluster.block_rank()) * features;
  for (int64_t f = threadIdx.x; f < features; f += blockDim.x) {
    const __nv_bfloat16* row = o_weights + f * kORow<kGroup, kDim>;
    float acc[kVec] = {};
#pragma unroll 4
    for (int kk = 0; kk < kIn; kk += kVec) {
      const Pack<__nv_bfloat16, kVec> w = LoadPack<__nv_bfloat16, kVec>(row + kk);
      const Pack<__nv_bfloat16, kVec> x = LoadPack<__nv_bfloat16, kVec>(merge.head + kk);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] += ToFloat(w.v[e]) * ToFloat(x.v[e]);
    }
    float total = acc[0];
#pragma unroll
    for (int e = 1; e < kVec; ++e) total += acc[e];
    o.partials[(kv_head * o.batch + b) * o.hidden + first + f] = total;
  }
  cluster.barrier_wait(std::move(read_all));
}

// The tensor-core kernel's static shared memory, one struct so that its launch can check the size
// of each form (at most 48 KiB).
template <int kDim, int kGroup, bool kPrep, int kBlockWarps>
struct MmaAttentionShared {
  alignas(16) __nv_bfloat16 prepared_q[kPrep ? kGroup : 1][kDim];
  alignas(16) __nv_bfloat16 step_rows[kPrep ? 2 : 1][kDim];
  float normed[kPrep ? kBlockWarps : 1][kMaxHeadDim];
  // P [high, low part][head][key], padded.
  alignas(16) __nv_bfloat16 weights[kBlockWarps][2][8][kTileKeys + 8];
  float warp_out[kBlockWarps][kGroup][kDim];
  float warp_max[kBlockWarps][kGroup];
  float warp_sum[kBlockWarps][kGroup];
};

template <int kDim, int kGroup, bool kPrep, int kBlockWarps, int kRing, bool kFillAll,
          bool kOSlice, bool kSplitTile>
__global__ void __launch_bounds__(kBlockWarps * 32)
    DecodeAttentionMmaKernel(const __nv_bfloat16* __restrict__ q, QkvPrepInputs prep,
                             __nv_bfloat16* k, __nv_bfloat16* v,
                             const int64_t* __restrict__ position, __nv_bfloat16* __restrict__ out,
                             float* __restrict__ partial_out, float* __restrict__ partial_stats,
                             DecodeAttentionShape p, OProjection o) {
  static_assert(!kOSlice || kPrep, "the o projection is folded into DecodeQkvAttention only");
  static_assert(!kSplitTile || (kRing == 1 && kFillAll && !kOSlice),
                "a split tile is a ring of one tile, filled before the wait");
  using T = __nv_bfloat16;
  constexpr int kRow = kDim + kRowPad;             // a staged key row, elements
  constexpr int kTile = kTileKeys * kRow;          // a staged tile of K or V
  constexpr int kSteps = kDim / 16;                // k16 steps over the dims; also dim tiles
  constexpr int kPieces = kTileKeys * kDim / 8;    // 16-byte pieces of a tile
  __shared__ MmaAttentionShared<kDim, kGroup, kPrep, kBlockWarps> shared;
  auto& prepared_q = shared.prepared_q;
  auto& step_rows = shared.step_rows;
  auto& normed = shared.normed;
  auto& weights = shared.weights;
  auto& warp_out = shared.warp_out;
  auto& warp_max = shared.warp_max;
  auto& warp_sum = shared.warp_sum;
  extern __shared__ __align__(16) unsigned char ring_bytes[];
  if constexpr (!kPrep) PrecedingKernelsDone();  // with kPrep: in StartRing
  const int split = blockIdx.x;
  const int64_t first_head = blockIdx.y * static_cast<int64_t>(kGroup);
  const int64_t kv_head = first_head / (p.q_heads / p.kv_heads);
  const int64_t b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int64_t begin = split * p.chunk;
  const int64_t chunk_end = begin + p.chunk < p.key_length ? begin + p.chunk : p.key_length;
  const int64_t pos = position[b * p.position_stride];
  const int64_t end = chunk_end < pos + 1 ? chunk_end : pos + 1;  // past the block's keys
  const int64_t copy_end = kPrep && pos < end ? pos : end;        // past the rows its copies read
  // The warp's ring [kRing][K, V][kTileKeys][kRow].
  T* ring = reinterpret_cast<T*>(ring_bytes) + warp * (kRing * 2 * kTile);
  const T* k_base = k + b * p.k_stride_b + kv_head * p.k_stride_h;
  const T* v_base = v + b * p.v_stride_b + kv_head * p.v_stride_h;
  constexpr int64_t kStride = kBlockWarps * kTileKeys;
  // The tile at t0 into `stage`, its rows before copy_end: its keys, its values or both (a row
  // piece's two copies issued together).
  const auto copy_parts = [&](int64_t t0, int stage, bool keys, bool values) {
    T* to = ring + stage * 2 * kTile;
#pragma unroll
    for (int i = lane; i < kPieces; i += 32) {
      const int key = i / (kDim / 8);
      const int col = i % (kDim / 8) * 8;
      if (t0 + key >= copy_end) break;
      if (keys) CopyAsync<16>(to + key * kRow + col, k_base + (t0 + key) * p.k_stride_t + col);
      if (values) {
        CopyAsync<16>(to + kTile + key * kRow + col, v_base + (t0 + key) * p.v_stride_t + col);
      }
    }
  };
  // The whole tile at t0 into `stage`. With kSplitTile the keys are a group of their own (the
  // caller commits the values').
  const auto copy = [&](int64_t t0, int stage) {
    if constexpr (kSplitTile) {
      copy_parts(t0, stage, true, false);
      CommitCopies();
      copy_parts(t0, stage, false, true);
    } else {
      copy_parts(t0, stage, true, true);
    }
  };
  // With kOSlice: this block's slice of the o projection, `features` rows of the head group's
  // columns, after the ring (Note [The o projection in the attention's clusters]).
  T* o_weights = reinterpret_cast<T*>(ring_bytes) + kBlockWarps * (kRing * 2 * kTile);
  const int64_t features = kOSlice ? o.hidden / gridDim.x : 0;
  const auto copy_o_weights = [&] {
    if constexpr (kOSlice) {
      constexpr int kIn = kGroup * kDim;
      const T* from = static_cast<const T*>(o.w) + split * features * (p.q_heads * kDim) +
                      kv_head * kIn;
      for (int64_t i = threadIdx.x; i < features * (kIn / 8); i += blockDim.x) {
        const int64_t f = i / (kIn / 8);
        const int col = static_cast<int>(i % (kIn / 8)) * 8;
        CopyAsync<16, true>(o_weights + f * kORow<kGroup, kDim> + col,
                            from + f * (p.q_heads * kDim) + col);
      }
      CommitCopies();
    }
  };
  const int64_t first = begin + warp * kTileKeys;
  int64_t t0 = first;
  if constexpr (kPrep) {
    const auto prepare = [&](const auto& fill) {
      PrepareHeads<T, kDim, kGroup, kBlockWarps>(prep, k, v, b, first_head, kv_head, pos,
                                                 pos < chunk_end, prepared_q, step_rows, normed,
                                                 fill);
    };
    const bool has_keys = StartRing<kRing, kFillAll>(begin, t0, kStride, copy_end, pos, copy,
                                                     prepare, copy_o_weights);
    if (!kOSlice && !has_keys) return;  // with kOSlice it still sums its slice
  } else {
    FillRing<kRing, kFillAll>(t0, kStride, copy_end, copy);
  }
  // Q^T as the B operand of S^T = K Q^T, per k16 step over the dims: column g is head g (zero
  // past the group), rows 2t, 2t + 1 and 2t + 8, 2t + 9 are its dims.
  uint32_t query[kSteps][2];
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    query[step][0] = query[step][1] = 0;
    if (g < kGroup) {
      const T* row = kPrep ? prepared_q[g]
                           : q + (b * p.q_heads + first_head + g) * kDim;
      query[step][0] = *reinterpret_cast<const uint32_t*>(row + 16 * step + 2 * t);
      query[step][1] = *reinterpret_cast<const uint32_t*>(row + 16 * step + 2 * t + 8);
    }
  }
  // Heads 2t and 2t + 1 of this lane: running maxima and sums (of its keys g, g + 8 of each
  // tile), and O^T's dims 16 i + g, 16 i + g + 8.
  float running_max[2] = {-FLT_MAX, -FLT_MAX};
  float running_sum[2] = {0.0f, 0.0f};
  float acc[kSteps][4];
#pragma unroll
  for (int i = 0; i < kSteps; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  for (int stage = 0; t0 < end; t0 += kStride, stage = stage + 1 == kRing ? 0 : stage + 1) {
    // With kSplitTile the groups in flight are this tile's keys and values (Note [One tile a warp
    // for a grid of more than a wave]; a warp whose first tile starts at the position has one
    // empty group, and copies nothing later): wait for the keys.
    if constexpr (kSplitTile) {
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
      AdvanceRing<kRing, kFillAll>(t0, first, kStride, end, stage, copy);
    }
    T* keys = ring + stage * 2 * kTile;
    T* values = ring + stage * 2 * kTile + kTile;
    const int valid = end - t0 < kTileKeys ? static_cast<int>(end - t0) : kTileKeys;
    // The tile's keys (kKeys), values (kValues) or both completed, once this lane's copies of them
    // have landed: the step's rows put in (16 bytes a lane) and every lane's copies waited for;
    // the values' rows past the position zeroed, so that 0 weight gives 0.
    enum Part { kKeys = 1, kValues = 2, kBoth = 3 };
    const auto complete = [&](Part part) {
      if (kPrep && t0 <= pos && pos < t0 + kTileKeys) {
        const int from = (part & kKeys) != 0 ? 0 : kDim / 8;
        const int to = (part & kValues) != 0 ? 2 * (kDim / 8) : kDim / 8;
        for (int i = from + lane; i < to; i += 32) {
          const int col = i % (kDim / 8) * 8;
          *reinterpret_cast<uint4*>((i < kDim / 8 ? keys : values) + (pos - t0) * kRow + col) =
              *reinterpret_cast<const uint4*>(step_rows[i / (kDim / 8)] + col);
        }
      }
      __syncwarp();  // every lane's copies and the step's rows are in the tile
      if ((part & kValues) != 0 && valid < kTileKeys) {
        for (int i = valid * (kDim / 8) + lane; i < kPieces; i += 32) {
          *reinterpret_cast<uint4*>(values + i / (kDim / 8) * kRow + i % (kDim / 8) * 8) =
              make_uint4(0, 0, 0, 0);
        }
        __syncwarp();
      }
    };
    complete(kSplitTile ? kKeys : kBoth);
    // S^T = K Q^T: ldmatrix row addresses, lane l -> matrix l / 8, row l % 8: keys (l % 8) +
    // 8 (matrix & 1), dims 8 (matrix >> 1) of the step.
    float scores[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int matrix = lane / 8;
    const T* k_row = keys + (lane % 8 + 8 * (matrix & 1)) * kRow + 8 * (matrix >> 1);
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      uint32_t a[4];
      LoadMatrices(a, k_row + 16 * step, false);
      Mma16816(scores, a, query[step][0], query[step][1]);
    }
    if constexpr (kSplitTile) {  // the next tile's keys, in flight behind the values' arithmetic
      __syncwarp();  // every lane has read the keys
      copy_parts(t0 + kStride, stage, true, false);
      CommitCopies();
    }
    // scores: (key g, head 2t), (key g, head 2t + 1), (key g + 8, head 2t), (key g + 8, 2t + 1).
    float weight[4];
    float correction[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float s0 = g < valid ? scores[h] * p.scale : -FLT_MAX;
      const float s1 = g + 8 < valid ? scores[2 + h] * p.scale : -FLT_MAX;
      float tile_max = fmaxf(s0, s1);
      for (int offset = 4; offset < 32; offset *= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, offset));
      }
      const float next_max = fmaxf(running_max[h], tile_max);
      correction[h] = expf(running_max[h] - next_max);
      running_max[h] = next_max;
      weight[h] = g < valid ? expf(s0 - next_max) : 0.0f;
      weight[2 + h] = g + 8 < valid ? expf(s1 - next_max) : 0.0f;
      running_sum[h] = running_sum[h] * correction[h] + (weight[h] + weight[2 + h]);
    }
    // P [head][key] for the B operand of V^T P^T, as the sum of two bf16 parts (the rounded
    // weight and what rounding left), so that the weights keep about 16 bits.
    const int heads[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    const int key_of[4] = {g, g, g + 8, g + 8};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const T high = FromFloat<T>(weight[e]);
      weights[warp][0][heads[e]][key_of[e]] = high;
      weights[warp][1][heads[e]][key_of[e]] = FromFloat<T>(weight[e] - ToFloat(high));
    }
    __syncwarp();
    uint32_t pb[4];  // the high part's two B registers, then the low part's
    {
      // ldmatrix .x4: lanes 8m to 8m + 7 address heads 0-7 of part m / 2 at keys 8 (m % 2) on.
      const T* p_row = &weights[warp][lane / 16][lane % 8][8 * ((lane / 8) & 1)];
      LoadMatrices(pb, p_row, false);
    }
    if constexpr (kSplitTile) {  // wait for this tile's values (the next keys may be in flight)
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      complete(kValues);
    }
    // O^T += V^T P^T: ldmatrix .trans, lane l -> matrix l / 8, row l % 8: keys (l % 8) +
    // 8 (matrix >> 1), dims 8 (matrix & 1) of the dim tile.
    const T* v_row = values + (lane % 8 + 8 * (matrix >> 1)) * kRow + 8 * (matrix & 1);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      acc[i][0] *= correction[0];
      acc[i][1] *= correction[1];
      acc[i][2] *= correction[0];
      acc[i][3] *= correction[1];
      uint32_t a[4];
      LoadMatrices(a, v_row + 16 * i, true);
      Mma16816(acc[i], a, pb[0], pb[1]);
      Mma16816(acc[i], a, pb[2], pb[3]);
    }
    __syncwarp();  // the ring stage and P are rewritten next
    if constexpr (kSplitTile) {  // the next tile's values
      copy_parts(t0 + kStride, stage, false, true);
      CommitCopies();
    }
  }
  if constexpr (!kOSlice) {
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy in flight at the exit
    if (begin > pos) return;  // a split past the position: no part in the merge
  }
  // The sums over the warp's keys: add the 8 lanes g of each t.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    for (int offset = 4; offset < 32; offset *= 2) {
      running_sum[h] += __shfl_xor_sync(0xffffffff, running_sum[h], offset);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = 2 * t + h;
    if (head >= kGroup) continue;
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      warp_out[warp][head][16 * i + g] = acc[i][h];
      warp_out[warp][head][16 * i + g + 8] = acc[i][2 + h];
    }
    if (g == 0) {
      warp_max[warp][head] = running_max[h];
      warp_sum[warp][head] = running_sum[h];
    }
  }
  if constexpr (kOSlice) {
    // The block's keys merged (read by the cluster's other blocks), and the head group's output.
    __shared__ ClusterMerge<kGroup, kDim> merge;
    MergeClusterAndProject<kDim, kGroup, kBlockWarps>(warp_out, warp_max, warp_sum, merge,
                                                      o_weights, o, features, kv_head, b);
  } else {
    MergeWarpsAndSplits<T, kDim, kGroup, kBlockWarps>(warp_out, warp_max, warp_sum, b, first_head,
                                                      split, pos, out, partial_out, partial_stats,
                                                      p);
  }
}

// How SmallLinearKernel gets its input rows x [rows, k_in].
enum class SmallInput {
  kPlain,    // x itself (from global memory, or staged where SharedWeightLinearKernel has room)
  kAddNorm,  // RmsNorm(x + add) (or of x, without add), staged in shared memory
  // RmsNorm(x + add), add given as fp32 partial sums [slices, rows, k_in] added in slice order and
  // rounded (DecodeQkvAttentionO's, Note [The o projection in the attention's clusters]), as
  // AddPartialsRmsNorm adds SplitKPartials's; staged in shared memory
  kAddPartialsNorm,
  kSiluMul,  // silu(gate) * up of x [rows, 2 k_in], staged in shared memory
};

// The forms whose staging ends in an RmsNorm (and so copy the norm's weight with the weights).
constexpr bool NormsInput(SmallInput mode) {
  return mode == SmallInput::kAddNorm || mode == SmallInput::kAddPartialsNorm;
}

// The staged inputs of SmallLinearKernel, computed by the whole block into `staged` [rows, k_in]
// (x's dtype) with the roundings of RmsNormKernel (the same loop and BlockSum, kThreads threads)
// and SiluMulKernel, or (kPlain) x itself. Block 0 writes x + add to `sum`. The plain and SiluMul
// inputs go by 16-byte vectors over all rows at once (SiluMul's where x is aligned to them), each
// thread's loaded before it uses the first, so that the staging costs about one memory round trip
// (elementwise with kLoadsAhead, three for Qwen3-0.6B's down projection).
// kAddPartialsNorm reads `partials` and `slices` in place of add.
template <typename T, SmallInput kMode>
__device__ void StageInput(const T* __restrict__ x, const T* __restrict__ add,
                           const float* __restrict__ partials, int slices,
                           const T* __restrict__ norm_weight, float eps, T* __restrict__ sum,
                           T* staged, int64_t rows, int64_t k_in) {
  constexpr int kVec = 16 / sizeof(T);
  using Vector = Pack<T, kVec>;
  const int64_t row_vectors = k_in / kVec;  // k_in is a multiple of kVec (the dispatch checks)
  if constexpr (kMode == SmallInput::kPlain) {
    ForEachLoadedAhead(
        rows * row_vectors, [&](int64_t i) { return LoadPack<T, kVec>(x + i * kVec); },
        [&](int64_t i, const Vector& v) { *reinterpret_cast<Vector*>(staged + i * kVec) = v; });
  } else if (kMode == SmallInput::kSiluMul && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    struct GateUp {
      Vector gate, up;
    };
    // Vector i's gate elements; its up elements are k_in after them.
    const auto gate = [&](int64_t i) {
      return x + (i / row_vectors) * 2 * k_in + i % row_vectors * kVec;
    };
    ForEachLoadedAhead(
        rows * row_vectors,
        [&](int64_t i) {
          return GateUp{LoadPack<T, kVec>(gate(i)), LoadPack<T, kVec>(gate(i) + k_in)};
        },
        [&](int64_t i, const GateUp& gu) {
          Vector out;
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            out.v[e] = SiluTimes<T>(ToFloat(gu.gate.v[e]), ToFloat(gu.up.v[e]));
          }
          *reinterpret_cast<Vector*>(staged + i * kVec) = out;
        });
  } else {
    if constexpr (kMode == SmallInput::kAddPartialsNorm) {
      // x + the partial sums into the staged rows, 4 elements of all rows a thread at a time:
      // every slice's 16 bytes loaded before the first add, so that it costs one memory round
      // trip (elementwise, each element's slices after the one before took four).
      constexpr int kEach = 4;
      for (int64_t e0 = threadIdx.x * kEach; e0 < rows * k_in; e0 += blockDim.x * kEach) {
        float4 part[kMaxOPartialSlices];
        T in[kEach];
#pragma unroll
        for (int s = 0; s < kMaxOPartialSlices; ++s) {
          if (s < slices) {
            part[s] = *reinterpret_cast<const float4*>(partials + s * rows * k_in + e0);
          }
        }
#pragma unroll
        for (int e = 0; e < kEach; ++e) in[e] = x[e0 + e];
#pragma unroll
        for (int e = 0; e < kEach; ++e) {
          const float total = SlicesSum<kMaxOPartialSlices>(
              [&](int s) { return reinterpret_cast<const float*>(&part[s])[e]; }, slices);
          staged[e0 + e] = AddRounded<T>(ToFloat(in[e]), ToFloat(FromFloat<T>(total)));
        }
      }
      __syncthreads();
    }
    __shared__ float scratch[kWarps];
    for (int64_t m = 0; m < rows; ++m) {
      T* row = staged + m * k_in;
      if constexpr (kMode == SmallInput::kSiluMul) {
        const T* gate = x + m * 2 * k_in;
        ForEachLoadedAhead(
            k_in, [&](int64_t i) { return make_float2(ToFloat(gate[i]), ToFloat(gate[k_in + i])); },
            [&](int64_t i, float2 gu) { row[i] = SiluTimes<T>(gu.x, gu.y); });
      } else {
        float inv;
        if constexpr (kMode == SmallInput::kAddPartialsNorm) {
          // The rows already hold x + add (above): the norm reads them there.
          inv = RowInverseRms(row, static_cast<const T*>(nullptr), k_in, eps, scratch,
                              [&](int64_t i, T v) {
                                if (blockIdx.x == 0) sum[m * k_in + i] = v;
                              });
        } else {
          inv = RowInverseRms(x + m * k_in, add != nullptr ? add + m * k_in : nullptr, k_in, eps,
                              scratch, [&](int64_t i, T v) {
                                if (add != nullptr && blockIdx.x == 0) sum[m * k_in + i] = v;
                                row[i] = v;
                              });
        }
        ForEachLoadedAhead(
            k_in, [&](int64_t i) { return make_float2(ToFloat(row[i]), ToFloat(norm_weight[i])); },
            [&](int64_t i, float2 vw) { row[i] = RmsNormed<T>(vw.x, inv, vw.y); });
      }
    }
  }
  __syncthreads();
}

// The two SmallLinear kernels' arithmetic, shared so that they give the same bits: acc[m] += the
// products of a lane's weight vector and input row m's, in element order (one fma each); and the
// end of a feature n: the lanes' sums added (WarpSum), the bias added, rounded once, written by
// lane 0 to y[m, n] for the rows there are.
template <typename T, int kRows, int kVec>
__device__ __forceinline__ void AddProducts(float (&acc)[kRows], const Pack<T, kVec>& w,
                                            const T* input, int64_t rows, int64_t k_in,
                                            int64_t kk) {
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    if (m >= rows) break;
    const Pack<T, kVec> in = LoadPack<T, kVec>(input + m * k_in + kk);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[m] += ToFloat(w.v[e]) * ToFloat(in.v[e]);
  }
}

template <typename T, int kRows>
__device__ __forceinline__ void StoreFeature(float (&acc)[kRows], const T* __restrict__ bias,
                                             T* __restrict__ y, int64_t rows, int64_t n_out,
                                             int64_t n) {
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[m] = WarpSum(acc[m]);
  if (threadIdx.x % 32 == 0) {
    const float b = bias != nullptr ? ToFloat(bias[n]) : 0.0f;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      if (m < rows) y[m * n_out + n] = FromFloat<T>(acc[m] + b);
    }
  }
}

// y [rows, n_out] = input [rows, k_in] w^T (+ bias) for rows <= kRows: a warp per output feature
// reads its weight row once in 16-byte vectors, kPacks per lane at once (the whole row where k_in
// <= 32 kVec kPacks), and every input row with it; fp32 sums in the order of k, one rounding. The
// input is x, or staged from x by the whole block (kMode) while the first kPacks vectors of every
// lane are in flight: the weights do not depend on the input, so a staged kernel waits for one
// memory round trip, not two.
template <typename T, int kRows, SmallInput kMode, int kPacks>
__global__ void __launch_bounds__(kThreads)
    SmallLinearKernel(const T* __restrict__ x, const T* __restrict__ add,
                      const float* __restrict__ partials, int slices,
                      const T* __restrict__ norm_weight, float eps, T* __restrict__ sum,
                      const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
                      int64_t rows, int64_t n_out, int64_t k_in) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int64_t kPass = 32 * kVec * kPacks;  // elements of a row per pass
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  const bool active = n < n_out;  // every warp stages; only those with a feature go on
  const T* w_row = w + (active ? n : 0) * k_in;
  Pack<T, kVec> weights[kPacks];
  // Lane l's vectors of the pass at k0: elements k0 + (l + 32 u) kVec, u < kPacks.
  const auto load = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < kPacks; ++u) {
      const int64_t kk = k0 + (lane + 32 * u) * kVec;
      if (active && kk < k_in) weights[u] = LoadPack<T, kVec>(w_row + kk);
    }
  };
  load(0);  // the weights: before the kernel ahead has finished, under programmatic launch
  PrecedingKernelsDone();
  const T* input = x;
  if constexpr (kMode != SmallInput::kPlain) {
    T* staged = reinterpret_cast<T*>(staged_bytes);
    StageInput<T, kMode>(x, add, partials, slices, norm_weight, eps, sum, staged, rows, k_in);
    input = staged;
  }
  if (!active) return;
  float acc[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[m] = 0.0f;
  for (int64_t k0 = 0; k0 < k_in; k0 += kPass) {
    if (k0 > 0) load(k0);
#pragma unroll
    for (int u = 0; u < kPacks; ++u) {
      const int64_t kk = k0 + (lane + 32 * u) * kVec;
      if (kk >= k_in) break;
      AddProducts(acc, weights[u], input, rows, k_in, kk);
    }
  }
  StoreFeature(acc, bias, y, rows, n_out, n);
}

// Note [Small linear with weights in shared memory]
// At one or two rows a decode step's projections are short kernels in a chain (147 in a step of
// Qwen3-0.6B), each of which loads its weights before it waits for the kernel ahead (Note
// [Programmatic dependent launch]). SmallLinearKernel holds them in registers: a warp per
// feature, which takes many blocks (512 for Qwen3-0.6B's q/k/v, 768 for its gate/up), and most of
// them find no room on an SM until the kernel ahead has left it, so their loads start only then.
// Where a block's share of the weights fits in shared memory (kPrefetchMaxSharedBytes with its
// staged input), this kernel takes one block per SM instead: block b copies the features [b F,
// (b + 1) F) (F = n_out / SMs, rounded up: one contiguous piece of w) into shared memory by
// cp.async before the wait, and the norm's weight in a group of its own, which the staging waits
// for alone. Two such blocks fit an SM, so a kernel's copies run beside the kernel ahead. Each
// warp then takes features warp, warp + kWarps, ... of the block, its lanes the same elements in
// the same order as a SmallLinearKernel warp: the same bits (decode_kernels_test).
//
// At two rows a warp sums 4 features at once, and the inputs are staged by 16-byte vectors, the o
// projection's plain input too (where it fits; StageInput): 1.08x a decode step at batch 2 on the
// H100 and the H200 (Qwen3-0.6B's shape, `decode_ab.sh`), of which the staging 1.045x. At one row
// neither paid: 4 features at once 0.946x (H100; 0.962x on the H200 in an earlier build), the
// staging 0.997x (it stays, one code path for both). Timestamps per block at batch 1
// (docs/decode-performance.md) show why: a projection's sums run while the next projection's
// blocks copy their weights, and their shared-memory reads wait behind those copies (the o
// projection's 8 features a block took 4.5 us, 1.3 us with the copies made bulk copies), so the
// next kernel's weights, not the sums, set the pace.
//
// The plain form (the o projection, after the attention) lets the kernel behind start before its
// own wait (LetDependentsStart), so that the gate/up projection's blocks copy their weights while
// the attention runs, not from the o projection's wait on. Timestamps per block at batch 1 (H100)
// show why that pays: the gate/up projection's wait returned 3.5 to 4 us after the o projection
// had ended (with its weights by bulk copies, whichever thread issued them), about when the 12.6
// MB it issued at the o projection's wait had landed; beside the attention, which reads little
// from HBM at a few rows, they land before it ends. 1.108x a decode step at batch 1 and 1.044x
// at batch 2 on the H100 (Qwen3-0.6B's shape, `decode_ab.sh`, the same bits). The same for the
// q/k/v or gate/up projections besides gained nothing (0.995x to 1.002x against this), for the
// down projection besides less (1.098x against the 1.108x), and the MoE and MLA shapes' batch-1
// steps did not change (0.998x, 0.999x).
//
// The norm's form (the q/k/v and gate/up projections) lets the kernel behind start only once its
// input is staged, so that the next projection's copies do not run beside its staging: 1.002x to
// 1.008x a decode step at batch 1 (within the noise) and 1.007x to 1.018x at batch 2, in two calls
// on H100s (Qwen3-0.6B's shape, the same bits). The same after the staging of every form was
// slower (0.98x at batch 1), and of the SiluMul form alone too (0.98x).
//
// At one row the weights' copies (the norm's weight too) bypass the L1 (cp.async .cg, kBypassL1),
// where .ca also cached them there, though no block fetches a weight twice: 1.026x a decode step
// at batch 1 on an H100 (Qwen3-0.6B's shape, `decode_ab.sh`; 1.032x with the attention's
// one-round-trip preparation, against main before both). At two rows the same was 0.951x, so
// they keep .ca. Why is not measured; a guess is that copies landing sooner compete harder with
// the shared-memory reads of the kernel ahead, whose two rows sum 4 features at once.
template <typename T, int kRows, SmallInput kMode>
__global__ void __launch_bounds__(kThreads)
    SharedWeightLinearKernel(const T* __restrict__ x, const T* __restrict__ add,
                             const float* __restrict__ partials, int slices,
                             const T* __restrict__ norm_weight, float eps, T* __restrict__ sum,
                             const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y,
                             int64_t rows, int64_t n_out, int64_t k_in, int64_t per_block,
                             bool staged_input) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr bool kNorm = NormsInput(kMode);
  // [per_block, k_in] weights, then (kNorm) the norm's weight [k_in], then the staged input.
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* weights = reinterpret_cast<T*>(shared_bytes);
  T* norm = weights + per_block * k_in;
  T* staged = norm + (kNorm ? k_in : 0);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t first = blockIdx.x * per_block;
  const int64_t count = min(per_block, n_out - first);
  // At one row the copies bypass the L1; at two they do not (see the Note).
  constexpr bool kBypassL1 = kRows == 1;
  if constexpr (kNorm) {
    for (int64_t i = threadIdx.x * kVec; i < k_in; i += kThreads * kVec) {
      CopyAsync<16, kBypassL1>(norm + i, norm_weight + i);
    }
    CommitCopies();
  }
  const T* piece = w + first * k_in;
  for (int64_t i = threadIdx.x * kVec; i < count * k_in; i += kThreads * kVec) {
    CopyAsync<16, kBypassL1>(weights + i, piece + i);
  }
  CommitCopies();
  // The kernel behind may start before this one's wait (the plain form), after its staging (the
  // norm's form) or after its wait: see the Note.
  if constexpr (kMode == SmallInput::kPlain) LetDependentsStart();
  if constexpr (kNorm) {
    WaitForPrecedingKernels();
  } else {
    PrecedingKernelsDone();
  }
  // The folded forms always stage their input; the plain one where the plan says so.
  const bool staged_here = kMode != SmallInput::kPlain || staged_input;
  if (staged_here) {
    // The norm's weight (the older group) has landed for this thread's copies; StageInput's
    // barriers show every thread's before it reads them.
    if constexpr (kNorm) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    StageInput<T, kMode>(x, add, partials, slices, norm, eps, sum, staged, rows, k_in);
  }
  if constexpr (kNorm) LetDependentsStart();
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  // At two rows a warp takes its features 4 at a time (f, f + kWarps, ...), their sums side by
  // side: independent chains of fma and shuffles, where each feature's waited on the one before
  // (each feature's sums in the same order either way). At one row that was slower (Note [Small
  // linear with weights in shared memory]).
  constexpr int kFeaturesAtOnce = kRows == 1 ? 1 : 4;
  const auto sums = [&](const T* input) {
    for (int64_t f0 = warp; f0 < count; f0 += kWarps * kFeaturesAtOnce) {
      float acc[kFeaturesAtOnce][kRows];
#pragma unroll
      for (int j = 0; j < kFeaturesAtOnce; ++j) {
#pragma unroll
        for (int m = 0; m < kRows; ++m) acc[j][m] = 0.0f;
      }
      for (int64_t kk = lane * kVec; kk < k_in; kk += 32 * kVec) {
#pragma unroll
        for (int j = 0; j < kFeaturesAtOnce; ++j) {
          const int64_t f = f0 + j * kWarps;
          if (f < count)
            AddProducts(acc[j], LoadPack<T, kVec>(weights + f * k_in + kk), input, rows, k_in, kk);
        }
      }
#pragma unroll
      for (int j = 0; j < kFeaturesAtOnce; ++j) {
        const int64_t f = f0 + j * kWarps;
        if (f < count) StoreFeature(acc[j], bias, y, rows, n_out, first + f);
      }
    }
  };
  // One loop for each input, so that the compiler sees which memory each reads: shared loads for
  // the staged rows, where one loop over either pointer read both by generic loads.
  if (staged_here) {
    sums(staged);
  } else {
    sums(x);
  }
}

struct SharedWeightPlan {
  int64_t per_block, bytes;
  bool staged_input;  // whether the input rows go to shared memory (always, but for kPlain)
};

struct SmallLinearArgs {
  const void* x;
  const void* add;
  const float* partials;  // kAddPartialsNorm's add (StageInput)
  int slices;
  const void* norm_weight;
  float eps;
  void* sum;
  const void* w;
  const void* bias;
  void* y;
  int64_t rows, n_out, k_in;
};

template <typename T, int kRows, SmallInput kMode, int kPacks>
cudaError_t LaunchSmallLinear(const SmallLinearArgs& a, cudaStream_t stream) {
  const auto kernel = SmallLinearKernel<T, kRows, kMode, kPacks>;
  const int64_t staged = kMode == SmallInput::kPlain ? 0 : a.rows * a.k_in * sizeof(T);
  if (staged > kSmallLinearMaxStagedBytes) return cudaErrorInvalidValue;
  // Once per kernel, before any capture (the engine's first step runs eagerly): shared memory
  // past the default 48 KiB.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmallLinearMaxStagedBytes);
  if (opt_in != cudaSuccess) return opt_in;
  const int64_t blocks = (a.n_out + kWarps - 1) / kWarps;
  return Launch(kernel, blocks, kThreads, staged, stream, static_cast<const T*>(a.x),
                static_cast<const T*>(a.add), a.partials, a.slices,
                static_cast<const T*>(a.norm_weight), a.eps,
                static_cast<T*>(a.sum), static_cast<const T*>(a.w), static_cast<const T*>(a.bias),
                static_cast<T*>(a.y), a.rows, a.n_out, a.k_in);
}

// The shared memory a SharedWeightLinearKernel block may take: kPrefetchMaxSharedBytes, or less
// where the device gives a block less (its opt-in limit) or an SM less than two such blocks (each
// with 1 KiB the system reserves).
int64_t SharedWeightCap() {
  static const int64_t cap = [] {
    const int per_block = CurrentDeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, -1);
    const int per_sm = CurrentDeviceAttribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, -1);
    if (per_block < 0 || per_sm < 0) return int64_t{0};
    return std::min<int64_t>({kPrefetchMaxSharedBytes, per_block, per_sm / 2 - 1024});
  }();
  return cap;
}

// SharedWeightLinearKernel's features per block and shared bytes, or 0 features where they do
// not fit SharedWeightCap() or the norm's weight (`norm`: the norm's forms) is not 16-byte
// aligned (cp.async copies 16 bytes at once; the weights and inputs always are). A folded form
// (`staged`) stages its input rows; a plain one does where they fit beside the weights, so that
// its warps read them from shared memory, not from the L2 at each step of each feature's sum.
SharedWeightPlan PlanSharedWeights(int64_t rows, int64_t n_out, int64_t k_in, int64_t element,
                                   const void* norm, bool staged) {
  if (norm != nullptr && reinterpret_cast<uintptr_t>(norm) % 16 != 0) return {0, 0, false};
  const int64_t per_block = (n_out + MultiprocessorCount() - 1) / MultiprocessorCount();
  const auto bytes = [&](bool staged_input) {
    return (per_block * k_in + (norm != nullptr ? k_in : 0) + (staged_input ? rows * k_in : 0)) *
           element;
  };
  const bool staged_input = staged || bytes(true) <= SharedWeightCap();
  if (bytes(staged_input) > SharedWeightCap()) return {0, 0, false};
  return {per_block, bytes(staged_input), staged_input};
}

// Once per kernel, before any capture (the engine's first step runs eagerly): shared memory up to
// SharedWeightCap() and the SM's whole carveout as shared memory, so that blocks of two of these
// kernels in a row find the SM configured alike and may share it. False where the device refused.
template <typename T, int kRows, SmallInput kMode>
bool SharedWeightKernelReady() {
  static const bool ready = [] {
    const auto kernel = SharedWeightLinearKernel<T, kRows, kMode>;
    const bool set = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(SharedWeightCap())) == cudaSuccess &&
                     cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared) == cudaSuccess;
    if (!set) (void)cudaGetLastError();
    return set;
  }();
  return ready;
}

template <typename T, int kRows, SmallInput kMode>
cudaError_t LaunchSharedWeightLinear(const SmallLinearArgs& a, const SharedWeightPlan& plan,
                                     cudaStream_t stream) {
  const int64_t blocks = (a.n_out + plan.per_block - 1) / plan.per_block;
  return Launch(SharedWeightLinearKernel<T, kRows, kMode>, blocks, kThreads, plan.bytes, stream,
                static_cast<const T*>(a.x), static_cast<const T*>(a.add), a.partials, a.slices,
                static_cast<const T*>(a.norm_weight), a.eps, static_cast<T*>(a.sum),
                static_cast<const T*>(a.w), static_cast<const T*>(a.bias), static_cast<T*>(a.y),
                a.rows, a.n_out, a.k_in, plan.per_block, plan.staged_input);
}

// Vectors per lane: 4 where they hold the whole row (k_in up to 1024 in bf16: the q/k/v and
// gate/up projections, whose many blocks want the registers for occupancy); for longer rows 16
// where the grid has at most a block per SM (the o and down projections of Qwen3-0.6B: few, long
// rows, which want more bytes in flight per warp; 16 take about 170 registers, one block per SM),
// else 8.
template <typename T, int kRows, SmallInput kMode>
cudaError_t LaunchSmallLinearPacks(const SmallLinearArgs& a, cudaStream_t stream) {
  constexpr int64_t kVec = 16 / sizeof(T);
  if (SharedWeightLinear::On()) {
    const SharedWeightPlan plan = PlanSharedWeights(
        a.rows, a.n_out, a.k_in, sizeof(T),
        NormsInput(kMode) ? a.norm_weight : nullptr,
        kMode != SmallInput::kPlain);
    if (plan.per_block > 0 && SharedWeightKernelReady<T, kRows, kMode>()) {
      return LaunchSharedWeightLinear<T, kRows, kMode>(a, plan, stream);
    }
  }
  if (a.k_in <= 4 * 32 * kVec) return LaunchSmallLinear<T, kRows, kMode, 4>(a, stream);
  if ((a.n_out + kWarps - 1) / kWarps <= MultiprocessorCount()) {
    return LaunchSmallLinear<T, kRows, kMode, 16>(a, stream);
  }
  return LaunchSmallLinear<T, kRows, kMode, 8>(a, stream);
}

template <typename T, SmallInput kMode>
cudaError_t DispatchSmallLinearRows(const SmallLinearArgs& a, cudaStream_t stream) {
  return a.rows <= 1 ? LaunchSmallLinearPacks<T, 1, kMode>(a, stream)
                     : LaunchSmallLinearPacks<T, 2, kMode>(a, stream);
}

template <SmallInput kMode>
cudaError_t DispatchSmallLinear(const SmallLinearArgs& a, DtypeCode dtype, cudaStream_t stream) {
  if (a.rows > kSmallLinearMaxRows || a.k_in % (dtype == kBFloat16 ? 8 : 4) != 0) {
    return cudaErrorInvalidValue;
  }
  if (a.rows == 0 || a.n_out == 0) return cudaSuccess;
  if constexpr (kMode == SmallInput::kAddPartialsNorm) {  // bf16 only: DecodeQkvAttentionO's
    return dtype == kBFloat16 ? DispatchSmallLinearRows<__nv_bfloat16, kMode>(a, stream)
                              : cudaErrorInvalidValue;
  } else {
    return dtype == kBFloat16 ? DispatchSmallLinearRows<__nv_bfloat16, kMode>(a, stream)
                              : DispatchSmallLinearRows<float, kMode>(a, stream);
  }
}

// The most query heads per block that divide the heads per key/value head.
int64_t HeadsPerBlock(int64_t q_heads, int64_t kv_heads) {
  const int64_t group = q_heads / kv_heads;
  int64_t heads = kMaxGroup;
  while (group % heads != 0) heads /= 2;
  return heads;
}

// f(std::integral_constant<int, kVec>{}, std::integral_constant<int, kGroup>{}) for heads of
// 32 kVec dims in blocks of kGroup query heads (HeadsPerBlock): the head layouts that
// DecodeAttentionSupports takes (dim 64, 128 or 256), which the caller has checked.
template <typename F>
auto WithHeadLayout(int64_t dim, int64_t q_heads, int64_t kv_heads, const F& f) {
  const auto of_vec = [&](auto vec) {
    switch (HeadsPerBlock(q_heads, kv_heads)) {
      case 1:
        return f(vec, std::integral_constant<int, 1>{});
      case 2:
        return f(vec, std::integral_constant<int, 2>{});
      case 4:
        return f(vec, std::integral_constant<int, 4>{});
      default:
        return f(vec, std::integral_constant<int, 8>{});
    }
  };
  switch (dim) {
    case 64:
      return of_vec(std::integral_constant<int, 2>{});
    case 128:
      return of_vec(std::integral_constant<int, 4>{});
    default:
      return of_vec(std::integral_constant<int, 8>{});
  }
}

// DecodeAttention's and DecodeQkvAttention's arguments: q, or (prep not null) the inputs to
// compute it from, the caches k and v (written too with prep), and the outputs.
struct AttentionArgs {
  const void* q;
  const QkvPrepInputs* prep;
  void* k;
  void* v;
  const int64_t* position;
  void* out;
  float* partial_out;
  float* partial_stats;
  int64_t batch;
};

// A form of the tensor-core kernel: kBlockWarps warps, each with a ring of kRing tiles (filled
// with all of them up front with kFillAll); with kOSlice, DecodeQkvAttentionO's, whose blocks
// hold up to kOSliceMaxBytes of the o projection's weights past the ring; with kSplitTile, a
// ring of one tile whose keys and values are copied apart (Note [One tile a warp for a grid of
// more than a wave]).
template <int kDim, int kGroup, bool kPrep, int kBlockWarps, int kRing, bool kFillAll,
          bool kOSlice = false, bool kSplitTile = false>
struct MmaAttentionForm {
  static constexpr int kRingBytes = kBlockWarps * kRing * 2 * kTileKeys * (kDim + kRowPad) * 2;
  // A function, so that the kernel is instantiated only for the forms that run.
  static constexpr auto Kernel() {
    return DecodeAttentionMmaKernel<kDim, kGroup, kPrep, kBlockWarps, kRing, kFillAll, kOSlice,
                                    kSplitTile>;
  }

  // Once per form, before any capture (the engine's first step runs eagerly, and every launch
  // opts in every form it may take): shared memory past the default 48 KiB.
  // kSplitTile: the whole carveout preferred as shared memory, for four blocks an SM.
  static cudaError_t OptIn() {
    constexpr int kMaxBytes = kRingBytes + (kOSlice ? kOSliceMaxBytes : 0);
    static const cudaError_t opted = [] {
      const cudaError_t sized =
          cudaFuncSetAttribute(Kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxBytes);
      if (sized != cudaSuccess || !kSplitTile) return sized;
      return cudaFuncSetAttribute(Kernel(), cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared);
    }();
    return opted;
  }

  // How many blocks of this form an SM holds at once, opted in (0 where either fails).
  static int BlocksPerSm() {
    static const int blocks = [] {
      int n = 0;
      if (OptIn() != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel(), kBlockWarps * 32,
                                                        kRingBytes) != cudaSuccess) {
        cudaGetLastError();
        return 0;
      }
      return n;
    }();
    return blocks;
  }

  // With kOSlice: `o_bytes` of the o projection's slice, and clusters of grid.x blocks.
  static cudaError_t Run(dim3 grid, const AttentionArgs& a, const QkvPrepInputs& prep,
                         const DecodeAttentionShape& p, cudaStream_t stream,
                         const OProjection& o = {}, int64_t o_bytes = 0) {
    using T = __nv_bfloat16;
    return LaunchClusters(Kernel(), grid, kBlockWarps * 32, kRingBytes + o_bytes,
                          kOSlice ? grid.x : 0, stream, static_cast<const T*>(a.q), prep,
                          static_cast<T*>(a.k), static_cast<T*>(a.v), a.position,
                          static_cast<T*>(a.out), a.partial_out, a.partial_stats, p, o);
  }
};

template <int kDim, int kGroup, bool kPrep>
using ShallowForm = MmaAttentionForm<kDim, kGroup, kPrep, kMmaWarps, kMmaStages, false>;
template <int kDim, int kGroup, bool kPrep>
using OneTileForm = MmaAttentionForm<kDim, kGroup, kPrep, kMmaWarps, 1, true, false, true>;

// Whether a grid of `blocks` takes the form of one tile a warp: where it runs in fewer waves than
// the shallow form (Note [One tile a warp for a grid of more than a wave]).
template <int kDim, int kGroup, bool kPrep>
bool TakesOneTile(int64_t blocks) {
  const int64_t shallow = ShallowForm<kDim, kGroup, kPrep>::BlocksPerSm() * MultiprocessorCount();
  const int64_t one_tile = OneTileForm<kDim, kGroup, kPrep>::BlocksPerSm() * MultiprocessorCount();
  if (shallow <= 0 || one_tile <= 0) return false;
  return (blocks + one_tile - 1) / one_tile < (blocks + shallow - 1) / shallow;
}

// The tensor-core kernel for bf16 caches: the deep form where the grid is small and the form fits
// (Note [Deep ring for a small grid]), else kMmaWarps warps of kMmaStages tiles, or of one split
// tile where that takes fewer waves (TakesOneTile).
template <int kDim, int kGroup, bool kPrep>
cudaError_t LaunchMmaAttention(dim3 grid, const AttentionArgs& a, const QkvPrepInputs& prep,
                               const DecodeAttentionShape& p, cudaStream_t stream) {
  using Shallow = ShallowForm<kDim, kGroup, kPrep>;
  using Deep = MmaAttentionForm<kDim, kGroup, kPrep, kMmaDeepWarps, kMmaDeepStages, true>;
  using OneTile = OneTileForm<kDim, kGroup, kPrep>;
  if (const cudaError_t opted = Shallow::OptIn(); opted != cudaSuccess) return opted;
  if (const cudaError_t opted = OneTile::OptIn(); opted != cudaSuccess) return opted;
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  if (TakesOneTile<kDim, kGroup, kPrep>(blocks)) return OneTile::Run(grid, a, prep, p, stream);
  // The deep form where its ring is within kMmaDeepMaxBytes and its static arrays within 48 KiB,
  // the same with and without kPrep: DecodeQkvAttention is bit for bit DecodeQkvPrep and then
  // DecodeAttention.
  if constexpr (Deep::kRingBytes <= kMmaDeepMaxBytes &&
                sizeof(MmaAttentionShared<kDim, kGroup, true, kMmaDeepWarps>) <= 48 * 1024) {
    if (const cudaError_t opted = Deep::OptIn(); opted != cudaSuccess) return opted;
    if (blocks * kMmaDeepGridShare <= MultiprocessorCount()) {
      return Deep::Run(grid, a, prep, p, stream);
    }
  }
  return Shallow::Run(grid, a, prep, p, stream);
}

// DecodeQkvAttentionO (Note [The o projection in the attention's clusters]): kOSliceWarps warps
// a block, each with a ring of two tiles filled up front, so that a split of up to 128 keys (of
// 1024, with clusters of 8) is in flight at once.
constexpr int kOSliceWarps = 4;
constexpr int kOSliceRing = 2;

template <int kDim, int kGroup>
using OSliceForm = MmaAttentionForm<kDim, kGroup, true, kOSliceWarps, kOSliceRing, true, true>;

// The bytes of a DecodeQkvAttentionO block's slice of the o projection (bf16 rows of kORow).
int64_t OSliceBytes(int64_t hidden, int64_t group, int64_t dim) {
  return hidden / kAttentionOCluster * ORowElements(group, dim) * 2;
}

template <int kDim, int kGroup>
cudaError_t LaunchAttentionO(const QkvPrepInputs& prep, const int64_t* position, void* k_cache,
                             void* v_cache, const OProjection& o, const DecodeAttentionShape& p,
                             cudaStream_t stream) {
  using Form = OSliceForm<kDim, kGroup>;
  const int64_t o_bytes = OSliceBytes(o.hidden, kGroup, kDim);
  if (o_bytes > kOSliceMaxBytes) return cudaErrorInvalidValue;
  if (const cudaError_t opted = Form::OptIn(); opted != cudaSuccess) return opted;
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.q_heads / kGroup),
                  static_cast<unsigned>(o.batch));
  const AttentionArgs a{nullptr, &prep, k_cache, v_cache, position, nullptr, nullptr, nullptr,
                        o.batch};
  return Form::Run(grid, a, prep, p, stream, o, o_bytes);
}

template <typename T, int kVec, int kGroup, bool kPrep>
cudaError_t LaunchDecodeAttention(const AttentionArgs& a, const DecodeAttentionShape& p,
                                  cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.q_heads / kGroup),
                  static_cast<unsigned>(a.batch));
  // DecodeAttention's caches are only read; DecodeQkvAttention's are written too (kPrep).
  const QkvPrepInputs prep = a.prep != nullptr ? *a.prep : QkvPrepInputs{};
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (p.tensor_cores) {
      return LaunchMmaAttention<32 * kVec, kGroup, kPrep>(grid, a, prep, p, stream);
    }
  }
  const auto kernel = DecodeAttentionKernel<T, kVec, kGroup, kPrep>;
  constexpr int ring = kDecodeWarps * kStages * 2 * kKeysPerIteration * 32 * kVec * sizeof(T);
  // Once per kernel, before any capture: shared memory past the default 48 KiB (up to 128 KiB,
  // for fp32 heads of 256).
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring);
  if (opt_in != cudaSuccess) return opt_in;
  return Launch(kernel, grid, kDecodeWarps * 32, ring, stream, static_cast<const T*>(a.q), prep,
                static_cast<T*>(a.k), static_cast<T*>(a.v), a.position, static_cast<T*>(a.out),
                a.partial_out, a.partial_stats, p);
}

template <typename T, int kVec, int kGroup>
cudaError_t LaunchDecodeAttention(const AttentionArgs& a, const DecodeAttentionShape& p,
                                  cudaStream_t stream) {
  return a.prep != nullptr ? LaunchDecodeAttention<T, kVec, kGroup, true>(a, p, stream)
                           : LaunchDecodeAttention<T, kVec, kGroup, false>(a, p, stream);
}

template <typename T>
cudaError_t DispatchDecodeAttention(const AttentionArgs& a, int64_t dim,
                                    const DecodeAttentionShape& p, cudaStream_t stream) {
  return WithHeadLayout(dim, p.q_heads, p.kv_heads, [&](auto vec, auto group) {
    return LaunchDecodeAttention<T, decltype(vec)::value, decltype(group)::value>(a, p, stream);
  });
}

cudaError_t RunDecodeAttention(const AttentionArgs& a, int64_t dim, const DecodeAttentionShape& p,
                               DtypeCode dtype, cudaStream_t stream) {
  if (!DecodeAttentionSupports(p.q_heads, p.kv_heads, dim)) return cudaErrorInvalidValue;
  if (a.batch == 0) return cudaSuccess;
  return dtype == kBFloat16 ? DispatchDecodeAttention<__nv_bfloat16>(a, dim, p, stream)
                            : DispatchDecodeAttention<float>(a, dim, p, stream);
}

}  // namespace

bool SmallLinearSharesWeights(int64_t rows, int64_t n_out, int64_t k_in, const void* norm_weight,
                              bool staged, DtypeCode dtype) {
  return SharedWeightLinear::On() &&
         PlanSharedWeights(rows, n_out, k_in, dtype == kBFloat16 ? 2 : 4, norm_weight, staged)
                 .per_block > 0;
}

cudaError_t SmallLinear(const void* x, const void* w, const void* bias, void* y, int64_t rows,
                        int64_t n_out, int64_t k_in, DtypeCode dtype, cudaStream_t stream) {
  return DispatchSmallLinear<SmallInput::kPlain>(
      {x, nullptr, nullptr, 0, nullptr, 0.0f, nullptr, w, bias, y, rows, n_out, k_in}, dtype,
      stream);
}

cudaError_t SmallLinearAddRmsNorm(const void* x, const void* add, const void* norm_weight,
                                  float eps, void* sum, const void* w, const void* bias, void* y,
                                  int64_t rows, int64_t n_out, int64_t k_in, DtypeCode dtype,
                                  cudaStream_t stream) {
  return DispatchSmallLinear<SmallInput::kAddNorm>(
      {x, add, nullptr, 0, norm_weight, eps, sum, w, bias, y, rows, n_out, k_in}, dtype, stream);
}

cudaError_t SmallLinearAddPartialsRmsNorm(const void* x, const float* partials, int slices,
                                          const void* norm_weight, float eps, void* sum,
                                          const void* w, const void* bias, void* y, int64_t rows,
                                          int64_t n_out, int64_t k_in, DtypeCode dtype,
                                          cudaStream_t stream) {
  if (partials == nullptr || slices < 1 || slices > kMaxOPartialSlices || k_in % 4 != 0 ||
      reinterpret_cast<uintptr_t>(partials) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  return DispatchSmallLinear<SmallInput::kAddPartialsNorm>(
      {x, nullptr, partials, slices, norm_weight, eps, sum, w, bias, y, rows, n_out, k_in}, dtype,
      stream);
}

cudaError_t SmallLinearSiluMul(const void* gate_up, const void* w, const void* bias, void* y,
                               int64_t rows, int64_t n_out, int64_t inner, DtypeCode dtype,
                               cudaStream_t stream) {
  return DispatchSmallLinear<SmallInput::kSiluMul>(
      {gate_up, nullptr, nullptr, 0, nullptr, 0.0f, nullptr, w, bias, y, rows, n_out, inner},
      dtype, stream);
}

cudaError_t SiluMul(const void* gate_up, void* out, int64_t rows, int64_t inner, DtypeCode dtype,
                    cudaStream_t stream) {
  const int64_t total = rows * inner;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 65535);
  if (dtype == kBFloat16) {
    using T = __nv_bfloat16;
    return Launch(SiluMulKernel<T>, blocks, kThreads, 0, stream, static_cast<const T*>(gate_up),
                  static_cast<T*>(out), rows, inner);
  }
  return Launch(SiluMulKernel<float>, blocks, kThreads, 0, stream,
                static_cast<const float*>(gate_up), static_cast<float*>(out), rows, inner);
}

cudaError_t DecodeQkvPrep(const void* qkv, const void* q_norm, const void* k_norm,
                          const void* cos, const void* sin, const int64_t* position, void* q_out,
                          void* k_cache, void* v_cache, int64_t batch, const QkvPrepShape& shape,
                          DtypeCode dtype, cudaStream_t stream) {
  if (shape.dim > kMaxHeadDim || 2 * shape.half > shape.dim) return cudaErrorInvalidValue;
  const int64_t warps = batch * (shape.q_heads + 2 * shape.kv_heads);
  if (warps == 0) return cudaSuccess;
  const int64_t blocks = (warps + kDecodeWarps - 1) / kDecodeWarps;
  if (dtype == kBFloat16) {
    using T = __nv_bfloat16;
    return Launch(DecodeQkvPrepKernel<T>, blocks, kDecodeWarps * 32, 0, stream,
                  static_cast<const T*>(qkv), static_cast<const T*>(q_norm),
                  static_cast<const T*>(k_norm), static_cast<const T*>(cos),
                  static_cast<const T*>(sin), position, static_cast<T*>(q_out),
                  static_cast<T*>(k_cache), static_cast<T*>(v_cache), batch, shape);
  }
  return Launch(DecodeQkvPrepKernel<float>, blocks, kDecodeWarps * 32, 0, stream,
                static_cast<const float*>(qkv), static_cast<const float*>(q_norm),
                static_cast<const float*>(k_norm), static_cast<const float*>(cos),
                static_cast<const float*>(sin), position, static_cast<float*>(q_out),
                static_cast<float*>(k_cache), static_cast<float*>(v_cache), batch, shape);
}

DecodeAttentionShape PlanDecodeAttention(int64_t batch, int64_t q_heads, int64_t kv_heads,
                                         int64_t key_length, float scale, int blocks_per_sm,
                                         bool tensor_cores) {
  if (blocks_per_sm <= 0) blocks_per_sm = kBlocksPerSm;
  DecodeAttentionShape p;
  p.tensor_cores = tensor_cores;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
  p.scale = scale;
  p.key_length = key_length;
  const int64_t blocks = batch * (q_heads / HeadsPerBlock(q_heads, kv_heads));
  // Splits that bring the grid to about kBlocksPerSm blocks per SM, each of at least one
  // iteration of every warp on CUDA cores and four on tensor cores (a shorter split leaves warps
  // without keys, and each split prepares its query heads and merges once more: on an H100 the
  // decode step of Qwen3-0.6B's shape over up to 256 cached positions was 1.02x to 1.04x faster
  // at batch 1 and 1.06x at batch 8 with one split of four tiles a warp than with four of one,
  // docs/decode-performance.md), and no more blocks than there are merge counters.
  const int64_t wanted =
      (static_cast<int64_t>(blocks_per_sm) * MultiprocessorCount() + blocks - 1) / blocks;
  const int64_t min_chunk =
      tensor_cores ? 4 * kMmaWarps * kTileKeys : kDecodeWarps * kKeysPerIteration;
  const int64_t most = std::max<int64_t>(1, key_length / min_chunk);  // splits >= min_chunk keys
  int64_t splits = std::max<int64_t>(1, std::min(wanted, most));
  if (blocks > kMaxMergeSlots) splits = 1;
  p.chunk = (key_length + splits - 1) / splits;
  p.splits = static_cast<int>((key_length + p.chunk - 1) / p.chunk);
  return p;
}

bool DecodeAttentionSupports(int64_t q_heads, int64_t kv_heads, int64_t dim) {
  return (dim == 64 || dim == 128 || dim == 256) && kv_heads > 0 && q_heads % kv_heads == 0;
}

bool DecodeAttentionTakesOneTile(int64_t batch, int64_t dim, const DecodeAttentionShape& p,
                                 bool prep) {
  if (!p.tensor_cores || !DecodeAttentionSupports(p.q_heads, p.kv_heads, dim)) return false;
  const int64_t blocks = p.splits * (p.q_heads / HeadsPerBlock(p.q_heads, p.kv_heads)) * batch;
  return WithHeadLayout(dim, p.q_heads, p.kv_heads, [&](auto vec, auto group) {
    constexpr int kDim = 32 * decltype(vec)::value;
    constexpr int kGroup = decltype(group)::value;
    return prep ? TakesOneTile<kDim, kGroup, true>(blocks)
                : TakesOneTile<kDim, kGroup, false>(blocks);
  });
}

cudaError_t DecodeAttention(const void* q, const void* k, const void* v, const int64_t* position,
                            void* out, float* partial_out, float* partial_stats, int64_t batch,
                            int64_t dim, const DecodeAttentionShape& shape, DtypeCode dtype,
                            cudaStream_t stream) {
  return RunDecodeAttention({q, nullptr, const_cast<void*>(k), const_cast<void*>(v), position,
                             out, partial_out, partial_stats, batch},
                            dim, shape, dtype, stream);
}

bool DecodeQkvAttentionSupports(int64_t q_heads, int64_t kv_heads, int64_t dim) {
  return DecodeAttentionSupports(q_heads, kv_heads, dim) &&
         HeadsPerBlock(q_heads, kv_heads) == q_heads / kv_heads;
}

cudaError_t DecodeQkvAttention(const QkvPrepInputs& prep, const int64_t* position, void* k_cache,
                               void* v_cache, void* out, float* partial_out,
                               float* partial_stats, int64_t batch,
                               const DecodeAttentionShape& shape, DtypeCode dtype,
                               cudaStream_t stream) {
  const QkvPrepShape& s = prep.shape;
  if (!DecodeQkvAttentionSupports(shape.q_heads, shape.kv_heads, s.dim) ||
      s.q_heads != shape.q_heads || s.kv_heads != shape.kv_heads || 2 * s.half > s.dim) {
    return cudaErrorInvalidValue;
  }
  return RunDecodeAttention(
      {nullptr, &prep, k_cache, v_cache, position, out, partial_out, partial_stats, batch}, s.dim,
      shape, dtype, stream);
}

bool DecodeQkvAttentionOSupports(int64_t q_heads, int64_t kv_heads, int64_t dim, int64_t hidden) {
  if (!DecodeQkvAttentionSupports(q_heads, kv_heads, dim) || kv_heads > kMaxOPartialSlices ||
      hidden <= 0 || hidden % (4 * kAttentionOCluster) != 0 || dim != 128) {
    return false;
  }
  const int64_t group = q_heads / kv_heads;
  return (group == 1 || group == 2 || group == 4) &&
         OSliceBytes(hidden, group, dim) <= kOSliceMaxBytes;
}

cudaError_t DecodeQkvAttentionO(const QkvPrepInputs& prep, const int64_t* position, void* k_cache,
                                void* v_cache, const OProjection& o, DecodeAttentionShape shape,
                                cudaStream_t stream) {
  const QkvPrepShape& s = prep.shape;
  if (!DecodeQkvAttentionOSupports(shape.q_heads, shape.kv_heads, s.dim, o.hidden) ||
      s.q_heads != shape.q_heads || s.kv_heads != shape.kv_heads || 2 * s.half > s.dim ||
      shape.key_length < 1) {
    return cudaErrorInvalidValue;
  }
  if (o.batch == 0) return cudaSuccess;
  // A cluster's splits: every block takes part in the merge and sums its slice, with keys or not.
  shape.splits = kAttentionOCluster;
  shape.chunk = (shape.key_length + kAttentionOCluster - 1) / kAttentionOCluster;
  shape.tensor_cores = true;
  switch (shape.q_heads / shape.kv_heads) {
    case 1:
      return LaunchAttentionO<128, 1>(prep, position, k_cache, v_cache, o, shape, stream);
    case 2:
      return LaunchAttentionO<128, 2>(prep, position, k_cache, v_cache, o, shape, stream);
    default:
      return LaunchAttentionO<128, 4>(prep, position, k_cache, v_cache, o, shape, stream);
  }
}

}  // namespace rl::kernels
