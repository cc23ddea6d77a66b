#include "trainer/kernels/cuda_kernels.h"

#include <cuda_bf16.h>

#include <atomic>
#include <cfloat>

#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

// Online softmax statistics of a set of values: running max m, s = sum exp(x - m) and
// t = sum exp(x - m) * (x - m).
struct SoftmaxStats {
  float m = -FLT_MAX;
  float s = 0.0f;
  float t = 0.0f;
};

__device__ __forceinline__ void Add(SoftmaxStats& a, float x) {
  if (x > a.m) {
    if (a.s > 0.0f) {
      const float shift = a.m - x;  // the old terms' (x - m) move by this
      const float scale = expf(shift);
      a.t = (a.t + shift * a.s) * scale;
      a.s *= scale;
    }
    a.m = x;
  }
  const float d = x - a.m;
  const float e = expf(d);
  if (e > 0.0f) {  // a -inf logit adds nothing (and would make e * d a NaN)
    a.s += e;
    a.t += e * d;
  }
}

__device__ __forceinline__ SoftmaxStats Merge(SoftmaxStats a, SoftmaxStats b) {
  if (b.m > a.m) {
    const SoftmaxStats c = a;
    a = b;
    b = c;
  }
  if (b.s == 0.0f) return a;
  const float shift = b.m - a.m;  // <= 0
  const float scale = expf(shift);
  a.s += b.s * scale;
  a.t += (b.t + shift * b.s) * scale;
  return a;
}

__device__ __forceinline__ SoftmaxStats Shuffle(const SoftmaxStats& a, int offset) {
  SoftmaxStats b;
  b.m = __shfl_xor_sync(0xffffffff, a.m, offset);
  b.s = __shfl_xor_sync(0xffffffff, a.s, offset);
  b.t = __shfl_xor_sync(0xffffffff, a.t, offset);
  return b;
}

__device__ SoftmaxStats BlockMerge(SoftmaxStats v, SoftmaxStats* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v = Merge(v, Shuffle(v, offset));
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kWarps ? scratch[lane] : SoftmaxStats();
  for (int offset = 16; offset > 0; offset /= 2) v = Merge(v, Shuffle(v, offset));
  return v;
}

// With `add` (and `sum`): the row is x + add, rounded to the dtype as LibTorch's add rounds it,
// and is written to `sum`. With kPartials (and kPerThread > 0), `partials` stands for add: a GEMM's
// fp32 partial sums over kPartialSlices slices of k, [kPartialSlices, rows, cols], of which add is
// the sum in slice order rounded to the dtype, as the GEMM rounds its output (each thread loads
// all its slices' elements at once, one round trip). Thread i takes elements i, i + kThreads, ...
// of the row; with kPerThread > 0 (cols <= kPerThread * kThreads) it holds them in registers
// between the passes, which then read the row once (in a decode step the passes' round trips to
// memory were most of its time), with 0 it reads them again each pass. The sums are the same
// either way.
template <typename T, int kPerThread, bool kPartials = false>
__global__ void RmsNormKernel(const T* __restrict__ x, const T* __restrict__ add,
                              const float* __restrict__ partials, const T* __restrict__ weight,
                              T* __restrict__ out, T* __restrict__ sum, float* __restrict__ inv_rms,
                              int64_t cols, float eps) {
  static_assert(!kPartials || kPerThread > 0);
  __shared__ float scratch[kWarps];
  PrecedingKernelsDone();
  const int64_t offset = blockIdx.x * cols;
  T* out_row = out + offset;
  if constexpr (kPerThread > 0) {
    float v[kPerThread], w[kPerThread];
    float addend[kPerThread];  // with kPartials
    if constexpr (kPartials) {
      // Every load first, predicated rather than branched around, so that they all go out at once.
      const int64_t stride = gridDim.x * cols;  // between the slices
      float part[kPartialSlices][kPerThread];
#pragma unroll
      for (int s = 0; s < kPartialSlices; ++s) {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int64_t i = threadIdx.x + j * static_cast<int64_t>(kThreads);
          part[s][j] = i < cols ? partials[s * stride + offset + i] : 0.0f;
        }
      }
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        addend[j] = SlicesSum<kPartialSlices>([&](int s) { return part[s][j]; });
      }
    }
    float squares = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = threadIdx.x + j * static_cast<int64_t>(kThreads);
      if (i >= cols) break;
      w[j] = ToFloat(weight[i]);
      if (kPartials || add != nullptr) {
        const float added = kPartials ? ToFloat(FromFloat<T>(addend[j])) : ToFloat(add[offset + i]);
        const T rounded = AddRounded<T>(ToFloat(x[offset + i]), added);
        sum[offset + i] = rounded;
        v[j] = ToFloat(rounded);
      } else {
        v[j] = ToFloat(x[offset + i]);
      }
      squares += v[j] * v[j];
    }
    const float inv = rsqrtf(BlockSum(squares, scratch) / static_cast<float>(cols) + eps);
    if (inv_rms != nullptr && threadIdx.x == 0) inv_rms[blockIdx.x] = inv;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = threadIdx.x + j * static_cast<int64_t>(kThreads);
      if (i >= cols) break;
      out_row[i] = RmsNormed<T>(v[j], inv, w[j]);
    }
  } else {
    const float inv = RowInverseRms(x + offset, add != nullptr ? add + offset : nullptr, cols, eps,
                                    scratch, [&](int64_t i, T v) {
                                      if (add != nullptr) sum[offset + i] = v;
                                    });
    // each thread reads back only what it wrote
    const T* row = add != nullptr ? sum + offset : x + offset;
    if (inv_rms != nullptr && threadIdx.x == 0) inv_rms[blockIdx.x] = inv;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      out_row[i] = RmsNormed<T>(ToFloat(row[i]), inv, ToFloat(weight[i]));
    }
  }
}

