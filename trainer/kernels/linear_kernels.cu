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


// Note [Shared-weight linear on tensor cores]
// From 33 to 64 rows the decode step's projections were cuBLAS's GEMMs (q/k/v, gate/up) and a
// batch of them over 4 slices of k (the o and down projections: Note [Split-k partial sums] in
// fused_ops.h). cuBLAS's kernels take no part in programmatic launch, so each starts only once
// the kernel ahead has ended, streams its weights from then on, and the kernel behind starts only
// once it has ended. This kernel gives each block kTiles 8 features (of one slice of k), few
// enough that the grid is at most a block per SM, and has its weights copied into shared memory
// by bulk copies (one a feature, on an mbarrier) before its wait (Note [Programmatic dependent
// launch] in kernel_util.cuh): they stream in while the kernel ahead runs. Once that kernel has
// ended, the block copies its whole slice of x [rows, slice] (which every block reads, from the
// L2) into shared memory as well: warp (r, s) of its kMmaLinearRowWarps x kMmaLinearSplits warps
// copies and sums rows [16 r, 16 r + 16) over the s-th quarter of the slice, in
// kMmaLinearGroups groups of copies that it waits for one by one, so that no barrier of the
// block stands between the copies and the sums:
//   Y [16 rows, 8 features] += X [16 rows, 16 dims] W^T [16 dims, 8 features]
// by m16n8k16 mmas (bf16 inputs, fp32 sums), A and B by ldmatrix (rows padded by kMmaLinearPad
// elements, so that ldmatrix's 8 rows fall in distinct banks). The quarters' sums meet in shared
// memory and are added in order. Each row's sums go in the same order whatever the other rows
// hold: the same inputs give the same bits (graph replays equal eager steps), which differ from
// cuBLAS's by the order of the fp32 sums. The output is y (rounded once, with the bias), or the
// fp32 partial sums [slices, rows, n_out] of SplitKPartials, slice blockIdx.y covering k
// [slice y, slice (y + 1)).
constexpr int kMmaLinearRowWarps = 4;  // a warp per 16 rows
constexpr int kMmaLinearSplits = 4;    // warps per 16 rows, each a quarter of the slice
constexpr int kMmaLinearWarps = kMmaLinearRowWarps * kMmaLinearSplits;
constexpr int kMmaLinearRows = 16 * kMmaLinearRowWarps;  // 64
constexpr int kMmaLinearGroups = 4;  // groups of a warp's copies of x, waited for in turn
// A slice is a whole number of groups of k16 steps for each split.
constexpr int kMmaLinearSliceMultiple = 16 * kMmaLinearSplits * kMmaLinearGroups;
constexpr int kMmaLinearPad = 8;

// Shared bytes of a block of `features` features over a slice of k: x's rows, then the weights.
int64_t MmaLinearSharedBytes(int64_t features, int64_t slice) {
  return (kMmaLinearRows + features) * (slice + kMmaLinearPad) *
         static_cast<int64_t>(sizeof(Bf16));
}

