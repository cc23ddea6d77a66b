// train_step_bench [--model-config FILE] [--batch B] [--seq S] [--steps N]: tokens/s of one
// training step (forward, backward, optimizer step) of a 4-layer CI model on the CPU, through our
// ZeRO-1 optimizer on one rank and through LibTorch's plain torch::optim::AdamW with
// separately allocated params, in the same process, alternating rounds (the machine is noisy).
// Prints both and the ratio ours / reference. Run: bazel run -c opt //tools/bench:train_step_bench
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "launch/json.h"
#include "launch/mpi_communicator.h"
#include "launch/mpi_session.h"
#include "optimizer/distributed_optimizer.h"
#include "trainer/model/decoder.h"
#include "trainer/model/params.h"

namespace {

using Clock = std::chrono::steady_clock;

double SecondsPerStep(const std::function<void()>& step, int steps) {
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  return std::chrono::duration<double>(Clock::now() - start).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  rl::MpiSession session(&argc, &argv);
  CLI::App app{"Train-step benchmark: our ZeRO-1 step vs torch::optim::AdamW, same model."};
  std::string model_config = "configs/models/qwen3_30b_a3b_4layer_ci.json";
  int64_t batch = 8, seq = 64;
  int steps = 10, rounds = 3;
  app.add_option("--model-config", model_config, "config.json of the model");
  app.add_option("--batch", batch, "sequences per step");
  app.add_option("--seq", seq, "tokens per sequence");
  app.add_option("--steps", steps, "timed steps per round");
  app.add_option("--rounds", rounds, "alternating rounds; the best of each side counts");
  CLI11_PARSE(app, argc, argv);

  const rl::model::ModelConfig config =
      rl::model::ParseModelConfig(rl::json::ParseFile(model_config), model_config);
  const std::vector<rl::model::ParamSpec> specs = rl::model::ListParams(config);
  const at::Tensor tokens = at::randint(config.vocab_size, {batch, seq + 1},
                                        at::make_generator<at::CPUGeneratorImpl>(7), at::kLong);
  const at::Tensor inputs = tokens.narrow(1, 0, seq);
  const at::Tensor targets = tokens.narrow(1, 1, seq);

  // Ours: params are views into the optimizer's flat buffer.
  rl::MpiCommunicator comm(session, rl::CommOptions{});
  std::vector<rl::optimizer::ParamDecl> trained;
  rl::model::TensorMap ours;
  for (const auto& s : specs) {
    if (s.role == rl::model::ParamRole::kFp32Extra) {
      ours[s.name] = at::zeros(s.shape, at::kFloat);
    } else {
      trained.push_back({s.name, s.shape,
                         s.role == rl::model::ParamRole::kRoutedExpert
                             ? rl::optimizer::BufferKind::kExpert
                             : rl::optimizer::BufferKind::kDense});
    }
  }
  rl::optimizer::AdamOptions adam;
  adam.schedule.lr = 1e-4;
  adam.weight_decay = 0.0;
  rl::optimizer::DistributedOptimizer optimizer(trained, comm, at::kFloat, c10::kCPU, adam,
                                                rl::optimizer::PlainAllocator(c10::kCPU));
  for (const auto& [name, t] : optimizer.params()) ours[name] = t;
  rl::model::InitParamsRandom(specs, ours, 1);
  optimizer.InitMastersFromParams();
  const rl::model::Decoder our_model(config, ours);

  // Reference: plainly allocated params, LibTorch's AdamW over all of them.
  rl::model::TensorMap ref = rl::model::AllocateParams(specs, at::kFloat, c10::kCPU);
  rl::model::InitParamsRandom(specs, ref, 1);
  std::vector<at::Tensor> ref_params;
  for (const auto& s : specs) {
    if (s.role != rl::model::ParamRole::kFp32Extra) {
      ref[s.name].set_requires_grad(true);
      ref_params.push_back(ref[s.name]);
    }
  }
  const rl::model::Decoder ref_model(config, ref);
  torch::optim::AdamW adamw(ref_params, torch::optim::AdamWOptions(1e-4).weight_decay(0.0));

  const auto our_step = [&] {
    our_model.TokenLogProbs(inputs, targets).log_probs.mean().neg().backward();
    optimizer.AccumulateGrads();
    optimizer.Step();
  };
  const auto ref_step = [&] {
    adamw.zero_grad();
    ref_model.TokenLogProbs(inputs, targets).log_probs.mean().neg().backward();
    adamw.step();
  };
  our_step();  // warm-up
  ref_step();
  double ours_best = 1e30, ref_best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    ours_best = std::min(ours_best, SecondsPerStep(our_step, steps));
    ref_best = std::min(ref_best, SecondsPerStep(ref_step, steps));
  }
  const double tokens_per_step = static_cast<double>(batch * seq);
  std::printf("model %s, batch %lld x %lld tokens, fp32, CPU, best of %d rounds of %d steps\n",
              model_config.c_str(), static_cast<long long>(batch), static_cast<long long>(seq),
              rounds, steps);
  std::printf("ours (ZeRO-1 buffers + AdamW on the shard): %10.0f tokens/s\n",
              tokens_per_step / ours_best);
  std::printf("reference (torch::optim::AdamW):             %10.0f tokens/s\n",
              tokens_per_step / ref_best);
  std::printf("ratio ours / reference: %.3f\n", ref_best / ours_best);
  return 0;
}
