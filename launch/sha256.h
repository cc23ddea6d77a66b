// SHA-256 of bytes, files and tensors, through OpenSSL's EVP interface. Checkpoint manifests,
// weight-sync checks and tests compare these digests.
//
// Ownership: Sha256 owns one EVP_MD_CTX (freed by its destructor); it is movable, not copyable.
// Thread safety: one Sha256 per thread; the free functions are stateless and safe to call
// concurrently.
// Failures: an OpenSSL failure throws rl::Error through RL_CHECK_OPENSSL; FileSha256 throws
// rl::CheckpointError naming the file it cannot open or read.
//
// Note [Tensor digest scheme]
// TensorSha256(t) is the SHA-256 of, in order:
//   1. the 16 bytes "rl.tensor.sha256" (a domain tag, no terminator),
//   2. the dtype name as c10 spells it (c10::toString: "Float", "BFloat16", "Half", "Long", ...)
//      followed by one 0 byte,
//   3. the number of dimensions as a little-endian uint64, then each size as a little-endian
//      int64,
//   4. the elements' bytes in row-major (contiguous) order, as the host stores them
//      (little-endian on every machine we run on).
// Strides, storage offset, device and requires_grad are not hashed: a transposed view and its
// contiguous copy hash alike, and a CUDA tensor hashes like its CPU copy. Two tensors with the
// same bytes but a different dtype or shape hash differently. Changing this scheme invalidates
// stored digests; bump the tag if it ever changes.
#ifndef RL_LAUNCH_SHA256_H_
#define RL_LAUNCH_SHA256_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of this header.

namespace rl {

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t num_bytes);
  // The digest of everything given so far, as 64 lowercase hex digits. Does not end the
  // computation: more Update() calls may follow, and HexDigest() then covers them too.
  std::string HexDigest() const;

 private:
  struct CtxDeleter {
    void operator()(evp_md_ctx_st* ctx) const;
  };
  std::unique_ptr<evp_md_ctx_st, CtxDeleter> ctx_;
};

// 64 lowercase hex digits.
std::string Sha256Hex(const void* data, size_t num_bytes);

// See Note [Tensor digest scheme]. Accepts any strided tensor on the CPU or a CUDA device. A
// non-contiguous tensor is first made contiguous on its own device (one full-size copy); a CUDA
// tensor is then copied to the host in 64 MiB chunks, synchronously on the current stream.
// Throws rl::Error for an undefined, sparse or quantized tensor or one on another device.
std::string TensorSha256(const at::Tensor& tensor);

// Streams the file in 1 MiB reads. Throws rl::CheckpointError naming the file.
std::string FileSha256(const std::string& path);

}  // namespace rl

#endif  // RL_LAUNCH_SHA256_H_
