// MlaDecodeAttention (cuda_kernels.h): an MLA decode step's attention in the latent space, the
// scores, the softmax and the weighted sum of the cached latents in one kernel (and a merge of
// its key splits).
//
// Note [MLA decode attention kernel]
// In the latent space (Note [MLA decode in the latent space] in trainer/model/layers.cc) every
// query head of a row attends over the same cached rows [latent (512) | k_pe (64)] with an
// absorbed query of 576 dims, and the values are the rows' latents. The LibTorch ops run a GEMM
// for the scores, three passes over them (the mask, the softmax, the bf16 cast) and a GEMM for
// the weighted latents: per cached key the row is read twice and the [heads] scores move about
// seven times. Here a block of 4 warps takes 16 query heads of one row over one split of the keys
// (the grid: head tiles, splits, rows), in rounds of 64 keys copied into shared memory by
// cp.async (two stages, so the next round's copies overlap this round's work):
//  1. warp w computes S^T [16 keys, 16 heads] = K Q^T for keys 16 w to 16 w + 15 of the round:
//     36 steps of 16 dims, an m16n8k16 mma per step and group of 8 heads, K by ldmatrix from the
//     stage and Q^T by ldmatrix from the block's 16 query rows in shared memory; it writes the
//     scaled scores to shared memory, -FLT_MAX for the keys the row cannot see;
//  2. the block's 128 threads, 8 per head, take each head's maximum over the round, the weights
//     exp(s - max) rounded to bf16 (the ops round the normalised probabilities to bf16 for their
//     GEMM; here the unnormalised weights, divided by their fp32 sum at the end) into shared
//     memory, and the running maximum, sum and correction of each head (fp32, the online softmax);
//  3. warp w rescales its accumulators and adds O^T [128 dims, 16 heads] += V^T P^T for its dims
//     128 w to 128 w + 127 over the round's 64 keys: V^T by ldmatrix .trans from the stage (the
//     values are the first 512 dims of the same rows), P^T by ldmatrix from the weights.
// A block reads each cached row once from global memory. With one split the block writes O / sum;
// with several it writes its unnormalised O, maximum and sum, and MlaMergeSplitsKernel combines
// the splits of each (row, head) in split order. No atomics: the same inputs give the same bits,
// so graph replays equal eager steps.
// DSA (Note [DSA decode over the selected keys]): with `indices` the block's keys are the rows
// indices[b, j] of the selected j, not the positions j; a selected key past the row's position
// scores -FLT_MAX and its stage row is copied from position 0 (any finite row: its weight is 0,
// and a cache row past the position may hold anything, NaN included).
// A NaN score of a visible key (a corrupt cache row) gets weight 0 here, where the ops' softmax
// would make the row's output NaN.
#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

using Bf16 = __nv_bfloat16;

constexpr int kMlaWarps = 4;
constexpr int kMlaThreads = kMlaWarps * 32;
constexpr int kMlaHeads = 16;                            // query heads per block
constexpr int kMlaRank = 512;                            // a row's latent: the values
constexpr int kMlaWidth = 576;                           // a cached row: latent and k_pe
constexpr int kMlaRow = kMlaWidth + 8;                   // a staged row (ldmatrix: no conflicts)
constexpr int kMlaTileKeys = 16;                         // keys of a warp's S^T
constexpr int kMlaRoundKeys = kMlaWarps * kMlaTileKeys;  // keys per round
constexpr int kMlaStages = 2;
constexpr int kMlaWarpDims = kMlaRank / kMlaWarps;  // O^T dims per warp
constexpr int kMlaDimTiles = kMlaWarpDims / 16;
constexpr int kMlaWeightRow = kMlaRoundKeys + 8;  // P [head][key] row, bf16
constexpr int kMlaScoreRow = kMlaHeads + 1;       // S [key][head] row, fp32
constexpr int kMlaPieces = kMlaWidth / 8;         // 16-byte pieces of a row

