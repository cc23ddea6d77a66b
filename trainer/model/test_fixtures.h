// Test-only access to the tiny Hugging Face reference checkpoints in tests/fixtures/ (see
// tests/fixtures/README.md): where they are in the Bazel runfiles, and loading one into a
// Decoder-ready parameter map.
#ifndef RL_TRAINER_MODEL_TEST_FIXTURES_H_
#define RL_TRAINER_MODEL_TEST_FIXTURES_H_

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "launch/check.h"
#include "tests/runfiles.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/model_config.h"
#include "trainer/model/params.h"
#include "trainer/model/safetensors.h"

namespace rl::model::testing {

inline std::string FixturesDir() { return rl::testing::RunfilePath("tests/fixtures"); }

// Every fixture directory (one holding a config.json), sorted by name.
inline std::vector<std::string> FixtureNames() {
  std::vector<std::string> names;
  const std::filesystem::path root = FixturesDir();
  RL_CHECK(std::filesystem::is_directory(root), Error, "fixtures not found at {}", root.string());
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (std::filesystem::exists(entry.path() / "config.json")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline std::string FixturePath(const std::string& name) { return FixturesDir() + "/" + name; }

struct LoadedModel {
  ModelConfig config;
  TensorMap params;
};

inline LoadedModel LoadFixture(const std::string& name, at::ScalarType dtype = at::kFloat) {
  LoadedModel m;
  m.config = LoadModelConfig(FixturePath(name));
  m.params = AllocateParams(ListParams(m.config), dtype, at::kCPU);
  LoadParams(CheckpointReader::Open(FixturePath(name)), m.config, m.params);
  return m;
}

// A tensor of reference.safetensors / generate.safetensors, copied out of the mapping.
inline at::Tensor ReferenceTensor(const std::string& name, const std::string& file,
                                  const std::string& tensor) {
  return SafetensorsFile::Open(FixturePath(name) + "/" + file).Get(tensor).clone();
}

// A fresh directory under $TEST_TMPDIR (or /tmp).
inline std::string TempDir(const std::string& leaf) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / leaf;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir.parent_path());
  return dir.string();
}

}  // namespace rl::model::testing

#endif  // RL_TRAINER_MODEL_TEST_FIXTURES_H_
