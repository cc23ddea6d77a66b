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

#include <algorithm>
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

// Note [Split-k linear kernel]
// From 33 to 64 rows cuBLAS keeps the decode step's projections (SkinnyLinear reads all of x per
// 16 features, 32 MB of L2 reads for Qwen3-0.6B's q/k/v at 64 rows), and cuBLAS's kernels take
// no part in programmatic launch: each reads its weights only once the kernel ahead has ended,
// and its own start ends the chain of the kernels behind it (docs/decode-performance.md: 5.5 to
// 7.6 us a GEMM at 64 rows on an H100, from HBM or from the L2 alike). SplitKLinearKernel gives a
// block kTiles tiles of 16 output features and one of `splits` slices of K (`chunk` dims), sized
// so that the grid is at most a block per SM:
//   - before the wait its slice of the weights [16 kTiles, chunk] goes to shared memory by
//     cp.async (the weights do not depend on the kernel ahead), after it x's rows [64, chunk];
//   - warp w takes feature tile w % kTiles and half w / kTiles of the chunk, and per piece of 32
//     dims adds two m16n8k16 mmas per 8 rows, Y^T += W X^T, with the lane's dims assigned to the
//     mma's k-slots as in Note [Skinny linear kernel] (rows past `rows` read the last row and are
//     not written);
//   - the second half's sums are added to the first's in shared memory, then, with one slice,
//     rounded once (with the bias) and written; with several, written as fp32 to `partial`,
//     and the last block of the feature tile to finish (a counter per tile, set back to 0 by it)
//     adds the slices in slice order, then rounds and writes.
// Every sum has a fixed order: the same inputs give the same bits (graph replays equal eager
// steps), which differ from cuBLAS's by the order of the fp32 sums.
// An mbarrier in shared memory for one arrival (the thread that announces the bytes), visible to
// the block's threads and the SM's bulk copies once the block has passed a barrier after it.
__device__ __forceinline__ void InitBarrier(uint64_t* barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(SharedAddress(barrier)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The arrival, announcing the bytes the copies counted on `barrier` will bring.
__device__ __forceinline__ void ExpectBytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SharedAddress(barrier)),
      "r"(bytes)
      : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the
// SM's copy engine, counted on `barrier`.
__device__ __forceinline__ void BulkCopy(void* shared, const void* global, uint32_t bytes,
                                         uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(SharedAddress(shared)),
      "l"(global), "r"(bytes), "r"(SharedAddress(barrier))
      : "memory");
}
// Until the phase `parity` of `barrier` has completed (every announced byte landed).
__device__ __forceinline__ void WaitBarrier(uint64_t* barrier, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SharedAddress(barrier)),
      "r"(parity)
      : "memory");
}

constexpr int kSplitRows = 64;  // x's rows a block stages (fewer are read again)
constexpr int kSplitPad = 8;    // elements after each staged row: rows 16 bytes apart in banks
constexpr int64_t kMaxSplitTiles = 1 << 14;
__device__ unsigned int g_splitk_counters[2 * kMaxSplitTiles];