template <int kTiles>
__global__ void __launch_bounds__(kMmaLinearWarps * 32)
    SharedWeightMmaKernel(const Bf16* __restrict__ x, const Bf16* __restrict__ w,
                          const Bf16* __restrict__ bias, Bf16* __restrict__ y,
                          float* __restrict__ partials, int64_t rows, int64_t n_out, int64_t k_in,
                          int slice) {
  static_assert(kTiles % 2 == 0, "ldmatrix .x4 loads the B operands of two tiles at once");
  constexpr int kFeatures = 8 * kTiles;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  __shared__ uint64_t weights_landed;
  // [kMmaLinearRows][slice + pad] x, then [kFeatures][slice + pad] w.
  const int row_elements = slice + kMmaLinearPad;
  Bf16* staged_x = reinterpret_cast<Bf16*>(shared_bytes);
  Bf16* weights = staged_x + kMmaLinearRows * row_elements;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kFeatures;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * slice;
  // The weights, before the kernel ahead has finished: a bulk copy a feature (features past
  // n_out copy the last one), issued by the first warp's lanes, all counted by one barrier.
  if (warp == 0) {
    if (lane == 0) {
      InitBarrier(&weights_landed);
      ArriveExpectingBytes(&weights_landed, kFeatures * slice * sizeof(Bf16));
    }
    __syncwarp();
    for (int f = lane; f < kFeatures; f += 32) {
      const int64_t feature = first + f < n_out ? first + f : n_out - 1;
      BulkCopy(weights + f * row_elements, w + feature * k_in + k0, slice * sizeof(Bf16),
               &weights_landed);
    }
  }
  __syncthreads();  // the barrier's initialisation, for every thread that waits on it
  PrecedingKernelsDone();
  // Warp (row_warp, split): rows [16 row_warp, + 16), dims [split quarter, + quarter) of the
  // slice; rows past `rows` copy the last row (never written out).
  const int row_warp = warp % kMmaLinearRowWarps;
  const int split = warp / kMmaLinearRowWarps;
  const int first_row = 16 * row_warp;
  const int quarter = slice / kMmaLinearSplits;
  const int group_dims = quarter / kMmaLinearGroups;
  const int begin = split * quarter;
  const bool has_rows = first_row < rows;  // the same for the whole warp
  if (has_rows) {
    const int group_pieces = 16 * group_dims / 8;  // 16-byte pieces of a group
    for (int group = 0; group < kMmaLinearGroups; ++group) {
      for (int i = lane; i < group_pieces; i += 32) {
        const int r = i / (group_dims / 8);
        const int dim = begin + group * group_dims + 8 * (i % (group_dims / 8));
        const int64_t row = first_row + r < rows ? first_row + r : rows - 1;
        CopyAsync<16>(staged_x + (first_row + r) * row_elements + dim, x + row * k_in + k0 + dim);
      }
      CommitCopies();
    }
  }
  // acc[j]: (row g, feature 8 j + 2t), (g, 8 j + 2t + 1), (g + 8, 8 j + 2t), (g + 8, 8 j + 2t + 1)
  // of the warp's 16 rows. ldmatrix addresses (shared, in bytes): A (x) lane l -> row l % 16,
  // dims 8 (l / 16) of a step; B (w) lane l -> feature l % 8 + 8 (l / 16) of a pair of tiles,
  // dims 8 ((l / 8) % 2).
  float acc[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  if (has_rows) {
    const uint32_t a_base = SharedAddress(staged_x + (first_row + lane % 16) * row_elements +
                                          begin + 8 * (lane / 16));
    const uint32_t b_base = SharedAddress(weights + (lane % 8 + 8 * (lane / 16)) * row_elements +
                                          begin + 8 * ((lane / 8) % 2));
    const uint32_t pair_bytes = 16 * row_elements * sizeof(Bf16);
    WaitBarrier(&weights_landed, 0);
    const int group_steps = group_dims / 16;
    for (int group = 0; group < kMmaLinearGroups; ++group) {
      // This lane's copies of the group have landed; __syncwarp shows the warp's.
      switch (group) {
        case 0:
          asm volatile("cp.async.wait_group 3;\n" ::: "memory");
          break;
        case 1:
          asm volatile("cp.async.wait_group 2;\n" ::: "memory");
          break;
        case 2:
          asm volatile("cp.async.wait_group 1;\n" ::: "memory");
          break;
        default:
          asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      }
      __syncwarp();
      for (int step = group * group_steps; step < (group + 1) * group_steps; ++step) {
        uint32_t a[4];
        LoadMatrices(a, a_base + 32 * step);
#pragma unroll
        for (int j = 0; j < kTiles; j += 2) {
          uint32_t b[4];
          LoadMatrices(b, b_base + (j / 2) * pair_bytes + 32 * step);
          Mma16816(acc[j], a, b[0], b[1]);
          Mma16816(acc[j + 1], a, b[2], b[3]);
        }
      }
    }
  }
  static_assert(kMmaLinearGroups == 4, "the waits above count 4 groups");
  // The quarters' sums meet in shared memory (x and the weights are done with), lane-minor:
  // [split][row_warp][j][e][lane], and are added in split order.
  __syncthreads();
  float* sums = reinterpret_cast<float*>(shared_bytes);
  constexpr int kPerWarp = kTiles * 4 * 32;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sums[warp * kPerWarp + (j * 4 + e) * 32 + lane] = acc[j][e];
  }
  __syncthreads();
  if (split != 0 || !has_rows) return;
  const int g = lane / 4;
  const int t = lane % 4;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kMmaLinearSplits; ++s) {
        sum += sums[(s * kMmaLinearRowWarps + row_warp) * kPerWarp + (j * 4 + e) * 32 + lane];
      }
      const int64_t row = first_row + g + (e >= 2 ? 8 : 0);
      const int64_t feature = first + 8 * j + 2 * t + (e & 1);
      if (row >= rows || feature >= n_out) continue;
      if (partials != nullptr) {
        partials[(blockIdx.y * rows + row) * n_out + feature] = sum;
      } else {
        const float b = bias != nullptr ? __bfloat162float(bias[feature]) : 0.0f;
        y[row * n_out + feature] = __float2bfloat16_rn(sum + b);
      }
    }
  }
}

