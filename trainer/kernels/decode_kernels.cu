// The decode-step kernels of cuda_kernels.h: SiluMul, DecodeQkvPrep and DecodeAttention.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

constexpr int kDecodeWarps = 4;          // warps per block of the decode kernels
constexpr int kMaxGroup = 8;             // query heads per key/value head
constexpr int kKeysPerIteration = 4;     // keys a warp loads at once
constexpr int kBlocksPerSm = 8;          // DecodeAttention splits the keys until about this many

template <typename T>
__global__ void SiluMulKernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows,
                              int64_t inner) {
  const int64_t total = rows * inner;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / inner;
    const int64_t j = i - r * inner;
    const float g = ToFloat(gate_up[r * 2 * inner + j]);
    const float u = ToFloat(gate_up[r * 2 * inner + inner + j]);
    // at::silu: g / (1 + exp(-g)) in fp32, rounded; then the product, rounded.
    const float s = ToFloat(FromFloat<T>(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g)))));
    out[i] = FromFloat<T>(__fmul_rn(s, u));
  }
}

// Sum over the lanes of a warp, every lane getting it, in BlockSum's order within a warp.
__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

// One warp per (row, head) of the q, k and v heads of qkv. Lane l holds the head's elements
// l, l + 32, ... (as RmsNormKernel's block of kThreads holds one element per thread).
template <typename T>
__global__ void DecodeQkvPrepKernel(const T* __restrict__ qkv, const T* __restrict__ q_norm,
                                    const T* __restrict__ k_norm, const T* __restrict__ cos,
                                    const T* __restrict__ sin,
                                    const int64_t* __restrict__ position, T* __restrict__ q_out,
                                    T* __restrict__ k_cache, T* __restrict__ v_cache,
                                    int64_t batch, QkvPrepShape p) {
  constexpr int kPerLane = kMaxHeadDim / 32;
  __shared__ float normed[kDecodeWarps][kMaxHeadDim];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t heads = p.q_heads + 2 * p.kv_heads;
  const int64_t index = blockIdx.x * static_cast<int64_t>(kDecodeWarps) + warp;
  if (index >= batch * heads) return;
  const int64_t b = index / heads;
  const int64_t head = index % heads;
  const int64_t pos = *position;
  const T* in = qkv + b * p.qkv_stride + head * p.dim;
  if (head >= p.q_heads + p.kv_heads) {  // a value head: into the cache as it is
    T* dst = v_cache + b * p.v_stride_b + (head - p.q_heads - p.kv_heads) * p.v_stride_h +
             pos * p.v_stride_t;
    for (int64_t j = lane; j < p.dim; j += 32) dst[j] = in[j];
    return;
  }
  const bool is_q = head < p.q_heads;
  const T* norm = is_q ? q_norm : k_norm;
  float x[kPerLane];
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    x[i] = j < p.dim ? ToFloat(in[j]) : 0.0f;
  }
  if (norm != nullptr) {
    // RmsNormKernel's sum of squares bit for bit: its warp i sums elements [32 i, 32 i + 32)
    // (the same butterfly as here), then lanes 0-7 of one warp hold the 8 warp sums (zeros past
    // the row) and a butterfly adds them; offsets 16 and 8 add zeros there, 4, 2, 1 remain.
    float sums[kWarps];
    for (int i = 0; i < kWarps; ++i) sums[i] = i < kPerLane ? WarpSum(x[i] * x[i]) : 0.0f;
    for (int offset = 4; offset > 0; offset /= 2) {
      float next[kWarps];
      for (int i = 0; i < kWarps; ++i) next[i] = sums[i] + sums[i ^ offset];
      for (int i = 0; i < kWarps; ++i) sums[i] = next[i];
    }
    const float inv = rsqrtf(sums[0] / static_cast<float>(p.dim) + p.eps);
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = lane + 32 * i;
      if (j < p.dim) {
        const float h = ToFloat(FromFloat<T>(__fmul_rn(x[i], inv)));
        x[i] = ToFloat(FromFloat<T>(__fmul_rn(ToFloat(norm[j]), h)));
      }
    }
  }
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j < p.dim) normed[warp][j] = x[i];
  }
  __syncwarp();
  T* dst = is_q ? q_out + (b * p.q_heads + head) * p.dim
                : k_cache + b * p.k_stride_b + (head - p.q_heads) * p.k_stride_h +
                      pos * p.k_stride_t;
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t j = lane + 32 * i;
    if (j >= p.dim) break;
    if (j >= 2 * p.half) {
      dst[j] = FromFloat<T>(x[i]);
      continue;
    }
    // RopeKernel's arithmetic, on the normed values.
    const int64_t r = j < p.half ? j : j - p.half;
    const float x1 = normed[warp][p.interleaved ? 2 * r : r];
    const float x2 = normed[warp][p.interleaved ? 2 * r + 1 : r + p.half];
    const float c = ToFloat(cos[r]);
    const float n = ToFloat(sin[r]);
    const float a = ToFloat(FromFloat<T>(__fmul_rn(j < p.half ? x1 : x2, c)));
    const float e = ToFloat(FromFloat<T>(__fmul_rn(j < p.half ? x2 : x1, n)));
    dst[j] = FromFloat<T>(j < p.half ? __fsub_rn(a, e) : __fadd_rn(a, e));
  }
}

