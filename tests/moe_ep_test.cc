// The expert-parallel MoE block (Note [Expert-parallel MoE], trainer/model/layers.h) on CPU ranks
// against the same block with every expert local, for a Qwen3-MoE-like block (softmax router) and
// a DeepSeek-like one (sigmoid router with e_score_correction_bias and group-limited selection,
// plus shared experts), fp32. Every rank draws the whole model's weights from one seed, keeps its
// shard of the experts (Note [Expert shard], trainer/model/model_config.h) and runs its own
// input, with a different number of tokens per rank. Runs at 2 ranks (moe_ep_test) and 4
// (moe_ep_np4_test).
//
// Tolerances: the forward and the gradients of x and of the router are per-row results of the
// CPU's batch-invariant GEMMs (Note [Batch-invariant CPU kernels], layers.cc), so they must be
// bitwise equal. An expert's weight gradient sums the rows of every rank in one GEMM under EP,
// against a per-rank GEMM summed by an all-reduce here: another summation order, so 1e-6 of the
// largest magnitude.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "launch/communicator.h"
#include "launch/mpi_communicator.h"
#include "tests/mpi_test_env.h"
#include "trainer/model/layers.h"
#include "trainer/model/model_config.h"

namespace rl::model {
namespace {

constexpr int64_t kHidden = 32;
constexpr int64_t kInter = 16;
constexpr int64_t kExperts = 8;  // 4 per rank at 2 ranks, 2 at 4
constexpr double kWeightGradTolerance = 1e-6;
// A hang ends the test as a CommError instead of waiting for mpirun's timeout.
const CommOptions kOptions{std::chrono::seconds(60)};

struct Family {
  std::string name;
  ModelConfig config;
};

std::vector<Family> Families() {
  ModelConfig qwen;
  qwen.model_type = ModelType::kQwen3Moe;
  qwen.hidden_size = kHidden;
  qwen.router = RouterKind::kSoftmax;
  qwen.n_routed_experts = kExperts;
  qwen.num_experts_per_tok = 2;
  qwen.moe_intermediate_size = kInter;
  qwen.norm_topk_prob = true;

  ModelConfig deepseek;
  deepseek.model_type = ModelType::kDeepseekV3;
  deepseek.hidden_size = kHidden;
  deepseek.router = RouterKind::kSigmoidNoauxTc;
  deepseek.n_routed_experts = kExperts;
  deepseek.num_experts_per_tok = 3;
  deepseek.moe_intermediate_size = kInter;
  deepseek.n_shared_experts = 1;
  deepseek.n_group = 4;
  deepseek.topk_group = 2;
  deepseek.routed_scaling_factor = 2.5;
  deepseek.norm_topk_prob = true;
  return {{"qwen3_moe-like (softmax router)", qwen},
          {"deepseek_v3-like (sigmoid router, bias, shared experts)", deepseek}};
}

at::Tensor Normal(at::Generator& gen, std::vector<int64_t> shape, double std) {
  return at::empty(shape, at::kFloat).normal_(0.0, std, gen);
}

// The whole model's MoE weights, identical on every rank: one generator seeded with `seed`.
MoeWeights WholeWeights(const ModelConfig& c, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  MoeWeights w;
  w.router = Normal(gen, {kExperts, kHidden}, 0.3);
  if (c.router == RouterKind::kSigmoidNoauxTc) w.router_bias = Normal(gen, {kExperts}, 0.1);
  w.gate_up = Normal(gen, {kExperts, 2 * kInter, kHidden}, 0.2);
  w.down = Normal(gen, {kExperts, kHidden, kInter}, 0.2);
  if (c.n_shared_experts > 0) {
    const int64_t inter = kInter * c.n_shared_experts;
    w.has_shared = true;
    w.shared.gate_proj = Normal(gen, {inter, kHidden}, 0.2);
    w.shared.up_proj = Normal(gen, {inter, kHidden}, 0.2);
    w.shared.down_proj = Normal(gen, {kHidden, inter}, 0.2);
  }
  return w;
}

// The experts of `group`'s rank (Note [Expert shard]), with the group as the expert group.
MoeWeights ShardOf(const MoeWeights& whole, Communicator& group) {
  const int64_t local = kExperts / group.size();
  MoeWeights w = whole;
  w.gate_up = whole.gate_up.narrow(0, group.rank() * local, local).clone();
  w.down = whole.down.narrow(0, group.rank() * local, local).clone();
  w.expert_group = &group;
  return w;
}

// Tokens of each rank: some with fewer rows per expert than Linear's 16-row GEMM, some with more.
int64_t TokensOf(int rank) {
  constexpr int64_t kTokens[] = {5, 37, 20, 11};
  return kTokens[rank];
}

// This rank's input [tokens, H] and output gradient, different on every rank.
at::Tensor InputOf(int rank, int64_t tokens) {
  at::Generator gen = at::detail::createCPUGenerator(100 + rank);
  return Normal(gen, {tokens, kHidden}, 1.0);
}
at::Tensor OutputGradOf(int rank, int64_t tokens) {
  at::Generator gen = at::detail::createCPUGenerator(200 + rank);
  return Normal(gen, {tokens, kHidden}, 1.0);
}

struct Result {
  at::Tensor out, x, gate_up, down, router;  // the output, then the gradients
};

// MoeBlock's output on x0 and the gradients of x0, the experts and the router for `out_grad`.
Result ForwardBackward(const MoeWeights& weights, const ModelConfig& c, const at::Tensor& x0,
                       const at::Tensor& out_grad) {
  MoeWeights w = weights;
  w.router = weights.router.clone().requires_grad_();
  w.gate_up = weights.gate_up.clone().requires_grad_();
  w.down = weights.down.clone().requires_grad_();
  const at::Tensor x = x0.clone().requires_grad_();
  const at::Tensor out = MoeBlock(w, c, x);
  out.backward(out_grad);
  return {out.detach(), x.grad(), w.gate_up.grad(), w.down.grad(), w.router.grad()};
}

// Whether this rank's tokens route rows to experts of another rank, so that the all-to-all
// carries them (else the comparison would not exercise the exchange).
bool SendsToOtherRanks(const MoeWeights& whole, const ModelConfig& c, const at::Tensor& x,
                       Communicator& group) {
  if (x.size(0) == 0) return false;
  const int64_t local = kExperts / group.size();
  const at::Tensor owner = at::floor_divide(Route(whole, c, x).indices, local);
  return (owner != group.rank()).any().item<bool>();
}

struct Runs {
  Result ep;     // this rank's shard of the experts, the world as expert group
  Result local;  // every expert on this rank
};

// Both runs of this rank's input with `tokens` tokens. Collective over `world`.
Runs RunBoth(Communicator& world, const ModelConfig& c, const MoeWeights& whole, int64_t tokens) {
  const at::Tensor x = InputOf(world.rank(), tokens);
  const at::Tensor out_grad = OutputGradOf(world.rank(), tokens);
  if (tokens > 0) REQUIRE(SendsToOtherRanks(whole, c, x, world));
  Runs runs;
  runs.ep = ForwardBackward(ShardOf(whole, world), c, x, out_grad);
  runs.local = ForwardBackward(whole, c, x, out_grad);
  return runs;
}

double MaxDifference(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

// |got - want| <= tolerance * max |want| everywhere, and `want` not all zero.
void CheckClose(const at::Tensor& got, const at::Tensor& want, double tolerance) {
  REQUIRE(got.sizes() == want.sizes());
  const double scale = want.abs().max().item<double>();
  const double difference = MaxDifference(got, want);
  INFO("max |difference| " << difference << ", max |reference| " << scale);
  REQUIRE(scale > 0);
  CHECK(difference <= tolerance * scale);
}

TEST_CASE("EP forward equals the all-local block bitwise on every rank's own tokens") {
  MpiCommunicator world(testing::Session(), kOptions);
  for (const Family& f : Families()) {
    const Runs runs = RunBoth(world, f.config, WholeWeights(f.config, 1), TokensOf(world.rank()));
    INFO(f.name << ", rank " << world.rank() << " of " << world.size() << ", max |difference| "
                << MaxDifference(runs.ep.out, runs.local.out));
    CHECK(at::equal(runs.ep.out, runs.local.out));
  }
}

TEST_CASE("EP gradient of the input equals the all-local one bitwise") {
  MpiCommunicator world(testing::Session(), kOptions);
  for (const Family& f : Families()) {
    const Runs runs = RunBoth(world, f.config, WholeWeights(f.config, 2), TokensOf(world.rank()));
    INFO(f.name << ", rank " << world.rank() << " of " << world.size() << ", max |difference| "
                << MaxDifference(runs.ep.x, runs.local.x));
    CHECK(at::equal(runs.ep.x, runs.local.x));
  }
}

TEST_CASE("EP gradient of a local expert sums the all-local gradients of every rank's tokens") {
  MpiCommunicator world(testing::Session(), kOptions);
  const int64_t local = kExperts / world.size();
  for (const Family& f : Families()) {
    const Runs runs = RunBoth(world, f.config, WholeWeights(f.config, 3), TokensOf(world.rank()));
    at::Tensor gate_up = runs.local.gate_up.contiguous();  // [E, 2I, H], this rank's tokens
    at::Tensor down = runs.local.down.contiguous();        // [E, H, I]
    world.AllReduce(gate_up, ReduceOp::kSum);
    world.AllReduce(down, ReduceOp::kSum);
    {
      INFO(f.name << ", rank " << world.rank() << ": gate_up");
      CheckClose(runs.ep.gate_up, gate_up.narrow(0, world.rank() * local, local),
                 kWeightGradTolerance);
    }
    {
      INFO(f.name << ", rank " << world.rank() << ": down");
      CheckClose(runs.ep.down, down.narrow(0, world.rank() * local, local), kWeightGradTolerance);
    }
  }
}

TEST_CASE("EP gradient of the router equals the all-local one bitwise") {
  MpiCommunicator world(testing::Session(), kOptions);
  for (const Family& f : Families()) {
    const Runs runs = RunBoth(world, f.config, WholeWeights(f.config, 4), TokensOf(world.rank()));
    INFO(f.name << ", rank " << world.rank() << " of " << world.size() << ", max |difference| "
                << MaxDifference(runs.ep.router, runs.local.router));
    CHECK(at::equal(runs.ep.router, runs.local.router));
  }
}

TEST_CASE("ExpertGroupIdle on the last rank serves the others' rows; their outputs stay exact") {
  MpiCommunicator world(testing::Session(), kOptions);
  const int idle = world.size() - 1;
  for (const Family& f : Families()) {
    INFO(f.name << ", rank " << world.rank() << " of " << world.size());
    const MoeWeights whole = WholeWeights(f.config, 5);
    const MoeWeights shard = ShardOf(whole, world);
    at::NoGradGuard no_grad;  // as in a rollout's forward (Decoder::IdleStep)
    if (world.rank() == idle) {
      ExpertGroupIdle(shard, f.config);  // a hang ends as CommError after kOptions.timeout
    } else {
      const at::Tensor x = InputOf(world.rank(), TokensOf(world.rank()));
      // Some of the rows go to the idle rank's experts.
      const at::Tensor owner =
          at::floor_divide(Route(whole, f.config, x).indices, kExperts / world.size());
      REQUIRE((owner == idle).any().item<bool>());
      const at::Tensor out = MoeBlock(shard, f.config, x);
      const at::Tensor want = MoeBlock(whole, f.config, x);
      INFO("max |difference| " << MaxDifference(out, want));
      CHECK(at::equal(out, want));
    }
  }
  world.Barrier();
}

// The last rank has no tokens: its block returns [0, H] and still joins both exchanges of the
// forward and of the backward, so the other ranks' results are those of the all-local block.
TEST_CASE("A rank with no tokens takes part in EP forward and backward") {
  MpiCommunicator world(testing::Session(), kOptions);
  const bool empty = world.rank() == world.size() - 1;
  const int64_t local = kExperts / world.size();
  for (const Family& f : Families()) {
    INFO(f.name << ", rank " << world.rank() << " of " << world.size());
    const Runs runs =
        RunBoth(world, f.config, WholeWeights(f.config, 6), empty ? 0 : TokensOf(world.rank()));
    CHECK(runs.ep.out.sizes() == runs.local.out.sizes());
    CHECK(at::equal(runs.ep.out, runs.local.out));
    CHECK(at::equal(runs.ep.x, runs.local.x));
    at::Tensor gate_up = runs.local.gate_up.contiguous();
    world.AllReduce(gate_up, ReduceOp::kSum);
    CheckClose(runs.ep.gate_up, gate_up.narrow(0, world.rank() * local, local),
               kWeightGradTolerance);
  }
}

// Note [Fixed-capacity dispatch]: a capacity every rank computes alike, and a fresh flag.
ExpertDispatch DispatchFor(int64_t capacity) {
  return {capacity, at::zeros({1}, at::kInt)};
}

// The most tokens any rank has, so that the worst-case capacity is the same on every rank.
int64_t MaxTokens(int ranks) {
  int64_t most = 0;
  for (int r = 0; r < ranks; ++r) most = std::max(most, TokensOf(r));
  return most;
}

TEST_CASE("Fixed-capacity dispatch equals the all-local block bitwise and never overflows at "
          "the worst-case capacity") {
  MpiCommunicator world(testing::Session(), kOptions);
  for (const Family& f : Families()) {
    INFO(f.name << ", rank " << world.rank() << " of " << world.size());
    const MoeWeights whole = WholeWeights(f.config, 7);
    const at::Tensor x = InputOf(world.rank(), TokensOf(world.rank()));
    REQUIRE(SendsToOtherRanks(whole, f.config, x, world));
    at::NoGradGuard no_grad;  // as in a decode step
    const ExpertDispatch dispatch =
        DispatchFor(DispatchCapacity(f.config, MaxTokens(world.size()), world.size(), 0));
    const at::Tensor out = MoeBlock(ShardOf(whole, world), f.config, x, nullptr, {}, &dispatch);
    const at::Tensor want = MoeBlock(whole, f.config, x);
    INFO("max |difference| " << MaxDifference(out, want));
    CHECK(at::equal(out, want));
    CHECK(dispatch.overflow.item<int>() == 0);
  }
}

// With one slot per pair of ranks, a rank overflows exactly when it routes two or more rows to
// one rank; the flag says so on that rank.
TEST_CASE("Fixed-capacity dispatch flags a step whose rows do not fit on the rank that sent them") {
  MpiCommunicator world(testing::Session(), kOptions);
  const int64_t local = kExperts / world.size();
  for (const Family& f : Families()) {
    INFO(f.name << ", rank " << world.rank() << " of " << world.size());
    const MoeWeights whole = WholeWeights(f.config, 8);
    at::NoGradGuard no_grad;
    for (const int64_t tokens : {int64_t{1}, TokensOf(world.rank())}) {
      const at::Tensor x = InputOf(world.rank(), tokens);
      const at::Tensor owners = at::floor_divide(Route(whole, f.config, x).indices, local);
      const bool crowded =
          at::bincount(owners.reshape({-1}), {}, world.size()).max().item<int64_t>() > 1;
      const ExpertDispatch dispatch = DispatchFor(1);
      const at::Tensor out = MoeBlock(ShardOf(whole, world), f.config, x, nullptr, {}, &dispatch);
      INFO(tokens << " tokens");
      CHECK(dispatch.overflow.item<int>() == (crowded ? 1 : 0));
      CHECK(at::isfinite(out).all().item<bool>());
      if (!crowded) CHECK(at::equal(out, MoeBlock(whole, f.config, x)));
    }
  }
}

TEST_CASE("ExpertGroupIdle with a fixed-capacity dispatch serves the others' rows exactly") {
  MpiCommunicator world(testing::Session(), kOptions);
  const int idle = world.size() - 1;
  for (const Family& f : Families()) {
    INFO(f.name << ", rank " << world.rank() << " of " << world.size());
    const MoeWeights whole = WholeWeights(f.config, 9);
    const MoeWeights shard = ShardOf(whole, world);
    at::NoGradGuard no_grad;
    const ExpertDispatch dispatch =
        DispatchFor(DispatchCapacity(f.config, MaxTokens(world.size()), world.size(), 0));
    if (world.rank() == idle) {
      ExpertGroupIdle(shard, f.config, &dispatch);
    } else {
      const at::Tensor x = InputOf(world.rank(), TokensOf(world.rank()));
      const at::Tensor out = MoeBlock(shard, f.config, x, nullptr, {}, &dispatch);
      CHECK(at::equal(out, MoeBlock(whole, f.config, x)));
    }
    CHECK(dispatch.overflow.item<int>() == 0);
  }
  world.Barrier();
}

}  // namespace
}  // namespace rl::model
