// compare_checkpoints A B [--tolerance X]: compares two Hugging Face checkpoint directories tensor
// by tensor. Prints one line per tensor that is not SHA256-identical and a summary.
// Exit status: 0 when every tensor is identical (or, with --tolerance, within X max abs
// difference), 1 otherwise, 2 on bad flags or unreadable checkpoints.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <set>

#include "launch/check.h"
#include "launch/sha256.h"
#include "trainer/model/safetensors.h"

int main(int argc, char** argv) {
  CLI::App app{"Compare two Hugging Face checkpoints tensor by tensor (SHA256, max abs diff)."};
  std::string a_dir, b_dir;
  double tolerance = -1;
  app.add_option("a", a_dir, "First checkpoint directory")->required();
  app.add_option("b", b_dir, "Second checkpoint directory")->required();
  app.add_option("--tolerance", tolerance,
                 "Accept tensors whose max abs difference is at most this (default: exact)");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto a = rl::model::CheckpointReader::Open(a_dir);
    const auto b = rl::model::CheckpointReader::Open(b_dir);
    const std::vector<std::string> a_names = a.names();
    const std::vector<std::string> b_names = b.names();
    const std::set<std::string> b_set(b_names.begin(), b_names.end());
    int64_t identical = 0, within = 0, differ = 0;
    double worst = 0;
    for (const std::string& name : a_names) {
      if (b_set.count(name) == 0) {
        std::printf("%s: only in %s\n", name.c_str(), a_dir.c_str());
        ++differ;
        continue;
      }
      const at::Tensor x = a.Get(name);
      const at::Tensor y = b.Get(name);
      if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type()) {
        std::printf("%s: shape or dtype differ\n", name.c_str());
        ++differ;
        continue;
      }
      if (rl::TensorSha256(x) == rl::TensorSha256(y)) {
        ++identical;
        continue;
      }
      const double diff = (x.to(at::kDouble) - y.to(at::kDouble)).abs().max().item<double>();
      worst = std::max(worst, diff);
      std::printf("%s: max abs diff %.3g\n", name.c_str(), diff);
      (tolerance >= 0 && diff <= tolerance ? within : differ) += 1;
    }
    for (const std::string& name : b_names) {
      if (std::find(a_names.begin(), a_names.end(), name) == a_names.end()) {
        std::printf("%s: only in %s\n", name.c_str(), b_dir.c_str());
        ++differ;
      }
    }
    std::printf("%lld tensors: %lld SHA256-identical, %lld within tolerance, %lld differ; max abs "
                "diff %.3g\n",
                static_cast<long long>(identical + within + differ),
                static_cast<long long>(identical), static_cast<long long>(within),
                static_cast<long long>(differ), worst);
    return differ == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_checkpoints: %s\n", e.what());
    return 2;
  }
}
