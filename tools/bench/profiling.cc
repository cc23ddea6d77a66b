#include "tools/bench/profiling.h"

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/profiler_kineto.h>

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

}  // namespace rl::bench
