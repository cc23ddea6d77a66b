// Test-only helpers shared by the safetensors reader and writer tests: a temporary directory,
// header bytes, the expected-error check, and small tensor lists. Catch2 assertions inside, so
// only for use from Catch2 test cases. Not thread-safe (single-threaded tests).
#ifndef RL_TRAINER_MODEL_SAFETENSORS_TESTING_H_
#define RL_TRAINER_MODEL_SAFETENSORS_TESTING_H_

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/named_tensors.h"
#include "trainer/model/safetensors_writer.h"

namespace rl::model::testing {

// A fresh directory, removed with everything in it. POSIX calls, not std::filesystem, whose
// symbols libtorch.so exports in an incompatible build.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/safetensors_test.XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { RemoveTree(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline uint64_t HeaderLength(const std::string& file) {
  uint64_t length = 0;
  std::memcpy(&length, file.data(), 8);
  return length;
}

inline std::string HeaderOf(const std::string& file) { return file.substr(8, HeaderLength(file)); }
inline std::string DataOf(const std::string& file) { return file.substr(8 + HeaderLength(file)); }

// Runs `open` and checks that it throws CheckpointError whose message holds every piece.
inline void ExpectCheckpointError(const std::function<void()>& open,
                                  const std::vector<std::string>& pieces) {
  try {
    open();
    FAIL("no throw");
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    for (const std::string& piece : pieces) {
      CAPTURE(message, piece);
      CHECK(message.find(piece) != std::string::npos);
    }
  }
}

// "a": F32 [2, 3], "b": BF16 [4], "c": F16 [2]; data section of 24 + 8 + 4 = 36 bytes.
inline NamedTensors SmallTensors() {
  return {
      {"a", at::arange(6, at::kFloat).reshape({2, 3})},
      {"b", at::tensor({1.5, -2.0, 3.25, 0.0}).to(at::kBFloat16)},
      {"c", at::tensor({0.5, -65504.0}).to(at::kHalf)},
  };
}

// A valid file of SmallTensors() with metadata {"format": "pt"}, as bytes.
inline std::string ValidFileBytes(const TempDir& dir) {
  const std::string path = dir / "valid.safetensors";
  WriteSafetensors(path, SmallTensors(), {{"format", "pt"}});
  return ReadWholeFile(path);
}

// Six F32 tensors of 16 bytes each, "t0" .. "t5".
inline NamedTensors SixTensors() {
  NamedTensors tensors;
  for (int i = 0; i < 6; ++i) {
    tensors.push_back({"t" + std::to_string(i), at::full({4}, static_cast<float>(i))});
  }
  return tensors;
}

}  // namespace rl::model::testing

#endif  // RL_TRAINER_MODEL_SAFETENSORS_TESTING_H_
