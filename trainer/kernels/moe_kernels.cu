// The MoE block's decode-step kernels (cuda_kernels.h): RouterTopK, a router's choice of experts
// and their weights per token from its fp32 logits; SortByExpert, the (token, slot) pairs sorted
// by expert; CombineExperts, the experts' rows weighted and summed per token.
//
// Note [Router kernel]
// The LibTorch ops of a router (Route in trainer/model/layers.cc) take about ten kernels per MoE
// layer and token batch: the softmax or the sigmoid, the bias, DeepSeek-V3's group selection
// (the sum of each group's two best scores, the best topk_group groups, the mask), the top-k,
// the gather of the weights, their sum, the division and the scaling. In a decode step the batch
// is a few dozen tokens, so those are launches, not work. Here one warp takes one token, lane l
// holding the experts l, l + 32, ...:
//  - softmax router (Qwen3-MoE): p = softmax(logits) (the maximum and the sum by warp
//    reductions), choose by p;
//  - sigmoid noaux_tc (DeepSeek-V3, GLM, Kimi): s = sigmoid(logits), choose by s + bias; with
//    groups, each group's score is the sum of its two largest choices and the experts outside
//    the best topk_group groups drop out;
//  - k rounds of a warp arg-max (ties to the lower expert id) pick the experts, in descending
//    order; their weights are p (or s) there, divided by their sum (plus 1e-20 for sigmoid) with
//    norm_topk_prob, times routed_scaling_factor for sigmoid.
// The same choices as the ops but for exact ties, which the ops break in no stated order; the
// weights equal the ops' up to the order of the softmax's sum (their order of ids is the ops'
// topk's, here descending). Per token, so graphs and eager steps agree.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

constexpr int kRouterWarps = 4;  // tokens per block

struct Best {
  float value;
  int expert;
};

// The better of two candidates: the larger value, then the lower expert id.
__device__ __forceinline__ Best Better(Best a, Best b) {
  return (b.value > a.value || (b.value == a.value && b.expert < a.expert)) ? b : a;
}

__device__ __forceinline__ Best WarpBest(Best b) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const Best other{__shfl_xor_sync(0xffffffff, b.value, offset),
                     __shfl_xor_sync(0xffffffff, b.expert, offset)};
    b = Better(b, other);
  }
  return b;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
  return v;
}

template <int kPerLane>
__global__ void __launch_bounds__(kRouterWarps * 32)
    RouterTopKKernel(const float* __restrict__ logits, const float* __restrict__ bias,
                     int64_t* __restrict__ ids, float* __restrict__ weights, RouterShape p) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  PrecedingKernelsDone();
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (token >= p.tokens) return;  // the whole warp
  const float* row = logits + token * p.experts;
  float score[kPerLane];   // the weight an expert would get: p or s
  float choice[kPerLane];  // what chooses it; -inf for no expert or a dropped one
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    score[i] = e < p.experts ? row[e] : -CUDART_INF_F;
  }
  if (p.sigmoid) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      score[i] = e < p.experts ? 1.0f / (1.0f + expf(-score[i])) : 0.0f;
      choice[i] = e < p.experts ? score[i] + (bias != nullptr ? bias[e] : 0.0f) : -CUDART_INF_F;
    }
  } else {
    float largest = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) largest = fmaxf(largest, score[i]);
    largest = WarpMax(largest);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      score[i] = lane + 32 * i < p.experts ? expf(score[i] - largest) : 0.0f;
      sum += score[i];
    }
    sum = WarpSum(sum);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      score[i] /= sum;
      choice[i] = lane + 32 * i < p.experts ? score[i] : -CUDART_INF_F;
    }
  }
  if (p.groups > 1) {
    // Each group's score: the sum of its two largest choices (top-2 of each lane, merged).
    const int per_group = p.experts / p.groups;
    float group_score[kMaxRouterGroups];
    for (int g = 0; g < p.groups; ++g) {
      float first = -CUDART_INF_F, second = -CUDART_INF_F;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + 32 * i;
        if (e >= p.experts || e / per_group != g) continue;
        if (choice[i] > first) {
          second = first;
          first = choice[i];
        } else if (choice[i] > second) {
          second = choice[i];
        }
      }
      for (int offset = 16; offset > 0; offset /= 2) {
        const float other_first = __shfl_xor_sync(0xffffffff, first, offset);
        const float other_second = __shfl_xor_sync(0xffffffff, second, offset);
        second = fmaxf(fminf(first, other_first), fmaxf(second, other_second));
        first = fmaxf(first, other_first);
      }
      group_score[g] = first + second;
    }
    // The best topk_group groups (ties to the lower group); every lane computes the same.
    bool kept[kMaxRouterGroups];
    for (int g = 0; g < p.groups; ++g) kept[g] = false;
    for (int round = 0; round < p.topk_group; ++round) {
      int best = -1;
      for (int g = 0; g < p.groups; ++g) {
        if (!kept[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
      }
      kept[best] = true;
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < p.experts && !kept[e / per_group]) choice[i] = -CUDART_INF_F;
    }
  }
  // k rounds of the arg-max; lane 0 keeps the choices.
  int64_t chosen[kMaxRouterK];
  float weight[kMaxRouterK];
  float total = 0.0f;
  for (int j = 0; j < p.k; ++j) {
    Best mine{-CUDART_INF_F, static_cast<int>(p.experts)};  // past every expert
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) mine = Better(mine, Best{choice[i], lane + 32 * i});
    Best best = WarpBest(mine);
    // No finite choice left (NaN logits): an expert id in range all the same, of weight 0.
    if (best.expert >= p.experts) best.expert = static_cast<int>(p.experts) - 1;
    const int owner = best.expert % 32;
    const int slot = best.expert / 32;
    float w = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (i == slot && lane == owner) {
        w = score[i];
        choice[i] = -CUDART_INF_F;
      }
    }
    w = __shfl_sync(0xffffffff, w, owner);
    chosen[j] = best.expert;
    weight[j] = w;
    total += w;
  }
  if (lane != 0) return;
  const float divisor = p.normalize ? (p.sigmoid ? total + 1e-20f : total) : 1.0f;
  for (int j = 0; j < p.k; ++j) {
    ids[token * p.k + j] = chosen[j];
    const float w = weight[j] / divisor;
    weights[token * p.k + j] = p.sigmoid ? w * p.scale : w;
  }
}

