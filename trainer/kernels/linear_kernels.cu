// SkinnyLinear (cuda_kernels.h): a decode step's projection of 3 to 64 rows on tensor cores,
// reading the weight once.
//
// Note [Skinny linear kernel]
// A decode step of B rows multiplies each projection's weight [N, K] by B rows x [B, K]. Past 2
// rows (SmallLinear's range) the engine took cuBLAS, whose tiles suit large GEMMs: with B = 64 its
// four GEMMs of a Qwen3-0.6B layer read their 30 MB of weights at about 1.3 TB/s (the profile of
// docs/decode-performance.md), the weights being the whole cost (x is 128 KB).
// This kernel gives each block 16 output features, one m16 tile, and its kBlockWarps warps split K
// in pieces of 32 dims: warp w takes pieces w, w + kBlockWarps, w + 2 kBlockWarps, ..., loading
// kSkinnyChunk of them at once (16-byte vectors, straight from global memory into registers). Per
// piece and group of 8 rows of x, two m16n8k16 mmas (bf16 inputs, fp32 sums) add
//   Y^T [16 features, 8 rows] += W [16 features, 32 dims] X^T [32 dims, 8 rows],
// with the dims assigned to the mma's k-slots as in Note [DSA index scores kernel]: the lane with
// groupID g and threadID_in_group t loads dims 32 s + 8 t to + 8 of weight rows g and g + 8 (the
// A operand) and of x row 8 j + g (the B operand), and those eight dims stand for its k-slots
// {2t, 2t + 1, 2t + 8, 2t + 9} of mma 2s (the first four) and of mma 2s + 1 (the last four):
// every dim meets its own dim of x, so the products are those of the dot products, summed in
// another order. x, which every block reads, stays in the caches; rows past B read row B - 1
// again, and features past N the last feature, and neither is written. Every block reads all of
// x, B / 16 of the bytes of its weights. Measured on the H200, it beats cuBLAS only up to 32 rows
// of up to 2048 features, where the engine takes it (SkinnyLinearPays in fused_ops.h); two tiles
// a warp (x read once for 32 features) never helped and were dropped. The warps' partial sums
// meet in shared memory and are added in warp order, then rounded once (with the bias): the same
// inputs give the same bits (graph replays equal eager steps), which differ from cuBLAS's by the
// order of the fp32 sums. Under programmatic launch (Note [Programmatic dependent launch]) the
// first chunk (for K up to 128 kBlockWarps every weight vector of the warp) is loaded before the
// wait.
#include <cuda_bf16.h>

#include <cstdint>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

using Bf16 = __nv_bfloat16;

// Pieces of 32 dims a warp has in flight.
constexpr int kSkinnyChunk = 4;

template <int kGroups, int kBlockWarps>
__global__ void __launch_bounds__(kBlockWarps * 32)
    SkinnyLinearKernel(const Bf16* __restrict__ x, const Bf16* __restrict__ w,
                       const Bf16* __restrict__ bias, Bf16* __restrict__ y, int64_t rows,
                       int64_t n_out, int64_t k_in) {
  // The warps' sums, [warp][group][register][lane]: lane-minor, so the writes do not conflict
  // (up to 64 KiB: dynamic shared memory).
  extern __shared__ float partial[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int64_t first_feature = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t pieces = k_in / 32;
  const Bf16* w_rows[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t feature = first_feature + g + 8 * r;
    w_rows[r] = w + (feature < n_out ? feature : n_out - 1) * k_in + 8 * t;
  }
  // Chunk c: the pieces warp + kBlockWarps (kSkinnyChunk c + u), u < kSkinnyChunk, of this warp.
  uint4 weights[kSkinnyChunk][2];
  const auto load = [&](int64_t chunk) {
#pragma unroll
    for (int u = 0; u < kSkinnyChunk; ++u) {
      const int64_t s = warp + kBlockWarps * (kSkinnyChunk * chunk + u);
      if (s < pieces) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          weights[u][r] = *reinterpret_cast<const uint4*>(w_rows[r] + 32 * s);
        }
      }
    }
  };
  load(0);  // the weights: before the kernel ahead has finished, under programmatic launch
  PrecedingKernelsDone();
  const Bf16* x_rows[kGroups];
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    const int64_t row = 8 * j + g;
    x_rows[j] = x + (row < rows ? row : rows - 1) * k_in + 8 * t;
  }
  // acc[j]: (feature g, row 8j + 2t), (feature g, row 8j + 2t + 1), (g + 8, 8j + 2t),
  // (g + 8, 8j + 2t + 1).
  float acc[kGroups][4];
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  }
  for (int64_t chunk = 0; warp + kBlockWarps * kSkinnyChunk * chunk < pieces; ++chunk) {
    if (chunk > 0) load(chunk);
#pragma unroll
    for (int u = 0; u < kSkinnyChunk; ++u) {
      const int64_t s = warp + kBlockWarps * (kSkinnyChunk * chunk + u);
      if (s >= pieces) break;
      const uint4(&a)[2] = weights[u];
      const uint32_t even[4] = {a[0].x, a[1].x, a[0].y, a[1].y};
      const uint32_t odd[4] = {a[0].z, a[1].z, a[0].w, a[1].w};
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        const uint4 in = *reinterpret_cast<const uint4*>(x_rows[j] + 32 * s);
        Mma16816(acc[j], even, in.x, in.y);
        Mma16816(acc[j], odd, in.z, in.w);
      }
    }
  }
  constexpr int kPerWarp = kGroups * 128;  // sums a warp leaves in `partial`
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp * kPerWarp + (j * 4 + i) * 32 + lane] = acc[j][i];
  }
  __syncthreads();
  // Element e = (j 4 + i) 32 + l: lane l's register i of group j.
  for (int e = threadIdx.x; e < kPerWarp; e += kBlockWarps * 32) {
    const int j = e / 128;
    const int i = e / 32 % 4;
    const int l = e % 32;
    const int64_t feature = first_feature + l / 4 + (i >= 2 ? 8 : 0);
    const int64_t row = 8 * j + 2 * (l % 4) + (i & 1);
    if (feature >= n_out || row >= rows) continue;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kBlockWarps; ++v) sum += partial[v * kPerWarp + e];
    if (bias != nullptr) sum += __bfloat162float(bias[feature]);
    y[row * n_out + feature] = __float2bfloat16_rn(sum);
  }
}

