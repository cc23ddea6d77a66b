// DsaIndexScores (cuda_kernels.h): the DSA indexer's scores of every cached key for one decode
// position per row, in one kernel.
//
// Note [DSA index scores kernel]
// The indexer scores key t for the query of row b as
//   index[b, t] = sum_h w[b, h] relu(scale (q[b, h] . k[b, t])),
// with H = 32 heads of D = 128 dims in GLM-5, over every cached key (Note [DSA decode over the
// selected keys] in trainer/model/layers.cc); the top index_topk of them are attended. The
// LibTorch ops (IndexerTopk in layers.cc) copy the whole bf16 key cache to fp32, write the [B, H,
// T] products, scale them, apply the relu and reduce them over the heads by a second GEMM: about
// 2 KB of memory traffic per key and row where the keys themselves are 256 bytes. This kernel
// reads each key once and writes one fp32 score.
//
// A warp takes tiles of 16 keys. Per tile and group of 8 heads, the products are a tensor-core
// mma (m16n8k16, bf16 inputs, fp32 sums) per 16 dims: S [16 keys, 8 heads] = K Q^T. The inputs
// are bf16 in the ops too (the query and the keys come from bf16 tensors and the ops only widen
// them), so the products are exact and only the order of the fp32 sums differs. The dims are
// assigned to the mma's k-slots so that each lane loads whole 16-byte pieces from global memory,
// no shared memory: in the mma pair (2s, 2s + 1), the lane with threadID_in_group t holds k-slots
// {2t, 2t + 1, 2t + 8, 2t + 9} of rows g and g + 8 of K (and of column g of Q^T), and those slots
// stand for dims 32 s + 8 t + {0, 1, 2, 3} in mma 2s and + {4, 5, 6, 7} in mma 2s + 1: one
// 16-byte load per row and pair, of dims 32 s + 8 t to + 8, gives both mmas' registers. Every dim
// meets its own dim of the query once, so the dot products are unchanged up to the order of sums.
// Each lane then has the scores of keys g and g + 8 for heads 8 j + 2t and 8 j + 2t + 1: it
// scales them, applies the relu, weights and adds them over its heads, and the 4 lanes of a key
// add theirs by 2 shuffles: a fixed order, so graphs and eager steps agree. Keys past the row's
// position score -inf, as the ops' mask gives them. A NaN product (a corrupt visible cache row)
// counts as 0 here (fmaxf), where at::relu keeps it and topk ranks it first: the kernel hides a
// NaN the ops would select.
#include <cuda_bf16.h>
#include <math_constants.h>

#include <cstdint>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

constexpr int kIndexWarps = 4;        // warps per block
constexpr int kIndexTileKeys = 16;    // keys per mma tile
constexpr int kIndexBlocksPerSm = 8;  // blocks per SM the grid aims at (rows x splits)

