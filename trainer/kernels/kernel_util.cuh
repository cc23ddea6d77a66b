// Device helpers the kernels of trainer/kernels share: dtype conversions, warp and block sums,
// and the elementwise steps whose rounding several kernels must reproduce.
#ifndef RL_TRAINER_KERNELS_KERNEL_UTIL_CUH_
#define RL_TRAINER_KERNELS_KERNEL_UTIL_CUH_

#include <cuda_bf16.h>

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

}  // namespace
}  // namespace rl::kernels

#endif  // RL_TRAINER_KERNELS_KERNEL_UTIL_CUH_
