#include "trainer/memory/region.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/TensorOptions.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "launch/check.h"
#include "trainer/memory/cuda_driver.h"

namespace rl::memory {
namespace {

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

[[noreturn]] void ThrowErrno(std::string_view call, std::string_view tag, int64_t num_bytes) {
  const int error = errno;
  throw Error(fmt::format("{} failed for memory region '{}' ({} bytes): {}", call, tag, num_bytes,
                          std::strerror(error)));
}

// Makes `device` current for the CUDA calls of one scope and restores the previous device.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) {
    RL_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) {
      RL_CHECK_CUDA(cudaSetDevice(device));
    }
  }
  ~CudaDeviceScope() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) {
      cudaSetDevice(previous_);  // Destructors never throw; nothing useful to do on failure.
    }
  }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int previous_ = 0;
};

CUmemAllocationProp DeviceAllocationProp(int device) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

c10::Device ResolveDevice(c10::Device device) {
  if (device.is_cuda() && !device.has_index()) {
    int current = 0;
    RL_CHECK_CUDA(cudaGetDevice(&current));
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(current));
  }
  return device;
}

}  // namespace

std::string_view RegionStateName(RegionState state) {
  return state == RegionState::kActive ? "active" : "paused";
}

Region::Region(RegionTag tag, int64_t num_bytes, c10::Device device, HostBackup backup,
               FreshPages fresh_pages)
    : tag_(tag),
      device_(ResolveDevice(device)),
      backup_(backup),
      fresh_pages_(fresh_pages),
      num_bytes_(num_bytes) {
  RL_CHECK(num_bytes > 0, Error, "memory region '{}' must have a positive size, got {} bytes",
           name(), num_bytes);
  RL_CHECK(device_.is_cpu() || device_.is_cuda(), Error,
           "memory region '{}' cannot live on {}: only CPU and CUDA regions exist", name(),
           device_.str());
  std::optional<CudaDeviceScope> scope;  // Also covers the poisoning below.
  try {
    if (device_.is_cpu()) {
      reserved_bytes_ = RoundUp(num_bytes_, static_cast<int64_t>(sysconf(_SC_PAGESIZE)));
      void* base = mmap(nullptr, static_cast<size_t>(reserved_bytes_), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) {
        ThrowErrno("mmap", name(), reserved_bytes_);
      }
      base_ = base;
      if (backup_ == HostBackup::kSaveOnPause) {
        host_backup_ = std::malloc(static_cast<size_t>(num_bytes_));
        RL_CHECK(host_backup_ != nullptr, Error,
                 "cannot allocate the {}-byte host backup of memory region '{}'", num_bytes_,
                 name());
      }
    } else {
      scope.emplace(device_.index());
      RL_CHECK_CUDA(cudaFree(nullptr));  // Makes the primary context current for the driver.
      const CudaDriverApi& driver = CudaDriver();
      const CUmemAllocationProp prop = DeviceAllocationProp(device_.index());
      size_t granularity = 0;
      RL_CHECK_CU(driver.cuMemGetAllocationGranularity(&granularity, &prop,
                                                       CU_MEM_ALLOC_GRANULARITY_MINIMUM));
      reserved_bytes_ = RoundUp(num_bytes_, static_cast<int64_t>(granularity));
      CUdeviceptr base = 0;
      RL_CHECK_CU(driver.cuMemAddressReserve(&base, static_cast<size_t>(reserved_bytes_),
                                             granularity, 0, 0));
      base_ = reinterpret_cast<void*>(base);
      if (backup_ == HostBackup::kSaveOnPause) {
        RL_CHECK_CUDA(
            cudaHostAlloc(&host_backup_, static_cast<size_t>(num_bytes_), cudaHostAllocDefault));
      }
      MapPhysical();
    }
    state_ = RegionState::kActive;
    if (fresh_pages_ == FreshPages::kPoison) {
      Poison();
    }
  } catch (...) {
    ReleaseAll();  // The destructor does not run for a constructor that throws.
    throw;
  }
}

Region::~Region() { ReleaseAll(); }

void Region::ReleaseAll() noexcept {
  if (base_ == nullptr && host_backup_ == nullptr) {
    return;
  }
  if (device_.is_cpu()) {
    if (base_ != nullptr) munmap(base_, static_cast<size_t>(reserved_bytes_));
    std::free(host_backup_);
  } else {
    // Errors are ignored: at process exit the context may already be gone, and there is no one
    // left to tell. The driver table is loaded whenever base_ is set.
    int previous = 0;
    const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
    cudaSetDevice(device_.index());
    if (base_ != nullptr) {
      const CudaDriverApi& driver = CudaDriver();
      const auto base = reinterpret_cast<CUdeviceptr>(base_);
      if (cuda_handle_ != 0) {
        cudaDeviceSynchronize();
        driver.cuMemUnmap(base, static_cast<size_t>(reserved_bytes_));
        driver.cuMemRelease(static_cast<CUmemGenericAllocationHandle>(cuda_handle_));
      }
      driver.cuMemAddressFree(base, static_cast<size_t>(reserved_bytes_));
    }
    if (host_backup_ != nullptr) cudaFreeHost(host_backup_);
    if (have_previous) cudaSetDevice(previous);
    cudaGetLastError();
  }
  base_ = nullptr;
  host_backup_ = nullptr;
  cuda_handle_ = 0;
}

std::string Region::StateError(std::string_view action) const {
  return fmt::format("cannot {} region '{}': it is already {}", action, name(),
                     RegionStateName(state_));
}

