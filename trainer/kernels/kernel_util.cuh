// Device helpers the kernels of trainer/kernels share: dtype conversions, warp and block sums,
// the elementwise steps whose rounding several kernels must reproduce, cp.async copies, ldmatrix,
// the bf16 tensor-core mma, the SM count, and programmatic dependent launch.
#ifndef RL_TRAINER_KERNELS_KERNEL_UTIL_CUH_
#define RL_TRAINER_KERNELS_KERNEL_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/kernels/cuda_kernels.h"

namespace rl::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Sum over the lanes of a warp by a butterfly; every lane gets the same value.
__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds kWarps floats.
__device__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpSum(lane < kWarps ? scratch[lane] : 0.0f);
}

// The elementwise steps our kernels share with LibTorch ops, each rounded to T as the op rounds
// it (the _rn intrinsics keep the compiler from contracting a product and a sum into one FMA), so
// that every kernel using them gives the same bits:
// a + b (at::add);
template <typename T>
__device__ __forceinline__ T AddRounded(float a, float b) {
  return FromFloat<T>(__fadd_rn(a, b));
}
// transformers' RMSNorm of x given the row's inverse rms: h = x * inv rounded, then weight * h;
template <typename T>
__device__ __forceinline__ T RmsNormed(float x, float inv, float weight) {
  return FromFloat<T>(__fmul_rn(weight, ToFloat(FromFloat<T>(__fmul_rn(x, inv)))));
}
// RoPE of the pair (x1, x2) by (cos c, sin n): x1 c - x2 n for the pair's first element, x2 c + x1 n
// for its second, each product and the sum rounded (ApplyRope's separate ops);
template <typename T>
__device__ __forceinline__ T Rotated(bool first, float x1, float x2, float c, float n) {
  const float a = ToFloat(FromFloat<T>(__fmul_rn(first ? x1 : x2, c)));
  const float e = ToFloat(FromFloat<T>(__fmul_rn(first ? x2 : x1, n)));
  return FromFloat<T>(first ? __fsub_rn(a, e) : __fadd_rn(a, e));
}
// at::silu(g) = g / (1 + exp(-g)) in fp32, rounded, times u.
template <typename T>
__device__ __forceinline__ T SiluTimes(float g, float u) {
  return FromFloat<T>(__fmul_rn(ToFloat(FromFloat<T>(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))))), u));
}

// One element of fp32 partial sums over slices of k, part(s) for s < slices, added in slice order:
// a split-k GEMM's (Note [Split-k partial sums] in fused_ops.h) or DecodeQkvAttentionO's, one
// slice per head group. Rounding the total to the dtype, as a GEMM rounds its output, is the
// caller's.
template <int kMaxSlices, typename Part>
__device__ __forceinline__ float SlicesSum(const Part& part, int slices = kMaxSlices) {
  float total = part(0);
#pragma unroll
  for (int s = 1; s < kMaxSlices; ++s) {
    if (s < slices) total = __fadd_rn(total, part(s));
  }
  return total;
}

// Thread t's elements t, t + blockDim.x, ... of [0, n), in that order: kLoadsAhead of them loaded
// (load(i)) before the first is used (use(i, loaded)), so that a thread pays a memory round trip
// per kLoadsAhead elements, not one per element.
constexpr int kLoadsAhead = 4;
template <typename Load, typename Use>
__device__ __forceinline__ void ForEachLoadedAhead(int64_t n, const Load& load, const Use& use) {
  using Loaded = decltype(load(int64_t{0}));
  const int64_t stride = blockDim.x;
  for (int64_t first = threadIdx.x; first < n; first += kLoadsAhead * stride) {
    Loaded loaded[kLoadsAhead];
#pragma unroll
    for (int j = 0; j < kLoadsAhead; ++j) {
      if (first + j * stride < n) loaded[j] = load(first + j * stride);
    }
#pragma unroll
    for (int j = 0; j < kLoadsAhead; ++j) {
      if (first + j * stride >= n) break;
      use(first + j * stride, loaded[j]);
    }
  }
}

