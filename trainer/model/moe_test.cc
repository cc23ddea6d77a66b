// The grouped MoE block (Note [MoE block] in layers.h) against the per-expert loop
// (moe_reference.h) over the same stacked weights, forward and gradients in fp32 on the CPU:
// routing with experts that receive no token, one expert that receives every token, and top-k
// equal to the number of experts.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <limits>
#include <string>
#include <vector>

#include "trainer/model/layers.h"
#include "trainer/model/model_config.h"
#include "trainer/model/moe_reference.h"

namespace rl::model {
namespace {

constexpr int64_t kHidden = 16;
constexpr int64_t kInter = 8;
constexpr int64_t kTokens = 24;

ModelConfig MoeConfig(RouterKind router, int64_t experts, int64_t top_k) {
  ModelConfig c;
  c.hidden_size = kHidden;
  c.router = router;
  c.n_routed_experts = experts;
  c.num_experts_per_tok = top_k;
  c.moe_intermediate_size = kInter;
  c.norm_topk_prob = true;
  if (router == RouterKind::kSigmoidNoauxTc) {
    c.n_group = 2;
    c.topk_group = 1;
    c.routed_scaling_factor = 2.5;
  }
  return c;
}

MoeWeights RandomWeights(const ModelConfig& c, uint64_t seed) {
  at::manual_seed(seed);
  MoeWeights w;
  const int64_t e = c.n_routed_experts;
  w.router = at::randn({e, kHidden}) * 0.3;
  if (c.router == RouterKind::kSigmoidNoauxTc) w.router_bias = at::randn({e}) * 0.1;
  w.gate_up = at::randn({e, 2 * kInter, kHidden}) * 0.2;
  w.down = at::randn({e, kHidden, kInter}) * 0.2;
  return w;
}

struct Grads {
  at::Tensor out, x, gate_up, down, router;
};

Grads Run(bool grouped, const MoeWeights& weights, const ModelConfig& c, const at::Tensor& x0,
          const at::Tensor& seed_grad) {
  MoeWeights w = weights;
  w.router = weights.router.clone().requires_grad_();
  w.gate_up = weights.gate_up.clone().requires_grad_();
  w.down = weights.down.clone().requires_grad_();
  const at::Tensor x = x0.clone().requires_grad_();
  const at::Tensor out = grouped ? MoeBlock(w, c, x) : MoeBlockByExpertLoop(w, c, x);
  out.backward(seed_grad);
  return {out.detach(), x.grad(), w.gate_up.grad(), w.down.grad(), w.router.grad()};
}

// How many distinct experts the routing uses.
int64_t ExpertsUsed(const MoeWeights& w, const ModelConfig& c, const at::Tensor& x) {
  return std::get<0>(at::_unique(Route(w, c, x).indices)).numel();
}

void CheckSame(const Grads& a, const Grads& b) {
  const std::vector<std::pair<std::string, std::pair<at::Tensor, at::Tensor>>> pairs = {
      {"output", {a.out, b.out}},
      {"d x", {a.x, b.x}},
      {"d gate_up", {a.gate_up, b.gate_up}},
      {"d down", {a.down, b.down}},
      {"d router", {a.router, b.router}}};
  for (const auto& [what, t] : pairs) {
    INFO(what << ": max |difference| " << (t.first - t.second).abs().max().item<double>());
    CHECK(at::allclose(t.first, t.second, /*rtol=*/1e-5, /*atol=*/1e-6));
  }
}

TEST_CASE("The grouped MoE block equals the per-expert loop, forward and gradients (fp32 CPU)") {
  struct Case {
    std::string name;
    RouterKind router;
    int64_t experts, top_k;
    bool one_expert_takes_all;
  };
  const std::vector<Case> cases = {
      {"softmax, 16 experts top-2: some receive no token", RouterKind::kSoftmax, 16, 2, false},
      {"softmax, one expert receives every token", RouterKind::kSoftmax, 8, 2, true},
      {"softmax, top-k = all 8 experts", RouterKind::kSoftmax, 8, 8, false},
      {"sigmoid noaux_tc with groups, 8 experts top-3", RouterKind::kSigmoidNoauxTc, 8, 3, false},
      {"sigmoid noaux_tc, top-k = all 4 experts", RouterKind::kSigmoidNoauxTc, 4, 4, false},
  };
  for (const Case& tc : cases) {
    INFO(tc.name);
    ModelConfig c = MoeConfig(tc.router, tc.experts, tc.top_k);
    if (tc.top_k == tc.experts) c.n_group = 1;
    MoeWeights w = RandomWeights(c, 11);
    at::Tensor x = at::randn({kTokens, kHidden});
    if (tc.one_expert_takes_all) {
      // Feature 0 is large for every token and only expert 3 reads it.
      x.select(1, 0).fill_(5.0);
      w.router.select(1, 0).zero_();
      w.router[3][0] = 4.0;
    }
    const int64_t used = ExpertsUsed(w, c, x);
    if (tc.name.find("no token") != std::string::npos) CHECK(used < tc.experts);
    if (tc.one_expert_takes_all) {
      const Routing r = Route(w, c, x);
      CHECK((r.indices == 3).any(1).all().item<bool>());
    }
    if (tc.top_k == tc.experts) CHECK(used == tc.experts);
    const at::Tensor seed_grad = at::randn({kTokens, kHidden});
    CheckSame(Run(true, w, c, x, seed_grad), Run(false, w, c, x, seed_grad));
  }
}

TEST_CASE("The MoE block keeps the input's shape and adds the shared experts") {
  ModelConfig c = MoeConfig(RouterKind::kSigmoidNoauxTc, 8, 2);
  MoeWeights w = RandomWeights(c, 5);
  const at::Tensor x = at::randn({2, kTokens / 2, kHidden});
  const at::Tensor routed = MoeBlock(w, c, x);
  CHECK(routed.sizes() == x.sizes());
  w.has_shared = true;
  w.shared.gate_proj = at::randn({kInter, kHidden}) * 0.2;
  w.shared.up_proj = at::randn({kInter, kHidden}) * 0.2;
  w.shared.down_proj = at::randn({kHidden, kInter}) * 0.2;
  const at::Tensor with_shared = MoeBlock(w, c, x);
  CHECK(at::allclose(with_shared - routed, DenseMlp(w.shared, x), 1e-5, 1e-6));
}

TEST_CASE("GroupedLinear takes groups with no rows and the fp64 loop path") {
  at::manual_seed(3);
  const at::Tensor w = at::randn({4, 6, 8}, at::kDouble);
  const at::Tensor x = at::randn({5, 8}, at::kDouble);
  const at::Tensor ends = at::tensor({0, 2, 2, 5}, at::kInt);
  const at::Tensor y = GroupedLinear(x, w, ends);
  REQUIRE(y.sizes() == at::IntArrayRef({5, 6}));
  CHECK(at::equal(y.narrow(0, 0, 2), Linear(x.narrow(0, 0, 2), w[1])));
  CHECK(at::equal(y.narrow(0, 2, 3), Linear(x.narrow(0, 2, 3), w[3])));
  const at::Tensor yf = GroupedLinear(x.to(at::kFloat), w.to(at::kFloat), ends);
  CHECK(at::allclose(yf.to(at::kDouble), y, 1e-5, 1e-6));
}

TEST_CASE("GroupedLinear leaves zeros in the rows past the last group on the CPU") {
  at::manual_seed(4);
  const at::Tensor w = at::randn({2, 6, 8});
  const at::Tensor x = at::randn({7, 8});
  const at::Tensor y = GroupedLinear(x, w, at::tensor({1, 4}, at::kInt));
  REQUIRE(y.sizes() == at::IntArrayRef({7, 6}));
  CHECK(at::equal(y.narrow(0, 1, 3), Linear(x.narrow(0, 1, 3), w[1])));
  CHECK(at::equal(y.narrow(0, 4, 3), at::zeros({3, 6})));
}

// Note [Fixed-capacity dispatch]: 8 experts, top-2, 10 tokens.
TEST_CASE("DispatchCapacity: the worst case by default, a multiple of the mean below it") {
  const ModelConfig c = MoeConfig(RouterKind::kSoftmax, 8, 2);
  CHECK(DispatchCapacity(c, 10, 2, 0) == 20);   // 4 local experts: both of a token's rows
  CHECK(DispatchCapacity(c, 10, 8, 0) == 10);   // 1 local expert: one row per token
  CHECK(DispatchCapacity(c, 10, 2, 1.0) == 10);  // mean 10 * 2 / 2
  CHECK(DispatchCapacity(c, 10, 4, 1.5) == 8);   // ceil(1.5 * 5)
  CHECK(DispatchCapacity(c, 10, 2, 9.0) == 20);  // never above the worst case
  CHECK(DispatchCapacity(c, 1, 8, 0.01) == 1);   // at least one slot
}

// A factor whose product with the mean does not fit in int64 is the worst case, not the
// undefined cast of a huge double (which gave one slot on x86).
TEST_CASE("DispatchCapacity: a huge factor gives the worst case") {
  const ModelConfig c = MoeConfig(RouterKind::kSoftmax, 8, 2);
  CHECK(DispatchCapacity(c, 10, 2, 1e300) == 20);
  CHECK(DispatchCapacity(c, 10, 2, 1e19) == 20);
  CHECK(DispatchCapacity(c, 10, 2, std::numeric_limits<double>::infinity()) == 20);
}

// Output and gradients of the grouped block, with `replay` replacing the router's choice.
Grads RunReplay(const MoeWeights& weights, const ModelConfig& c, const at::Tensor& x0,
                const at::Tensor& seed_grad, const at::Tensor& replay, at::Tensor* chosen) {
  MoeWeights w = weights;
  w.router = weights.router.clone().requires_grad_();
  w.gate_up = weights.gate_up.clone().requires_grad_();
  w.down = weights.down.clone().requires_grad_();
  const at::Tensor x = x0.clone().requires_grad_();
  const at::Tensor out = MoeBlock(w, c, x, chosen, replay);
  out.backward(seed_grad);
  return {out.detach(), x.grad(), w.gate_up.grad(), w.down.grad(), w.router.grad()};
}

TEST_CASE("Replaying the block's own routing reproduces it bit for bit, gradients included") {
  for (RouterKind router : {RouterKind::kSoftmax, RouterKind::kSigmoidNoauxTc}) {
    INFO((router == RouterKind::kSoftmax ? "softmax" : "sigmoid noaux_tc"));
    const ModelConfig c = MoeConfig(router, 8, 3);
    const MoeWeights w = RandomWeights(c, 21);
    const at::Tensor x = at::randn({kTokens, kHidden});
    const at::Tensor seed_grad = at::randn({kTokens, kHidden});
    at::Tensor recorded, replayed;
    const Grads natural = RunReplay(w, c, x, seed_grad, {}, &recorded);
    const Grads again = RunReplay(w, c, x, seed_grad, recorded, &replayed);
    CHECK(at::equal(replayed, recorded));
    CHECK(at::equal(natural.out, again.out));
    CHECK(at::equal(natural.x, again.x));
    CHECK(at::equal(natural.gate_up, again.gate_up));
    CHECK(at::equal(natural.down, again.down));
    CHECK(at::equal(natural.router, again.router));
  }
}

TEST_CASE(
    "A replayed routing that differs on some tokens changes exactly their outputs, and the "
    "router keeps its gradient") {
  for (RouterKind router : {RouterKind::kSoftmax, RouterKind::kSigmoidNoauxTc}) {
    INFO((router == RouterKind::kSoftmax ? "softmax" : "sigmoid noaux_tc"));
    const ModelConfig c = MoeConfig(router, 8, 2);
    const MoeWeights w = RandomWeights(c, 23);
    const at::Tensor x = at::randn({kTokens, kHidden});
    const at::Tensor seed_grad = at::randn({kTokens, kHidden});
    at::Tensor recorded;
    const Grads natural = RunReplay(w, c, x, seed_grad, {}, &recorded);
    // Tokens 3 and 10 get an expert the router did not choose in their first slot.
    at::Tensor forced = recorded.clone();
    for (int64_t t : {3, 10}) {
      const int64_t other =
          (recorded[t][0].item<int64_t>() + 1) % 8 == recorded[t][1].item<int64_t>()
              ? (recorded[t][0].item<int64_t>() + 2) % 8
              : (recorded[t][0].item<int64_t>() + 1) % 8;
      forced[t][0] = other;
    }
    const Grads replayed = RunReplay(w, c, x, seed_grad, forced, nullptr);
    const at::Tensor changed = (replayed.out != natural.out).any(1);
    for (int64_t t = 0; t < kTokens; ++t) {
      INFO("token " << t);
      CHECK(changed[t].item<bool>() == (t == 3 || t == 10));
    }
    REQUIRE(replayed.router.defined());
    CHECK(replayed.router.abs().sum().item<double>() > 0);
    CHECK_FALSE(at::equal(replayed.router, natural.router));
  }
}

}  // namespace
}  // namespace rl::model
