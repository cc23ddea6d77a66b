// SampleRows (cuda_kernels.h): a decode step's token per row, drawn from the whole vocabulary,
// in one kernel.
//
// Note [Sampling kernel]
// The rule is SampleWithUniforms's for a row that keeps every token (trainer/rollout/sampler.h,
// Note [Sampling without a sort]): s = logits (as fp32) / T, p = softmax(s), the token is the
// first in id order whose cumulative p exceeds u (or, greedy, the first largest logit, NaN
// counting as the largest as in at::argmax), and its log-prob is log_softmax(s) there. The
// LibTorch ops take six passes over [B, V] in fp32 and fp64 (the cast, log_softmax, the fp64
// cast, softmax, cumsum); this kernel reads each row twice (the second time mostly from L2) and
// writes two numbers. A row takes a cluster of blocks (one block per row left the rest of the GPU
// idle and took 83-92 us a step at batch 1, bound by one SM's exponentials), whose blocks meet in
// distributed shared memory. The row's steps of 32 x kVec elements (lane l a vector of kVec) fall
// into 128 slices of whole steps, in order. A cluster has 8 blocks of 16 warps, a slice a warp,
// unless the rows' clusters of 8 would not all run at once (cudaOccupancyMaxActiveClusters: at
// batch 64 they took three waves on an H100); then 4 blocks, two consecutive slices a warp, or 2,
// four a warp. The slices, and every sum below, are the same whatever the cluster, so are the
// bits.
//  1. each block's largest s and first index of its largest logit (greedy) over its slices:
//     a thread keeps its largest logit, the index where `>` last took one (it visits its
//     elements in index order) and its first NaN's index, and scales the largest once (dividing
//     by T > 0 rounds monotonically: the largest s is the largest logit's); after a cluster
//     barrier every block takes the row's from the blocks' (max and TakeLarger give the same
//     whatever the order);
//  2. per step of its slice, each lane's exp(s - max) (expf, within 2 ulp: by estimate, exp in
//     fp64 would take tens of us for a row of 151,936 words) summed in fp64 in element order, and
//     the lanes' sums added by a warp butterfly into the step's total (shared memory, a double
//     per step); lane 0 sums its slice's steps in order. After a second cluster barrier each
//     block reads the 128 slice sums, and its first warp forms their prefix (excl[q]) and the
//     row's total, the same in every block: each lane adds 4 slices in order, then a warp scan
//     (a fixed order; one thread adding all 128 in turn made this phase 4.2 us instead of 1.9,
//     and the comparisons of TakeLarger per element made step 1 4.8 us instead of 2.3, of a
//     row's 16 and now 11 on an H100). The blocks arrive at a third barrier once read, and wait
//     at it just before they exit;
//  3. greedy: the argmax, written by block 0. Else, with t = u x total, the first slice with t <
//     excl[q + 1]; its warp repeats lane 0's sums to find the first step whose cumulative mass
//     exceeds t, loads that step again, and takes its first element whose cumulative mass,
//     excl[q] + (the steps before + (the lanes before, by a warp scan, + the lane's own up to
//     it)), exceeds t. Rounding can leave none there, within 1e-16 of the step's end: then the
//     step's last element of mass.
// So the tokens are those of the LibTorch ops up to where u falls within about 1e-7 of a boundary
// of the cumulative distribution (fp32 masses, summed in another order), and the log-prob is s -
// max - log(total) from the fp64 total, rounded once to fp32 (log_softmax in fp32 may differ in
// its last bits). A token is always a valid id, of positive mass where any word has it. A row's
// result does not depend on the batch: graphs and eager steps agree.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <math_constants.h>

#include <cstdint>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/kernel_util.cuh"

namespace rl::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kSampleWarps = 16;  // per block
constexpr int kSampleThreads = kSampleWarps * 32;
// A row's slices, whatever its cluster: so the sums, and with them the bits, do not depend on it.
constexpr int kSampleSlices = 128;
constexpr int kSampleMaxBlocks = kSampleSlices / kSampleWarps;  // a row's largest cluster: 8
constexpr int kSampleMinBlocks = 2;
static_assert(kSampleThreads >= kSampleSlices, "a thread per slice reads the slice sums");
constexpr int kSampleUnroll = 4;  // steps of loads in flight per lane in the first pass

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) SamplePack {
  T v[kVec];
};

