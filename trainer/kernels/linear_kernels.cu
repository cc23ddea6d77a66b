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
//
// Note [Cluster linear kernel]
// Past 32 rows, or past 2048 features, SkinnyLinear lost to cuBLAS: each of its blocks of 16
// features reads every row of x, so at 64 rows it reads x from L2 four times for each byte of
// weights. ClusterLinear (17 to 64 rows) gives a block F = 64 or 128 features (16 a warp) and
// splits k over a cluster of S blocks (S = 1, 2, 4 or 8), so that the grid is one to two blocks
// per SM and every block holds its whole slice of k (K / S dims, in chunks of 64) of the
// weights and of x in shared memory at once, F x K / S and 64 x K / S bf16 of at most
// kClusterLinearMaxSharedBytes: every byte the block needs is in flight from its start. A block
// issues the copies (cp.async, 16 bytes each, a commit group per chunk) of its weights before
// PrecedingKernelsDone(), so under programmatic launch they stream in while the kernel ahead
// finishes, then those of x after it; it computes chunk c as soon as that chunk has landed. Rows
// are 128 bytes a chunk, their 16-byte pieces swizzled (piece p of row r at p ^ (r % 8)) so that
// the ldmatrix reads (8 rows at one piece) hit distinct banks. Per 16 dims a warp loads its A
// operand (16 features) with one ldmatrix.x4, then per pair of 8-row groups of x the B operands
// with another, and issues m16n8k16 mmas (bf16 inputs, fp32 sums) into [16 features, 64 rows].
// The S blocks' partial sums then meet over distributed shared memory: each block writes its
// [64 rows, F] fp32 tile to its shared memory, and after a cluster barrier block s adds, for
// rows s 64 / S to (s + 1) 64 / S, the S tiles in rank order, adds the bias and rounds once.
// So the sums run in one fixed order, k ascending within a block and the blocks in rank order:
// the same inputs give the same bits (graph replays equal eager steps). Rows past `rows` read
// row rows - 1 again and features past n_out the last feature, and neither is written. At
// Qwen3-0.6B's widths and 64 rows (132 SMs): q/k/v F 128, S 4 (128 blocks of 96 KiB); o F 64,
// S 8 (128 of 64 KiB); gate/up F 128, S 4 (192 of 96 KiB); down F 64, S 8 (128 of 96 KiB); the
// LM head would take thousands of blocks and stays cuBLAS's.
#include <cooperative_groups.h>
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