// Dynamic shared memory: the stages, the query rows, P, S and the per-head statistics.
constexpr int64_t kMlaRingElements = int64_t{kMlaStages} * kMlaRoundKeys * kMlaRow;
constexpr int64_t kMlaQueryElements = int64_t{kMlaHeads} * kMlaRow;
constexpr int64_t kMlaWeightElements = int64_t{kMlaHeads} * kMlaWeightRow;
constexpr int64_t kMlaSmemBytes = (kMlaRingElements + kMlaQueryElements + kMlaWeightElements) * 2 +
                                  (int64_t{kMlaRoundKeys} * kMlaScoreRow + 3 * kMlaHeads) * 4;
static_assert((kMlaRingElements + kMlaQueryElements + kMlaWeightElements) * 2 % 16 == 0,
              "the fp32 part starts 16-byte aligned");

__global__ void __launch_bounds__(kMlaThreads, 1)
    MlaDecodeKernel(const Bf16* __restrict__ q, const Bf16* __restrict__ cache,
                    const int64_t* __restrict__ position, const int64_t* __restrict__ indices,
                    Bf16* __restrict__ out, float* __restrict__ partial_out,
                    float* __restrict__ partial_stats, MlaDecodeShape p) {
  extern __shared__ __align__(16) unsigned char smem[];
  Bf16* ring = reinterpret_cast<Bf16*>(smem);
  Bf16* query = ring + kMlaRingElements;
  Bf16* weights = query + kMlaQueryElements;
  float* scores = reinterpret_cast<float*>(weights + kMlaWeightElements);
  float* run_max = scores + kMlaRoundKeys * kMlaScoreRow;
  float* run_sum = run_max + kMlaHeads;
  float* correction = run_sum + kMlaHeads;
  PrecedingKernelsDone();

  const int64_t first_head = static_cast<int64_t>(blockIdx.x) * kMlaHeads;
  const int64_t split = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int matrix = lane / 8;  // the ldmatrix .x4 matrix whose row address this lane gives
  const int64_t pos = position[b * p.position_stride];
  const int64_t begin = split * p.chunk;
  const int64_t chunk_end = begin + p.chunk < p.keys ? begin + p.chunk : p.keys;
  // Keys [begin, end) of this split: positions up to the row's, or selected keys.
  const int64_t end = indices != nullptr ? chunk_end : (chunk_end < pos + 1 ? chunk_end : pos + 1);
  const int64_t* row_indices = indices != nullptr ? indices + b * p.index_stride : nullptr;
  const Bf16* row_cache = cache + b * p.cache_stride_b;

  for (int i = threadIdx.x; i < kMlaHeads * kMlaPieces; i += kMlaThreads) {
    const int h = i / kMlaPieces;
    const int col = i % kMlaPieces * 8;
    uint4 piece = make_uint4(0, 0, 0, 0);  // heads past the last: zero queries, not written
    if (first_head + h < p.heads) {
      piece = *reinterpret_cast<const uint4*>(q + (b * p.heads + first_head + h) * kMlaWidth + col);
    }
    *reinterpret_cast<uint4*>(query + h * kMlaRow + col) = piece;
  }
  if (threadIdx.x < kMlaHeads) {
    run_max[threadIdx.x] = -FLT_MAX;
    run_sum[threadIdx.x] = 0.0f;
    correction[threadIdx.x] = 1.0f;
  }
  // The cache row of key j of the split, and whether the row sees it.
  const auto row_of = [&](int64_t j) { return row_indices != nullptr ? row_indices[j] : j; };
  const auto sees = [&](int64_t j) {
    if (j >= end) return false;
    const int64_t row = row_of(j);
    return row >= 0 && row <= pos;
  };
  const auto copy = [&](int64_t j0, int stage) {
    Bf16* to = ring + stage * kMlaRoundKeys * kMlaRow;
    for (int i = threadIdx.x; i < kMlaRoundKeys * kMlaPieces; i += kMlaThreads) {
      const int r = i / kMlaPieces;
      const int col = i % kMlaPieces * 8;
      const int64_t j = j0 + r < end ? j0 + r : end - 1;
      const int64_t row = sees(j) ? row_of(j) : 0;
      CopyAsync<16>(to + r * kMlaRow + col, row_cache + row * p.cache_stride_t + col);
    }
  };
  const int64_t rounds = end > begin ? (end - begin + kMlaRoundKeys - 1) / kMlaRoundKeys : 0;
  if (rounds > 0) copy(begin, 0);
  CommitCopies();
  __syncthreads();  // the query rows and the statistics

  // O^T accumulators: dim tile i (dims 128 warp + 16 i on), head group n (heads 8 n on):
  // (dim g, head 2t), (dim g, 2t + 1), (dim g + 8, 2t), (dim g + 8, 2t + 1).
  float acc[kMlaDimTiles][2][4];
#pragma unroll
  for (int i = 0; i < kMlaDimTiles; ++i) {
#pragma unroll
    for (int n = 0; n < 2; ++n) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.0f;
  }
  for (int64_t r = 0; r < rounds; ++r) {
    const int stage = static_cast<int>(r % kMlaStages);
    const int64_t j0 = begin + r * kMlaRoundKeys;
    if (r + 1 < rounds) copy(j0 + kMlaRoundKeys, (stage + 1) % kMlaStages);
    CommitCopies();
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // this round's copies, this thread's
    __syncthreads();                                        // and every thread's
    const Bf16* keys = ring + stage * kMlaRoundKeys * kMlaRow;

    // 1. S^T = K Q^T for the warp's 16 keys. K (A, 16 keys x 16 dims): matrix m holds keys
    // 8 (m & 1) on, dims 8 (m >> 1) on. Q^T (B, 16 dims x 8 heads, two groups): matrix m holds
    // heads 8 (m >> 1) on, dims 8 (m & 1) on, so r[0], r[1] are group 0's b0, b1 and r[2], r[3]
    // group 1's.
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    const Bf16* k_row =
        keys + (warp * kMlaTileKeys + lane % 8 + 8 * (matrix & 1)) * kMlaRow + 8 * (matrix >> 1);
    const Bf16* q_row = query + (lane % 8 + 8 * (matrix >> 1)) * kMlaRow + 8 * (matrix & 1);
#pragma unroll 4
    for (int step = 0; step < kMlaWidth / 16; ++step) {
      uint32_t a[4], qb[4];
      LoadMatrices(a, k_row + 16 * step, false);
      LoadMatrices(qb, q_row + 16 * step, false);
      Mma16816(s[0], a, qb[0], qb[1]);
      Mma16816(s[1], a, qb[2], qb[3]);
    }
    // s[n]: (key g, head 8n + 2t), (key g, 8n + 2t + 1), (key g + 8, 8n + 2t), (g + 8, + 1).
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = warp * kMlaTileKeys + g + (e >= 2 ? 8 : 0);
        const int head = 8 * n + 2 * t + (e & 1);
        scores[key * kMlaScoreRow + head] = sees(j0 + key) ? s[n][e] * p.scale : -FLT_MAX;
      }
    }
    __syncthreads();

    // 2. The online softmax over the round: thread i takes head i / 8, keys 8 (i % 8) to + 7.
    {
      const int head = threadIdx.x / 8;
      const int part = threadIdx.x % 8;
      const float before = run_max[head];
      float v[8];
      float round_max = -FLT_MAX;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v[k] = scores[(8 * part + k) * kMlaScoreRow + head];
        round_max = fmaxf(round_max, v[k]);
      }
      for (int offset = 1; offset < 8; offset *= 2) {
        round_max = fmaxf(round_max, __shfl_xor_sync(0xffffffff, round_max, offset));
      }
      const float next = fmaxf(before, round_max);
      float sum = 0.0f;
      __align__(16) Bf16 w[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float weight = v[k] > -FLT_MAX ? expf(v[k] - next) : 0.0f;
        w[k] = __float2bfloat16_rn(weight);
        sum += weight;
      }
      *reinterpret_cast<uint4*>(weights + head * kMlaWeightRow + 8 * part) =
          *reinterpret_cast<const uint4*>(w);
      for (int offset = 1; offset < 8; offset *= 2) {
        sum += __shfl_xor_sync(0xffffffff, sum, offset);
      }
      __syncwarp();  // every thread of the head has read run_max[head]
      if (part == 0) {
        const float c = expf(before - next);
        correction[head] = c;
        run_sum[head] = run_sum[head] * c + sum;
        run_max[head] = next;
      }
    }
    __syncthreads();

    // 3. O^T += V^T P^T over the round's keys, the warp's dims. V^T (A, 16 dims x 16 keys, by
    // ldmatrix .trans): matrix m holds keys 8 (m >> 1) on, dims 8 (m & 1) on. P^T (B, 16 keys x
    // 8 heads): matrix m holds heads 8 (m >> 1) on, keys 8 (m & 1) on.
    float c[2][2];  // the corrections of heads 8n + 2t, 8n + 2t + 1
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      c[n][0] = correction[8 * n + 2 * t];
      c[n][1] = correction[8 * n + 2 * t + 1];
    }