// (value, index) of the larger value, the smaller index among equals; NaN counts as the largest,
// as in at::argmax (so a row with a NaN yields the first NaN's index).
__device__ __forceinline__ void TakeLarger(float& value, int64_t& index, float other_value,
                                           int64_t other_index) {
  const bool larger =
      isnan(other_value)
          ? !isnan(value) || other_index < index
          : !isnan(value) && (other_value > value || (other_value == value && other_index < index));
  if (larger) {
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

__device__ __forceinline__ double WarpSumDouble(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

// The row's steps of kStep elements fall into kSampleSlices slices of `slice_steps` whole steps
// (the last ones short or empty); in a cluster of kBlocks blocks, a warp holds kSampleSlices /
// (kBlocks kSampleWarps) consecutive slices, the warps of block b those after block b - 1's.
struct SliceSplit {
  int64_t steps, slice_steps;
  __host__ __device__ SliceSplit(int64_t vocab, int64_t step) {
    steps = (vocab + step - 1) / step;
    slice_steps = (steps + kSampleSlices - 1) / kSampleSlices;
  }
  __host__ __device__ int64_t First(int64_t slice) const {
    return slice * slice_steps < steps ? slice * slice_steps : steps;
  }
};

// The dynamic shared memory of a block of a cluster of `blocks`: one double per step of its
// slices.
template <typename T>
int64_t StepTotalsBytes(int64_t vocab, int blocks) {
  const SliceSplit split(vocab, 32 * (16 / sizeof(T)));
  return kSampleSlices / blocks * split.slice_steps * static_cast<int64_t>(sizeof(double));
}

// A row's token and log-prob to the targets of HandOnTargets that are set.
__device__ __forceinline__ void HandOnRow(const HandOnTargets& to, int64_t row, int64_t token,
                                       float log_prob) {
  if (to.host_tokens != nullptr) to.host_tokens[row] = token;
  if (to.host_log_probs != nullptr) to.host_log_probs[row] = log_prob;
  if (to.next_tokens != nullptr) {
    to.next_tokens[row] = token;
    to.positions[row] += 1;
  }
}

template <typename T, int kBlocks>
__global__ void __cluster_dims__(kBlocks, 1, 1) __launch_bounds__(kSampleThreads, 2)
    SampleRowsKernel(const T* __restrict__ logits, int64_t vocab, int64_t stride, float temperature,
                     bool scale, bool greedy, const double* __restrict__ uniforms,
                     int64_t* __restrict__ tokens, float* __restrict__ log_probs,
                     HandOnTargets hand_on) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int64_t kStep = 32 * kVec;
  constexpr int kBlockSlices = kSampleSlices / kBlocks;
  constexpr int kWarpSlices = kBlockSlices / kSampleWarps;
  __shared__ float warp_max[kSampleWarps];
  __shared__ float warp_best[kSampleWarps];
  __shared__ int64_t warp_arg[kSampleWarps];
  __shared__ float block_max, block_best;  // read by the cluster's other blocks
  __shared__ int64_t block_arg;
  __shared__ double slice_mass[kBlockSlices];  // read by the cluster's other blocks
  __shared__ double excl[kSampleSlices + 1];
  __shared__ double row_slice_mass[kSampleSlices];
  __shared__ float row_max;
  __shared__ int64_t row_arg;
  extern __shared__ double step_total[];  // per step of this block's slices, its masses' sum
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / kBlocks;
  const T* x = logits + row * stride;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const SliceSplit split(vocab, kStep);
  const int64_t block_first_step = split.First(static_cast<int64_t>(rank) * kBlockSlices);
  const int64_t block_end_step = split.First(static_cast<int64_t>(rank + 1) * kBlockSlices);
  // s = logits / T, rounded as the division of the LibTorch ops.
  const auto scaled = [&](float v) { return scale ? __fdiv_rn(v, temperature) : v; };

  // 1. The largest s and the first largest logit of the block's steps, strided over its
  // threads; then of the row, from every block's (in rank order, though max and TakeLarger do
  // not depend on it). A thread visits its elements in index order, so that `>` keeps the first
  // of the largest, and the first NaN it meets is its own first; the largest s is the largest
  // logit scaled (division by T > 0 rounds monotonically).
  float best = -CUDART_INF_F;
  // Indices fit an int: kSampleMaxSharedBytes keeps vocab under 2^24.
  int arg = static_cast<int>(vocab), first_nan = static_cast<int>(vocab);
  const int64_t block_end = min(vocab, block_end_step * kStep);
  for (int64_t base = block_first_step * kStep + threadIdx.x * kVec; base < block_end;
       base += static_cast<int64_t>(kSampleThreads) * kVec * kSampleUnroll) {
    SamplePack<T, kVec> packs[kSampleUnroll];
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      const int64_t at = base + static_cast<int64_t>(u) * kSampleThreads * kVec;
      if (at < block_end) packs[u] = *reinterpret_cast<const SamplePack<T, kVec>*>(x + at);
    }
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      const int64_t at = base + static_cast<int64_t>(u) * kSampleThreads * kVec;
      if (at >= block_end) break;  // packs are whole: vocab is a multiple of kVec
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float v = ToFloat(packs[u].v[e]);
        const int j = static_cast<int>(at) + e;
        if (v > best) {
          best = v;
          arg = j;
        }
        if (isnan(v)) first_nan = min(first_nan, j);
      }
    }
  }
  float max_s = scaled(best);
  int64_t arg64 = arg;
  if (first_nan < vocab) {
    best = CUDART_NAN_F;
    arg64 = first_nan;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    max_s = fmaxf(max_s, __shfl_xor_sync(0xffffffff, max_s, offset));
    TakeLarger(best, arg64, __shfl_xor_sync(0xffffffff, best, offset),
               __shfl_xor_sync(0xffffffff, arg64, offset));
  }
  if (lane == 0) {
    warp_max[warp] = max_s;
    warp_best[warp] = best;
    warp_arg[warp] = arg64;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_max[0], b = warp_best[0];
    int64_t a = warp_arg[0];
    for (int w = 1; w < kSampleWarps; ++w) {
      m = fmaxf(m, warp_max[w]);
      TakeLarger(b, a, warp_best[w], warp_arg[w]);
    }
    block_max = m;
    block_best = b;
    block_arg = a;
  }
  cluster.sync();  // every block's block_max, block_best and block_arg are written
  if (threadIdx.x == 0) {
    float m = -CUDART_INF_F, b = -CUDART_INF_F;
    int64_t a = vocab;
    for (int q = 0; q < kBlocks; ++q) {
      m = fmaxf(m, *cluster.map_shared_rank(&block_max, q));
      TakeLarger(b, a, *cluster.map_shared_rank(&block_best, q),
                 *cluster.map_shared_rank(&block_arg, q));
    }
    row_max = m;
    row_arg = a < vocab ? a : 0;  // a valid id whatever the row holds
  }
  __syncthreads();
  const float top = row_max;
  const auto log_prob = [&](int64_t token, double total) {
    const double s = scaled(ToFloat(x[token]));
    return static_cast<float>(s - static_cast<double>(top) - log(total));
  };

  // 2. Warp w's slices [warp_slice, warp_slice + kWarpSlices): steps [first_step, end_step),
  // step k's total at step_total[k - the block's first step].
  const int64_t warp_slice =
      static_cast<int64_t>(rank) * kBlockSlices + static_cast<int64_t>(warp) * kWarpSlices;
  const int64_t first_step = split.First(warp_slice);
  const int64_t end_step = split.First(warp_slice + kWarpSlices);
  const auto totals = [&](int64_t k) -> double& { return step_total[k - block_first_step]; };
  // Lane l's masses of step k in element order, mass[e] (0 past the row), and their sum.
  const auto load = [&](int64_t k, SamplePack<T, kVec>& pack) {
    const int64_t first = k * kStep + lane * kVec;
    if (first < vocab) pack = *reinterpret_cast<const SamplePack<T, kVec>*>(x + first);
  };
  const auto masses = [&](int64_t k, const SamplePack<T, kVec>& pack, double(&mass)[kVec]) {
    const int64_t first = k * kStep + lane * kVec;
    double sum = 0.0;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      mass[e] = first + e < vocab
                    ? static_cast<double>(expf(__fsub_rn(scaled(ToFloat(pack.v[e])), top)))
                    : 0.0;
      sum += mass[e];
    }
    return sum;
  };
  for (int64_t k = first_step; k < end_step; k += kSampleUnroll) {
    SamplePack<T, kVec> packs[kSampleUnroll];
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      if (k + u < end_step) load(k + u, packs[u]);
    }
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      if (k + u >= end_step) break;
      double mass[kVec];
      const double sum = WarpSumDouble(masses(k + u, packs[u], mass));
      if (lane == 0) totals(k + u) = sum;
    }
  }
  __syncwarp();
  if (lane == 0) {  // each slice's steps summed in order: the walk below repeats these sums
    for (int i = 0; i < kWarpSlices; ++i) {
      double run = 0.0;
      for (int64_t k = split.First(warp_slice + i); k < split.First(warp_slice + i + 1); ++k) {
        run += totals(k);
      }
      slice_mass[warp * kWarpSlices + i] = run;
    }
  }
  cluster.sync();  // every block's slice_mass is written
  if (threadIdx.x < kSampleSlices) {
    row_slice_mass[threadIdx.x] = *cluster.map_shared_rank(
        &slice_mass[threadIdx.x % kBlockSlices], static_cast<int>(threadIdx.x / kBlockSlices));
  }
  // Past this no block reads another's shared memory, so none may leave before every block has
  // arrived here (the wait at the end).
  cg::cluster_group::arrival_token read_all = cluster.barrier_arrive();
  __syncthreads();
  if (warp == 0) {  // the prefix: each lane's run over its slices, then a scan over the lanes
    constexpr int kLaneSlices = kSampleSlices / 32;
    double run[kLaneSlices];
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < kLaneSlices; ++i) {
      sum += row_slice_mass[lane * kLaneSlices + i];
      run[i] = sum;
    }
    const double inclusive = WarpInclusiveScan(sum);
    const double before = __shfl_up_sync(0xffffffff, inclusive, 1);
    const double lane_excl = lane == 0 ? 0.0 : before;
    if (lane == 0) excl[0] = 0.0;
