// Kernels that do nothing but wait for the kernel ahead, or read given bytes, for
// decode_floor_bench: what a chain of kernels costs beyond the bytes it reads, and what one
// persistent kernel doing the same phases would.
#ifndef RL_TOOLS_BENCH_FLOOR_KERNELS_H_
#define RL_TOOLS_BENCH_FLOOR_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace rl::bench {

// A kernel of a block an SM that waits for the kernel ahead (under a ProgrammaticLaunch scope,
// trainer/kernels/cuda_kernels.h, by programmatic dependent launch) and returns.
cudaError_t EmptyKernel(cudaStream_t stream);

// A kernel that waits for the kernel ahead as EmptyKernel does, then reads `bytes` (a multiple of
// 16) from `data` (16-byte aligned) once, by a grid-stride loop of 16-byte loads, 8 a thread a
// round, and keeps nothing (`sink` is written only if the bits of the data hash to a value they
// never do).
cudaError_t ReadKernel(const void* data, int64_t bytes, unsigned* sink, cudaStream_t stream);

// The decode attention's reads without its arithmetic: a block per (key/value head, row) of the
// bf16 caches k and v [batch, kv_heads, capacity, dim] reads rows [0, keys) of its head in each
// (dim a multiple of 8; `threads` a block), as the attention's tensor-core kernel does at batch 64.
cudaError_t CacheReadKernel(const void* k, const void* v, int64_t batch, int64_t kv_heads,
                            int64_t capacity, int64_t keys, int64_t dim, int threads,
                            unsigned* sink, cudaStream_t stream);

// One phase of PersistentReadKernel: a dependent kernel of the step, as one persistent kernel's
// blocks would run it.
struct FloorPhase {
  int64_t own_offset;    // where the phase's own bytes (weights, the cache of earlier steps) start
  int64_t own_bytes;     // in `pool`, a multiple of 16, split evenly over the blocks
  int32_t input_bytes;   // each block reads from `scratch` once the phase ahead has ended
  int32_t output_bytes;  // each block writes to `scratch` after its reads (multiples of 16)
};

// PersistentReadKernel's blocks a grid: one an SM.
int PersistentReadBlocks();

// How PersistentReadKernel's blocks learn that every block has ended a phase: by polling one
// counter all raise, by polling a flag the last to raise it sets, or by a flag the last of a tree
// of counters sets (Note [Decode floor, persistent] in floor_kernels.cu).
enum class PersistentWait { kCounter, kFlag, kTree };

// How PersistentReadKernel streams a phase's own bytes: through a ring of `slots` 16 KiB slots
// of shared memory; with `lookahead` its copies run ahead of the phases as far as the ring has
// room, without, a phase's copies start only once the phase ahead has ended; with `read_slots`
// the readers read every slot, without, they free each slot unread once it has landed; and how
// the blocks wait for each other.
struct PersistentRing {
  int slots;
  bool lookahead;
  bool read_slots = true;
  PersistentWait wait = PersistentWait::kCounter;
};

// The words of PersistentReadKernel's `counters` for `phase_count` phases.
int64_t PersistentCounterWords(int phase_count);

// A step's phases in one kernel of a block an SM (Note [Decode floor, persistent] in
// floor_kernels.cu): each block streams its share of every phase's own bytes through `ring`, and
// uses (reads) a phase's bytes only after every block has ended the phase ahead, counted in
// `counters` (PersistentCounterWords(phase_count) words, zeros before the first launch, then
// left as a launch leaves them for the next). `phases` is in device
// memory; `scratch` (16-byte aligned, `scratch_bytes` at least every phase's input and output
// bytes) should stay in the L2, as a step's activations do.
cudaError_t PersistentReadKernel(const void* pool, const FloorPhase* phases, int phase_count,
                                 void* scratch, int64_t scratch_bytes, unsigned* counters,
                                 PersistentRing ring, unsigned* sink, cudaStream_t stream);

}  // namespace rl::bench

#endif  // RL_TOOLS_BENCH_FLOOR_KERNELS_H_
