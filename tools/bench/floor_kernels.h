// Kernels that do nothing but wait for the kernel ahead, or read given bytes, for
// decode_floor_bench: what a chain of kernels costs beyond the bytes it reads.
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

}  // namespace rl::bench

#endif  // RL_TOOLS_BENCH_FLOOR_KERNELS_H_