#pragma unroll
    for (int i = 0; i < kLaneSlices; ++i) excl[lane * kLaneSlices + i + 1] = lane_excl + run[i];
  }
  __syncthreads();
  const double total = excl[kSampleSlices];

  // 3. The token, and its log-prob (a lambda, so that every thread reaches the wait after it).
  const auto draw = [&] {
    if (greedy) {
      if (rank == 0 && threadIdx.x == 0) {
        const float lp = log_prob(row_arg, total);
        tokens[row] = row_arg;
        log_probs[row] = lp;
        HandOnRow(hand_on, row, row_arg, lp);
      }
      return;
    }
    const double t = uniforms[row] * total;
    int chosen = kSampleSlices - 1;  // the first slice past t, else the last with mass
    for (int q = 0; q < kSampleSlices; ++q) {
      if (t < excl[q + 1]) {
        chosen = q;
        break;
      }
    }
    while (chosen > 0 && !(row_slice_mass[chosen] > 0.0)) --chosen;
    if (chosen < warp_slice || chosen >= warp_slice + kWarpSlices) return;
    const int64_t slice = chosen;
    const int64_t slice_first = split.First(slice);
    const int64_t slice_end = split.First(slice + 1);
    // The step: the first whose cumulative mass, excl + the slice's steps so far (the sums of
    // step 2), exceeds t; else (t at or past the row's total) the last with mass.
    int64_t step = -1, last_with_mass = -1;
    double before = 0.0;  // the slice's mass before `step`
    {
      double run = 0.0;
      for (int64_t k = slice_first; k < slice_end; ++k) {
        const double next = run + totals(k);
        if (totals(k) > 0.0) last_with_mass = k;
        if (excl[slice] + next > t) {
          step = k;
          before = run;
          break;
        }
        run = next;
      }
      if (step < 0) {
        step = last_with_mass >= 0 ? last_with_mass : slice_first;
        before = 0.0;
        for (int64_t k = slice_first; k < step; ++k) before += totals(k);
      }
    }
    // In the step: the first element whose cumulative mass exceeds t (rounding can leave none,
    // within 1e-16 of the step's end: then the step's last element of mass).
    int64_t token = -1, positive = -1;
    if (step < slice_end) {
      SamplePack<T, kVec> pack;
      load(step, pack);
      double mass[kVec];
      const double own = masses(step, pack, mass);
      double cumulative = WarpInclusiveScan(own) - own;  // the lanes before this one
      int64_t found = -1;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        cumulative += mass[e];
        const int64_t j = step * kStep + lane * kVec + e;
        if (mass[e] > 0.0) positive = j;
        if (found < 0 && mass[e] > 0.0 && excl[slice] + (before + cumulative) > t) found = j;
      }
      const unsigned found_lanes = __ballot_sync(0xffffffff, found >= 0);
      if (found_lanes != 0) token = __shfl_sync(0xffffffff, found, __ffs(found_lanes) - 1);
      const unsigned positive_lanes = __ballot_sync(0xffffffff, positive >= 0);
      if (positive_lanes != 0) {
        positive = __shfl_sync(0xffffffff, positive, 31 - __clz(positive_lanes));
      } else {
        positive = -1;
      }
    }
    if (lane == 0) {
      if (token < 0) token = positive >= 0 ? positive : row_arg;
      const float lp = log_prob(token, total);
      tokens[row] = token;
      log_probs[row] = lp;
      HandOnRow(hand_on, row, token, lp);
    }
  };
  draw();
  cluster.barrier_wait(std::move(read_all));
}

}  // namespace