template <int kGroups, int kBlockWarps>
cudaError_t LaunchSkinnyLinear(const void* x, const void* w, const void* bias, void* y,
                               int64_t rows, int64_t n_out, int64_t k_in, cudaStream_t stream) {
  const auto kernel = SkinnyLinearKernel<kGroups, kBlockWarps>;
  constexpr int kShared = kBlockWarps * kGroups * 128 * sizeof(float);
  // Once per kernel, before any capture (the engine's first step runs eagerly): shared memory
  // past the default 48 KiB.
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared);
  if (opt_in != cudaSuccess) return opt_in;
  const auto blocks = static_cast<unsigned>((n_out + 15) / 16);
  return Launch(kernel, blocks, kBlockWarps * 32, kShared, stream, static_cast<const Bf16*>(x),
                static_cast<const Bf16*>(w), static_cast<const Bf16*>(bias), static_cast<Bf16*>(y),
                rows, n_out, k_in);
}

// Warps per block: the fewest (of 4, 8 and 16) whose first chunks cover K (every weight vector
// in flight at once), else 16 (512 threads of about 100 registers, a block per SM).
template <int kGroups>
cudaError_t DispatchSkinnyWarps(const void* x, const void* w, const void* bias, void* y,
                                int64_t rows, int64_t n_out, int64_t k_in, cudaStream_t stream) {
  const int64_t pieces = k_in / 32;
  if (pieces <= 4 * kSkinnyChunk) {
    return LaunchSkinnyLinear<kGroups, 4>(x, w, bias, y, rows, n_out, k_in, stream);
  }
  if (pieces <= 8 * kSkinnyChunk) {
    return LaunchSkinnyLinear<kGroups, 8>(x, w, bias, y, rows, n_out, k_in, stream);
  }
  return LaunchSkinnyLinear<kGroups, 16>(x, w, bias, y, rows, n_out, k_in, stream);
}

}  // namespace

cudaError_t SkinnyLinear(const void* x, const void* w, const void* bias, void* y, int64_t rows,
                         int64_t n_out, int64_t k_in, cudaStream_t stream) {
  if (rows < 1 || rows > kSkinnyLinearMaxRows || k_in < 32 || k_in % 32 != 0 || n_out < 1 ||
      (n_out + 15) / 16 > 2147483647) {
    return cudaErrorInvalidValue;
  }
  if (rows <= 8) return DispatchSkinnyWarps<1>(x, w, bias, y, rows, n_out, k_in, stream);
  if (rows <= 16) return DispatchSkinnyWarps<2>(x, w, bias, y, rows, n_out, k_in, stream);
  if (rows <= 32) return DispatchSkinnyWarps<4>(x, w, bias, y, rows, n_out, k_in, stream);
  return DispatchSkinnyWarps<8>(x, w, bias, y, rows, n_out, k_in, stream);
}

}  // namespace rl::kernels