// Note [Sort by expert kernel]
// The MoE block sorts its (token, slot) pairs by expert (Note [MoE block] in
// trainer/model/layers.h): a stable argsort, the sorted ids, each expert's end by searchsorted and
// the inverse permutation by a scatter, some eight kernels. One block does it here, for the few
// hundred pairs of a decode step: counts per expert (shared-memory atomics: the counts do not
// depend on their order), their inclusive scan (the ends), then the pairs in chunks of the
// block's size in pair order, each placed at its expert's start plus the pairs of that expert
// before it (those of earlier chunks, counted as the chunks pass, and those earlier in its own
// chunk, counted by comparing ids). That is the stable order, so every output equals the ops'
// bit for bit.
constexpr int kSortThreads = 256;

__global__ void __launch_bounds__(kSortThreads)
    SortByExpertKernel(const int64_t* __restrict__ ids, int64_t pairs, int64_t experts,
                       int64_t* __restrict__ order, int64_t* __restrict__ sorted_ids,
                       int32_t* __restrict__ ends, int64_t* __restrict__ inverse) {
  extern __shared__ int shared[];
  int* counts = shared;             // [experts], then each expert's start
  int* seen = shared + experts;     // [experts]: pairs of each expert in earlier chunks
  int* chunk_ids = seen + experts;  // [kSortThreads]
  PrecedingKernelsDone();
  for (int64_t e = threadIdx.x; e < experts; e += kSortThreads) {
    counts[e] = 0;
    seen[e] = 0;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += kSortThreads) {
    const int64_t id = ids[p];
    if (id >= 0 && id < experts) atomicAdd(&counts[id], 1);  // (the caller's ids are in range)
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive starts in counts, inclusive ends out
    int total = 0;
    for (int64_t e = 0; e < experts; ++e) {
      const int count = counts[e];
      counts[e] = total;
      total += count;
      ends[e] = total;
    }
  }
  __syncthreads();
  for (int64_t chunk = 0; chunk < pairs; chunk += kSortThreads) {
    const int64_t p = chunk + threadIdx.x;
    const int64_t read = p < pairs ? ids[p] : -1;
    const int id = read >= 0 && read < experts ? static_cast<int>(read) : -1;
    chunk_ids[threadIdx.x] = id;
    __syncthreads();
    if (id >= 0) {
      int before = 0;  // pairs of this expert earlier in the chunk
      for (int j = 0; j < static_cast<int>(threadIdx.x); ++j) before += chunk_ids[j] == id ? 1 : 0;
      const int64_t row = static_cast<int64_t>(counts[id]) + seen[id] + before;
      order[row] = p;
      sorted_ids[row] = id;
      inverse[p] = row;
    }
    __syncthreads();  // every thread has read seen[] for this chunk
    if (id >= 0) atomicAdd(&seen[id], 1);
    __syncthreads();
  }
}

