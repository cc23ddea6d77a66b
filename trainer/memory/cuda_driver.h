// The few CUDA driver entry points the pausable regions need (virtual memory management), found
// through the runtime's cudaGetDriverEntryPointByVersion so that nothing links libcuda: the CPU
// machines have no libcuda.so.1, and the binaries must still load and run their CPU paths there.
//
// <cuda.h> is included for the types and enums only; every call goes through CudaDriver().
//
// Ownership: the table is a process-wide constant, filled on first use.
// Thread safety: CudaDriver() is safe to call from any thread (function-local static); the
// driver calls themselves are thread-safe as the driver documents.
// Failures: CudaDriver() throws rl::CudaError when the driver is missing or lacks an entry
// point; RL_CHECK_CU throws rl::CudaError naming the call, the CUresult (name and the driver's
// text when the driver can give them) and the call site.
#ifndef RL_TRAINER_MEMORY_CUDA_DRIVER_H_
#define RL_TRAINER_MEMORY_CUDA_DRIVER_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace rl::memory {

// Each pointer has the ABI of the CUDA version in its type's suffix, which is the version asked
// for, so a newer driver keeps answering with the signature declared here.
struct CudaDriverApi {
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 cuGetErrorString = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
};

// The entry points, looked up once. Throws rl::CudaError ("no usable CUDA driver ...") on a
// machine without a driver; call it only on the CUDA path.
const CudaDriverApi& CudaDriver();

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or "CUresult 2" when the driver cannot be asked.
std::string DescribeCuResult(CUresult result);

namespace internal {
[[noreturn]] void ThrowCuError(CUresult result, const char* expr, const char* file, int line);
}  // namespace internal

}  // namespace rl::memory

// `expr` is a driver call through CudaDriver() and returns CUresult.
#define RL_CHECK_CU(expr)                                                                   \
  do {                                                                                      \
    const CUresult rl_check_cu_result_ = (expr);                                            \
    if (rl_check_cu_result_ != CUDA_SUCCESS) {                                              \
      ::rl::memory::internal::ThrowCuError(rl_check_cu_result_, #expr, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

#endif  // RL_TRAINER_MEMORY_CUDA_DRIVER_H_