template <int kTiles>
__global__ void __launch_bounds__(kTiles * 64)
    SplitKLinearKernel(const Bf16* __restrict__ x, const Bf16* __restrict__ w,
                       const Bf16* __restrict__ bias, Bf16* __restrict__ y,
                       float* __restrict__ partial, int64_t rows, int64_t n_out, int64_t k_in,
                       int64_t chunk, int splits) {
  constexpr int kFeatures = 16 * kTiles;
  constexpr int kThreadsHere = kTiles * 64;
  extern __shared__ __align__(16) unsigned char split_bytes[];
  const int64_t pitch = chunk + kSplitPad;
  Bf16* const w_tile = reinterpret_cast<Bf16*>(split_bytes);  // [kFeatures][pitch]
  Bf16* const x_tile = w_tile + kFeatures * pitch;            // [kSplitRows][pitch]
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int64_t group = blockIdx.x;  // the block's kFeatures features
  const int split = blockIdx.y;
  const int64_t first_feature = group * kFeatures;
  const int64_t k0 = split * chunk;
  // The tiles by the SM's bulk copies, a row each, counted on two mbarriers: per-thread cp.async
  // of 16 bytes left an SM of one block far from its share of the bandwidth.
  __shared__ __align__(8) uint64_t landed[2];  // the weights, x
  const auto row_bytes = static_cast<uint32_t>(chunk * sizeof(Bf16));
  if (threadIdx.x == 0) {
    InitBarrier(&landed[0]);
    InitBarrier(&landed[1]);
  }
  __syncthreads();
  // The weights, by warp 0: before the kernel ahead has finished, under programmatic launch.
  if (warp == 0) {
    if (lane == 0) ExpectBytes(&landed[0], row_bytes * kFeatures);
    __syncwarp();
    for (int f = lane; f < kFeatures; f += 32) {
      const int64_t feature = first_feature + f < n_out ? first_feature + f : n_out - 1;
      BulkCopy(w_tile + f * pitch, w + feature * k_in + k0, row_bytes, &landed[0]);
    }
  }
  PrecedingKernelsDone();
  if (warp == 0) {
    if (lane == 0) ExpectBytes(&landed[1], row_bytes * kSplitRows);
    __syncwarp();
    for (int r = lane; r < kSplitRows; r += 32) {
      const int64_t row = r < rows ? r : rows - 1;
      BulkCopy(x_tile + r * pitch, x + row * k_in + k0, row_bytes, &landed[1]);
    }
  }
  WaitBarrier(&landed[0], 0);
  WaitBarrier(&landed[1], 0);
  const int tile = warp % kTiles;
  const int half = warp / kTiles;
  const int64_t span = chunk / 2;  // dims of a half
  const Bf16* a_rows[2] = {w_tile + (16 * tile + g) * pitch + half * span + 8 * t,
                           w_tile + (16 * tile + g + 8) * pitch + half * span + 8 * t};
  // acc[j]: (feature g, row 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1).
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  }
#pragma unroll 4
  for (int64_t s = 0; s < span / 32; ++s) {
    const uint4 a0 = *reinterpret_cast<const uint4*>(a_rows[0] + 32 * s);
    const uint4 a1 = *reinterpret_cast<const uint4*>(a_rows[1] + 32 * s);
    const uint32_t even[4] = {a0.x, a1.x, a0.y, a1.y};
    const uint32_t odd[4] = {a0.z, a1.z, a0.w, a1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint4 in = *reinterpret_cast<const uint4*>(x_tile + (8 * j + g) * pitch + half * span +
                                                       8 * t + 32 * s);
      Mma16816(acc[j], even, in.x, in.y);
      Mma16816(acc[j], odd, in.z, in.w);
    }
  }
  // The halves meet in shared memory (the staged tiles are read no more), lane-minor:
  // element (tile, j, i, lane) at ((tile 8 + j) 4 + i) 32 + lane.
  float* const sums = reinterpret_cast<float*>(split_bytes);
  __syncthreads();
  if (half == 1) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) sums[((tile * 8 + j) * 4 + i) * 32 + lane] = acc[j][i];
    }
  }
  __syncthreads();
  const auto feature_of = [&](int e) {
    return first_feature + 16 * (e / 1024) + (e % 32) / 4 + (e / 32 % 4 >= 2 ? 8 : 0);
  };
  const auto row_of = [&](int e) { return 8 * (e / 128 % 8) + 2 * (e % 4) + (e / 32 % 2); };
  const auto store = [&](int64_t feature, int64_t row, float sum) {
    if (bias != nullptr) sum += __bfloat162float(bias[feature]);
    y[row * n_out + feature] = __float2bfloat16_rn(sum);
  };
  constexpr int kElements = kTiles * 1024;  // the block's sums
  float* const mine = partial + (group * splits + split) * static_cast<int64_t>(kElements);
  if (half == 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = ((tile * 8 + j) * 4 + i) * 32 + lane;
        const float sum = acc[j][i] + sums[e];
        if (splits == 1) {
          if (feature_of(e) < n_out && row_of(e) < rows) store(feature_of(e), row_of(e), sum);
        } else {
          mine[e] = sum;
        }
      }
    }
  }
  if (splits == 1) return;
  // The group's blocks meet (all resident: the grid has at most a block per SM, and the kernel
  // behind starts only once every block has passed PrecedingKernelsDone); block `split` then
  // adds the slices of its share of the sums in slice order. The last block to leave sets the
  // group's two counts back to 0.
  unsigned* const counts = g_splitk_counters + 2 * group;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(&counts[0], 1u);
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(counts) : "memory");
    } while (seen < static_cast<unsigned>(splits));
    __threadfence();
  }
  __syncthreads();
  const float* slices = partial + group * splits * static_cast<int64_t>(kElements);
  const int share = kElements / splits;
  for (int e = split * share + threadIdx.x; e < (split + 1) * share; e += kThreadsHere) {
    if (feature_of(e) >= n_out || row_of(e) >= rows) continue;
    float sum = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s)
      sum += __ldcg(slices + s * static_cast<int64_t>(kElements) + e);
    store(feature_of(e), row_of(e), sum);
  }
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(&counts[1], 1u) == static_cast<unsigned>(splits - 1)) {
    counts[0] = 0;
    counts[1] = 0;
  }
}