void Region::Pause() {
  RL_CHECK(state_ == RegionState::kActive, Error, "{}", StateError("pause"));
  std::optional<CudaDeviceScope> scope;
  if (device_.is_cuda()) {
    scope.emplace(device_.index());
    // Kernels queued on any stream may still read or write the region.
    RL_CHECK_CUDA(cudaDeviceSynchronize());
  }
  if (backup_ == HostBackup::kSaveOnPause) {
    CopyToHost();
  }
  UnmapPhysical();
  state_ = RegionState::kPaused;
}

void Region::Resume() {
  RL_CHECK(state_ == RegionState::kPaused, Error, "{}", StateError("resume"));
  std::optional<CudaDeviceScope> scope;
  if (device_.is_cuda()) {
    scope.emplace(device_.index());
  }
  MapPhysical();
  state_ = RegionState::kActive;
  if (backup_ == HostBackup::kSaveOnPause) {
    CopyFromHost();
  } else if (fresh_pages_ == FreshPages::kPoison) {
    Poison();
  }
}

void Region::MapPhysical() {
  if (device_.is_cpu()) {
    if (mprotect(base_, static_cast<size_t>(reserved_bytes_), PROT_READ | PROT_WRITE) != 0) {
      ThrowErrno("mprotect(PROT_READ|PROT_WRITE)", name(), reserved_bytes_);
    }
    return;
  }
  const CudaDriverApi& driver = CudaDriver();
  const CUmemAllocationProp prop = DeviceAllocationProp(device_.index());
  const auto base = reinterpret_cast<CUdeviceptr>(base_);
  const auto size = static_cast<size_t>(reserved_bytes_);
  CUmemGenericAllocationHandle handle = 0;
  RL_CHECK_CU(driver.cuMemCreate(&handle, size, &prop, 0));
  try {
    RL_CHECK_CU(driver.cuMemMap(base, size, 0, handle, 0));
    CUmemAccessDesc access;
    std::memset(&access, 0, sizeof(access));
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const CUresult result = driver.cuMemSetAccess(base, size, &access, 1);
    if (result != CUDA_SUCCESS) {
      driver.cuMemUnmap(base, size);
      RL_CHECK_CU(result);
    }
  } catch (...) {
    driver.cuMemRelease(handle);  // Leaves the region paused, with its address still reserved.
    throw;
  }
  cuda_handle_ = static_cast<unsigned long long>(handle);
}

void Region::UnmapPhysical() {
  const auto size = static_cast<size_t>(reserved_bytes_);
  if (device_.is_cpu()) {
    if (madvise(base_, size, MADV_DONTNEED) != 0) {
      ThrowErrno("madvise(MADV_DONTNEED)", name(), reserved_bytes_);
    }
    if (mprotect(base_, size, PROT_NONE) != 0) {
      ThrowErrno("mprotect(PROT_NONE)", name(), reserved_bytes_);
    }
    return;
  }
  const CudaDriverApi& driver = CudaDriver();
  RL_CHECK_CU(driver.cuMemUnmap(reinterpret_cast<CUdeviceptr>(base_), size));
  const auto handle = static_cast<CUmemGenericAllocationHandle>(cuda_handle_);
  cuda_handle_ = 0;
  RL_CHECK_CU(driver.cuMemRelease(handle));
}

void Region::CopyToHost() {
  if (device_.is_cpu()) {
    std::memcpy(host_backup_, base_, static_cast<size_t>(num_bytes_));
  } else {
    RL_CHECK_CUDA(
        cudaMemcpy(host_backup_, base_, static_cast<size_t>(num_bytes_), cudaMemcpyDeviceToHost));
  }
}

void Region::CopyFromHost() {
  if (device_.is_cpu()) {
    std::memcpy(base_, host_backup_, static_cast<size_t>(num_bytes_));
  } else {
    // Synchronous with respect to the host: the source is pinned.
    RL_CHECK_CUDA(
        cudaMemcpy(base_, host_backup_, static_cast<size_t>(num_bytes_), cudaMemcpyHostToDevice));
  }
}

void Region::Poison() {
  if (device_.is_cpu()) {
    std::memset(base_, 0xFF, static_cast<size_t>(num_bytes_));
  } else {
    RL_CHECK_CUDA(cudaMemset(base_, 0xFF, static_cast<size_t>(num_bytes_)));
    RL_CHECK_CUDA(cudaDeviceSynchronize());
  }
}

at::Tensor Region::View(at::ScalarType dtype, int64_t offset_bytes,
                        std::vector<int64_t> shape) const {
  const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t num_elements = 1;
  for (int64_t size : shape) {
    RL_CHECK(size >= 0, Error, "view of memory region '{}' has a negative size in shape [{}]",
             name(), fmt::join(shape, ", "));
    num_elements *= size;
  }
  RL_CHECK(offset_bytes >= 0 && offset_bytes % element_bytes == 0, Error,
           "view of memory region '{}' at byte {} is not aligned to its {}-byte {} elements",
           name(), offset_bytes, element_bytes, c10::toString(dtype));
  RL_CHECK(offset_bytes + num_elements * element_bytes <= num_bytes_, Error,
           "view of memory region '{}' ([{}] {} at byte {}: {} bytes) ends past the region's {} "
           "bytes",
           name(), fmt::join(shape, ", "), c10::toString(dtype), offset_bytes,
           num_elements * element_bytes, num_bytes_);
  // target_device: no pointer query, which would fail on a paused CUDA region.
  return at::for_blob(static_cast<char*>(base_) + offset_bytes, shape)
      .options(at::TensorOptions().dtype(dtype).device(device_))
      .target_device(device_)
      .make_tensor();
}

at::Tensor Region::AsTensor(at::ScalarType dtype) const {
  const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(dtype));
  return View(dtype, 0, {num_bytes_ / element_bytes});
}

}  // namespace rl::memory
