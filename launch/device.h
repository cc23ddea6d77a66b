// Rank to device binding: rank with local rank i uses cuda:i when CUDA is available, else the CPU.
#ifndef RL_LAUNCH_DEVICE_H_
#define RL_LAUNCH_DEVICE_H_

#include <c10/core/Device.h>

namespace rl {

enum class DevicePreference { kCudaIfAvailable, kCpu };

// Makes cuda:<local_rank> the current device and returns it, or returns the CPU when CUDA is not
// available (or kCpu is asked for). Throws CudaError when there are fewer GPUs than local ranks.
c10::Device BindDevice(int local_rank, DevicePreference preference);

// The number of visible CUDA devices; 0 on a machine without a GPU or driver.
int CudaDeviceCount();

}  // namespace rl

#endif  // RL_LAUNCH_DEVICE_H_
