#include "tools/bench/profiling.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>

namespace rl::bench {
namespace {

std::unique_ptr<torch::autograd::profiler::ProfilerResult> Profile(
    const std::function<void()>& step) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const profiler::ProfilerConfig config(profiler::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  step();
  if (c10::cuda::device_count() > 0) c10::cuda::device_synchronize();
  return profiler::disableProfiler();
}

}  // namespace

void ProfileToFile(const std::function<void()>& step, const std::string& path) {
  Profile(step)->save(path);
}

int64_t CountDeviceActivities(const std::function<void()>& step) {
  int64_t count = 0;
  const auto result = Profile(step);  // the events live as long as the result
  for (const auto& event : result->events()) {
    if (event.deviceType() == c10::DeviceType::CUDA) ++count;
  }
  return count;
}

double GraphMicrosPerCall(const std::function<void()>& call, int calls) {
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
    call();  // warm-up outside the capture
    c10::cuda::device_synchronize();
    graph.capture_begin();
    for (int i = 0; i < calls; ++i) call();
    graph.capture_end();
  }
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    c10::cuda::device_synchronize();
    const auto start = std::chrono::steady_clock::now();
    graph.replay();
    c10::cuda::device_synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) best = std::min(best, seconds);  // replay 0 warms up
  }
  return 1e6 * best / calls;
}

}  // namespace rl::bench
