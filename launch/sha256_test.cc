// SHA-256 matches the FIPS 180-2 test vectors, files hash like their bytes, and tensor digests
// follow Note [Tensor digest scheme].
#include "launch/sha256.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "launch/check.h"

namespace rl {
namespace {

std::string Sha256Of(const std::string& text) { return Sha256Hex(text.data(), text.size()); }

TEST_CASE("Sha256Hex matches the FIPS 180-2 test vectors") {
  CHECK(Sha256Of("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Sha256Of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(Sha256Of(std::string(1'000'000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("Sha256 fed in pieces equals one call, and HexDigest does not end the computation") {
  const std::string text = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  Sha256 sha;
  sha.Update(text.data(), 3);
  CHECK(sha.HexDigest() == Sha256Of("abc"));
  sha.Update(nullptr, 0);
  sha.Update(text.data() + 3, 10);
  sha.Update(text.data() + 13, text.size() - 13);
  CHECK(sha.HexDigest() == Sha256Of(text));
  Sha256 moved = std::move(sha);
  CHECK(moved.HexDigest() == Sha256Of(text));
}

class TempFile {
 public:
  explicit TempFile(const std::string& contents)
      : path_("/tmp/rl_sha256_test_" + std::to_string(::getpid()) + ".bin") {
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST_CASE("FileSha256 equals the digest of the file's bytes, across read boundaries") {
  std::string contents(3 * (1 << 20) + 17, '\0');
  for (size_t i = 0; i < contents.size(); ++i) contents[i] = static_cast<char>(i * 131 % 251);
  const TempFile file(contents);
  CHECK(FileSha256(file.path()) == Sha256Of(contents));
  const TempFile empty("");
  CHECK(FileSha256(empty.path()) == Sha256Of(""));
}

TEST_CASE("FileSha256 throws CheckpointError naming a missing file") {
  try {
    FileSha256("/nonexistent/model.safetensors");
    FAIL("no throw");
  } catch (const CheckpointError& e) {
    CHECK(std::string(e.what()) ==
          "/nonexistent/model.safetensors: cannot open to compute its SHA-256: No such file or "
          "directory");
  }
}

TEST_CASE("TensorSha256 hashes the tag, dtype name, shape and bytes as the Note documents") {
  const at::Tensor t = at::arange(6, at::kFloat).reshape({2, 3});
  Sha256 expected;
  expected.Update("rl.tensor.sha256", 16);
  expected.Update("Float", 6);  // with its 0 byte
  const uint64_t num_dims = 2;
  const int64_t sizes[2] = {2, 3};
  expected.Update(&num_dims, 8);
  expected.Update(sizes, 16);
  const float values[6] = {0, 1, 2, 3, 4, 5};
  expected.Update(values, sizeof(values));
  CHECK(TensorSha256(t) == expected.HexDigest());
}

TEST_CASE("Tensors with the same bytes but another dtype or shape hash differently") {
  const at::Tensor t = at::arange(8, at::kInt);
  CHECK(TensorSha256(t) != TensorSha256(t.view(at::kFloat)));
  CHECK(TensorSha256(t) != TensorSha256(t.view({2, 4})));
  CHECK(TensorSha256(t.view({2, 4})) != TensorSha256(t.view({4, 2})));
  CHECK(TensorSha256(at::zeros({0, 4})) != TensorSha256(at::zeros({4, 0})));
  CHECK(TensorSha256(t) == TensorSha256(t.clone()));
}

TEST_CASE("A non-contiguous view hashes like its contiguous copy") {
  const at::Tensor t = at::randn({5, 7}, at::kBFloat16).t();
  REQUIRE_FALSE(t.is_contiguous());
  CHECK(TensorSha256(t) == TensorSha256(t.contiguous()));
  const at::Tensor scalar = at::scalar_tensor(2.5, at::kDouble);
  CHECK(TensorSha256(scalar) == TensorSha256(scalar.clone()));
}

TEST_CASE("TensorSha256 refuses undefined and sparse tensors") {
  CHECK_THROWS_AS(TensorSha256(at::Tensor()), Error);
  CHECK_THROWS_AS(TensorSha256(at::eye(3).to_sparse()), Error);
}

TEST_CASE("A CUDA tensor hashes like its CPU copy, across chunk boundaries") {
  if (!at::hasCUDA()) {
    WARN("SKIPPED: no CUDA device on this machine");
    return;
  }
  // 96 MiB of floats: two 64 MiB chunks, the second partial.
  const at::Tensor cpu = at::randn({24, 1 << 20}, at::kFloat);
  const at::Tensor cuda = cpu.to(at::kCUDA);
  CHECK(TensorSha256(cuda) == TensorSha256(cpu));
  CHECK(TensorSha256(cuda.t()) == TensorSha256(cpu.t()));
}

}  // namespace
}  // namespace rl