#pragma unroll
    for (int i = 0; i < kMlaDimTiles; ++i) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        acc[i][n][0] *= c[n][0];
        acc[i][n][1] *= c[n][1];
        acc[i][n][2] *= c[n][0];
        acc[i][n][3] *= c[n][1];
      }
    }
#pragma unroll
    for (int kk = 0; kk < kMlaRoundKeys / 16; ++kk) {
      uint32_t pb[4];
      LoadMatrices(
          pb, weights + (lane % 8 + 8 * (matrix >> 1)) * kMlaWeightRow + 16 * kk + 8 * (matrix & 1),
          false);
      const Bf16* v_row = keys + (16 * kk + lane % 8 + 8 * (matrix >> 1)) * kMlaRow +
                          warp * kMlaWarpDims + 8 * (matrix & 1);
#pragma unroll
      for (int i = 0; i < kMlaDimTiles; ++i) {
        uint32_t va[4];
        LoadMatrices(va, v_row + 16 * i, true);
        Mma16816(acc[i][0], va, pb[0], pb[1]);
        Mma16816(acc[i][1], va, pb[2], pb[3]);
      }
    }
    __syncthreads();  // the stage, the scores, the weights and the corrections are rewritten
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");

  const int64_t row_head = b * p.heads + first_head;  // (row, first head of the block)