// Note [Combine kernel]
// The MoE block's last steps (Note [MoE block] in trainer/model/layers.h) take the experts' rows
// back to pair order (an index_select by the inverse permutation), multiply them by the routing
// weights (fp32), sum each token's k slots, cast to the model's dtype and add the shared expert:
// five kernels and a [T, k, H] fp32 temporary. Here a block per token reads each of its k rows
// where the experts left it (sorted row inverse[t k + j]) and sums the fp32 products in slot
// order, each product and sum rounded as its own op (__fmul_rn, __fadd_rn: no contraction), then
// rounds to T and adds the shared expert's row as at::add does. The ops' sum over the slots may
// add them in another order, so the result equals theirs up to that rounding.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    CombineExpertsKernel(const T* __restrict__ rows, const int64_t* __restrict__ inverse,
                         const float* __restrict__ weights, const T* __restrict__ shared,
                         T* __restrict__ out, int64_t k, int64_t hidden) {
  PrecedingKernelsDone();
  const int64_t token = blockIdx.x;
  for (int64_t h = threadIdx.x; h < hidden; h += kThreads) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pair = token * k + j;
      sum = __fadd_rn(sum, __fmul_rn(ToFloat(rows[inverse[pair] * hidden + h]), weights[pair]));
    }
    T value = FromFloat<T>(sum);
    if (shared != nullptr)
      value = AddRounded<T>(ToFloat(value), ToFloat(shared[token * hidden + h]));
    out[token * hidden + h] = value;
  }
}

}  // namespace

cudaError_t CombineExperts(const void* rows, const int64_t* inverse, const float* weights,
                           const void* shared, void* out, int64_t tokens, int64_t k, int64_t hidden,
                           DtypeCode dtype, cudaStream_t stream) {
  if (tokens < 0 || k < 1 || hidden < 1 || tokens > 2147483647) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(tokens);
  if (dtype == kBFloat16) {
    using T = __nv_bfloat16;
    return Launch(CombineExpertsKernel<T>, blocks, kThreads, 0, stream, static_cast<const T*>(rows),
                  inverse, weights, static_cast<const T*>(shared), static_cast<T*>(out), k, hidden);
  }
  return Launch(CombineExpertsKernel<float>, blocks, kThreads, 0, stream,
                static_cast<const float*>(rows), inverse, weights,
                static_cast<const float*>(shared), static_cast<float*>(out), k, hidden);
}

bool SortByExpertSupports(int64_t pairs, int64_t experts) {
  return pairs >= 1 && pairs <= kMaxSortPairs && experts >= 1 && experts <= kMaxSortExperts;
}

cudaError_t SortByExpert(const int64_t* ids, int64_t pairs, int64_t experts, int64_t* order,
                         int64_t* sorted_ids, int32_t* ends, int64_t* inverse,
                         cudaStream_t stream) {
  if (!SortByExpertSupports(pairs, experts)) return cudaErrorInvalidValue;
  const size_t shared = (2 * static_cast<size_t>(experts) + kSortThreads) * sizeof(int);
  return Launch(SortByExpertKernel, 1, kSortThreads, shared, stream, ids, pairs, experts, order,
                sorted_ids, ends, inverse);
}

bool RouterTopKSupports(int64_t experts, int64_t k, int64_t groups, int64_t topk_group) {
  // Groups of two experts at least: a group's score is its two best.
  return experts >= 1 && experts <= 32 * kMaxRouterLanes && k >= 1 && k <= kMaxRouterK &&
         k <= experts && groups >= 1 && groups <= kMaxRouterGroups && experts % groups == 0 &&
         (groups == 1 || experts / groups >= 2) && topk_group >= 1 && topk_group <= groups &&
         topk_group * (experts / groups) >= k;
}

cudaError_t RouterTopK(const float* logits, const float* bias, int64_t* ids, float* weights,
                       const RouterShape& shape, cudaStream_t stream) {
  if (!RouterTopKSupports(shape.experts, shape.k, shape.groups, shape.topk_group)) {
    return cudaErrorInvalidValue;
  }
  if (shape.tokens == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((shape.tokens + kRouterWarps - 1) / kRouterWarps);
  const int per_lane = static_cast<int>((shape.experts + 31) / 32);
  const auto kernel = per_lane <= 2   ? RouterTopKKernel<2>
                      : per_lane <= 4 ? RouterTopKKernel<4>
                      : per_lane <= 8 ? RouterTopKKernel<8>
                                      : RouterTopKKernel<16>;
  return Launch(kernel, blocks, kRouterWarps * 32, 0, stream, logits, bias, ids, weights, shape);
}

}  // namespace rl::kernels
