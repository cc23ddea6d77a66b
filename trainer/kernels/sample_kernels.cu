// SampleRows (cuda_kernels.h): a decode step's token per row, drawn from the whole vocabulary,
// in one kernel.
//
// Note [Sampling kernel]
// The rule is SampleWithUniforms's for a row that keeps every token (trainer/rollout/sampler.h,
// Note [Sampling without a sort]): s = logits (as fp32) / T, p = softmax(s), the token is the
// first in id order whose cumulative p exceeds u (or, greedy, the first largest logit), and its
// log-prob is log_softmax(s) there. The LibTorch ops take six passes over [B, V] in fp32 and fp64
// (the cast, log_softmax, the fp64 cast, softmax, cumsum); this kernel reads each row twice (the
// second time mostly from L2) and writes two numbers. One block per row:
//  1. the row's largest s, and the first index of its largest logit (greedy);
//  2. warp w takes the w-th of 16 contiguous slices of the row: per step of 32 x kVec elements,
//     each lane's exp(s - max) (expf, within 2 ulp: by estimate, exp in fp64 on one SM would
//     take tens of us for a row of 151,936 words) summed in fp64 in element order, a warp scan
//     over the lanes, the step's total added to the slice's; one thread then sums the slices in
//     order into their prefix (excl[w]) and the row's total;
//  3. greedy: the argmax. Else, with t = u x total: the first slice with t < excl[w + 1], whose
//     warp walks its steps again: the cumulative mass of element j is excl[w] + (the steps before
//     + (the lanes before + the lane's own up to j)), and the token is the first j where it
//     exceeds t (rounding can leave none there, within 1e-16 of the slice's end: then the slice's
//     last element of positive mass).
// So the tokens are those of the LibTorch ops up to where u falls within about 1e-7 of a boundary
// of the cumulative distribution (fp32 masses, summed in another order), and the log-prob is s -
// max - log(total) from the fp64 total, rounded once to fp32 (log_softmax in fp32 may differ in
// its last bits). The block's result does not depend on the batch: graphs and eager steps agree.
#include <cuda_bf16.h>
#include <math_constants.h>

#include <cstdint>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

constexpr int kSampleWarps = 16;
constexpr int kSampleThreads = kSampleWarps * 32;
constexpr int kSampleUnroll = 4;  // steps of loads in flight per lane in the first pass

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) SamplePack {
  T v[kVec];
};

// (value, index) of the larger value, the smaller index among equals.
__device__ __forceinline__ void TakeLarger(float& value, int64_t& index, float other_value,
                                           int64_t other_index) {
  if (other_value > value || (other_value == value && other_index < index)) {
    value = other_value;
    index = other_index;
  }
}