namespace {

// Dims of k per chunk (a copy group): 128 bytes of a row.
constexpr int kClusterChunk = 64;
// Chunks a block's slice may take (cp.async.wait_group counts at most 7 pending below).
constexpr int kClusterMaxChunks = 8;
// Blocks of a cluster: the portable limit.
constexpr int kClusterMaxSplit = 8;

// Waits until at most `pending` (0 to 7) of this thread's copy groups are in flight.
__device__ __forceinline__ void WaitCopies(int pending) {
  switch (pending) {
    case 0:
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      break;
    case 1:
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      break;
    case 2:
      asm volatile("cp.async.wait_group 2;\n" ::: "memory");
      break;
    case 3:
      asm volatile("cp.async.wait_group 3;\n" ::: "memory");
      break;
    case 4:
      asm volatile("cp.async.wait_group 4;\n" ::: "memory");
      break;
    case 5:
      asm volatile("cp.async.wait_group 5;\n" ::: "memory");
      break;
    case 6:
      asm volatile("cp.async.wait_group 6;\n" ::: "memory");
      break;
    default:
      asm volatile("cp.async.wait_group 7;\n" ::: "memory");
      break;
  }
}

// Byte offset of 16-byte piece `piece` (0 to 7) of row `row` in a chunk of 128-byte rows, swizzled.
__device__ __forceinline__ int ChunkOffset(int row, int piece) {
  return row * 128 + (piece ^ (row % 8)) * 16;
}

// y [rows, n_out] = x w^T + bias for the features of cluster blockIdx.x / split and slice
// `rank` of k (chunks x 64 dims), as Note [Cluster linear kernel] lays out.
template <int kWarps, int kGroups>
__global__ void __launch_bounds__(kWarps * 32)
    ClusterLinearKernel(const Bf16* __restrict__ x, const Bf16* __restrict__ w,
                        const Bf16* __restrict__ bias, Bf16* __restrict__ y, int64_t rows,
                        int64_t n_out, int64_t k_in, int split, int chunks) {
  constexpr int kFeatures = 16 * kWarps;
  constexpr int kRows = 8 * kGroups;
  constexpr int kBlockThreads = 32 * kWarps;
  constexpr int kWeightChunk = kFeatures * 128;  // bytes of a chunk of weights
  constexpr int kInputChunk = kRows * 128;
  constexpr int kPartialStride = kFeatures + 4;  // floats a row of partial sums: no bank conflicts
  extern __shared__ __align__(16) unsigned char shared[];
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t first_feature = static_cast<int64_t>(blockIdx.x / split) * kFeatures;
  const int64_t first_dim = static_cast<int64_t>(rank) * chunks * kClusterChunk;
  unsigned char* weights = shared;                         // [chunks][kFeatures rows]
  unsigned char* inputs = shared + chunks * kWeightChunk;  // [chunks][kRows rows]
  for (int c = 0; c < chunks; ++c) {
    for (int i = threadIdx.x; i < kFeatures * 8; i += kBlockThreads) {
      const int64_t feature = min(first_feature + i / 8, n_out - 1);
      CopyAsync<16>(weights + c * kWeightChunk + ChunkOffset(i / 8, i % 8),
                    w + feature * k_in + first_dim + c * kClusterChunk + 8 * (i % 8));
    }
    CommitCopies();
  }
  PrecedingKernelsDone();
  for (int c = 0; c < chunks; ++c) {
    for (int i = threadIdx.x; i < kRows * 8; i += kBlockThreads) {
      const int64_t row = min(static_cast<int64_t>(i / 8), rows - 1);
      CopyAsync<16>(inputs + c * kInputChunk + ChunkOffset(i / 8, i % 8),
                    x + row * k_in + first_dim + c * kClusterChunk + 8 * (i % 8));
    }
    CommitCopies();
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int matrix = lane / 8;  // the ldmatrix matrix this lane gives a row address of
  const int row_in_matrix = lane % 8;
  // acc[j]: (feature g, row 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1)
  // of the warp's 16 features (Mma16816).
  float acc[kGroups][4];
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  }
  for (int c = 0; c < chunks; ++c) {
    // Chunk c's weights (group c) and inputs (group chunks + c) have landed when at most
    // chunks - 1 - c groups are pending; then every thread's copies have.
    WaitCopies(chunks - 1 - c);
    __syncthreads();
    const unsigned char* weight_chunk = weights + c * kWeightChunk;
    const unsigned char* input_chunk = inputs + c * kInputChunk;
#pragma unroll
    for (int s = 0; s < kClusterChunk / 16; ++s) {
      // A: matrices (features 0-7, dims 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
      uint32_t a[4];
      LoadMatrices(a,
                   weight_chunk + ChunkOffset(16 * warp + row_in_matrix + 8 * (matrix % 2),
                                              2 * s + matrix / 2),
                   false);
#pragma unroll
      for (int p = 0; p < kGroups / 2; ++p) {
        // B of groups 2p and 2p + 1: matrices (rows 16p + 0-7, dims 0-7), (the same rows,
        // dims 8-15), (rows 16p + 8-15, dims 0-7), (those rows, dims 8-15).
        uint32_t b[4];
        LoadMatrices(b,
                     input_chunk +
                         ChunkOffset(16 * p + row_in_matrix + 8 * (matrix / 2), 2 * s + matrix % 2),
                     false);
        Mma16816(acc[2 * p], a, b[0], b[1]);
        Mma16816(acc[2 * p + 1], a, b[2], b[3]);
      }
    }
  }
  __syncthreads();  // every warp has read its last chunk: the partial sums take their place
  float* partial = reinterpret_cast<float*>(shared);  // [kRows][kPartialStride]
  {
    const int feature = 16 * warp + lane / 4;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int row = 8 * j + 2 * (lane % 4);
      partial[row * kPartialStride + feature] = acc[j][0];
      partial[(row + 1) * kPartialStride + feature] = acc[j][1];
      partial[row * kPartialStride + feature + 8] = acc[j][2];
      partial[(row + 1) * kPartialStride + feature + 8] = acc[j][3];
    }
  }
  cluster.sync();  // every block's partial sums are written
  const int rows_per_rank = kRows / split;
  constexpr int kQuads = kFeatures / 4;
  for (int e = threadIdx.x; e < rows_per_rank * kQuads; e += kBlockThreads) {
    const int row = rank * rows_per_rank + e / kQuads;
    const int quad = 4 * (e % kQuads);
    if (row >= rows) continue;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int q = 0; q < split; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(
          cluster.map_shared_rank(partial + row * kPartialStride + quad, q));
      sum[0] += v.x;
      sum[1] += v.y;
      sum[2] += v.z;
      sum[3] += v.w;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t feature = first_feature + quad + u;
      if (feature >= n_out) break;
      const float out = bias != nullptr ? sum[u] + __bfloat162float(bias[feature]) : sum[u];
      y[row * n_out + feature] = __float2bfloat16_rn(out);
    }
  }
  cluster.sync();  // no block leaves while another reads its partial sums
}

// The shared memory a ClusterLinearKernel block may take: kClusterLinearMaxSharedBytes, or less
// where the device gives a block less or an SM less than two such blocks.
int64_t ClusterSharedCap() {
  return std::min(kClusterLinearMaxSharedBytes, SharedBytesForTwoBlocks());
}