namespace {

// One thread per row (HandOnSampled).
__global__ void HandOnSampledKernel(const int64_t* __restrict__ tokens,
                                    const float* __restrict__ log_probs, int64_t rows,
                                    HandOnTargets to) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row < rows) HandOnRow(to, row, tokens[row], log_probs[row]);
}

// How many clusters of kBlocks blocks the GPU runs at once, with `shared` bytes of dynamic shared
// memory a block (read once per size: one vocabulary in practice).
template <typename T, int kBlocks>
int MaxActiveClusters(size_t shared) {
  static size_t cached_shared = 0;
  static int cached = -1;
  if (cached < 0 || cached_shared != shared) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kBlocks, 1, 1);
    config.blockDim = dim3(kSampleThreads, 1, 1);
    config.dynamicSmemBytes = shared;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, SampleRowsKernel<T, kBlocks>, &config) !=
        cudaSuccess) {
      cudaGetLastError();  // not sticky; count none
      clusters = 0;
    }
    cached_shared = shared;
    cached = clusters;
  }
  return cached;
}

template <typename T, int kBlocks>
cudaError_t LaunchSampleRows(const T* logits, int64_t rows, int64_t vocab, int64_t stride,
                             float temperature, bool scale, bool greedy, const double* uniforms,
                             int64_t* tokens, float* log_probs, const HandOnTargets& hand_on,
                             cudaStream_t stream) {
  const auto shared = static_cast<size_t>(StepTotalsBytes<T>(vocab, kBlocks));
  if constexpr (kBlocks > kSampleMinBlocks) {
    // Note [Sampling kernel]: the largest cluster whose rows all run at once (and whose blocks'
    // step totals fit: a smaller cluster's blocks hold more steps).
    if (rows > MaxActiveClusters<T, kBlocks>(shared) &&
        StepTotalsBytes<T>(vocab, kBlocks / 2) <= kSampleMaxSharedBytes) {
      return LaunchSampleRows<T, kBlocks / 2>(logits, rows, vocab, stride, temperature, scale,
                                              greedy, uniforms, tokens, log_probs, hand_on, stream);
    }
  }
  SampleRowsKernel<T, kBlocks><<<rows * kBlocks, kSampleThreads, shared, stream>>>(
      logits, vocab, stride, temperature, scale, greedy, uniforms, tokens, log_probs, hand_on);
  return cudaGetLastError();
}

}  // namespace

