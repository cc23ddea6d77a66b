// The ZeRO-1 optimizer on several CPU ranks against LibTorch's own AdamW on the full parameter
// set, fed the same mean gradient.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>

#include "launch/check.h"
#include "launch/mpi_communicator.h"
#include "optimizer/distributed_optimizer.h"
#include "tests/mpi_test_env.h"

namespace rl::optimizer {
namespace {

// Odd shapes, 1-D params and a bias (no weight decay), params split across shards.
const std::vector<ParamSpec> kParams = {
    {"embed.weight", {13, 7}, ParamRole::kDense},
    {"layer.norm.weight", {7}, ParamRole::kDense},
    {"layer.q_proj.weight", {9, 7}, ParamRole::kDense},
    {"layer.q_proj.bias", {9}, ParamRole::kDense},
    {"layer.experts.0.up_proj.weight", {5, 7}, ParamRole::kRoutedExpert},
    {"layer.experts.1.up_proj.weight", {5, 7}, ParamRole::kRoutedExpert},
    {"head.weight", {13, 7}, ParamRole::kDense},
};

AdamOptions Options(double clip, std::optional<bool> fused = std::nullopt) {
  AdamOptions o;
  o.fused = fused;
  o.schedule.lr = 1e-2;
  o.beta1 = 0.9;
  o.beta2 = 0.98;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  o.clip_grad = clip;
  return o;
}

// Same on every rank: initial values; rank-specific: gradients.
at::Tensor Initial(const ParamSpec& p, int index) {
  return at::randn(p.shape, at::make_generator<at::CPUGeneratorImpl>(100 + index),
                   at::TensorOptions().dtype(at::kFloat));
}
at::Tensor Gradient(const ParamSpec& p, int index, int rank, int step) {
  return at::randn(p.shape,
                   at::make_generator<at::CPUGeneratorImpl>(1000 * (step + 1) + 10 * index + rank),
                   at::TensorOptions().dtype(at::kFloat));
}

struct Runs {
  std::unordered_map<std::string, at::Tensor> ours;
  std::unordered_map<std::string, at::Tensor> reference;
};

Runs RunBoth(MpiCommunicator& comm, double clip, int steps,
             std::optional<bool> fused = std::nullopt) {
  DistributedOptimizer optimizer(kParams, comm, at::kFloat, c10::kCPU, Options(clip, fused),
                                 PlainAllocator(c10::kCPU));
  std::vector<at::Tensor> decay, no_decay;
  std::unordered_map<std::string, at::Tensor> reference;
  for (size_t i = 0; i < kParams.size(); ++i) {
    const at::Tensor init = Initial(kParams[i], i);
    {
      at::NoGradGuard no_grad;
      optimizer.params().at(kParams[i].name).copy_(init);
    }
    at::Tensor ref = init.clone().set_requires_grad(true);
    reference[kParams[i].name] = ref;
    (DecaysWeight(kParams[i].name, kParams[i].shape) ? decay : no_decay).push_back(ref);
  }
  optimizer.InitMastersFromParams();
  const AdamOptions o = Options(clip);
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(o.schedule.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd));
  };
  torch::optim::AdamW adamw({torch::optim::OptimizerParamGroup(decay, options(o.weight_decay)),
                             torch::optim::OptimizerParamGroup(no_decay, options(0.0))},
                            torch::optim::AdamWOptions(o.schedule.lr));

  for (int step = 0; step < steps; ++step) {
    // Ours: each rank backpropagates its own gradient.
    for (size_t i = 0; i < kParams.size(); ++i) {
      const at::Tensor& p = optimizer.params().at(kParams[i].name);
      (p * Gradient(kParams[i], i, comm.rank(), step)).sum().backward();
    }
    optimizer.AccumulateGrads();
    optimizer.Step();
    // Reference: the mean gradient over the ranks, computed the way the reduce-scatter does
    // (a sum in rank order, then a division).
    double sum_sq = 0;
    for (size_t i = 0; i < kParams.size(); ++i) {
      at::Tensor mean = at::zeros(kParams[i].shape);
      for (int r = 0; r < comm.size(); ++r) mean += Gradient(kParams[i], i, r, step);
      mean /= comm.size();
      reference[kParams[i].name].mutable_grad() = mean;
      sum_sq += mean.to(at::kDouble).square().sum().item<double>();
    }
    const double norm = std::sqrt(sum_sq);
    if (clip > 0 && clip / (norm + 1e-6) < 1.0) {
      for (auto& [name, ref] : reference) ref.mutable_grad().mul_(clip / (norm + 1e-6));
    }
    adamw.step();
  }
  Runs runs;
  for (const ParamSpec& p : kParams) {
    runs.ours[p.name] = optimizer.params().at(p.name).detach().clone();
    runs.reference[p.name] = reference[p.name].detach().clone();
  }
  return runs;
}

