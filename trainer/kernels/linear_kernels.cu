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
#include <cuda.h>
#include <cudaTypedefs.h>
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

// Note [Gate/up projection with SiluMul on tensor cores]
// A decode step's gated MLP computes gate_up = x W^T (W the gate's rows, then the up's), then
// SiluMul(gate_up) in a kernel of its own (2.7 us a layer at batch 64 on the H200, where the
// whole layer takes 55). This kernel gives each block kGateUpHalf (24) features of the gate and
// the same 24 of the up, so that one wgmma of n = 48 sums both for the block's rows and each thread
// holds a gate sum and its up sum in its own registers: the epilogue rounds each to bf16, as the
// GEMM's output was, and writes SiluTimes of the two (SiluMul's arithmetic), so the activation
// costs no kernel and the [rows, 2 inner] product is never written. One warpgroup a block:
// - k goes by tiles of 64 dims (128 bytes a row, swizzled by 128 bytes as wgmma reads them) in a
//   ring of `stages` stages, each the weights' [48, 64] (two tensor-map copies: the gate's 24 rows
//   and the up's; where inner is not a multiple of 24, the last block's gate copy reads up rows
//   and its up copy zeros past the weight, whose sums are never written out) and x's [64 rows,
//   64] (of at most `rows` rows; wgmma reads 64, and the sums of the rows past `rows` are never
//   written out), both counted by the stage's mbarrier;
// - before its wait (Note [Programmatic dependent launch] in kernel_util.cuh) one thread has the
//   tensor memory accelerator copy the weights of the first `stages` tiles, which stream in while
//   the kernel ahead runs; after it, their x tiles;
// - the warpgroup sums D [64 rows, 48] += X [64, 16] W^T [16, 48] by wgmma (bf16 inputs, fp32
//   sums, both operands read from shared memory), four k16 steps a tile, each tile once its stage
//   has landed; once a tile's wgmma have completed, the same thread refills its stage with the
//   tile `stages` further on.
// Each row's sums go in the same order whatever the other rows hold: the same inputs give the same
// bits (graph replays equal eager steps). cuBLAS's kernel for Qwen3-0.6B's gate/up projection at
// 64 rows sums k in the same order by the same wgmma: the engine's batch-64 generations (tokens and
// log-probs) had the same SHA-256 with this kernel as with cuBLAS's GEMM and SiluMul; other shapes
// may differ from cuBLAS by the order of the fp32 sums. From 33 to 64 rows it replaces cuBLAS's
// gate/up GEMM and SiluMul (Note [Decode kernels] in trainer/model/layers.cc); below, where
// cuBLAS runs other kernels and a 64-row wgmma does 4 to 8 times the sums, it lost (0.985x at 16
// rows, 0.926x at 8; docs/decode-performance.md).
constexpr int kMmaRows = 64;           // wgmma's m
constexpr int kMmaTile = 64;           // dims of a tile: 128 bytes, the swizzle's span
constexpr int kMmaThreads = 128;       // one warpgroup
constexpr int kGateUpHalf = 24;        // gate features (and up features) a block
constexpr int kGateUpMaxStages = 16;   // 1024 dims of k: the ring of Qwen3-0.6B's whole slice
constexpr int kGateUpWeightBytes = 2 * kGateUpHalf * kMmaTile * 2;  // a stage's weights
constexpr int kGateUpXBytes = kMmaRows * kMmaTile * 2;              // a stage's x
constexpr int kGateUpStageBytes = kGateUpWeightBytes + kGateUpXBytes;
static_assert(kGateUpWeightBytes % 1024 == 0 && kGateUpStageBytes % 1024 == 0,
              "each tile starts on the 1024-byte boundary the 128-byte swizzle repeats at");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma and tensor-map copies: sm_90a's code only
// A wgmma operand in shared memory: rows of 128 bytes (64 dims), swizzled by 128 bytes, groups of
// 8 rows 1024 bytes apart (the layout of a 128-byte-swizzled tensor-map copy), from a 1024-byte
// aligned tile; a k16 step further is 32 bytes further.
__device__ __forceinline__ uint64_t WgmmaOperand(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// D [64, 48] += A [64, 16] B^T (A and B K-major in shared memory, fp32 D in registers: thread t of
// the warpgroup holds, for each 8 columns i, rows 16 (t / 32) + (t % 32) / 4 (+ 8) at columns
// 8 i + 2 (t % 4) (+ 1), as d[4 i], d[4 i + 1] (and d[4 i + 2], d[4 i + 3] 8 rows below).
__device__ __forceinline__ void Wgmma48(float (&d)[24], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23}, %24, %25, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(a), "l"(b), "r"(1));
}

