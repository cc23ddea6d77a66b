#include "launch/sha256.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "launch/check.h"

namespace rl {
namespace {

// Host-order bytes are hashed as little-endian; see Note [Tensor digest scheme].
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the tensor digest assumes little-endian");

constexpr char kTensorTag[] = "rl.tensor.sha256";
constexpr size_t kTensorTagBytes = sizeof(kTensorTag) - 1;  // without the terminator
static_assert(kTensorTagBytes == 16);

// Bounds the host memory a CUDA or non-contiguous tensor's digest needs.
constexpr int64_t kChunkBytes = int64_t{64} << 20;

constexpr size_t kFileReadBytes = size_t{1} << 20;

std::string ToHex(const unsigned char* bytes, size_t num_bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(2 * num_bytes, '0');
  for (size_t i = 0; i < num_bytes; ++i) {
    hex[2 * i] = kDigits[bytes[i] >> 4];
    hex[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  return hex;
}

}  // namespace

void Sha256::CtxDeleter::operator()(evp_md_ctx_st* ctx) const { EVP_MD_CTX_free(ctx); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  RL_CHECK_OPENSSL(ctx_ != nullptr);
  RL_CHECK_OPENSSL(EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr));
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(const void* data, size_t num_bytes) {
  if (num_bytes == 0) return;
  RL_CHECK_OPENSSL(EVP_DigestUpdate(ctx_.get(), data, num_bytes));
}

std::string Sha256::HexDigest() const {
  // Finalise a copy, so that this object can go on taking bytes.
  std::unique_ptr<evp_md_ctx_st, CtxDeleter> copy(EVP_MD_CTX_new());
  RL_CHECK_OPENSSL(copy != nullptr);
  RL_CHECK_OPENSSL(EVP_MD_CTX_copy_ex(copy.get(), ctx_.get()));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int num_bytes = 0;
  RL_CHECK_OPENSSL(EVP_DigestFinal_ex(copy.get(), digest, &num_bytes));
  return ToHex(digest, num_bytes);
}

std::string Sha256Hex(const void* data, size_t num_bytes) {
  Sha256 sha;
  sha.Update(data, num_bytes);
  return sha.HexDigest();
}

std::string TensorSha256(const at::Tensor& tensor) {
  RL_CHECK(tensor.defined(), Error, "TensorSha256: the tensor is undefined");
  RL_CHECK(tensor.layout() == at::kStrided && !tensor.is_quantized(), Error,
           "TensorSha256: only dense (strided) tensors can be hashed, got layout {}{}",
           c10::toString(tensor.layout()), tensor.is_quantized() ? " (quantized)" : "");
  RL_CHECK(tensor.is_cpu() || tensor.is_cuda(), Error,
           "TensorSha256: the tensor is on {}, expected the CPU or a CUDA device",
           tensor.device().str());

  Sha256 sha;
  sha.Update(kTensorTag, kTensorTagBytes);
  const char* dtype_name = c10::toString(tensor.scalar_type());
  sha.Update(dtype_name, std::strlen(dtype_name) + 1);  // with its 0 byte
  const uint64_t num_dims = static_cast<uint64_t>(tensor.dim());
  sha.Update(&num_dims, sizeof(num_dims));
  for (const int64_t size : tensor.sizes()) sha.Update(&size, sizeof(size));

  // Conjugate and negative views carry a bit instead of the values; materialise them.
  const at::Tensor values = tensor.resolve_conj().resolve_neg().contiguous();
  const auto element_bytes = static_cast<int64_t>(values.element_size());
  const int64_t num_elements = values.numel();
  if (values.is_cpu()) {
    sha.Update(values.const_data_ptr(), static_cast<size_t>(num_elements * element_bytes));
    return sha.HexDigest();
  }
  const at::Tensor flat = values.view({-1});
  const int64_t chunk_elements = std::max<int64_t>(1, kChunkBytes / element_bytes);
  for (int64_t begin = 0; begin < num_elements; begin += chunk_elements) {
    const int64_t end = std::min(num_elements, begin + chunk_elements);
    const at::Tensor host = flat.slice(/*dim=*/0, begin, end).to(at::kCPU);
    sha.Update(host.const_data_ptr(), static_cast<size_t>((end - begin) * element_bytes));
  }
  return sha.HexDigest();
}

std::string FileSha256(const std::string& path) {
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    throw CheckpointError(
        fmt::format("{}: cannot open to compute its SHA-256: {}", path, std::strerror(errno)));
  }
  Sha256 sha;
  std::vector<unsigned char> buffer(kFileReadBytes);
  while (true) {
    const size_t n = std::fread(buffer.data(), 1, buffer.size(), file.get());
    sha.Update(buffer.data(), n);
    if (n < buffer.size()) break;
  }
  if (std::ferror(file.get())) {
    throw CheckpointError(
        fmt::format("{}: cannot read to compute its SHA-256: {}", path, std::strerror(errno)));
  }
  return sha.HexDigest();
}

}  // namespace rl