TEST_CASE("three AdamW steps over DP equal LibTorch's AdamW on the mean gradient, bit for bit") {
  // Tolerance 0: with 2 ranks the mean is one IEEE addition and one division, as in the
  // reference, and every Adam operation is element-wise in torch's order (decay, moments,
  // bias-corrected update), so nothing is summed in a different order.
  MpiCommunicator comm(testing::Session(), CommOptions{});
  REQUIRE(comm.size() == 2);
  const Runs runs = RunBoth(comm, /*clip=*/0.0, /*steps=*/3);
  for (const ParamSpec& p : kParams) {
    CAPTURE(p.name);
    CHECK(at::equal(runs.ours.at(p.name), runs.reference.at(p.name)));
  }
}

TEST_CASE("with gradient clipping the step matches LibTorch's AdamW within 1e-6") {
  // The global norm is a sum of squares in a different order (per shard, then across ranks), so
  // the clip coefficient may differ in its last bits: relative 1e-6 covers that for fp32.
  MpiCommunicator comm(testing::Session(), CommOptions{});
  const Runs runs = RunBoth(comm, /*clip=*/0.5, /*steps=*/2);
  for (const ParamSpec& p : kParams) {
    CAPTURE(p.name);
    const at::Tensor diff = (runs.ours.at(p.name) - runs.reference.at(p.name)).abs().max();
    CHECK(diff.item<float>() <= 1e-6 * (1 + runs.reference.at(p.name).abs().max().item<float>()));
  }
}

TEST_CASE("the fused AdamW kernel matches LibTorch's AdamW within 1e-6, decay groups and clip") {
  // Note [Fused AdamW]: the kernel the GPU runs by default, here on the CPU (ATen has both). It
  // rounds differently from the reference ops (one fused expression per element), not more.
  MpiCommunicator comm(testing::Session(), CommOptions{});
  for (const double clip : {0.0, 0.5}) {
    CAPTURE(clip);
    const Runs runs = RunBoth(comm, clip, /*steps=*/3, /*fused=*/true);
    for (const ParamSpec& p : kParams) {
      CAPTURE(p.name);
      const at::Tensor diff = (runs.ours.at(p.name) - runs.reference.at(p.name)).abs().max();
      CHECK(diff.item<float>() <= 1e-6 * (1 + runs.reference.at(p.name).abs().max().item<float>()));
      // Not vacuous: the params moved by far more than the tolerance.
      CHECK((runs.ours.at(p.name) - Initial(p, &p - kParams.data())).abs().max().item<float>() >
            1e-3);
    }
  }
}

TEST_CASE("bf16 params are the cast of the fp32 masters and identical on every rank") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  DistributedOptimizer optimizer(kParams, comm, at::kBFloat16, c10::kCPU, Options(1.0),
                                 PlainAllocator(c10::kCPU));
  for (size_t i = 0; i < kParams.size(); ++i) {
    at::NoGradGuard no_grad;
    optimizer.params().at(kParams[i].name).copy_(Initial(kParams[i], i));
  }
  optimizer.InitMastersFromParams();
  for (size_t i = 0; i < kParams.size(); ++i) {
    const at::Tensor& p = optimizer.params().at(kParams[i].name);
    (p.to(at::kFloat) * Gradient(kParams[i], i, comm.rank(), 0)).sum().backward();
  }
  optimizer.AccumulateGrads();
  optimizer.Step();
  const ShardState state = optimizer.ExportState();
  for (BufferKind kind : kBufferKinds) {
    const BufferLayout& layout = optimizer.layout(kind);
    const at::Tensor owned =
        optimizer.param_buffer(kind).narrow(0, layout.shard_offset(comm.rank()),
                                            layout.shard_numel());
    const at::Tensor master = state.tensors.at(std::string(ToString(kind)) + ".master");
    CHECK(at::equal(owned, master.to(at::kBFloat16)));
    // Every rank holds the same buffer: compare with rank 0's by broadcast.
    at::Tensor theirs = optimizer.param_buffer(kind).clone();
    comm.Broadcast(theirs, 0);
    CHECK(at::equal(theirs, optimizer.param_buffer(kind)));
  }
}

