// Driver failures are reported with the call and the CUresult, on machines with or without a
// driver; the entry points load wherever a driver exists.
#include "trainer/memory/cuda_driver.h"

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <string>

#include "launch/check.h"

namespace rl::memory {
namespace {

bool HaveCudaDevice() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
}

TEST_CASE("RL_CHECK_CU throws CudaError naming the call, the CUresult and the call site") {
  try {
    RL_CHECK_CU(CUDA_ERROR_OUT_OF_MEMORY);
    FAIL("no throw");
  } catch (const CudaError& e) {
    const std::string message = e.what();
    CHECK(message.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
    CHECK(message.find("cuda_driver_test.cc:") != std::string::npos);
    // With a driver the name comes from cuGetErrorName; without one, the number.
    CHECK((message.find("CUDA_ERROR_OUT_OF_MEMORY (out of memory)") != std::string::npos ||
           message.find("CUresult 2") != std::string::npos));
  }
}

TEST_CASE("the driver entry points load with a driver and fail clearly without one") {
  if (HaveCudaDevice()) {
    const CudaDriverApi& driver = CudaDriver();
    CHECK(driver.cuMemCreate != nullptr);
    CHECK(driver.cuMemAddressReserve != nullptr);
    CHECK(DescribeCuResult(CUDA_ERROR_OUT_OF_MEMORY) == "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  } else {
    WARN("no CUDA device: checking the no-driver error path only");
    CHECK_THROWS_WITH(CudaDriver(), Catch::Contains("no usable CUDA driver"));
    CHECK(DescribeCuResult(CUDA_ERROR_OUT_OF_MEMORY) == "CUresult 2");
  }
}

}  // namespace
}  // namespace rl::memory
