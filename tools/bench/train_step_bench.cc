// train_step_bench [--model-config FILE | --checkpoint DIR] [--batch B] [--seq S] [--steps N]
// [--device cpu|auto]: tokens/s of one training step (forward, backward, optimizer step) through
// our ZeRO-1 optimizer on one rank and through LibTorch's plain torch::optim::AdamW with
// separately allocated params, in the same process, alternating rounds (the machine is noisy).
// On the CPU the model is fp32; on a GPU (--device auto) bf16 params, our optimizer keeping fp32
// masters. Prints both, the ratio ours / reference, and a JSON line (tools/bench/
// vs_transformers.sh sets it against `transformers` + torch.optim.AdamW).
// Run: bazel run -c opt //tools/bench:train_step_bench
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "launch/communicator.h"
#include "launch/device.h"
#include "launch/json.h"
#include "launch/mpi_session.h"
#include "optimizer/distributed_optimizer.h"
#include "tools/bench/profiling.h"
#include "trainer/model/decoder.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/params.h"
#include "trainer/model/safetensors.h"

namespace {

using Clock = std::chrono::steady_clock;

double SecondsPerStep(const std::function<void()>& step, int steps, const c10::Device& device) {
  const auto synchronize = [&] {
    if (device.is_cuda()) at::empty({1}, at::TensorOptions().device(device)).cpu();
  };
  synchronize();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  synchronize();
  return std::chrono::duration<double>(Clock::now() - start).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  rl::MpiSession session(&argc, &argv);
  CLI::App app{"Train-step benchmark: our ZeRO-1 step vs torch::optim::AdamW, same model."};
  std::string model_config = "configs/models/qwen3_30b_a3b_4layer_ci.json";
  std::string checkpoint, device_name = "cpu";
  int64_t batch = 8, seq = 64;
  int steps = 10, rounds = 3;
  std::string profile;
  app.add_option("--model-config", model_config, "config.json of the model (random weights)");
  app.add_option("--checkpoint", checkpoint, "a Hugging Face checkpoint instead (its weights)");
  app.add_option("--device", device_name, "cpu, or auto (the GPU when there is one)")
      ->check(CLI::IsMember({"cpu", "auto"}));
  app.add_option("--batch", batch, "sequences per step");
  app.add_option("--profile", profile, "also write a Chrome trace of one of our steps here");
  app.add_option("--seq", seq, "tokens per sequence");
  app.add_option("--steps", steps, "timed steps per round");
  app.add_option("--rounds", rounds, "alternating rounds; the best of each side counts");
  CLI11_PARSE(app, argc, argv);

  const c10::Device device = rl::BindDevice(
      0, device_name == "cpu" ? rl::DevicePreference::kCpu
                              : rl::DevicePreference::kCudaIfAvailable);
  const at::ScalarType dtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;
  const rl::model::ModelConfig config =
      checkpoint.empty()
          ? rl::model::ParseModelConfig(rl::json::ParseFile(model_config), model_config)
          : rl::model::LoadModelConfig(checkpoint);
  const std::vector<rl::ParamSpec> specs = rl::model::ListParams(config);
  const auto init = [&](rl::model::TensorMap& params) {
    if (checkpoint.empty()) {
      rl::model::InitParamsRandom(specs, params, 1);
    } else {
      rl::model::LoadParams(rl::model::CheckpointReader::Open(checkpoint), config, params);
    }
  };
  const at::Tensor tokens = at::randint(config.vocab_size, {batch, seq + 1},
                                        at::make_generator<at::CPUGeneratorImpl>(7), at::kLong)
                                .to(device);
  const at::Tensor inputs = tokens.narrow(1, 0, seq);
  const at::Tensor targets = tokens.narrow(1, 1, seq);

  // Ours: params are views into the optimizer's flat buffer.
  const std::unique_ptr<rl::Communicator> comm =
      rl::CreateCommunicator(session, device, rl::CommOptions{});
  std::vector<rl::ParamSpec> trained;
  rl::model::TensorMap ours;
  for (const auto& s : specs) {
    if (s.role == rl::ParamRole::kFp32Extra) {
      ours[s.name] = at::zeros(s.shape, at::TensorOptions().dtype(at::kFloat).device(device));
    } else {
      trained.push_back(s);
    }
  }
  rl::optimizer::AdamOptions adam;
  adam.schedule.lr = 1e-4;
  adam.weight_decay = 0.0;
  rl::optimizer::DistributedOptimizer optimizer(trained, *comm, dtype, device, adam,
                                                rl::optimizer::PlainAllocator(device));
  for (const auto& [name, t] : optimizer.params()) ours[name] = t;
  init(ours);
  optimizer.InitMastersFromParams();
  const rl::model::Decoder our_model(config, ours);

  // Reference: plainly allocated params, LibTorch's AdamW over all of them.
  rl::model::TensorMap ref = rl::model::AllocateParams(specs, dtype, device);
  init(ref);
  std::vector<at::Tensor> ref_params;
  for (const auto& s : specs) {
    if (s.role != rl::ParamRole::kFp32Extra) {
      ref[s.name].set_requires_grad(true);
      ref_params.push_back(ref[s.name]);
    }
  }
  const rl::model::Decoder ref_model(config, ref);
  torch::optim::AdamW adamw(ref_params, torch::optim::AdamWOptions(1e-4).weight_decay(0.0));

  // -mean log-prob of the next tokens (no entropy: the reference computes none).
  const auto loss_of = [&](const rl::model::Decoder& model) {
    return model.TokenLogProbs(inputs, targets, /*with_entropy=*/false).log_probs.mean().neg();
  };
  const auto our_step = [&] {
    loss_of(our_model).backward();
    optimizer.AccumulateGrads();
    optimizer.Step();
  };
  const auto ref_step = [&] {
    adamw.zero_grad();
    loss_of(ref_model).backward();
    adamw.step();
  };
  our_step();  // warm-up
  ref_step();
  double ours_best = 1e30, ref_best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    ours_best = std::min(ours_best, SecondsPerStep(our_step, steps, device));
    ref_best = std::min(ref_best, SecondsPerStep(ref_step, steps, device));
  }
  // Where our step's time goes: forward (to the loss), backward, accumulate (the param grads
  // into the flat fp32 grad buffer), optimizer (the ZeRO-1 step), each timed alone with a device
  // sync around it.
  std::map<std::string, double> phase_ms = {
      {"forward", 0}, {"backward", 0}, {"accumulate", 0}, {"optimizer", 0}};
  for (int i = 0; i < steps; ++i) {
    at::Tensor loss;
    phase_ms["forward"] += 1e3 * SecondsPerStep([&] { loss = loss_of(our_model); }, 1, device);
    phase_ms["backward"] += 1e3 * SecondsPerStep([&] { loss.backward(); }, 1, device);
    phase_ms["accumulate"] +=
        1e3 * SecondsPerStep([&] { optimizer.AccumulateGrads(); }, 1, device);
    phase_ms["optimizer"] += 1e3 * SecondsPerStep([&] { optimizer.Step(); }, 1, device);
  }
  if (!profile.empty()) rl::bench::ProfileToFile(our_step, profile);
  const double tokens_per_step = static_cast<double>(batch * seq);
  std::printf("model %s, batch %lld x %lld tokens, %s on %s, best of %d rounds of %d steps\n",
              checkpoint.empty() ? model_config.c_str() : checkpoint.c_str(),
              static_cast<long long>(batch), static_cast<long long>(seq),
              c10::toString(dtype), device.str().c_str(), rounds, steps);
  std::printf("ours (ZeRO-1 buffers + AdamW on the shard): %10.0f tokens/s\n",
              tokens_per_step / ours_best);
  std::printf("reference (torch::optim::AdamW):             %10.0f tokens/s\n",
              tokens_per_step / ref_best);
  std::printf("ratio ours / reference: %.3f\n", ref_best / ours_best);
  rl::json::Value line = rl::json::Value::MakeObject({});
  line.Set("bench", rl::json::Value::String("train_step"));
  line.Set("device", rl::json::Value::String(device.str()));
  line.Set("batch", rl::json::Value::Int(batch));
  line.Set("seq", rl::json::Value::Int(seq));
  line.Set("tokens_per_s", rl::json::Value::Double(tokens_per_step / ours_best));
  line.Set("libtorch_adamw_tokens_per_s", rl::json::Value::Double(tokens_per_step / ref_best));
  for (const auto& [phase, ms] : phase_ms) {
    line.Set(phase + "_ms", rl::json::Value::Double(ms / steps));
  }
  std::printf("%s\n", rl::json::Dump(line).c_str());
  return 0;
}