TEST_CASE(
    "after ZeroGrads the grad buffers hold exactly the accumulated grads, whatever was there") {
  // Note [Lazy grad zeroing]: the first AccumulateGrads overwrites; slots without a .grad and the
  // alignment padding become zero, later micro-batches add.
  MpiCommunicator comm(testing::Session(), CommOptions{});
  DistributedOptimizer optimizer(kParams, comm, at::kFloat, c10::kCPU, Options(0.0),
                                 PlainAllocator(c10::kCPU));
  const std::string skipped = "layer.q_proj.bias";  // no gradient in this step
  for (BufferKind kind : kBufferKinds) {
    optimizer.grad_buffer(kind).fill_(std::numeric_limits<float>::quiet_NaN());
  }
  optimizer.ZeroGrads();
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    for (size_t i = 0; i < kParams.size(); ++i) {
      if (kParams[i].name == skipped) continue;
      (optimizer.params().at(kParams[i].name) * Gradient(kParams[i], i, comm.rank(), micro_batch))
          .sum()
          .backward();
    }
    optimizer.AccumulateGrads();
  }
  for (BufferKind kind : kBufferKinds) {
    at::Tensor expected = at::zeros_like(optimizer.grad_buffer(kind));
    for (const BufferEntry& entry : optimizer.layout(kind).entries) {
      const size_t i = std::find_if(kParams.begin(), kParams.end(),
                                    [&](const ParamSpec& p) { return p.name == entry.name; }) -
                       kParams.begin();
      if (entry.name == skipped) continue;
      expected.narrow(0, entry.offset, entry.numel)
          .copy_((Gradient(kParams[i], i, comm.rank(), 0) + Gradient(kParams[i], i, comm.rank(), 1))
                     .reshape({-1}));
    }
    CHECK(at::equal(optimizer.grad_buffer(kind), expected));
  }
}

TEST_CASE("offload and onload of the optimizer state is bit-identical and reuses the host copy") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  DistributedOptimizer optimizer(kParams, comm, at::kFloat, c10::kCPU, Options(0.0),
                                 PlainAllocator(c10::kCPU));
  for (size_t i = 0; i < kParams.size(); ++i) {
    at::NoGradGuard no_grad;
    optimizer.params().at(kParams[i].name).copy_(Initial(kParams[i], i));
  }
  optimizer.InitMastersFromParams();
  for (size_t i = 0; i < kParams.size(); ++i) {
    (optimizer.params().at(kParams[i].name) * Gradient(kParams[i], i, comm.rank(), 0))
        .sum()
        .backward();
  }
  optimizer.AccumulateGrads();
  optimizer.Step();
  const ShardState before = optimizer.ExportState();
  optimizer.OffloadState();
  CHECK(optimizer.host_state_bytes() == optimizer.state_bytes());
  optimizer.OnloadState();
  optimizer.OffloadState();  // second cycle: the same host allocation
  CHECK(optimizer.host_state_bytes() == optimizer.state_bytes());
  optimizer.OnloadState();
  const ShardState after = optimizer.ExportState();
  for (const auto& [name, tensor] : before.tensors) {
    CAPTURE(name);
    CHECK(at::equal(tensor, after.tensors.at(name)));
  }
  CHECK_THROWS_AS(optimizer.OnloadState(), Error);
}

TEST_CASE("state import refuses a different layout and names the difference") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  DistributedOptimizer a(kParams, comm, at::kFloat, c10::kCPU, Options(0.0),
                         PlainAllocator(c10::kCPU));
  std::vector<ParamSpec> other = kParams;
  other[2].shape = {10, 7};
  DistributedOptimizer b(other, comm, at::kFloat, c10::kCPU, Options(0.0),
                         PlainAllocator(c10::kCPU));
  const ShardState state = a.ExportState();
  CHECK_NOTHROW(a.ImportState(state));
  try {
    b.ImportState(state);
    FAIL("no throw");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK(message.find("different dense buffer layout") != std::string::npos);
    CHECK(message.find("layer.q_proj.weight [9,7]") != std::string::npos);
  }
}

TEST_CASE("the role picks the buffer and fp32 extras are refused") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  const DistributedOptimizer optimizer(kParams, comm, at::kFloat, c10::kCPU, Options(0.0),
                                       PlainAllocator(c10::kCPU));
  CHECK(optimizer.layout(BufferKind::kExpert).entries.size() == 2);
  CHECK(optimizer.layout(BufferKind::kDense).entries.size() == kParams.size() - 2);
  CHECK_THROWS_WITH(DistributedOptimizer::StorageBytes({{"gate.bias", {4}, ParamRole::kFp32Extra}},
                                                       1, at::kFloat),
                    Catch::Contains("gate.bias is an fp32 extra"));
}

}  // namespace
}  // namespace rl::optimizer
