// Where a test finds a file of the repository: under `bazel test` in the runfiles tree
// ($TEST_SRCDIR/$TEST_WORKSPACE/<path>), else relative to the working directory (a test binary
// run by hand from the repository root). //tests:runfiles; every test links it.
#ifndef RL_TESTS_RUNFILES_H_
#define RL_TESTS_RUNFILES_H_

#include <cstdlib>
#include <string>

namespace rl::testing {

// `path` is relative to the repository root, e.g. "tests/fixtures/qwen3".
inline std::string RunfilePath(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir == nullptr) return path;
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir) + "/" + (workspace != nullptr ? workspace : "rl") + "/" + path;
}

}  // namespace rl::testing

#endif  // RL_TESTS_RUNFILES_H_