// The first pass of an RMSNorm of one row of `cols` by the whole block: each element v of the row
// x + add (AddRounded; x itself where add is null) goes to store(i, v), and the row's inverse rms
// rsqrt(mean(v^2) + eps) is returned to every thread. Thread i takes elements i, i + blockDim.x,
// ... (ForEachLoadedAhead); `scratch` holds kWarps floats (BlockSum). Every kernel that normalises
// a row this way gives the same bits.
template <typename T, typename Store>
__device__ float RowInverseRms(const T* __restrict__ x, const T* __restrict__ add, int64_t cols,
                               float eps, float* scratch, const Store& store) {
  struct Element {
    T x;
    T add;
  };
  float squares = 0.0f;
  ForEachLoadedAhead(
      cols,
      [&](int64_t i) {
        return Element{x[i], add != nullptr ? add[i] : T{}};
      },
      [&](int64_t i, const Element& e) {
        const T v = add != nullptr ? AddRounded<T>(ToFloat(e.x), ToFloat(e.add)) : e.x;
        store(i, v);
        squares += ToFloat(v) * ToFloat(v);
      });
  return rsqrtf(BlockSum(squares, scratch) / static_cast<float>(cols) + eps);
}

// D += A B on the tensor cores, one m16n8k16 mma with bf16 inputs and fp32 sums. Per lane
// (g = lane / 4, t = lane % 4), each register two bf16 of consecutive k, the lower k in the low
// half: A (16 x 16, row-major) a[0] rows g, k 2t and 2t + 1; a[1] row g + 8, the same k; a[2] row
// g, k 2t + 8 and 2t + 9; a[3] row g + 8, those k. B (16 x 8, by column) b0 column g, k 2t and
// 2t + 1; b1 column g, k 2t + 8 and 2t + 9. D (16 x 8) d[0] (g, 2t), d[1] (g, 2t + 1), d[2]
// (g + 8, 2t), d[3] (g + 8, 2t + 1).
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A shared-memory address as the 32-bit operand of cp.async and ldmatrix.
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// kBytes (4, 8, 16 or a multiple of 16, aligned to the lesser of itself and 16) from global to
// shared memory without passing through registers (cp.async); they may be read once this thread's
// cp.async.wait_group has counted them. Copies of up to 16 bytes go through the L1 (.ca); with
// kBypassL1 a 16-byte one goes to the L2 only (.cg), as larger ones always do.
template <int kBytes, bool kBypassL1 = false>
__device__ __forceinline__ void CopyAsync(void* shared, const void* global) {
  static_assert(!kBypassL1 || kBytes >= 16, "cp.async.cg copies 16 bytes");
  const uint32_t to = SharedAddress(shared);
  if constexpr (kBytes < 16 || (kBytes == 16 && !kBypassL1)) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(to), "l"(global), "n"(kBytes));
  } else {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to + 16 * i),
                   "l"(static_cast<const char*>(global) + 16 * i));
    }
  }
}

// Closes this thread's group of cp.async copies issued since the last (cp.async.wait_group counts
// groups).
__device__ __forceinline__ void CommitCopies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// The tensor memory accelerator's copies (cp.async.bulk.tensor) complete on an mbarrier in shared
// memory, which counts the bytes it expects. Each thread that waits on it must see it initialised
// (a barrier after InitBarrier). A phase of the barrier completes after `arrivals` arrivals.
__device__ __forceinline__ void InitBarrier(uint64_t* barrier, unsigned arrivals = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(barrier)),
               "r"(arrivals));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The barrier's one arrival in its current phase, telling it to expect `bytes` bytes.
__device__ __forceinline__ void ArriveExpectingBytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SharedAddress(barrier)),
      "r"(bytes)
      : "memory");
}

// Waits until the barrier's phase of parity `phase` has completed (every expected byte landed).
__device__ __forceinline__ void WaitBarrier(uint64_t* barrier, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SharedAddress(barrier)),
      "r"(phase)
      : "memory");
}

// ldmatrix .x4: lanes 8m to 8m + 7 give the addresses of rows 0 to 7 (16 bytes each, in shared
// memory) of matrix m; each lane receives in r[m] its two elements of matrix m, row lane / 4,
// columns 2 (lane % 4) and + 1 (the matrix transposed first with `transpose`).
__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], const void* row, bool transpose) {
  if (transpose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddress(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddress(row)));
  }
}

// An attribute of the current device, or `fallback` where it cannot be read (the failed call's
// error cleared, so that no later launch reports it).
inline int CurrentDeviceAttribute(cudaDeviceAttr attribute, int fallback) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess) {
    cudaGetLastError();
    return fallback;
  }
  return value;
}

// The current device's SM count (132 if it cannot be read), read once.
inline int MultiprocessorCount() {
  static const int count = CurrentDeviceAttribute(cudaDevAttrMultiProcessorCount, 132);
  return count;
}