// kVec consecutive elements of T at `src` (aligned to their size, which DecodeAttention's caller
// checks), as floats, in one vector load.
template <typename T, int kVec>
__device__ __forceinline__ void LoadRow(const T* __restrict__ src, float (&dst)[kVec]) {
  struct alignas(sizeof(T) * kVec) Pack {
    T v[kVec];
  };
  const Pack pack = *reinterpret_cast<const Pack*>(src);
  for (int e = 0; e < kVec; ++e) dst[e] = ToFloat(pack.v[e]);
}

// Block (split, kv head, row): the G query heads of one key/value head against keys
// [split * chunk, min(split * chunk + chunk, position + 1)). Warp w takes keys
// begin + w * kKeysPerIteration + i * kDecodeWarps * kKeysPerIteration, each with an online
// softmax; the warps are merged in shared memory. Lane l holds dims [l kVec, l kVec + kVec).
// With one split the block writes the normalised output; with more, its unnormalised partial
// output, max and sum for DecodeAttentionCombineKernel. A split past the position writes nothing.
template <typename T, int kVec>
__global__ void DecodeAttentionKernel(const T* __restrict__ q, const T* __restrict__ k,
                                      const T* __restrict__ v,
                                      const int64_t* __restrict__ position, T* __restrict__ out,
                                      float* __restrict__ partial_out,
                                      float* __restrict__ partial_stats, DecodeAttentionShape p) {
  constexpr int kDim = 32 * kVec;
  __shared__ float warp_out[kDecodeWarps][kMaxGroup][kDim];
  __shared__ float warp_max[kDecodeWarps][kMaxGroup];
  __shared__ float warp_sum[kDecodeWarps][kMaxGroup];
  const int split = blockIdx.x;
  const int64_t kv_head = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = static_cast<int>(p.q_heads / p.kv_heads);
  const int64_t pos = *position;
  const int64_t begin = split * p.chunk;
  if (begin > pos) return;
  const int64_t end = begin + p.chunk < pos + 1 ? begin + p.chunk : pos + 1;

  float query[kMaxGroup][kVec];
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      LoadRow<T, kVec>(q + ((b * p.q_heads + kv_head * group + g) * kDim + lane * kVec),
                       query[g]);
    }
  }
  float running_max[kMaxGroup], running_sum[kMaxGroup], acc[kMaxGroup][kVec];
  for (int g = 0; g < kMaxGroup; ++g) {
    running_max[g] = -FLT_MAX;
    running_sum[g] = 0.0f;
    for (int e = 0; e < kVec; ++e) acc[g][e] = 0.0f;
  }
  const T* k_base = k + b * p.k_stride_b + kv_head * p.k_stride_h + lane * kVec;
  const T* v_base = v + b * p.v_stride_b + kv_head * p.v_stride_h + lane * kVec;
  for (int64_t t0 = begin + warp * kKeysPerIteration; t0 < end;
       t0 += kDecodeWarps * kKeysPerIteration) {
    float keys[kKeysPerIteration][kVec], values[kKeysPerIteration][kVec];
    for (int u = 0; u < kKeysPerIteration; ++u) {
      if (t0 + u < end) {
        LoadRow<T, kVec>(k_base + (t0 + u) * p.k_stride_t, keys[u]);
        LoadRow<T, kVec>(v_base + (t0 + u) * p.v_stride_t, values[u]);
      }
    }
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= group) break;
      float scores[kKeysPerIteration];
      float step_max = running_max[g];
      for (int u = 0; u < kKeysPerIteration; ++u) {
        float dot = 0.0f;
        if (t0 + u < end) {
          for (int e = 0; e < kVec; ++e) dot += query[g][e] * keys[u][e];
        }
        dot = WarpSum(dot);
        scores[u] = t0 + u < end ? dot * p.scale : -FLT_MAX;
        step_max = fmaxf(step_max, scores[u]);
      }
      const float correction = expf(running_max[g] - step_max);
      running_sum[g] *= correction;
      for (int e = 0; e < kVec; ++e) acc[g][e] *= correction;
      for (int u = 0; u < kKeysPerIteration; ++u) {
        if (t0 + u >= end) break;
        const float weight = expf(scores[u] - step_max);
        running_sum[g] += weight;
        for (int e = 0; e < kVec; ++e) acc[g][e] += weight * values[u][e];
      }
      running_max[g] = step_max;
    }
  }
  for (int g = 0; g < group; ++g) {
    for (int e = 0; e < kVec; ++e) warp_out[warp][g][lane * kVec + e] = acc[g][e];
    if (lane == 0) {
      warp_max[warp][g] = running_max[g];
      warp_sum[warp][g] = running_sum[g];
    }
  }
  __syncthreads();
  // Merge the warps: thread i takes (g, d) = (i / kDim, i % kDim), and so on.
  for (int i = threadIdx.x; i < group * kDim; i += blockDim.x) {
    const int g = i / kDim;
    const int d = i % kDim;
    float m = -FLT_MAX;
    for (int w = 0; w < kDecodeWarps; ++w) m = fmaxf(m, warp_max[w][g]);
    float sum = 0.0f, o = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      if (warp_sum[w][g] == 0.0f) continue;  // a warp that saw no key
      const float scale = expf(warp_max[w][g] - m);
      sum += warp_sum[w][g] * scale;
      o += warp_out[w][g][d] * scale;
    }
    const int64_t row = b * p.q_heads + kv_head * group + g;  // [B, Hq]
    if (p.splits == 1) {
      out[row * kDim + d] = FromFloat<T>(o / sum);
    } else {
      partial_out[(row * p.splits + split) * kDim + d] = o;
      if (d == 0) {
        partial_stats[(row * p.splits + split) * 2] = m;
        partial_stats[(row * p.splits + split) * 2 + 1] = sum;
      }
    }
  }
}