// A 2-d tile of a tensor map (dims: c0 inner, c1 outer) into shared memory, counted by `barrier`.
__device__ __forceinline__ void CopyTile(uint32_t shared, const CUtensorMap& map, int c0, int c1,
                                         uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(shared),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(SharedAddress(barrier))
      : "memory");
}
#endif

__global__ void __launch_bounds__(kMmaThreads)
    GateUpSiluMmaKernel(const __grid_constant__ CUtensorMap x_map,
                        const __grid_constant__ CUtensorMap w_map, Bf16* __restrict__ out,
                        int rows, int inner, int tiles, int stages) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // elsewhere never launched (GateUpSiluMmaFits)
  extern __shared__ unsigned char shared_bytes[];
  __shared__ uint64_t landed[kGateUpMaxStages];
  // The stages, from the first 1024-byte boundary: each the weights' [48][64], then x's [64][64].
  const uint32_t base = (SharedAddress(shared_bytes) + 1023) & ~1023u;
  const int first = blockIdx.x * kGateUpHalf;
  const uint32_t stage_bytes = kGateUpWeightBytes + rows * kMmaTile * 2;
  const auto copy_weights = [&](int tile, int stage) {
    const uint32_t at = base + stage * kGateUpStageBytes;
    CopyTile(at, w_map, tile * kMmaTile, first, &landed[stage]);
    CopyTile(at + kGateUpWeightBytes / 2, w_map, tile * kMmaTile, inner + first, &landed[stage]);
  };
  const auto copy_x = [&](int tile, int stage) {
    CopyTile(base + stage * kGateUpStageBytes + kGateUpWeightBytes, x_map, tile * kMmaTile, 0,
             &landed[stage]);
  };
  if (threadIdx.x == 0) {  // stages <= tiles (GateUpStages)
    for (int s = 0; s < stages; ++s) InitBarrier(&landed[s]);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    for (int s = 0; s < stages; ++s) {
      ArriveExpectingBytes(&landed[s], stage_bytes);
      copy_weights(s, s);
    }
  }
  __syncthreads();  // the barriers' initialisation, for every thread that waits on them
  PrecedingKernelsDone();
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) copy_x(s, s);
  }
  float acc[24];
#pragma unroll
  for (int i = 0; i < 24; ++i) acc[i] = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    const int stage = t % stages;
    WaitBarrier(&landed[stage], (t / stages) & 1);
    const uint32_t w_at = base + stage * kGateUpStageBytes;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int step = 0; step < kMmaTile / 16; ++step) {
      Wgmma48(acc, WgmmaOperand(w_at + kGateUpWeightBytes + 32 * step),
              WgmmaOperand(w_at + 32 * step));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    // Tile t - 1's wgmma have read their stage: refill it with tile t - 1 + stages.
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    const int next = t - 1 + stages;
    if (threadIdx.x == 0 && t >= 1 && next < tiles) {
      const int free_stage = (t - 1) % stages;
      ArriveExpectingBytes(&landed[free_stage], stage_bytes);
      copy_weights(next, free_stage);
      copy_x(next, free_stage);
    }
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < 24; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const auto rounded = [](float sum) { return ToFloat(FromFloat<Bf16>(sum)); };
#pragma unroll
  for (int i = 0; i < kGateUpHalf / 8; ++i) {  // the gate's column groups; the up's are 3 on
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * warp + lane / 4 + 8 * half;
      const int feature = first + 8 * i + 2 * (lane % 4);  // and + 1 (inner is even)
      if (row >= rows || feature >= inner) continue;
      const int e = 4 * i + 2 * half;
      __nv_bfloat162 pair;
      pair.x = SiluTimes<Bf16>(rounded(acc[e]), rounded(acc[e + 12]));
      pair.y = SiluTimes<Bf16>(rounded(acc[e + 1]), rounded(acc[e + 13]));
      *reinterpret_cast<__nv_bfloat162*>(&out[static_cast<int64_t>(row) * inner + feature]) = pair;
    }
  }