template <int kDim, int kHeads>
__global__ void __launch_bounds__(kIndexWarps * 32)
    DsaIndexScoresKernel(const __nv_bfloat16* __restrict__ q, const float* __restrict__ weights,
                         const __nv_bfloat16* __restrict__ keys,
                         const int64_t* __restrict__ position, float* __restrict__ out,
                         DsaIndexShape p) {
  static_assert(kDim % 32 == 0 && kHeads % 8 == 0, "dims in pieces of 32, heads in groups of 8");
  constexpr int kPieces = kDim / 32;  // 16-byte pieces a lane loads per key row (mma pairs)
  constexpr int kGroups = kHeads / 8;
  PrecedingKernelsDone();
  const int64_t b = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int64_t pos = position[b * p.position_stride];
  const int64_t visible = pos + 1 < p.key_length ? pos + 1 : p.key_length;  // keys [0, visible)
  // Q^T's registers: head 8 j + g, dims 32 s + 8 t to + 8 (Note [DSA index scores kernel]).
  uint4 query[kGroups][kPieces];
  float weight[kGroups][2];  // heads 8 j + 2 t and 8 j + 2 t + 1
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    const __nv_bfloat16* head = q + (b * kHeads + 8 * j + g) * kDim + 8 * t;
#pragma unroll
    for (int s = 0; s < kPieces; ++s) query[j][s] = *reinterpret_cast<const uint4*>(head + 32 * s);
    weight[j][0] = weights[b * kHeads + 8 * j + 2 * t];
    weight[j][1] = weights[b * kHeads + 8 * j + 2 * t + 1];
  }
  const __nv_bfloat16* row_keys = keys + b * p.key_stride_b + 8 * t;
  float* row_out = out + b * p.out_stride;
  const int64_t tiles = (p.key_length + kIndexTileKeys - 1) / kIndexTileKeys;
  for (int64_t tile = static_cast<int64_t>(blockIdx.x) * kIndexWarps + warp; tile < tiles;
       tile += static_cast<int64_t>(gridDim.x) * kIndexWarps) {
    const int64_t t0 = tile * kIndexTileKeys;
    const int64_t key[2] = {t0 + g, t0 + g + 8};
    float index[2] = {0.0f, 0.0f};
    if (t0 < visible) {  // else every key of the tile is past the position
      // Rows past the last visible key load that key again (their scores are dropped).
      uint4 k[2][kPieces];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = key[r] < visible ? key[r] : visible - 1;
#pragma unroll
        for (int s = 0; s < kPieces; ++s) {
          k[r][s] = *reinterpret_cast<const uint4*>(row_keys + row * p.key_stride_t + 32 * s);
        }
      }
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        // scores: (key g, head 8j + 2t), (key g, 8j + 2t + 1), (key g + 8, 8j + 2t), (g + 8, +1).
        float scores[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < kPieces; ++s) {
          const uint32_t even[4] = {k[0][s].x, k[1][s].x, k[0][s].y, k[1][s].y};
          Mma16816(scores, even, query[j][s].x, query[j][s].y);
          const uint32_t odd[4] = {k[0][s].z, k[1][s].z, k[0][s].w, k[1][s].w};
          Mma16816(scores, odd, query[j][s].z, query[j][s].w);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          index[r] += weight[j][0] * fmaxf(scores[2 * r] * p.scale, 0.0f) +
                      weight[j][1] * fmaxf(scores[2 * r + 1] * p.scale, 0.0f);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      index[r] += __shfl_xor_sync(0xffffffff, index[r], 1);
      index[r] += __shfl_xor_sync(0xffffffff, index[r], 2);
      if (t == 0 && key[r] < p.key_length) {
        row_out[key[r]] = key[r] < visible ? index[r] : -CUDART_INF_F;
      }
    }
  }
}

template <int kDim, int kHeads>
cudaError_t LaunchDsaIndexScores(const void* q, const float* weights, const void* keys,
                                 const int64_t* position, float* out, const DsaIndexShape& p,
                                 cudaStream_t stream) {
  const int64_t tiles = (p.key_length + kIndexTileKeys - 1) / kIndexTileKeys;
  const int64_t per_row =
      (kIndexBlocksPerSm * static_cast<int64_t>(MultiprocessorCount()) + p.batch - 1) / p.batch;
  const int64_t wanted = (tiles + kIndexWarps - 1) / kIndexWarps;
  const dim3 grid(static_cast<unsigned>(wanted < per_row ? wanted : per_row),
                  static_cast<unsigned>(p.batch));
  return Launch(DsaIndexScoresKernel<kDim, kHeads>, grid, kIndexWarps * 32, 0, stream,
                static_cast<const __nv_bfloat16*>(q), weights,
                static_cast<const __nv_bfloat16*>(keys), position, out, p);
}

}  // namespace

bool DsaIndexScoresSupports(int64_t heads, int64_t dim) {
  return (dim == 64 || dim == 128) && (heads == 8 || heads == 16 || heads == 32);
}

cudaError_t DsaIndexScores(const void* q, const float* weights, const void* keys,
                           const int64_t* position, float* out, const DsaIndexShape& shape,
                           cudaStream_t stream) {
  if (!DsaIndexScoresSupports(shape.heads, shape.dim) || shape.batch < 1 || shape.batch > 65535 ||
      shape.key_length < 1 || shape.key_stride_t % 8 != 0 || shape.key_stride_b % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  const auto launch = [&](auto kernel) {
    return kernel(q, weights, keys, position, out, shape, stream);
  };
  if (shape.dim == 128) {
    if (shape.heads == 32) return launch(LaunchDsaIndexScores<128, 32>);
    if (shape.heads == 16) return launch(LaunchDsaIndexScores<128, 16>);
    return launch(LaunchDsaIndexScores<128, 8>);
  }
  if (shape.heads == 32) return launch(LaunchDsaIndexScores<64, 32>);
  if (shape.heads == 16) return launch(LaunchDsaIndexScores<64, 16>);
  return launch(LaunchDsaIndexScores<64, 8>);
}

}  // namespace rl::kernels
