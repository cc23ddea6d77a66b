#include "launch/check.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <openssl/err.h>

#include <utility>

namespace rl {
namespace {
ProcessIdentity& MutableIdentity() {
  static ProcessIdentity identity;
  return identity;
}
}  // namespace

void SetProcessIdentity(ProcessIdentity identity) { MutableIdentity() = std::move(identity); }

const ProcessIdentity& GetProcessIdentity() { return MutableIdentity(); }

std::string CallSite(const char* file, int line) {
  const ProcessIdentity& id = GetProcessIdentity();
  return fmt::format("{}:{} (rank {} on {})", file, line, id.rank, id.host);
}

namespace internal {

void ThrowCudaError(int code, const char* expr, const char* file, int line) {
  const auto error = static_cast<cudaError_t>(code);
  throw CudaError(fmt::format("CUDA error {} ({}: {}) in `{}` at {}", code, cudaGetErrorName(error),
                              cudaGetErrorString(error), expr, CallSite(file, line)));
}

void ThrowNcclError(int code, const char* expr, const char* file, int line) {
  const auto result = static_cast<ncclResult_t>(code);
  int version = 0;
  ncclGetVersion(&version);
  const char* last = ncclGetLastError(nullptr);
  throw CommError(fmt::format("NCCL error {} ({}) in `{}` at {}; NCCL {} says: {}", code,
                              ncclGetErrorString(result), expr, CallSite(file, line), version,
                              last != nullptr && *last != '\0' ? last : "(nothing)"));
}

void ThrowMpiError(int code, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = "(MPI not initialised)";
  int initialized = 0;
  MPI_Initialized(&initialized);
  int length = 0;
  if (initialized && MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    text[0] = '\0';
  }
  throw CommError(
      fmt::format("MPI error {} ({}) in `{}` at {}", code, text, expr, CallSite(file, line)));
}

void ThrowOpenSslError(const char* expr, const char* file, int line) {
  const unsigned long code = ERR_get_error();
  char text[256] = {};
  ERR_error_string_n(code, text, sizeof(text));
  throw Error(fmt::format("OpenSSL call `{}` failed at {}: {}", expr, CallSite(file, line),
                          code != 0 ? text : "(no error queued)"));
}

}  // namespace internal
}  // namespace rl

// The macros in check.h spell these codes as literals so that the header needs no library headers.
static_assert(ncclSuccess == 0 && ncclInProgress == 7, "RL_CHECK_NCCL literals");
static_assert(MPI_SUCCESS == 0, "RL_CHECK_MPI literal");
static_assert(cudaSuccess == 0, "RL_CHECK_CUDA literal");