// Inclusive scan of v over the lanes of a warp (Hillis-Steele, a fixed order).
__device__ __forceinline__ double WarpInclusiveScan(double v) {
  const int lane = threadIdx.x % 32;
  for (int offset = 1; offset < 32; offset *= 2) {
    const double other = __shfl_up_sync(0xffffffff, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(const T* __restrict__ logits, int64_t vocab, int64_t stride,
                     float inv_temperature, bool scale, bool greedy,
                     const double* __restrict__ uniforms, int64_t* __restrict__ tokens,
                     float* __restrict__ log_probs) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int64_t kStep = 32 * kVec;
  __shared__ float warp_max[kSampleWarps];
  __shared__ float warp_best[kSampleWarps];
  __shared__ int64_t warp_arg[kSampleWarps];
  __shared__ double slice_mass[kSampleWarps];
  __shared__ double excl[kSampleWarps + 1];
  __shared__ float row_max;
  __shared__ int64_t row_arg;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * stride;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const auto scaled = [&](float v) { return scale ? v * inv_temperature : v; };

  // 1. The largest s and the first largest logit, the row strided over the block's threads.
  float max_s = -CUDART_INF_F, best = -CUDART_INF_F;
  int64_t arg = vocab;
  for (int64_t base = threadIdx.x * kVec; base < vocab;
       base += static_cast<int64_t>(kSampleThreads) * kVec * kSampleUnroll) {
    SamplePack<T, kVec> packs[kSampleUnroll];
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      const int64_t at = base + static_cast<int64_t>(u) * kSampleThreads * kVec;
      if (at < vocab) packs[u] = *reinterpret_cast<const SamplePack<T, kVec>*>(x + at);
    }
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      const int64_t at = base + static_cast<int64_t>(u) * kSampleThreads * kVec;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (at + e >= vocab) break;
        const float v = ToFloat(packs[u].v[e]);
        max_s = fmaxf(max_s, scaled(v));
        TakeLarger(best, arg, v, at + e);
      }
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    max_s = fmaxf(max_s, __shfl_xor_sync(0xffffffff, max_s, offset));
    TakeLarger(best, arg, __shfl_xor_sync(0xffffffff, best, offset),
               __shfl_xor_sync(0xffffffff, arg, offset));
  }
  if (lane == 0) {
    warp_max[warp] = max_s;
    warp_best[warp] = best;
    warp_arg[warp] = arg;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_max[0], b = warp_best[0];
    int64_t a = warp_arg[0];
    for (int w = 1; w < kSampleWarps; ++w) {
      m = fmaxf(m, warp_max[w]);
      TakeLarger(b, a, warp_best[w], warp_arg[w]);
    }
    row_max = m;
    row_arg = a;
  }
  __syncthreads();
  const float top = row_max;

  // 2. Warp w's slice [w * slice, (w + 1) * slice), whole steps of kStep elements.
  const int64_t steps = (vocab + kStep - 1) / kStep;
  const int64_t slice_steps = (steps + kSampleWarps - 1) / kSampleWarps;
  const int64_t slice_begin = warp * slice_steps * kStep;
  const int64_t slice_end = min(vocab, slice_begin + slice_steps * kStep);
  // Lane l's vector of the step at `at` (undefined past the slice), and its masses in element
  // order, mass[e] (0 past the slice), and their sum.
  const auto load = [&](int64_t at, SamplePack<T, kVec>& pack) {
    const int64_t first = at + lane * kVec;
    if (first < slice_end) pack = *reinterpret_cast<const SamplePack<T, kVec>*>(x + first);
  };
  const auto masses = [&](int64_t at, const SamplePack<T, kVec>& pack, double (&mass)[kVec]) {
    const int64_t first = at + lane * kVec;
    double sum = 0.0;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      mass[e] = first + e < slice_end ? static_cast<double>(expf(scaled(ToFloat(pack.v[e])) - top))
                                      : 0.0;
      sum += mass[e];
    }
    return sum;
  };
  double run = 0.0;
  for (int64_t at = slice_begin; at < slice_end; at += kStep * kSampleUnroll) {
    SamplePack<T, kVec> packs[kSampleUnroll];
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) load(at + u * kStep, packs[u]);
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      if (at + u * kStep >= slice_end) break;
      double mass[kVec];
      const double lanes = WarpInclusiveScan(masses(at + u * kStep, packs[u], mass));
      run += __shfl_sync(0xffffffff, lanes, 31);
    }
  }
  if (lane == 0) slice_mass[warp] = run;
  __syncthreads();
  if (threadIdx.x == 0) {
    excl[0] = 0.0;
    for (int w = 0; w < kSampleWarps; ++w) excl[w + 1] = excl[w] + slice_mass[w];
  }
  __syncthreads();
  const double total = excl[kSampleWarps];
  const auto log_prob = [&](int64_t token) {
    const double s = scaled(ToFloat(x[token]));
    return static_cast<float>(s - static_cast<double>(top) - log(total));
  };

  // 3. The token, and its log-prob.
  if (greedy) {
    if (threadIdx.x == 0) {
      tokens[row] = row_arg;
      log_probs[row] = log_prob(row_arg);
    }
    return;
  }
  const double t = uniforms[row] * total;
  int chosen = kSampleWarps - 1;  // the first slice past t, else the last with mass
  for (int w = 0; w < kSampleWarps; ++w) {
    if (t < excl[w + 1]) {
      chosen = w;
      break;
    }
  }
  while (chosen > 0 && slice_mass[chosen] == 0.0) --chosen;
  if (warp != chosen) return;
  run = 0.0;
  int64_t last_positive = -1, token = -1;
  for (int64_t at = slice_begin; at < slice_end && token < 0; at += kStep) {
    SamplePack<T, kVec> pack;
    load(at, pack);
    double mass[kVec];
    const double own = masses(at, pack, mass);
    const double lanes = WarpInclusiveScan(own);
    double cumulative = lanes - own;  // the lanes before this one
    int64_t found = -1, positive = -1;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      cumulative += mass[e];
      const int64_t j = at + lane * kVec + e;
      if (mass[e] > 0.0) positive = j;
      if (found < 0 && mass[e] > 0.0 && excl[warp] + (run + cumulative) > t) found = j;
    }
    // The first lane that found one holds the token; the last lane with mass, the fallback.
    const unsigned found_lanes = __ballot_sync(0xffffffff, found >= 0);
    if (found_lanes != 0) token = __shfl_sync(0xffffffff, found, __ffs(found_lanes) - 1);
    const unsigned positive_lanes = __ballot_sync(0xffffffff, positive >= 0);
    if (positive_lanes != 0) {
      last_positive = __shfl_sync(0xffffffff, positive, 31 - __clz(positive_lanes));
    }
    run += __shfl_sync(0xffffffff, lanes, 31);
  }
  if (lane == 0) {
    if (token < 0) token = last_positive >= 0 ? last_positive : row_arg;
    tokens[row] = token;
    log_probs[row] = log_prob(token);
  }
}

}  // namespace

cudaError_t SampleRows(const void* logits, int64_t rows, int64_t vocab, int64_t stride,
                       double temperature, bool greedy, const double* uniforms, int64_t* tokens,
                       float* log_probs, DtypeCode dtype, cudaStream_t stream) {
  const int64_t vec = dtype == kBFloat16 ? 8 : 4;
  if (vocab < 1 || vocab % vec != 0 || stride % vec != 0 || temperature < 0 ||
      (!greedy && uniforms == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  // Temperature 0 is greedy at temperature 1 (sampler.h); 1 scales nothing.
  const bool scale = temperature > 0 && temperature != 1.0;
  const float inv_temperature = scale ? static_cast<float>(1.0 / temperature) : 1.0f;
  if (dtype == kBFloat16) {
    SampleRowsKernel<<<rows, kSampleThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(logits), vocab, stride, inv_temperature, scale, greedy,
        uniforms, tokens, log_probs);
  } else {
    SampleRowsKernel<<<rows, kSampleThreads, 0, stream>>>(
        static_cast<const float*>(logits), vocab, stride, inv_temperature, scale, greedy, uniforms,
        tokens, log_probs);
  }
  return cudaGetLastError();
}

}  // namespace rl::kernels