// grad_x, one block per row.
template <typename T>
__global__ void RmsNormGradInputKernel(const T* __restrict__ x, const T* __restrict__ weight,
                                       const float* __restrict__ inv_rms,
                                       const T* __restrict__ grad_out, int64_t cols,
                                       T* __restrict__ grad_x) {
  __shared__ float scratch[kWarps];
  const int64_t offset = blockIdx.x * cols;
  const float r = inv_rms[blockIdx.x];
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float g = ToFloat(FromFloat<T>(ToFloat(grad_out[offset + i]) * ToFloat(weight[i])));
    dot += g * ToFloat(x[offset + i]);
  }
  const float coefficient = BlockSum(dot, scratch) * r * r * r / static_cast<float>(cols);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float g = ToFloat(FromFloat<T>(ToFloat(grad_out[offset + i]) * ToFloat(weight[i])));
    grad_x[offset + i] = FromFloat<T>(r * g - coefficient * ToFloat(x[offset + i]));
  }
}

// Partial weight gradients: block (column tile, row chunk), one thread per column.
template <typename T>
__global__ void RmsNormGradWeightKernel(const T* __restrict__ x, const float* __restrict__ inv_rms,
                                        const T* __restrict__ grad_out, int64_t rows,
                                        int64_t cols, int64_t rows_per_chunk,
                                        float* __restrict__ partial) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  const int64_t begin = blockIdx.y * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    const float h = ToFloat(FromFloat<T>(__fmul_rn(ToFloat(x[r * cols + col]), inv_rms[r])));
    sum += ToFloat(grad_out[r * cols + col]) * h;
  }
  partial[blockIdx.y * cols + col] = sum;
}

struct RopeShape {
  int64_t stride_b, stride_s, stride_h, stride_d;
  int64_t seq, heads, dim, half;
  bool interleaved;
  int64_t cos_stride_b;  // rows of cos/sin per b: S, or 0 where the batch shares them
};

template <typename T>
__global__ void RopeKernel(const T* __restrict__ x, const T* __restrict__ cos,
                           const T* __restrict__ sin, T* __restrict__ out, int64_t total,
                           RopeShape p) {
  PrecedingKernelsDone();
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= total) return;
  const int64_t j = index % p.dim;
  int64_t rest = index / p.dim;
  const int64_t h = rest % p.heads;
  rest /= p.heads;
  const int64_t s = rest % p.seq;
  const int64_t b = rest / p.seq;
  const T* in = x + b * p.stride_b + s * p.stride_s + h * p.stride_h;
  if (j >= 2 * p.half) {
    out[index] = in[j * p.stride_d];
    return;
  }
  const int64_t i = j < p.half ? j : j - p.half;
  const int64_t i1 = p.interleaved ? 2 * i : i;
  const int64_t i2 = p.interleaved ? 2 * i + 1 : i + p.half;
  const float x1 = ToFloat(in[i1 * p.stride_d]);
  const float x2 = ToFloat(in[i2 * p.stride_d]);
  const int64_t c = (b * p.cos_stride_b + s) * p.half + i;
  out[index] = Rotated<T>(j < p.half, x1, x2, ToFloat(cos[c]), ToFloat(sin[c]));
}

template <typename T>
__global__ void TokenLogProbsForwardKernel(const T* __restrict__ logits,
                                           const int64_t* __restrict__ targets, int64_t vocab,
                                           float* __restrict__ log_probs, float* __restrict__ lse,
                                           float* __restrict__ entropy) {
  __shared__ SoftmaxStats scratch[kWarps];
  const T* row = logits + blockIdx.x * vocab;
  SoftmaxStats stats;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) Add(stats, ToFloat(row[i]));
  stats = BlockMerge(stats, scratch);
  if (threadIdx.x == 0) {
    const float log_sum = logf(stats.s);
    const float row_lse = stats.m + log_sum;
    lse[blockIdx.x] = row_lse;
    log_probs[blockIdx.x] = ToFloat(row[targets[blockIdx.x]]) - row_lse;
    // H = -sum p (x - lse) = lse - m - E[x - m] = log s - t / s.
    if (entropy != nullptr) entropy[blockIdx.x] = log_sum - stats.t / stats.s;
  }
}