#pragma unroll
  for (int i = 0; i < kMlaDimTiles; ++i) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int head = 8 * n + 2 * t + (e & 1);
        if (first_head + head >= p.heads) continue;
        const int dim = warp * kMlaWarpDims + 16 * i + g + (e >= 2 ? 8 : 0);
        if (p.splits == 1) {
          out[(row_head + head) * kMlaRank + dim] =
              __float2bfloat16_rn(acc[i][n][e] / run_sum[head]);
        } else {
          partial_out[((row_head + head) * p.splits + split) * kMlaRank + dim] = acc[i][n][e];
        }
      }
    }
  }
  if (p.splits > 1 && threadIdx.x < kMlaHeads && first_head + threadIdx.x < p.heads) {
    float* stats = partial_stats + ((row_head + threadIdx.x) * p.splits + split) * 2;
    stats[0] = run_max[threadIdx.x];
    stats[1] = run_sum[threadIdx.x];
  }
}

// One block per (row, head): the splits' unnormalised outputs weighted by exp(max - the largest
// max), in split order, over the weighted sums. A split without keys the row sees has sum 0 and
// maximum -FLT_MAX: weight 0.
__global__ void __launch_bounds__(kMlaThreads)
    MlaMergeSplitsKernel(const float* __restrict__ partial_out,
                         const float* __restrict__ partial_stats, Bf16* __restrict__ out,
                         int64_t splits) {
  PrecedingKernelsDone();
  const int64_t row_head = blockIdx.x;
  const float* stats = partial_stats + row_head * splits * 2;
  float largest = -FLT_MAX;
  for (int64_t s = 0; s < splits; ++s) largest = fmaxf(largest, stats[2 * s]);
  float total = 0.0f;
  for (int64_t s = 0; s < splits; ++s) total += expf(stats[2 * s] - largest) * stats[2 * s + 1];
  for (int dim = threadIdx.x; dim < kMlaRank; dim += kMlaThreads) {
    float sum = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      sum += expf(stats[2 * s] - largest) * partial_out[(row_head * splits + s) * kMlaRank + dim];
    }
    out[row_head * kMlaRank + dim] = __float2bfloat16_rn(sum / total);
  }
}

}  // namespace