// A shape's launch: features per block 16 warps, blocks per cluster split, chunks of 64 dims
// per block, shared bytes; warps 0 where there is none.
struct ClusterLinearPlan {
  int warps = 0;
  int split = 0;
  int chunks = 0;
  int64_t shared = 0;
};

// The first of F = 128, then 64 features a block, and of S = 1, 2, 4, 8, whose grid fills at
// least 7/8 of the SMs and at most two blocks per SM, whose slices are whole chunks (at most
// kClusterMaxChunks), and whose block fits in the shared memory of two blocks an SM (and
// kClusterLinearMaxSharedBytes).
ClusterLinearPlan PlanClusterLinear(int64_t rows, int64_t n_out, int64_t k_in) {
  if (rows < kClusterLinearMinRows || rows > kSkinnyLinearMaxRows || n_out < 1 || k_in < 1) {
    return {};
  }
  const int64_t staged_rows = rows <= 32 ? 32 : 64;
  const int64_t sms = MultiprocessorCount();
  const int64_t cap = ClusterSharedCap();
  for (const int warps : {8, 4}) {
    const int64_t features = 16 * warps;
    const int64_t tiles = (n_out + features - 1) / features;
    for (int split = 1; split <= kClusterMaxSplit; split *= 2) {
      if (k_in % (int64_t{kClusterChunk} * split) != 0) break;
      const int64_t chunks = k_in / kClusterChunk / split;
      const int64_t blocks = tiles * split;
      const int64_t staging = (features + staged_rows) * chunks * 128;
      const int64_t partial = staged_rows * (features + 4) * 4;
      const int64_t shared = std::max(staging, partial);
      if (chunks <= kClusterMaxChunks && shared <= cap && 8 * blocks >= 7 * sms &&
          blocks <= 2 * sms) {
        return {warps, split, static_cast<int>(chunks), shared};
      }
    }
  }
  return {};
}

// Once per kernel, before any capture (the engine's first step runs eagerly): shared memory past
// the default 48 KiB, and the SM's whole carveout as shared memory. False where the device
// refused.
template <int kWarps, int kGroups>
bool ClusterKernelReady() {
  static const bool ready = [] {
    const auto kernel = ClusterLinearKernel<kWarps, kGroups>;
    const bool set = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(ClusterSharedCap())) == cudaSuccess &&
                     cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared) == cudaSuccess;
    if (!set) (void)cudaGetLastError();
    return set;
  }();
  return ready;
}

template <int kWarps, int kGroups>
cudaError_t LaunchClusterLinear(const ClusterLinearPlan& plan, const void* x, const void* w,
                                const void* bias, void* y, int64_t rows, int64_t n_out,
                                int64_t k_in, cudaStream_t stream) {
  const int64_t tiles = (n_out + 16 * kWarps - 1) / (16 * kWarps);
  return LaunchInClusters(static_cast<unsigned>(plan.split), ClusterLinearKernel<kWarps, kGroups>,
                          static_cast<unsigned>(tiles * plan.split), kWarps * 32, plan.shared,
                          stream, static_cast<const Bf16*>(x), static_cast<const Bf16*>(w),
                          static_cast<const Bf16*>(bias), static_cast<Bf16*>(y), rows, n_out, k_in,
                          plan.split, plan.chunks);
}

// The plan for the shape where it has one and its kernel is ready (warps 0 where not).
ClusterLinearPlan ReadyPlan(int64_t rows, int64_t n_out, int64_t k_in) {
  const ClusterLinearPlan plan = PlanClusterLinear(rows, n_out, k_in);
  const bool ready =
      plan.warps == 0 ? false
      : rows <= 32    ? (plan.warps == 8 ? ClusterKernelReady<8, 4>() : ClusterKernelReady<4, 4>())
                      : (plan.warps == 8 ? ClusterKernelReady<8, 8>() : ClusterKernelReady<4, 8>());
  return ready ? plan : ClusterLinearPlan{};
}

}  // namespace

bool ClusterLinearPlanned(int64_t rows, int64_t n_out, int64_t k_in) {
  return ReadyPlan(rows, n_out, k_in).warps > 0;
}

cudaError_t ClusterLinear(const void* x, const void* w, const void* bias, void* y, int64_t rows,
                          int64_t n_out, int64_t k_in, cudaStream_t stream) {
  const ClusterLinearPlan plan = ReadyPlan(rows, n_out, k_in);
  if (plan.warps == 0) return cudaErrorInvalidValue;
  const auto launch =
      rows <= 32 ? (plan.warps == 8 ? LaunchClusterLinear<8, 4> : LaunchClusterLinear<4, 4>)
                 : (plan.warps == 8 ? LaunchClusterLinear<8, 8> : LaunchClusterLinear<4, 8>);
  return launch(plan, x, w, bias, y, rows, n_out, k_in, stream);
}

}  // namespace rl::kernels
