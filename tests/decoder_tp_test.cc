// A tensor-parallel Decoder (Note [Tensor shard], trainer/model/model_config.h) on CPU ranks
// against the whole model on one rank, for every fixture (dense Qwen3 with tied embeddings,
// Qwen3-MoE, GLM-4.5, GLM-4.7-Flash and DeepSeek-V3 MLA, GLM-5 DSA):
// each rank's vocabulary slice of the logits, the token log-probs and entropy, and the gradient
// of each rank's slice of the params, with and without sequence parallelism, fp32; and the
// KV-cache forwards of the rollout engine. Every rank loads the whole fixture and keeps its slices
// (ShardTensorParallel). Runs at 2 ranks.
//
// Tolerance: 1e-4 of the largest magnitude (fp32; the sharded GEMMs sum in another order).
#include <ATen/ATen.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "launch/mpi_communicator.h"
#include "tests/mpi_test_env.h"
#include "trainer/model/decoder.h"
#include "trainer/model/params.h"
#include "trainer/model/test_fixtures.h"

namespace rl::model {
namespace {

const CommOptions kOptions{std::chrono::seconds(60)};
constexpr double kTolerance = 1e-4;

double Scaled(const at::Tensor& got, const at::Tensor& want) {
  REQUIRE(got.sizes() == want.sizes());
  if (want.numel() == 0) return 0;
  return (got - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
}

// Every fixture: dense Qwen3 with tied embeddings, Qwen3-MoE, GLM-4.5, DeepSeek-V3 and
// GLM-4.7-Flash MLA, GLM-5 DSA (with and without shared indexer layers).
std::vector<std::string> TakenFixtures() {
  std::vector<std::string> out = testing::FixtureNames();
  REQUIRE(out.size() >= 7);
  return out;
}

TEST_CASE("A tensor-parallel decoder gives the whole model's logits, log-probs and gradients") {
  MpiCommunicator world(rl::testing::Session(), kOptions);
  for (const std::string& name : TakenFixtures()) {
    const testing::LoadedModel whole = testing::LoadFixture(name);
    const at::Tensor tokens =
        testing::ReferenceTensor(name, "reference.safetensors", "tokens_long");  // [2, 16]
    const at::Tensor targets = at::roll(tokens, -1, 1);
    TensorMap full_params;
    for (const auto& [n, t] : whole.params) full_params.emplace(n, t.clone().requires_grad_());
    const Decoder full(whole.config, full_params);
    const at::Tensor full_logits = full.Logits(tokens).detach();
    const TokenStats want = full.TokenLogProbs(tokens, targets);
    (want.log_probs.sum() + want.entropy.sum()).backward();

    ModelConfig config = whole.config;
    config.tensor_shard = {world.rank(), world.size()};
    const std::vector<ParamSpec> specs = ListParams(config);
    const HeadRange vocab = VocabSlice(config.vocab_size, world.rank(), world.size());
    for (const bool sequence_parallel : {false, true}) {
      INFO(name << ", rank " << world.rank() << (sequence_parallel ? ", sequence parallel" : ""));
      TensorMap local;
      for (const auto& [n, t] : ShardTensorParallel(specs, whole.params)) {
        local.emplace(n, t.clone().requires_grad_());
      }
      const Decoder tp(config, local, Kernels::kLibTorch, nullptr, &world, sequence_parallel);
      CHECK(Scaled(tp.Logits(tokens).detach(), full_logits.narrow(-1, vocab.first, vocab.count)) <=
            kTolerance);
      const TokenStats got = tp.TokenLogProbs(tokens, targets);
      CHECK(Scaled(got.log_probs.detach(), want.log_probs.detach()) <= kTolerance);
      CHECK(Scaled(got.entropy.detach(), want.entropy.detach()) <= kTolerance);
      (got.log_probs.sum() + got.entropy.sum()).backward();
      for (const ParamSpec& spec : specs) {
        if (spec.tp_dim < 0) continue;  // replicated: partial gradients, summed by the optimizer
        INFO(spec.name);
        const at::Tensor want_grad = full_params.at(spec.name).grad().narrow(
            spec.tp_dim, spec.tp_start, spec.shape[static_cast<size_t>(spec.tp_dim)]);
        CHECK(Scaled(local.at(spec.name).grad(), want_grad) <= kTolerance);
      }
    }
  }
}

// The rollout engine's forwards: a prefill and decode steps over a KV cache of this rank's heads,
// at host-side and device-side positions, give the whole vocabulary's logits of the whole model
// (gathered from the vocabulary slices). With Kernels::kFused the MLA steps attend in the latent
// space, as the engine's do.
TEST_CASE("A tensor-parallel decoder's KV-cache steps give the whole model's logits") {
  MpiCommunicator world(rl::testing::Session(), kOptions);
  for (const std::string& name : TakenFixtures()) {
    const testing::LoadedModel whole = testing::LoadFixture(name);
    const at::Tensor tokens =
        testing::ReferenceTensor(name, "reference.safetensors", "tokens_long");  // [2, 16]
    const Decoder full(whole.config, whole.params);
    const at::Tensor want = full.Logits(tokens);
    ModelConfig config = whole.config;
    config.tensor_shard = {world.rank(), world.size()};
    const TensorMap local = ShardTensorParallel(ListParams(config), whole.params);
    for (const Kernels kernels : {Kernels::kLibTorch, Kernels::kFused}) {
      INFO(name << ", rank " << world.rank()
                << (kernels == Kernels::kFused ? ", fused kernels" : ""));
      const Decoder tp(config, local, kernels, nullptr, &world);
      const int64_t seq = tokens.size(1);
      KvCache host = KvCache::Allocate(config, 2, seq, at::kFloat, at::kCPU);
      KvCache device = KvCache::Allocate(config, 2, seq, at::kFloat, at::kCPU);
      const RopeTable rope = MakeRopeTable(config, 0, seq, at::kFloat, at::kCPU);
      std::vector<at::Tensor> by_host = {tp.ForwardStep(tokens.narrow(1, 0, 5), host, 0)};
      std::vector<at::Tensor> by_device = {tp.ForwardStep(tokens.narrow(1, 0, 5), device, 0)};
      for (int64_t p = 5; p < seq; ++p) {
        by_host.push_back(tp.ForwardStep(tokens.narrow(1, p, 1), host, p));
        by_device.push_back(
            tp.DecodeStep(tokens.narrow(1, p, 1), at::full({1}, p, at::kLong), seq, rope, device)
                .unsqueeze(1));
      }
      CHECK(Scaled(at::cat(by_host, 1), want) <= kTolerance);
      CHECK(Scaled(at::cat(by_device, 1), want) <= kTolerance);
    }
  }
}

}  // namespace
}  // namespace rl::model