// Block per (row, query head), a thread per dim: merges the splits that hold keys.
template <typename T>
__global__ void DecodeAttentionCombineKernel(const float* __restrict__ partial_out,
                                             const float* __restrict__ partial_stats,
                                             const int64_t* __restrict__ position,
                                             T* __restrict__ out, int64_t dim,
                                             DecodeAttentionShape p) {
  const int64_t row = blockIdx.x;
  const int64_t used = *position / p.chunk + 1;  // splits with keys
  const int64_t splits = used < p.splits ? used : p.splits;
  const float* stats = partial_stats + row * p.splits * 2;
  float m = -FLT_MAX;
  for (int64_t s = 0; s < splits; ++s) m = fmaxf(m, stats[2 * s]);
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float sum = 0.0f, o = 0.0f;
    for (int64_t s = 0; s < splits; ++s) {
      const float scale = expf(stats[2 * s] - m);
      sum += stats[2 * s + 1] * scale;
      o += partial_out[(row * p.splits + s) * dim + d] * scale;
    }
    out[row * dim + d] = FromFloat<T>(o / sum);
  }
}

int MultiprocessorCount() {
  static const int count = [] {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 132;
    }
    return sms;
  }();
  return count;
}

template <typename T, int kVec>
cudaError_t LaunchDecodeAttention(const void* q, const void* k, const void* v,
                                  const int64_t* position, void* out, float* partial_out,
                                  float* partial_stats, int64_t batch,
                                  const DecodeAttentionShape& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.kv_heads),
                  static_cast<unsigned>(batch));
  DecodeAttentionKernel<T, kVec><<<grid, kDecodeWarps * 32, 0, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), position,
      static_cast<T*>(out), partial_out, partial_stats, p);
  if (p.splits > 1) {
    DecodeAttentionCombineKernel<T><<<batch * p.q_heads, 32 * kVec, 0, stream>>>(
        partial_out, partial_stats, position, static_cast<T*>(out), 32 * kVec, p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t DispatchDecodeAttention(const void* q, const void* k, const void* v,
                                    const int64_t* position, void* out, float* partial_out,
                                    float* partial_stats, int64_t batch, int64_t dim,
                                    const DecodeAttentionShape& p, cudaStream_t stream) {
  switch (dim) {
    case 64:
      return LaunchDecodeAttention<T, 2>(q, k, v, position, out, partial_out, partial_stats,
                                         batch, p, stream);
    case 128:
      return LaunchDecodeAttention<T, 4>(q, k, v, position, out, partial_out, partial_stats,
                                         batch, p, stream);
    case 256:
      return LaunchDecodeAttention<T, 8>(q, k, v, position, out, partial_out, partial_stats,
                                         batch, p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t SiluMul(const void* gate_up, void* out, int64_t rows, int64_t inner, DtypeCode dtype,
                    cudaStream_t stream) {
  const int64_t total = rows * inner;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 65535);
  if (dtype == kBFloat16) {
    SiluMulKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(gate_up),
                                                   static_cast<__nv_bfloat16*>(out), rows, inner);
  } else {
    SiluMulKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(gate_up),
                                                   static_cast<float*>(out), rows, inner);
  }
  return cudaGetLastError();
}

cudaError_t DecodeQkvPrep(const void* qkv, const void* q_norm, const void* k_norm,
                          const void* cos, const void* sin, const int64_t* position, void* q_out,
                          void* k_cache, void* v_cache, int64_t batch, const QkvPrepShape& shape,
                          DtypeCode dtype, cudaStream_t stream) {
  if (shape.dim > kMaxHeadDim || 2 * shape.half > shape.dim) return cudaErrorInvalidValue;
  const int64_t warps = batch * (shape.q_heads + 2 * shape.kv_heads);
  if (warps == 0) return cudaSuccess;
  const int64_t blocks = (warps + kDecodeWarps - 1) / kDecodeWarps;
  if (dtype == kBFloat16) {
    using T = __nv_bfloat16;
    DecodeQkvPrepKernel<<<blocks, kDecodeWarps * 32, 0, stream>>>(
        static_cast<const T*>(qkv), static_cast<const T*>(q_norm), static_cast<const T*>(k_norm),
        static_cast<const T*>(cos), static_cast<const T*>(sin), position, static_cast<T*>(q_out),
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), batch, shape);
  } else {
    DecodeQkvPrepKernel<<<blocks, kDecodeWarps * 32, 0, stream>>>(
        static_cast<const float*>(qkv), static_cast<const float*>(q_norm),
        static_cast<const float*>(k_norm), static_cast<const float*>(cos),
        static_cast<const float*>(sin), position, static_cast<float*>(q_out),
        static_cast<float*>(k_cache), static_cast<float*>(v_cache), batch, shape);
  }
  return cudaGetLastError();
}

DecodeAttentionShape PlanDecodeAttention(int64_t batch, int64_t q_heads, int64_t kv_heads,
                                         int64_t key_length, float scale) {
  DecodeAttentionShape p;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
  p.scale = scale;
  const int64_t pairs = batch * kv_heads;
  const int64_t wanted = (static_cast<int64_t>(kBlocksPerSm) * MultiprocessorCount() + pairs - 1) /
                         pairs;  // splits that bring the grid to about kBlocksPerSm per SM
  const int64_t min_chunk = kDecodeWarps * kKeysPerIteration;
  const int64_t most = (key_length + min_chunk - 1) / min_chunk;
  const int64_t splits = std::max<int64_t>(1, std::min(wanted, most));
  p.chunk = (key_length + splits - 1) / splits;
  p.splits = static_cast<int>((key_length + p.chunk - 1) / p.chunk);
  return p;
}

bool DecodeAttentionSupports(int64_t q_heads, int64_t kv_heads, int64_t dim) {
  return (dim == 64 || dim == 128 || dim == 256) && kv_heads > 0 && q_heads % kv_heads == 0 &&
         q_heads / kv_heads <= kMaxGroup;
}

cudaError_t DecodeAttention(const void* q, const void* k, const void* v, const int64_t* position,
                            void* out, float* partial_out, float* partial_stats, int64_t batch,
                            int64_t dim, const DecodeAttentionShape& shape, DtypeCode dtype,
                            cudaStream_t stream) {
  if (!DecodeAttentionSupports(shape.q_heads, shape.kv_heads, dim)) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  return dtype == kBFloat16
             ? DispatchDecodeAttention<__nv_bfloat16>(q, k, v, position, out, partial_out,
                                                      partial_stats, batch, dim, shape, stream)
             : DispatchDecodeAttention<float>(q, k, v, position, out, partial_out, partial_stats,
                                              batch, dim, shape, stream);
}

}  // namespace rl::kernels