// Of a block's shared memory, what SharedWeightMmaKernel's static arrays (its barriers) may take.
constexpr int64_t kMmaLinearStaticBytes = 1024;

// The device's opt-in shared memory a block (0 where it cannot be read), read once.
int64_t OptInSharedBytes() {
  static const int64_t bytes = [] {
    int device = 0, per_block = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
      return int64_t{0};
    }
    return int64_t{per_block};
  }();
  return bytes;
}

// SharedWeightMmaKernel's tiles of 8 features a block: the fewest of 2, 4, 6 and 8 that keep the
// grid within a block per SM, or 0 where those do not, or their weights do not fit the block's
// shared memory.
int SharedWeightMmaTiles(int64_t n_out, int64_t slices, int64_t slice) {
  for (int tiles = 2; tiles <= 8; tiles += 2) {
    if ((n_out + 8 * tiles - 1) / (8 * tiles) * slices <= MultiprocessorCount()) {
      return MmaLinearSharedBytes(8 * tiles, slice) <= OptInSharedBytes() - kMmaLinearStaticBytes
                 ? tiles
                 : 0;
    }
  }
  return 0;
}

template <int kTiles>
cudaError_t LaunchSharedWeightMma(const void* x, const void* w, const void* bias, void* y,
                                  float* partials, int64_t rows, int64_t n_out, int64_t k_in,
                                  int64_t slices, cudaStream_t stream) {
  const auto kernel = SharedWeightMmaKernel<kTiles>;
  // Once per kernel, before any capture (the engine's first step runs eagerly): the device's
  // opt-in shared memory but for the static arrays, and the SM's whole carveout as shared memory.
  static const cudaError_t opt_in = [&] {
    cudaError_t set = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(OptInSharedBytes() - kMmaLinearStaticBytes));
    if (set == cudaSuccess) {
      set = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    }
    return set;
  }();
  if (opt_in != cudaSuccess) return opt_in;
  const int64_t slice = k_in / slices;
  const dim3 grid(static_cast<unsigned>((n_out + 8 * kTiles - 1) / (8 * kTiles)),
                  static_cast<unsigned>(slices));
  return Launch(kernel, grid, kMmaLinearWarps * 32,
                static_cast<size_t>(MmaLinearSharedBytes(8 * kTiles, slice)), stream,
                static_cast<const Bf16*>(x), static_cast<const Bf16*>(w),
                static_cast<const Bf16*>(bias), static_cast<Bf16*>(y), partials, rows, n_out, k_in,
                static_cast<int>(slice));
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

namespace rl::kernels {

bool SharedWeightMmaFits(int64_t rows, int64_t n_out, int64_t k_in, int64_t slices) {
  return rows >= 1 && rows <= kMmaLinearRows && n_out >= 1 && slices >= 1 &&
         k_in % (slices * kMmaLinearSliceMultiple) == 0 &&
         SharedWeightMmaTiles(n_out, slices, k_in / slices) > 0;
}

cudaError_t SharedWeightMmaLinear(const void* x, const void* w, const void* bias, void* y,
                                  float* partials, int64_t rows, int64_t n_out, int64_t k_in,
                                  int64_t slices, cudaStream_t stream) {
  if (!SharedWeightMmaFits(rows, n_out, k_in, slices) || (partials == nullptr) == (y == nullptr) ||
      (partials != nullptr && bias != nullptr)) {
    return cudaErrorInvalidValue;
  }
  switch (SharedWeightMmaTiles(n_out, slices, k_in / slices)) {
    case 2:
      return LaunchSharedWeightMma<2>(x, w, bias, y, partials, rows, n_out, k_in, slices, stream);
    case 4:
      return LaunchSharedWeightMma<4>(x, w, bias, y, partials, rows, n_out, k_in, slices, stream);
    case 6:
      return LaunchSharedWeightMma<6>(x, w, bias, y, partials, rows, n_out, k_in, slices, stream);
    default:
      return LaunchSharedWeightMma<8>(x, w, bias, y, partials, rows, n_out, k_in, slices, stream);
  }
}

}  // namespace rl::kernels