template <typename T>
__global__ void TokenLogProbsBackwardKernel(const T* __restrict__ logits,
                                            const int64_t* __restrict__ targets,
                                            const float* __restrict__ lse,
                                            const float* __restrict__ entropy,
                                            const float* __restrict__ grad_log_probs,
                                            const float* __restrict__ grad_entropy, int64_t vocab,
                                            T* __restrict__ grad_logits) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * vocab;
  T* grad_row = grad_logits + r * vocab;
  const float row_lse = lse[r];
  const float g_lp = grad_log_probs != nullptr ? grad_log_probs[r] : 0.0f;
  const float g_h = grad_entropy != nullptr ? grad_entropy[r] : 0.0f;
  // d H / d x = p * (E[x] - x) with E[x] = lse - H.
  const float mean_x = grad_entropy != nullptr ? row_lse - entropy[r] : 0.0f;
  const int64_t target = targets[r];
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = ToFloat(row[i]);
    const float p = expf(x - row_lse);
    float g = -g_lp * p;
    if (i == target) g += g_lp;
    if (g_h != 0.0f && p > 0.0f) g += g_h * p * (mean_x - x);
    grad_row[i] = FromFloat<T>(g);
  }
}

}  // namespace

namespace {

template <typename T>
cudaError_t LaunchRmsNorm(const void* x, const void* add, const float* partials, const void* weight,
                          void* out, void* sum, float* inv_rms, int64_t rows, int64_t cols,
                          float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  static_assert(kAddPartialsMaxCols == 8 * kThreads, "the partial sums' loads in registers");
  if (partials != nullptr && cols > kAddPartialsMaxCols) return cudaErrorInvalidValue;
  const auto kernel =
      partials != nullptr
          ? (cols <= 4 * kThreads ? RmsNormKernel<T, 4, true> : RmsNormKernel<T, 8, true>)
      : cols <= 4 * kThreads  ? RmsNormKernel<T, 4>
      : cols <= 8 * kThreads  ? RmsNormKernel<T, 8>
      : cols <= 32 * kThreads ? RmsNormKernel<T, 32>
                              : RmsNormKernel<T, 0>;
  return Launch(kernel, rows, kThreads, 0, stream, static_cast<const T*>(x),
                static_cast<const T*>(add), partials, static_cast<const T*>(weight),
                static_cast<T*>(out), static_cast<T*>(sum), inv_rms, cols, eps);
}

thread_local bool programmatic_launch = false;
thread_local bool shared_weight_linear = true;
std::atomic<bool> programmatic_refused{false};

}  // namespace

ProgrammaticLaunch::ProgrammaticLaunch(bool on) : previous_(programmatic_launch) {
  int device = 0, major = 0;
  programmatic_launch =
      on && !programmatic_refused.load() && cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      major >= 9;
}

ProgrammaticLaunch::~ProgrammaticLaunch() { programmatic_launch = previous_; }

bool ProgrammaticLaunch::On() { return programmatic_launch && !programmatic_refused.load(); }

void ProgrammaticLaunch::Refused() {
  programmatic_refused.store(true);
  programmatic_launch = false;
}

SharedWeightLinear::SharedWeightLinear(bool on) : previous_(shared_weight_linear) {
  shared_weight_linear = on;
}

SharedWeightLinear::~SharedWeightLinear() { shared_weight_linear = previous_; }

bool SharedWeightLinear::On() { return shared_weight_linear; }

cudaError_t RmsNorm(const void* x, const void* weight, void* out, float* inv_rms, int64_t rows,
                    int64_t cols, float eps, DtypeCode dtype, cudaStream_t stream) {
  return dtype == kBFloat16
             ? LaunchRmsNorm<__nv_bfloat16>(x, nullptr, nullptr, weight, out, nullptr, inv_rms,
                                            rows, cols, eps, stream)
             : LaunchRmsNorm<float>(x, nullptr, nullptr, weight, out, nullptr, inv_rms, rows, cols,
                                    eps, stream);
}

cudaError_t AddRmsNorm(const void* x, const void* add, const void* weight, void* sum, void* out,
                       int64_t rows, int64_t cols, float eps, DtypeCode dtype,
                       cudaStream_t stream) {
  return dtype == kBFloat16 ? LaunchRmsNorm<__nv_bfloat16>(x, add, nullptr, weight, out, sum,
                                                           nullptr, rows, cols, eps, stream)
                            : LaunchRmsNorm<float>(x, add, nullptr, weight, out, sum, nullptr, rows,
                                                   cols, eps, stream);
}

