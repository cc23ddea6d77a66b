#include "trainer/memory/cuda_driver.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <string>

#include "launch/check.h"

namespace rl::memory {
namespace {

// Looks one symbol up; returns nullptr (and the reason in `why`) instead of throwing, so that
// the error path can use it too.
void* TryEntryPoint(const char* symbol, unsigned int cuda_version, std::string* why) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(symbol, &function, cuda_version, cudaEnableDefault, &status);
  if (error != cudaSuccess) {
    *why = fmt::format("cudaGetDriverEntryPointByVersion failed with {} ({})",
                       cudaGetErrorName(error), cudaGetErrorString(error));
    cudaGetLastError();  // Do not leave the error for the next runtime call to report.
    return nullptr;
  }
  if (status != cudaDriverEntryPointSuccess || function == nullptr) {
    *why = status == cudaDriverEntryPointVersionNotSufficent
               ? "the driver is older than the version asked for"
               : "the driver has no such symbol";
    return nullptr;
  }
  return function;
}

template <typename Pfn>
void LoadOrThrow(Pfn* slot, const char* symbol, unsigned int cuda_version) {
  std::string why;
  void* function = TryEntryPoint(symbol, cuda_version, &why);
  RL_CHECK(function != nullptr, CudaError,
           "no usable CUDA driver: cannot get the entry point {} (CUDA {}.{} ABI): {}. Pausable "
           "CUDA memory regions need an NVIDIA driver; on a machine without a GPU use CPU "
           "regions",
           symbol, cuda_version / 1000, cuda_version % 1000 / 10, why);
  *slot = reinterpret_cast<Pfn>(function);
}

CudaDriverApi LoadDriverApi() {
  CudaDriverApi api;
  LoadOrThrow(&api.cuGetErrorName, "cuGetErrorName", 6000);
  LoadOrThrow(&api.cuGetErrorString, "cuGetErrorString", 6000);
  LoadOrThrow(&api.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020);
  LoadOrThrow(&api.cuMemAddressReserve, "cuMemAddressReserve", 10020);
  LoadOrThrow(&api.cuMemAddressFree, "cuMemAddressFree", 10020);
  LoadOrThrow(&api.cuMemCreate, "cuMemCreate", 10020);
  LoadOrThrow(&api.cuMemRelease, "cuMemRelease", 10020);
  LoadOrThrow(&api.cuMemMap, "cuMemMap", 10020);
  LoadOrThrow(&api.cuMemUnmap, "cuMemUnmap", 10020);
  LoadOrThrow(&api.cuMemSetAccess, "cuMemSetAccess", 10020);
  return api;
}

}  // namespace

const CudaDriverApi& CudaDriver() {
  static const CudaDriverApi api = LoadDriverApi();
  return api;
}

std::string DescribeCuResult(CUresult result) {
  // Looked up directly, not through CudaDriver(): describing an error must not throw.
  std::string why;
  static const auto get_name =
      reinterpret_cast<PFN_cuGetErrorName_v6000>(TryEntryPoint("cuGetErrorName", 6000, &why));
  static const auto get_string =
      reinterpret_cast<PFN_cuGetErrorString_v6000>(TryEntryPoint("cuGetErrorString", 6000, &why));
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_name != nullptr) get_name(result, &name);
  if (get_string != nullptr) get_string(result, &text);
  if (name == nullptr) {
    return fmt::format("CUresult {}", static_cast<int>(result));
  }
  return fmt::format("{} ({})", name, text != nullptr ? text : "no description");
}

namespace internal {

void ThrowCuError(CUresult result, const char* expr, const char* file, int line) {
  throw CudaError(fmt::format("CUDA driver error {} in `{}` at {}", DescribeCuResult(result), expr,
                              CallSite(file, line)));
}

}  // namespace internal
}  // namespace rl::memory
