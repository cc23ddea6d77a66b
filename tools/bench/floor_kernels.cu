#include "tools/bench/floor_kernels.h"

#include <algorithm>

#include "trainer/kernels/kernel_util.cuh"

namespace rl::bench {
namespace {

using kernels::ArriveExpectingBytes;
using kernels::InitBarrier;
using kernels::Launch;
using kernels::MultiprocessorCount;
using kernels::PrecedingKernelsDone;
using kernels::SharedAddress;
using kernels::WaitBarrier;

constexpr int kReadThreads = 256;
constexpr int kReadsInFlight = 8;  // 16-byte loads a thread a round of the loop
constexpr int kMaxBlocksPerSm = 8;

__global__ void EmptyKernelImpl() { PrecedingKernelsDone(); }

__device__ __forceinline__ unsigned Fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// The xor of pieces first, first + stride, ... of data[0, pieces), kReadsInFlight loads at once,
// each by `load` (__ldcs for bytes read once from HBM, __ldcg for what another block wrote).
template <typename Load>
__device__ __forceinline__ unsigned FoldPieces(const uint4* data, int64_t pieces, int64_t first,
                                               int64_t stride, const Load& load) {
  unsigned hash = 0;
  for (int64_t i = first; i < pieces; i += kReadsInFlight * stride) {
    uint4 v[kReadsInFlight];
#pragma unroll
    for (int u = 0; u < kReadsInFlight; ++u) {
      const int64_t j = i + u * stride;
      v[u] = j < pieces ? load(data + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kReadsInFlight; ++u) hash ^= Fold(v[u]);
  }
  return hash;
}

__global__ void __launch_bounds__(kReadThreads)
    ReadKernelImpl(const uint4* __restrict__ data, int64_t pieces, unsigned* sink) {
  PrecedingKernelsDone();
  const unsigned hash = FoldPieces(
      data, pieces, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
      static_cast<int64_t>(gridDim.x) * blockDim.x, [](const uint4* p) { return __ldcs(p); });
  if (hash == 0x9e3779b9u) *sink = hash;
}

__global__ void CacheReadKernelImpl(const uint4* __restrict__ k, const uint4* __restrict__ v,
                                    int64_t capacity_pieces, int64_t pieces, unsigned* sink) {
  PrecedingKernelsDone();
  const int64_t head = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t slab = head * capacity_pieces;
  unsigned hash = 0;
  for (int64_t i = threadIdx.x; i < pieces; i += kReadsInFlight / 2 * blockDim.x) {
    uint4 keys[kReadsInFlight / 2], values[kReadsInFlight / 2];
#pragma unroll
    for (int u = 0; u < kReadsInFlight / 2; ++u) {
      const int64_t j = i + u * blockDim.x;
      const bool in = j < pieces;
      keys[u] = in ? __ldcs(k + slab + j) : make_uint4(0, 0, 0, 0);
      values[u] = in ? __ldcs(v + slab + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kReadsInFlight / 2; ++u) {  // every word, so that the loads stay 16 bytes
      hash ^= keys[u].x ^ keys[u].y ^ keys[u].z ^ keys[u].w;
      hash ^= values[u].x ^ values[u].y ^ values[u].z ^ values[u].w;
    }
  }
  if (hash == 0x9e3779b9u) *sink = hash;
}

// Note [Decode floor, persistent]
// decode_floor_bench's chains pay, at every kernel boundary, the drain of the kernel ahead and the
// ramp of the next one's reads (Note [Decode floor] in decode_floor_bench.cc). A persistent kernel
// could stream almost every byte of a step without regard to those boundaries: a phase's own
// bytes (its weights, and for the attention the cache of earlier steps) depend on nothing the step
// computes, and only their use must wait for the phase ahead. PersistentReadKernel is the floor of
// that design: one block an SM, whose first warp copies the block's share of each phase's own
// bytes in turn into a ring of 16 KiB slots by bulk copies (cp.async.bulk, counted on the slot's
// `full` mbarrier), and whose other 8 warps, for each phase: wait until every block has ended the
// phase ahead (a counter a phase in global memory, raised by each block with release semantics and
// read with acquire), read the phase's input from `scratch` (what a real phase reads of the one
// ahead: a GEMM's slice of x, a norm's partial sums), read each of the phase's slots (and free it
// on its `empty` mbarrier), write the phase's output to `scratch`, and raise the phase's counter.
// With lookahead the copying warp never waits for a phase, only for free slots, so the ring holds
// the next phases' bytes while the blocks wait for each other; without it, it waits for the phase
// ahead as the readers do, as a kernel a phase would. How a block learns that every block has
// ended a phase (PersistentWait): each block raises one counter and polls it (kCounter, as
// CUTLASS's GenericBarrier); or the block that raises it last, told so by its atomic's old value,
// raises a flag of its own cache line, which the others poll (kFlag), so that the polls do not
// queue behind the arrivals; or the blocks arrive on 8 counters of their own lines, the last of
// each on the top counter, whose last raises the flag (kTree), so that no line takes more than 17
// arrivals. Counts and flags only grow: a launch's targets are its epoch (launches before it, a
// word the last block to end raises) times what a launch adds, so a graph may replay the kernel
// without resetting them. A wait that lasts
// over 2 s traps (a grid not resident at once, or a plan that never ends), so the call fails
// instead of hanging. What the kernel leaves out: the arithmetic, and a phase's finer dependences
// (a GEMM tile needs only its slice of x, and so could start before the whole phase ahead ends).
constexpr int kChunkBytes = 16384;
constexpr int kReaderWarps = 8;
constexpr int kReaders = 32 * kReaderWarps;
constexpr int kPersistentThreads = 32 + kReaders;

__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t GlobalNanoseconds() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// Spins until *word reaches `target`; traps after 2 s.
__device__ void WaitForCount(const unsigned* word, unsigned target) {
  if (LoadAcquire(word) >= target) return;
  const uint64_t start = GlobalNanoseconds();
  while (LoadAcquire(word) < target) {
    if (GlobalNanoseconds() - start > 2000000000ull) __trap();
  }
}

// The counters' words (PersistentCounterWords), each on a 128-byte line of its own: the epoch,
// the blocks ended, then for each phase its top counter, its flag and kWaitGroups counters.
constexpr int kLine = 32;  // words
constexpr int kWaitGroups = 8;
constexpr int kPhaseLines = 2 + kWaitGroups;
__device__ __forceinline__ unsigned* PhaseWord(unsigned* counters, int phase, int line) {
  return counters + (2 + static_cast<int64_t>(phase) * kPhaseLines + line) * kLine;
}

__device__ __forceinline__ unsigned AddAcquireRelease(unsigned* word) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(word) : "memory");
  return old;
}

__device__ __forceinline__ void StoreRelease(unsigned* word, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(word), "r"(v) : "memory");
}

// This block has ended `phase` (its writes ordered before by a block barrier); `launch` is the
// launch's epoch + 1.
__device__ void ArriveOnPhase(unsigned* counters, int phase, PersistentWait wait, unsigned launch) {
  unsigned* top = PhaseWord(counters, phase, 0);
  unsigned* flag = PhaseWord(counters, phase, 1);
  const unsigned grid = gridDim.x;
  switch (wait) {
    case PersistentWait::kCounter:
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(top) : "memory");
      break;
    case PersistentWait::kFlag:
      if (AddAcquireRelease(top) == launch * grid - 1) StoreRelease(flag, launch);
      break;
    case PersistentWait::kTree: {
      const unsigned group = blockIdx.x % kWaitGroups;
      const unsigned groups = grid < kWaitGroups ? grid : kWaitGroups;
      const unsigned members = (grid - group + kWaitGroups - 1) / kWaitGroups;
      if (AddAcquireRelease(PhaseWord(counters, phase, 2 + group)) == launch * members - 1 &&
          AddAcquireRelease(top) == launch * groups - 1) {
        StoreRelease(flag, launch);
      }
      break;
    }
  }
}