cudaError_t AddPartialsRmsNorm(const void* x, const float* partials, const void* weight, void* sum,
                               void* out, int64_t rows, int64_t cols, float eps, DtypeCode dtype,
                               cudaStream_t stream) {
  if (partials == nullptr) return cudaErrorInvalidValue;
  return dtype == kBFloat16 ? LaunchRmsNorm<__nv_bfloat16>(x, nullptr, partials, weight, out, sum,
                                                           nullptr, rows, cols, eps, stream)
                            : LaunchRmsNorm<float>(x, nullptr, partials, weight, out, sum, nullptr,
                                                   rows, cols, eps, stream);
}

cudaError_t RmsNormBackward(const void* x, const void* weight, const float* inv_rms,
                            const void* grad_out, int64_t rows, int64_t cols, DtypeCode dtype,
                            void* grad_x, float* grad_weight_partial, int64_t chunks,
                            cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const dim3 weight_grid((cols + kThreads - 1) / kThreads, chunks);
  if (dtype == kBFloat16) {
    using T = __nv_bfloat16;
    RmsNormGradInputKernel<<<rows, kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), inv_rms,
        static_cast<const T*>(grad_out), cols, static_cast<T*>(grad_x));
    RmsNormGradWeightKernel<<<weight_grid, kThreads, 0, stream>>>(
        static_cast<const T*>(x), inv_rms, static_cast<const T*>(grad_out), rows, cols,
        rows_per_chunk, grad_weight_partial);
  } else {
    RmsNormGradInputKernel<<<rows, kThreads, 0, stream>>>(
        static_cast<const float*>(x), static_cast<const float*>(weight), inv_rms,
        static_cast<const float*>(grad_out), cols, static_cast<float*>(grad_x));
    RmsNormGradWeightKernel<<<weight_grid, kThreads, 0, stream>>>(
        static_cast<const float*>(x), inv_rms, static_cast<const float*>(grad_out), rows, cols,
        rows_per_chunk, grad_weight_partial);
  }
  return cudaGetLastError();
}

cudaError_t Rope(const void* x, int64_t stride_b, int64_t stride_s, int64_t stride_h,
                 int64_t stride_d, const void* cos, const void* sin, int64_t cos_stride_b,
                 void* out, int64_t batch, int64_t seq, int64_t heads, int64_t dim, int64_t half,
                 bool interleaved, DtypeCode dtype, cudaStream_t stream) {
  const int64_t total = batch * seq * heads * dim;
  if (total == 0) return cudaSuccess;
  const RopeShape shape{stride_b, stride_s, stride_h, stride_d,    seq,
                        heads,    dim,      half,     interleaved, cos_stride_b};
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  if (dtype == kBFloat16) {
    using T = __nv_bfloat16;
    return Launch(RopeKernel<T>, blocks, kThreads, 0, stream, static_cast<const T*>(x),
                  static_cast<const T*>(cos), static_cast<const T*>(sin), static_cast<T*>(out),
                  total, shape);
  }
  return Launch(RopeKernel<float>, blocks, kThreads, 0, stream, static_cast<const float*>(x),
                static_cast<const float*>(cos), static_cast<const float*>(sin),
                static_cast<float*>(out), total, shape);
}

cudaError_t TokenLogProbsForward(const void* logits, const int64_t* targets, int64_t rows,
                                 int64_t vocab, DtypeCode dtype, float* log_probs, float* lse,
                                 float* entropy, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (dtype == kBFloat16) {
    TokenLogProbsForwardKernel<<<rows, kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(logits), targets, vocab, log_probs, lse, entropy);
  } else {
    TokenLogProbsForwardKernel<<<rows, kThreads, 0, stream>>>(
        static_cast<const float*>(logits), targets, vocab, log_probs, lse, entropy);
  }
  return cudaGetLastError();
}

cudaError_t TokenLogProbsBackward(const void* logits, const int64_t* targets, const float* lse,
                                  const float* entropy, const float* grad_log_probs,
                                  const float* grad_entropy, int64_t rows, int64_t vocab,
                                  DtypeCode dtype, void* grad_logits, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (dtype == kBFloat16) {
    TokenLogProbsBackwardKernel<<<rows, kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(logits), targets, lse, entropy, grad_log_probs,
        grad_entropy, vocab, static_cast<__nv_bfloat16*>(grad_logits));
  } else {
    TokenLogProbsBackwardKernel<<<rows, kThreads, 0, stream>>>(
        static_cast<const float*>(logits), targets, lse, entropy, grad_log_probs, grad_entropy,
        vocab, static_cast<float*>(grad_logits));
  }
  return cudaGetLastError();
}

}  // namespace rl::kernels