MlaDecodeShape PlanMlaDecode(int64_t batch, int64_t heads, int64_t keys) {
  MlaDecodeShape shape;
  shape.batch = batch;
  shape.heads = heads;
  shape.keys = keys;
  // One block per SM fits (its shared memory): split the keys, in whole rounds, until the grid
  // has about one block per SM.
  const int64_t blocks = batch * ((heads + kMlaHeads - 1) / kMlaHeads);
  const int64_t rounds = (keys + kMlaRoundKeys - 1) / kMlaRoundKeys;
  int64_t splits = MultiprocessorCount() / blocks;  // rounded down: a second wave costs more
  splits = splits < 1 ? 1 : (splits > rounds ? rounds : splits);
  shape.chunk = (rounds + splits - 1) / splits * kMlaRoundKeys;
  shape.splits = (keys + shape.chunk - 1) / shape.chunk;
  return shape;
}

cudaError_t MlaDecodeAttention(const void* q, const void* cache, const int64_t* position,
                               const int64_t* indices, void* out, float* partial_out,
                               float* partial_stats, const MlaDecodeShape& shape,
                               cudaStream_t stream) {
  if (shape.batch < 1 || shape.batch > 65535 || shape.heads < 1 || shape.keys < 1 ||
      shape.splits < 1 || shape.splits > 65535 || shape.chunk % kMlaRoundKeys != 0 ||
      shape.cache_stride_b % 8 != 0 || shape.cache_stride_t % 8 != 0 ||
      (shape.splits > 1 && (partial_out == nullptr || partial_stats == nullptr))) {
    return cudaErrorInvalidValue;
  }
  // Once, before any capture (the engine's first step runs eagerly): shared memory past 48 KiB.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      MlaDecodeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMlaSmemBytes);
  if (opt_in != cudaSuccess) return opt_in;
  const dim3 grid(static_cast<unsigned>((shape.heads + kMlaHeads - 1) / kMlaHeads),
                  static_cast<unsigned>(shape.splits), static_cast<unsigned>(shape.batch));
  const cudaError_t attended =
      Launch(MlaDecodeKernel, grid, kMlaThreads, kMlaSmemBytes, stream, static_cast<const Bf16*>(q),
             static_cast<const Bf16*>(cache), position, indices, static_cast<Bf16*>(out),
             partial_out, partial_stats, shape);
  if (attended != cudaSuccess || shape.splits == 1) return attended;
  return Launch(MlaMergeSplitsKernel, static_cast<unsigned>(shape.batch * shape.heads), kMlaThreads,
                0, stream, static_cast<const float*>(partial_out),
                static_cast<const float*>(partial_stats), static_cast<Bf16*>(out), shape.splits);
}

}  // namespace rl::kernels