// Returns once every block has ended `phase` (ArriveOnPhase).
__device__ void WaitForPhase(unsigned* counters, int phase, PersistentWait wait, unsigned launch) {
  if (wait == PersistentWait::kCounter) {
    WaitForCount(PhaseWord(counters, phase, 0), launch * gridDim.x);
  } else {
    WaitForCount(PhaseWord(counters, phase, 1), launch);
  }
}

__device__ __forceinline__ void ArriveOnBarrier(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SharedAddress(barrier))
               : "memory");
}

__device__ __forceinline__ void BulkCopy(void* shared, const void* global, uint32_t bytes,
                                         uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(SharedAddress(shared)),
      "l"(global), "r"(bytes), "r"(SharedAddress(barrier))
      : "memory");
}

__device__ __forceinline__ void ReadersBarrier() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kReaders) : "memory");
}

// This block's share [first, last) of `bytes` (a multiple of 16), in whole 16-byte pieces.
__device__ __forceinline__ void BlockShare(int64_t bytes, int64_t& first, int64_t& last) {
  const int64_t pieces = bytes / 16;
  first = pieces * blockIdx.x / gridDim.x * 16;
  last = pieces * (blockIdx.x + 1) / gridDim.x * 16;
}

__global__ void __launch_bounds__(kPersistentThreads, 1)
    PersistentReadKernelImpl(const char* __restrict__ pool, const FloorPhase* __restrict__ phases,
                             int phase_count, uint4* scratch, int64_t scratch_pieces,
                             unsigned* counters, PersistentRing shape, unsigned* sink) {
  const int slots = shape.slots;
  extern __shared__ __align__(128) unsigned char ring[];
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + static_cast<size_t>(slots) * kChunkBytes);
  uint64_t* empty = full + slots;
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      InitBarrier(&full[s]);
      InitBarrier(&empty[s], kReaderWarps);
    }
  }
  PrecedingKernelsDone();
  __shared__ unsigned launch_shared;
  if (threadIdx.x == 0) launch_shared = LoadAcquire(counters) + 1;  // raised at the last one's end
  __syncthreads();
  const unsigned launch = launch_shared;
  if (threadIdx.x < 32) {  // the copying warp: one lane issues the ring's copies
    if (threadIdx.x != 0) return;
    int64_t n = 0;  // copies issued
    for (int p = 0; p < phase_count; ++p) {
      int64_t first, last;
      BlockShare(phases[p].own_bytes, first, last);
      if (!shape.lookahead && p > 0) WaitForPhase(counters, p - 1, shape.wait, launch);
      const char* own = pool + phases[p].own_offset;
      for (int64_t at = first; at < last; at += kChunkBytes, ++n) {
        const int slot = static_cast<int>(n % slots);
        const int64_t use = n / slots;
        if (use > 0) WaitBarrier(&empty[slot], static_cast<uint32_t>((use - 1) & 1));
        const uint32_t bytes =
            static_cast<uint32_t>(last - at < kChunkBytes ? last - at : kChunkBytes);
        ArriveExpectingBytes(&full[slot], bytes);
        BulkCopy(ring + static_cast<size_t>(slot) * kChunkBytes, own + at, bytes, &full[slot]);
      }
    }
    return;
  }
  const int t = threadIdx.x - 32;
  unsigned hash = 0;
  int64_t n = 0;  // slots used
  for (int p = 0; p < phase_count; ++p) {
    if (p > 0) {
      if (t == 0) WaitForPhase(counters, p - 1, shape.wait, launch);
      ReadersBarrier();
    }
    const int64_t inputs = phases[p].input_bytes / 16;
    const int64_t input_at = blockIdx.x * inputs % (scratch_pieces - inputs + 1);
    // kReadsInFlight loads a thread at once, as a real phase would copy its input in one go.
    hash ^= FoldPieces(scratch + input_at, inputs, t, kReaders,
                       [](const uint4* p) { return __ldcg(p); });
    int64_t first, last;
    BlockShare(phases[p].own_bytes, first, last);
    for (int64_t at = first; at < last; at += kChunkBytes, ++n) {
      const int slot = static_cast<int>(n % slots);
      WaitBarrier(&full[slot], static_cast<uint32_t>((n / slots) & 1));
      const int64_t pieces = (last - at < kChunkBytes ? last - at : kChunkBytes) / 16;
      const uint4* chunk =
          reinterpret_cast<const uint4*>(ring + static_cast<size_t>(slot) * kChunkBytes);
      if (shape.read_slots) {
        for (int64_t i = t; i < pieces; i += kReaders) hash ^= Fold(chunk[i]);
      }
      __syncwarp();
      if (t % 32 == 0) ArriveOnBarrier(&empty[slot]);
    }
    const int64_t outputs = phases[p].output_bytes / 16;
    const int64_t output_at = blockIdx.x * outputs % (scratch_pieces - outputs + 1);
    for (int64_t i = t; i < outputs; i += kReaders) {
      scratch[output_at + i] = make_uint4(hash, hash, hash, hash);
    }
    ReadersBarrier();
    // (The arrival's release orders the block's writes, which the barrier ordered before this
    // thread's, as CUTLASS's GenericBarrier arrives.)
    if (t == 0) ArriveOnPhase(counters, p, shape.wait, launch);
  }
  // The last block to end starts the next launch's epoch; every block has read this one's.
  if (t == 0 && atomicAdd(&counters[kLine], 1u) == launch * gridDim.x - 1) atomicAdd(counters, 1u);
  if (hash == 0x9e3779b9u) *sink = hash;
}

}  // namespace