// Note [Programmatic dependent launch]
// A decode step is a chain of small kernels, each reading what the one before wrote; between two
// of them the GPU drains the first, then launches the second, whose blocks then wait for their
// first loads: a few microseconds per kernel, a large part of a step of a few rows (Qwen3-0.6B's
// widths at batch 1: 147 kernels in a step of 1.4 ms). Hopper's programmatic dependent
// launch takes most of that away: a kernel launched by Launch() below while a ProgrammaticLaunch
// scope is on (cuda_kernels.h; the engine's decode steps) may start before the kernel ahead of it
// in the stream has finished, and its blocks then run up to PrecedingKernelsDone():
//  - griddepcontrol.wait there returns once every kernel ahead in the stream has finished and its
//    writes are visible. Before it a kernel reads only what no kernel of a decode step writes,
//    its weights (SmallLinear and SkinnyLinear issue the loads of their weights there, so they
//    stream in while the kernel ahead finishes) and, in DecodeQkvAttention, the rows' positions
//    (copied from the host before a step) and the cached keys and values before them (written
//    by earlier steps), and writes nothing;
//  - griddepcontrol.launch_dependents right after lets a kernel behind that was launched with
//    the attribute start once every block of this one has got that far; its blocks take the SMs
//    this one leaves idle.
// Every block of every kernel so launched passes PrecedingKernelsDone(), so a kernel's end implies
// the end of every kernel ahead of it; kernels launched the ordinary way (LibTorch's, cuBLAS's,
// NCCL's) start after the whole of the kernel ahead, as always. In a kernel launched without the
// attribute (training, or any launch outside the scope) the wait returns at once. Our kernels
// trigger wherever they run, so the one right before a kernel that loads weights before its wait
// must not write those weights: a DecodeStep starts with LibTorch kernels (the embedding), which
// trigger nothing, and no kernel of a step writes a weight. The kernels compute the same bits
// either way: the attribute changes when a kernel starts, never what it reads after the wait.
// A kernel may trigger earlier, before its wait (LetDependentsStart), so that the kernel behind
// starts while the one ahead still runs; the wait of the kernel behind still returns only after
// this one, and so every one ahead, has finished (Note [Small linear with weights in shared
// memory] in decode_kernels.cu says where that pays).

// The wait of PrecedingKernelsDone() alone, for a kernel that lets the kernel behind start later,
// by LetDependentsStart() once it has done part of its work (Note [Small linear with weights in
// shared memory] in decode_kernels.cu).
__device__ __forceinline__ void WaitForPrecedingKernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// griddepcontrol.launch_dependents before the wait (Note [Programmatic dependent launch]), or
// after it once part of the work is done (WaitForPrecedingKernels).
__device__ __forceinline__ void LetDependentsStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The wait, then the trigger: Note [Programmatic dependent launch] above.
__device__ __forceinline__ void PrecedingKernelsDone() {
  WaitForPrecedingKernels();
  LetDependentsStart();
}

// kernel<<<grid, block, shared, stream>>>(args...), asking for programmatic dependent launch
// while a ProgrammaticLaunch scope is on (Note [Programmatic dependent launch]); `kernel` must then
// call PrecedingKernelsDone() in every block before it reads anything but its weights. With
// `cluster` > 0 the blocks run in clusters of that many along x (grid.x a multiple of it). Returns
// the launch's error (and clears it, as cudaGetLastError after <<<>>> does).
template <typename... Params, typename... Args>
cudaError_t LaunchClusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                           unsigned cluster, cudaStream_t stream, const Args&... args) {
  // The cluster's shape (with `cluster`), then the programmatic launch (while the scope is on).
  cudaLaunchAttribute attrs[2] = {};
  unsigned own = 0;  // the attributes besides the programmatic one
  if (cluster > 0) {
    attrs[own].id = cudaLaunchAttributeClusterDimension;
    attrs[own++].val.clusterDim = {cluster, 1, 1};
  }
  attrs[own].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[own].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = own + (ProgrammaticLaunch::On() ? 1 : 0);
  cudaError_t launched = cudaLaunchKernelEx(&config, kernel, args...);
  if (launched != cudaSuccess && config.numAttrs > own) {
    // Where the ordinary launch succeeds, a driver or stream refused the attribute: launch the
    // ordinary way from now on (ProgrammaticLaunch::On() then says false).
    (void)cudaGetLastError();
    config.numAttrs = own;
    launched = cudaLaunchKernelEx(&config, kernel, args...);
    if (launched == cudaSuccess) ProgrammaticLaunch::Refused();
  }
  const cudaError_t last = cudaGetLastError();
  return launched != cudaSuccess ? launched : last;
}

template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                   cudaStream_t stream, const Args&... args) {
  return LaunchClusters(kernel, grid, block, shared, 0, stream, args...);
}

}  // namespace
}  // namespace rl::kernels

#endif  // RL_TRAINER_KERNELS_KERNEL_UTIL_CUH_