#endif
}

// The device's opt-in shared memory a block (0 where it cannot be read), read once.
int64_t OptInSharedBytes() {
  static const int64_t bytes = CurrentDeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  return bytes;
}

// Of a block's shared memory, what GateUpSiluMmaKernel's static array (its barriers) takes.
constexpr int64_t kGateUpStaticBytes = 1024;

// Whether the current device runs sm_90a's code (compute capability 9.0), read once.
bool HopperDevice() {
  static const bool hopper = CurrentDeviceAttribute(cudaDevAttrComputeCapabilityMajor, 0) == 9 &&
                             CurrentDeviceAttribute(cudaDevAttrComputeCapabilityMinor, -1) == 0;
  return hopper;
}

// The driver's cuTensorMapEncodeTiled, through the runtime (nothing links libcuda), or null.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                         cudaEnableDefault, &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// A tensor map of the bf16 matrix [outer, inner] (row-major, 16-byte aligned) in tiles of
// [box_outer, 64], swizzled by 128 bytes; elements past the matrix read as zeros.
bool EncodeTiles(CUtensorMap* map, const void* data, int64_t outer, int64_t inner, int box_outer) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(inner * sizeof(Bf16))};
  const cuuint32_t box[2] = {kMmaTile, static_cast<cuuint32_t>(box_outer)};
  const cuuint32_t element_strides[2] = {1, 1};
  return TensorMapEncoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims,
                            strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// GateUpSiluMmaKernel's blocks: one per 24 features of the gate (the last may have fewer).
int64_t GateUpBlocks(int64_t inner) { return (inner + kGateUpHalf - 1) / kGateUpHalf; }

// GateUpSiluMmaKernel's ring: as many stages as k's tiles (up to kGateUpMaxStages) that fit a
// block's shared memory, with two blocks an SM where the grid has more blocks than SMs.
int GateUpStages(int64_t inner, int64_t k_in) {
  const int64_t blocks_per_sm = GateUpBlocks(inner) > MultiprocessorCount() ? 2 : 1;
  const int64_t room = OptInSharedBytes() / blocks_per_sm - kGateUpStaticBytes - 1024;
  return static_cast<int>(std::min<int64_t>(
      {k_in / kMmaTile, kGateUpMaxStages, std::max<int64_t>(room / kGateUpStageBytes, 0)}));
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

bool GateUpSiluMmaFits(int64_t rows, int64_t inner, int64_t k_in) {
  return rows >= 1 && rows <= kMmaRows && inner >= 2 && inner % 2 == 0 &&
         GateUpBlocks(inner) <= 2147483647 && k_in >= kMmaTile && k_in % kMmaTile == 0 &&
         HopperDevice() && TensorMapEncoder() != nullptr &&
         GateUpStages(inner, k_in) >= std::min<int64_t>(k_in / kMmaTile, 2);  // a ring, or all
}

cudaError_t GateUpSiluMma(const void* x, const void* w, void* out, int64_t rows, int64_t inner,
                          int64_t k_in, cudaStream_t stream) {
  if (!GateUpSiluMmaFits(rows, inner, k_in)) return cudaErrorInvalidValue;
  // Once, before any capture (the engine's first step runs eagerly): the device's opt-in shared
  // memory but for the static array.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      GateUpSiluMmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(OptInSharedBytes() - kGateUpStaticBytes));
  if (opt_in != cudaSuccess) return opt_in;
  CUtensorMap x_map, w_map;
  if (!EncodeTiles(&x_map, x, rows, k_in, static_cast<int>(rows)) ||
      !EncodeTiles(&w_map, w, 2 * inner, k_in, kGateUpHalf)) {
    return cudaErrorInvalidValue;
  }
  const int stages = GateUpStages(inner, k_in);
  return Launch(GateUpSiluMmaKernel, dim3(static_cast<unsigned>(GateUpBlocks(inner))),
                kMmaThreads, static_cast<size_t>(stages) * kGateUpStageBytes + 1024, stream, x_map,
                w_map, static_cast<Bf16*>(out), static_cast<int>(rows), static_cast<int>(inner),
                static_cast<int>(k_in / kMmaTile), stages);
}

}  // namespace rl::kernels