cudaError_t EmptyKernel(cudaStream_t stream) {
  return Launch(EmptyKernelImpl, dim3(static_cast<unsigned>(MultiprocessorCount())), 128, 0,
                stream);
}

cudaError_t ReadKernel(const void* data, int64_t bytes, unsigned* sink, cudaStream_t stream) {
  if (bytes <= 0 || bytes % 16 != 0 || reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t pieces = bytes / 16;
  // Enough blocks that each thread issues one round of loads, up to kMaxBlocksPerSm an SM.
  constexpr int64_t kPiecesPerBlock = kReadThreads * kReadsInFlight;
  const int64_t wanted = (pieces + kPiecesPerBlock - 1) / kPiecesPerBlock;
  const int64_t blocks =
      std::min<int64_t>(wanted, static_cast<int64_t>(MultiprocessorCount()) * kMaxBlocksPerSm);
  return Launch(ReadKernelImpl, dim3(static_cast<unsigned>(blocks)), kReadThreads, 0, stream,
                static_cast<const uint4*>(data), pieces, sink);
}

cudaError_t CacheReadKernel(const void* k, const void* v, int64_t batch, int64_t kv_heads,
                            int64_t capacity, int64_t keys, int64_t dim, int threads,
                            unsigned* sink, cudaStream_t stream) {
  if (dim % 8 != 0 || keys > capacity || reinterpret_cast<uintptr_t>(k) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(v) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  return Launch(CacheReadKernelImpl,
                dim3(static_cast<unsigned>(kv_heads), static_cast<unsigned>(batch)), threads, 0,
                stream, static_cast<const uint4*>(k), static_cast<const uint4*>(v),
                capacity * dim / 8, keys * dim / 8, sink);
}

int PersistentReadBlocks() { return MultiprocessorCount(); }

int64_t PersistentCounterWords(int phase_count) {
  return (2 + static_cast<int64_t>(phase_count) * kPhaseLines) * kLine;
}

cudaError_t PersistentReadKernel(const void* pool, const FloorPhase* phases, int phase_count,
                                 void* scratch, int64_t scratch_bytes, unsigned* counters,
                                 PersistentRing ring, unsigned* sink, cudaStream_t stream) {
  if (ring.slots < 1 || phase_count < 1 || scratch_bytes < 16 || scratch_bytes % 16 != 0 ||
      reinterpret_cast<uintptr_t>(pool) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(scratch) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const size_t shared = static_cast<size_t>(ring.slots) * (kChunkBytes + 2 * sizeof(uint64_t));
  if (const cudaError_t e = cudaFuncSetAttribute(PersistentReadKernelImpl,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(shared));
      e != cudaSuccess) {
    return e;
  }
  // Every block must be resident at once, or the counters' waits never end.
  int per_sm = 0;
  if (const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, PersistentReadKernelImpl, kPersistentThreads, shared);
      e != cudaSuccess) {
    return e;
  }
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  return Launch(PersistentReadKernelImpl, dim3(static_cast<unsigned>(PersistentReadBlocks())),
                kPersistentThreads, shared, stream, static_cast<const char*>(pool), phases,
                phase_count, static_cast<uint4*>(scratch), scratch_bytes / 16, counters, ring,
                sink);
}

}  // namespace rl::bench