cudaError_t SampleRows(const void* logits, int64_t rows, int64_t vocab, int64_t stride,
                       double temperature, bool greedy, const double* uniforms, int64_t* tokens,
                       float* log_probs, const HandOnTargets& hand_on, DtypeCode dtype,
                       cudaStream_t stream) {
  const int64_t vec = dtype == kBFloat16 ? 8 : 4;
  if (vocab < 1 || vocab % vec != 0 || stride % vec != 0 || temperature < 0 ||
      (!greedy && uniforms == nullptr) || rows > 2147483647 / kSampleMaxBlocks ||
      SampleRowsSharedBytes(vocab, dtype) > kSampleMaxSharedBytes ||
      (hand_on.next_tokens == nullptr) != (hand_on.positions == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  // Temperature 0 is greedy at temperature 1 (sampler.h); 1 scales nothing.
  const bool scale = temperature > 0 && temperature != 1.0;
  const float t = scale ? static_cast<float>(temperature) : 1.0f;
  if (dtype == kBFloat16) {
    return LaunchSampleRows<__nv_bfloat16, kSampleMaxBlocks>(
        static_cast<const __nv_bfloat16*>(logits), rows, vocab, stride, t, scale, greedy, uniforms,
        tokens, log_probs, hand_on, stream);
  }
  return LaunchSampleRows<float, kSampleMaxBlocks>(static_cast<const float*>(logits), rows, vocab,
                                                   stride, t, scale, greedy, uniforms, tokens,
                                                   log_probs, hand_on, stream);
}

// The largest cluster's, whose blocks hold the fewest slices (LaunchSampleRows takes a smaller
// one only where its blocks' step totals fit too).
int64_t SampleRowsSharedBytes(int64_t vocab, DtypeCode dtype) {
  return dtype == kBFloat16 ? StepTotalsBytes<__nv_bfloat16>(vocab, kSampleMaxBlocks)
                            : StepTotalsBytes<float>(vocab, kSampleMaxBlocks);
}

cudaError_t HandOnSampled(const int64_t* tokens, const float* log_probs, int64_t rows,
                          const HandOnTargets& to, cudaStream_t stream) {
  if (rows < 0 || (to.next_tokens == nullptr) != (to.positions == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  HandOnSampledKernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(tokens, log_probs, rows, to);
  return cudaGetLastError();
}

}  // namespace rl::kernels