template <int kTiles>
cudaError_t LaunchSplitKLinear(const void* x, const void* w, const void* bias, void* y,
                               float* partial, int64_t rows, int64_t n_out, int64_t k_in,
                               const SplitKPlan& plan, cudaStream_t stream) {
  const auto kernel = SplitKLinearKernel<kTiles>;
  // Once per kernel, before any capture (the engine's first step runs eagerly): shared memory
  // up to kSplitKMaxSharedBytes.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSplitKMaxSharedBytes));
  if (opt_in != cudaSuccess) return opt_in;
  const dim3 grid(static_cast<unsigned>((n_out + 16 * kTiles - 1) / (16 * kTiles)),
                  static_cast<unsigned>(plan.splits));
  return Launch(kernel, grid, kTiles * 64, static_cast<size_t>(plan.shared_bytes), stream,
                static_cast<const Bf16*>(x), static_cast<const Bf16*>(w),
                static_cast<const Bf16*>(bias), static_cast<Bf16*>(y), partial, rows, n_out, k_in,
                k_in / plan.splits, plan.splits);
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

SplitKPlan PlanSplitKLinear(int64_t rows, int64_t n_out, int64_t k_in) {
  // Of 4, 6 and 8 feature tiles a block and 1 to 8 slices of K: the grid with the most blocks up
  // to one per SM, each slice a multiple of 64 dims, the block's weights and x within
  // kSplitKMaxSharedBytes; on a tie the fewer tiles.
  SplitKPlan best;
  if (rows < 1 || rows > kSplitKLinearMaxRows || n_out < 1 || k_in < 64) return best;
  const int64_t sms = MultiprocessorCount();
  int64_t best_blocks = 0;
  for (const int tiles : {4, 6, 8}) {
    const int64_t groups = (n_out + 16 * tiles - 1) / (16 * tiles);
    if (groups > kMaxSplitTiles) continue;
    for (int splits = 1; splits <= 8; splits *= 2) {
      const int64_t blocks = groups * splits;
      if (k_in % (64 * splits) != 0 || blocks > sms) continue;
      const int64_t bytes = (16 * tiles + kSplitRows) * (k_in / splits + kSplitPad) * 2;
      // The halves' sums reuse the staged tiles: at least 4 KiB a feature tile.
      const int64_t shared = std::max<int64_t>(bytes, int64_t{4096} * tiles);
      if (shared > kSplitKMaxSharedBytes || blocks <= best_blocks) continue;
      best_blocks = blocks;
      best = SplitKPlan{tiles, splits, shared};
    }
  }
  return best;
}

cudaError_t SplitKLinear(const void* x, const void* w, const void* bias, void* y, float* partial,
                         int64_t rows, int64_t n_out, int64_t k_in, cudaStream_t stream) {
  const SplitKPlan plan = PlanSplitKLinear(rows, n_out, k_in);
  switch (plan.tiles) {
    case 4:
      return LaunchSplitKLinear<4>(x, w, bias, y, partial, rows, n_out, k_in, plan, stream);
    case 6:
      return LaunchSplitKLinear<6>(x, w, bias, y, partial, rows, n_out, k_in, plan, stream);
    case 8:
      return LaunchSplitKLinear<8>(x, w, bias, y, partial, rows, n_out, k_in, plan, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace rl::kernels
