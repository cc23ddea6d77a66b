// Error vocabulary and check macros shared by every layer.
//
// Every failure the trainer reports is one of a few exception types, so that `main` can tell a
// bad config (exit 2) from a communication failure (abort the job) from a bad file. Every call
// into CUDA, NCCL, MPI or OpenSSL goes through one RL_CHECK_* macro, which throws with the call
// site (file:line), the process identity (rank and host) and the library's own message.
//
// Thread safety: the process identity is written once, by MpiSession, before any other thread
// starts; everything else here is stateless.
#ifndef RL_LAUNCH_CHECK_H_
#define RL_LAUNCH_CHECK_H_

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace rl {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A config value or flag is wrong; the message names the option. `main` exits with status 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A collective failed, timed out, or a peer is gone. The communicator is unusable afterwards;
// `main` aborts the whole job so no rank is left waiting.
class CommError : public Error {
 public:
  using Error::Error;
};

// A checkpoint, dataset or tokenizer file is missing, truncated or corrupt; the message names it.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// A CUDA runtime or driver call failed.
class CudaError : public Error {
 public:
  using Error::Error;
};

// Who this process is, for error messages. Set once at start-up by MpiSession.
struct ProcessIdentity {
  int rank = -1;
  std::string host = "?";
};
void SetProcessIdentity(ProcessIdentity identity);
const ProcessIdentity& GetProcessIdentity();

// "file.cc:42 (rank 1 on host-a)"
std::string CallSite(const char* file, int line);

namespace internal {
[[noreturn]] void ThrowCudaError(int code, const char* expr, const char* file, int line);
[[noreturn]] void ThrowNcclError(int code, const char* expr, const char* file, int line);
[[noreturn]] void ThrowMpiError(int code, const char* expr, const char* file, int line);
[[noreturn]] void ThrowOpenSslError(const char* expr, const char* file, int line);
}  // namespace internal

}  // namespace rl

// `expr` returns cudaError_t.
#define RL_CHECK_CUDA(expr)                                                    \
  do {                                                                         \
    const int rl_check_code_ = static_cast<int>(expr);                         \
    if (rl_check_code_ != 0) {                                                 \
      ::rl::internal::ThrowCudaError(rl_check_code_, #expr, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)

// `expr` returns ncclResult_t. ncclInProgress is not an error (non-blocking communicators).
#define RL_CHECK_NCCL(expr)                                                    \
  do {                                                                         \
    const int rl_check_code_ = static_cast<int>(expr);                         \
    if (rl_check_code_ != 0 && rl_check_code_ != 7 /* ncclInProgress */) {     \
      ::rl::internal::ThrowNcclError(rl_check_code_, #expr, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)

// `expr` returns an MPI error code (communicators use MPI_ERRORS_RETURN).
#define RL_CHECK_MPI(expr)                                                    \
  do {                                                                        \
    const int rl_check_code_ = (expr);                                        \
    if (rl_check_code_ != 0 /* MPI_SUCCESS */) {                              \
      ::rl::internal::ThrowMpiError(rl_check_code_, #expr, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

// `expr` returns 1 on success, as the OpenSSL EVP functions do.
#define RL_CHECK_OPENSSL(expr)                                           \
  do {                                                                   \
    if ((expr) != 1) {                                                   \
      ::rl::internal::ThrowOpenSslError(#expr, __FILE__, __LINE__);      \
    }                                                                    \
  } while (0)

// Checks a condition on input or state that is not a library call; throws `ErrorType` with a
// formatted message. Never compiled out (unlike assert()).
#define RL_CHECK(cond, ErrorType, ...)                     \
  do {                                                     \
    if (!(cond)) {                                         \
      throw ErrorType(::fmt::format(__VA_ARGS__));         \
    }                                                      \
  } while (0)

#endif  // RL_LAUNCH_CHECK_H_
