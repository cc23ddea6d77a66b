// Kineto profiles for the benchmarks: a Chrome trace of one call (tools/bench/profile_summary.py
// sums it by kernel), and the number of device activities (kernels, copies, sets) one call
// launches; and the time of a call replayed as a CUDA graph.
#ifndef RL_TOOLS_BENCH_PROFILING_H_
#define RL_TOOLS_BENCH_PROFILING_H_

#include <cstdint>
#include <functional>
#include <string>

namespace rl::bench {

// Runs `step` once under the Kineto profiler (CPU ops and CUDA kernels) and writes a Chrome
// trace to `path`.
void ProfileToFile(const std::function<void()>& step, const std::string& path);

// Runs `step` once under the profiler and returns how many kernels, copies and sets it ran on
// the GPU (each node of a replayed CUDA graph counts).
int64_t CountDeviceActivities(const std::function<void()>& step);

// Microseconds per call of `call`, from replays of a CUDA graph of `calls` calls captured on a
// side stream (no launch gaps; best of 3 replays after one to warm up). `call` runs once more
// before the capture, outside it.
double GraphMicrosPerCall(const std::function<void()>& call, int calls = 100);

}  // namespace rl::bench

#endif  // RL_TOOLS_BENCH_PROFILING_H_
