#include "launch/device.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>

#include "launch/check.h"

namespace rl {

int CudaDeviceCount() { return at::hasCUDA() ? static_cast<int>(c10::cuda::device_count()) : 0; }

c10::Device BindDevice(int local_rank, DevicePreference preference) {
  const int count = preference == DevicePreference::kCpu ? 0 : CudaDeviceCount();
  if (count == 0) {
    return c10::Device(c10::kCPU);
  }
  RL_CHECK(local_rank < count, CudaError,
           "local rank {} has no GPU: this host has {} CUDA device(s); start at most {} ranks per "
           "host",
           local_rank, count, count);
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace rl
