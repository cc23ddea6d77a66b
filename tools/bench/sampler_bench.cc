// sampler_bench [--batch 64] [--vocab 151936] [--rounds 20]: one decode step's token sampling
// (rl::rollout::SampleWithUniforms on [batch, vocab] logits, the tokens and log-probs read back
// to the host as the engine does), on the GPU when there is one (bf16 logits) or on the CPU
// (fp32), in one process, for: greedy; temperature 1 over the whole vocabulary (no sort: Note
// [Sampling without a sort] in trainer/rollout/sampler.h); the same through the sort (top-k of
// vocab - 1: the op sequence of the sampler before that Note, less one token); top-p 0.95;
// top-k 50. Prints the best time of --rounds per case, in us, and its ratio to the sorted one.
#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "launch/device.h"
#include "trainer/rollout/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Case {
  std::string name;
  rl::rollout::SamplerConfig config;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Token sampling of a decode step: greedy, whole vocabulary, sorted, top-p, top-k."};
  int64_t batch = 64, vocab = 151936;
  int rounds = 20;
  app.add_option("--batch", batch, "rows")->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "vocabulary size")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  app.add_option("--rounds", rounds, "timed calls per case; the best counts")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const at::Device device = rl::BindDevice(0, rl::DevicePreference::kCudaIfAvailable);
  const at::ScalarType dtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;
  at::Generator gen = rl::rollout::MakeGenerator(5);
  const at::Tensor logits =
      (at::randn({batch, vocab}, gen, at::TensorOptions().dtype(at::kFloat)) * 3)
          .to(at::TensorOptions().dtype(dtype).device(device));
  const at::Tensor uniforms = at::rand({batch}, gen, at::TensorOptions().dtype(at::kDouble));

  std::vector<Case> cases(5);
  cases[0].name = "greedy";
  cases[0].config.temperature = 0;
  cases[1].name = "temperature 1, whole vocabulary (no sort)";
  cases[2].name = "temperature 1, whole vocabulary but one, sorted";
  cases[2].config.top_k = vocab - 1;
  cases[3].name = "temperature 1, top-p 0.95 (sorted)";
  cases[3].config.top_p = 0.95;
  cases[4].name = "temperature 1, top-k 50 (sorted)";
  cases[4].config.top_k = 50;

  std::vector<double> best(cases.size(), 1e30);
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int r = 0; r <= rounds; ++r) {  // round 0 warms up
      const auto start = Clock::now();
      const rl::rollout::SampledTokens out =
          rl::rollout::SampleWithUniforms(logits, cases[c].config, uniforms);
      const at::Tensor tokens = out.tokens.cpu();
      const at::Tensor log_probs = out.log_probs.cpu();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (r > 0) best[c] = std::min(best[c], us);
    }
  }
  std::printf("sampling [%lld, %lld] %s logits on %s, best of %d calls\n",
              static_cast<long long>(batch), static_cast<long long>(vocab), c10::toString(dtype),
              device.str().c_str(), rounds);
  for (size_t c = 0; c < cases.size(); ++c) {
    std::printf("%-50s %10.1f us  sorted / this %.2f\n", cases[c].name.c_str(), best[c],
                best[2] / best[c]);
  }
  return 0;
}
