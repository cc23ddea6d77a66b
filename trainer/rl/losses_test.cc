// The policy loss and its parts against hand-computed values, the first-step property CI checks,
// masking, scaling, and the gradient against finite differences. All in fp64.
#include "trainer/rl/losses.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "launch/check.h"
#include "trainer/config/options.h"

namespace rl::rl_algo {
namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);

at::Tensor Vec(std::vector<double> v) { return at::tensor(at::ArrayRef<double>(v), kF64); }
at::Tensor Mat(std::vector<double> v, int64_t rows) {
  return Vec(std::move(v)).reshape({rows, -1});
}

double Item(const at::Tensor& t) { return t.item<double>(); }
double Slot(const PolicyLossOutput& out, LossMetricSlot slot) {
  return Item(out.metric_sums[slot]);
}

void CheckClose(const at::Tensor& actual, const at::Tensor& expected, double tol = 1e-12) {
  REQUIRE(actual.sizes() == expected.sizes());
  const at::Tensor a = actual.to(at::kDouble).contiguous().reshape({-1});
  const at::Tensor e = expected.to(at::kDouble).contiguous().reshape({-1});
  for (int64_t i = 0; i < a.size(0); ++i) {
    INFO("element " << i);
    CHECK(Item(a[i]) == Approx(Item(e[i])).margin(tol).epsilon(0));
  }
}

TEST_CASE("KL estimators k1, k2, k3, low_var_kl on hand-computed values", "[losses]") {
  // r = logp - ref = [0, 1, -1, 30, -30].
  const at::Tensor logp = Vec({0, 1, -1, 30, -30});
  const at::Tensor ref = at::zeros({5}, kF64);
  const double e = std::exp(1.0);
  CheckClose(ApproxKl(logp, ref, KlType::kK1), Vec({0, 1, -1, 30, -30}));
  CheckClose(ApproxKl(logp, ref, KlType::kK2), Vec({0, .5, .5, 450, 450}));
  // k3 = exp(-r) - 1 + r.
  CheckClose(ApproxKl(logp, ref, KlType::kK3),
             Vec({0, 1 / e, e - 2, std::exp(-30.0) + 29, std::exp(30.0) - 31}), 1e-3);
  // low_var_kl: -r clamped to [-20, 20] (r = 30 -> exp(-20) + 19), then clamped to [-10, 10].
  CheckClose(ApproxKl(logp, ref, KlType::kLowVarKl), Vec({0, 1 / e, e - 2, 10, 10}));
  // A reference that is not zero: only the difference matters.
  CheckClose(ApproxKl(Vec({-1.5}), Vec({-2.5}), KlType::kK2), Vec({.5}));
}

TEST_CASE("PPO clip: pg = max(-A*ratio, -A*clamp(ratio, 1-eps, 1+eps_high)), clipfrac, dual clip",
          "[losses]") {
  // ratio = exp(-ppo_kl); eps_clip 0.2, eps_clip_high 0.28: clamp to [0.8, 1.28].
  //   A=1,  r=1.5: pg1 -1.5, pg2 -1.28 -> -1.28, clipped
  //   A=1,  r=0.5: pg1 -0.5, pg2 -0.8  -> -0.5
  //   A=-1, r=1.5: pg1  1.5, pg2  1.28 ->  1.5
  //   A=-1, r=0.5: pg1  0.5, pg2  0.8  ->  0.8,  clipped
  //   A=2,  r=1.1: pg1 -2.2, pg2 -2.2  -> -2.2
  //   A=-1, r=4:   pg1  4,   pg2  1.28 ->  4;    dual clip c=3: min(3, 4) = 3
  const at::Tensor ratio = Vec({1.5, 0.5, 1.5, 0.5, 1.1, 4});
  const at::Tensor ppo_kl = -ratio.log();
  const at::Tensor adv = Vec({1, 1, -1, -1, 2, -1});
  ClippedPolicyLoss out = ComputePolicyLoss(ppo_kl, adv, 0.2, 0.28, std::nullopt);
  CheckClose(out.pg_loss, Vec({-1.28, -0.5, 1.5, 0.8, -2.2, 4}));
  CheckClose(out.clipfrac, Vec({1, 0, 0, 1, 0, 0}));
  out = ComputePolicyLoss(ppo_kl, adv, 0.2, 0.28, 3.0);
  CheckClose(out.pg_loss, Vec({-1.28, -0.5, 1.5, 0.8, -2.2, 3}));
}

TEST_CASE("the ratio's exponent is clamped to +-20 and NaN counts as 0", "[losses]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // ppo_kl -50 -> ratio exp(20); A = -1 -> pg1 = exp(20) wins. NaN -> ratio 1 -> pg -A = 1.
  const ClippedPolicyLoss out =
      ComputePolicyLoss(Vec({-50, nan}), Vec({-1, -1}), 0.2, 0.2, std::nullopt);
  CheckClose(out.pg_loss, Vec({std::exp(20.0), 1}), 1e-6);
}

TEST_CASE("aggregation: per-sample masked mean (empty samples count 1), or per-token sum",
          "[losses]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Sample 0: (1 + 2) / 2 = 1.5; sample 1 has no mask-1 token: 0 / max(0, 1) = 0. NaN is masked.
  const at::Tensor x = Mat({1, 2, nan, 4, 5, 6}, 2);
  const at::Tensor mask = Mat({1, 1, 0, 0, 0, 0}, 2);
  CHECK(Item(Aggregate(x, mask, LossAggregation::kSampleMean)) == 1.5);
  CHECK(Item(Aggregate(x, mask, LossAggregation::kTokenSum)) == 3.0);
  // Two full samples: (1+2+3)/3 + (4+5+6)/3 = 7; per token 21.
  const at::Tensor y = Mat({1, 2, 3, 4, 5, 6}, 2);
  CHECK(Item(Aggregate(y, at::ones_like(y), LossAggregation::kSampleMean)) == Approx(7.0));
  CHECK(Item(Aggregate(y, at::ones_like(y), LossAggregation::kTokenSum)) == Approx(21.0));
}

TEST_CASE("GSPO's ppo_kl is the masked per-sequence mean of old - logp, broadcast", "[losses]") {
  // (old - logp) = [0.5, 0, 1] with mask [1, 1, 0]: (0.5 + 0) / 2 = 0.25 on every token.
  CheckClose(SequencePpoKl(Mat({-1, -2, -3}, 1), Mat({-0.5, -2, -2}, 1), Mat({1, 1, 0}, 1)),
             Mat({.25, .25, .25}, 1));
}

PolicyLossInputs FirstStepInputs(int64_t batch, int64_t length) {
  PolicyLossInputs in;
  in.log_probs = -at::rand({batch, length}, kF64) * 3;
  in.old_log_probs = in.log_probs.clone();
  // GRPO: one advantage per sample, broadcast to its tokens.
  in.advantages = (at::randn({batch, 1}, kF64)).expand({batch, length}).contiguous();
  in.loss_mask = (at::rand({batch, length}, kF64) > 0.3).to(at::kInt);
  in.loss_mask.select(1, 0).fill_(1);  // every sample has a trainable token
  return in;
}

TEST_CASE("first step (old == new): ppo_kl exactly 0, clipfrac 0, loss = -mean advantage",
          "[losses]") {
  at::manual_seed(1);
  const PolicyLossInputs in = FirstStepInputs(6, 9);
  LossScale scale;
  scale.global_batch_size = 6;
  const PolicyLossOutput out = PolicyLoss(in, LossOptions{}, scale);
  const LossMetrics m = SummarizeLossMetrics(out.metric_sums);
  CHECK(m.ppo_kl == 0.0);
  CHECK(m.pg_clipfrac == 0.0);
  const double mean_advantage = Item(in.advantages.select(1, 0).mean());
  CHECK(m.loss == Approx(-mean_advantage).margin(1e-14));
  CHECK(m.pg_loss == Approx(-mean_advantage).margin(1e-14));
  // One rank, the whole global batch in one micro-batch: the loss is the metric.
  CHECK(Item(out.loss) == Approx(-mean_advantage).margin(1e-14));
}

TEST_CASE(
    "entropy bonus and KL loss enter with their coefficients; the loss is scaled by "
    "dp_size / global_batch_size",
    "[losses]") {
  // One sample, two tokens, old == new (pg = -A = -1 per token, sample mean -1).
  // Entropy [0.5, 1.5]: mean 1. KL k2 with r = [1, -1]: 0.5 each, mean 0.5.
  // loss = -1 - 0.1 * 1 + 0.5 * 0.5 = -0.85; scaled by dp 2 / gbs 4: -0.425.
  PolicyLossInputs in;
  in.log_probs = Mat({-1, -2}, 1);
  in.old_log_probs = in.log_probs.clone();
  in.ref_log_probs = Mat({-2, -1}, 1);
  in.advantages = Mat({1, 1}, 1);
  in.loss_mask = Mat({1, 1}, 1);
  in.entropy = Mat({0.5, 1.5}, 1);
  LossOptions o;
  o.entropy_coef = 0.1;
  o.use_kl_loss = true;
  o.kl_loss_coef = 0.5;
  o.kl_loss_type = KlType::kK2;
  LossScale scale;
  scale.global_batch_size = 4;
  scale.dp_size = 2;
  const PolicyLossOutput out = PolicyLoss(in, o, scale);
  CHECK(Item(out.loss) == Approx(-0.425).margin(1e-14));
  const LossMetrics m = SummarizeLossMetrics(out.metric_sums);
  CHECK(m.loss == Approx(-0.85).margin(1e-14));
  CHECK(m.pg_loss == Approx(-1).margin(1e-14));
  REQUIRE(m.entropy_loss.has_value());
  CHECK(*m.entropy_loss == Approx(1).margin(1e-14));
  REQUIRE(m.kl_loss.has_value());
  CHECK(*m.kl_loss == Approx(0.5).margin(1e-14));
  CHECK_FALSE(m.train_rollout_logprob_abs_diff.has_value());
  CHECK_FALSE(m.tis.has_value());
}

TEST_CASE("per-token aggregation scales by dp_size / global_num_tokens", "[losses]") {
  // Tokens (mask 1): A = 1, 1, 3 with old == new: pg -1, -1, -3, sum -5.
  PolicyLossInputs in;
  in.log_probs = Mat({-1, -2, -3, -4}, 2);
  in.old_log_probs = in.log_probs.clone();
  in.advantages = Mat({1, 1, 3, 3}, 2);
  in.loss_mask = Mat({1, 1, 1, 0}, 2);
  LossOptions o;
  o.aggregation = LossAggregation::kTokenSum;
  LossScale scale;
  scale.global_num_tokens = 10;
  scale.dp_size = 2;
  const PolicyLossOutput out = PolicyLoss(in, o, scale);
  CHECK(Item(out.loss) == Approx(-5.0 * 2 / 10).margin(1e-14));
  CHECK(Slot(out, kMetricCount) == 3.0);
  CHECK(SummarizeLossMetrics(out.metric_sums).loss == Approx(-5.0 / 3).margin(1e-14));
}

TEST_CASE("TIS multiplies pg by clamp(exp(old - rollout), low, high) and reports tis metrics",
          "[losses]") {
  // old - rollout = [ln 3, ln 0.5, 0]: tis [3, 0.5, 1], clamped to [0, 2]: [2, 0.5, 1].
  // A = 1, old == new: pg = -1 * w = [-2, -0.5, -1], sample mean -3.5 / 3.
  PolicyLossInputs in;
  in.log_probs = Mat({-1, -1, -1}, 1);
  in.old_log_probs = in.log_probs.clone();
  in.rollout_log_probs = in.old_log_probs - Mat({std::log(3.0), std::log(0.5), 0}, 1);
  in.advantages = Mat({1, 1, 1}, 1);
  in.loss_mask = Mat({1, 1, 1}, 1);
  LossOptions o;
  o.use_tis = true;
  const PolicyLossOutput out = PolicyLoss(in, o, LossScale{});
  const LossMetrics m = SummarizeLossMetrics(out.metric_sums);
  CHECK(m.pg_loss == Approx(-3.5 / 3).margin(1e-12));
  REQUIRE(m.tis.has_value());
  CHECK(*m.tis == Approx(4.5 / 3).margin(1e-12));
  CHECK(*m.tis_clipfrac == Approx(1.0 / 3).margin(1e-12));
  CHECK(*m.tis_abs == Approx(2.5 / 3).margin(1e-12));
  // |old - rollout| = [ln 3, ln 2, 0].
  REQUIRE(m.train_rollout_logprob_abs_diff.has_value());
  CHECK(*m.train_rollout_logprob_abs_diff ==
        Approx((std::log(3.0) + std::log(2.0)) / 3).margin(1e-12));
}

TEST_CASE("with use_rollout_logprobs the engine's log-probs are the old policy", "[losses]") {
  // rollout = logp + ln(1.5): ppo_kl = ln 1.5 -> ratio 1/1.5; A = 1: pg1 = -0.667, pg2 = -0.8.
  PolicyLossInputs in;
  in.log_probs = Mat({-1}, 1);
  in.rollout_log_probs = in.log_probs + std::log(1.5);
  in.advantages = Mat({1}, 1);
  in.loss_mask = Mat({1}, 1);
  LossOptions o;
  o.use_rollout_logprobs = true;
  const LossMetrics m = SummarizeLossMetrics(PolicyLoss(in, o, LossScale{}).metric_sums);
  CHECK(m.ppo_kl == Approx(std::log(1.5)).margin(1e-14));
  CHECK(m.pg_loss == Approx(-1 / 1.5).margin(1e-14));
  CHECK(m.pg_clipfrac == 0.0);
}

TEST_CASE("mask-0 tokens change nothing: not the loss, not a metric, not a gradient", "[losses]") {
  at::manual_seed(2);
  PolicyLossInputs in = FirstStepInputs(3, 7);
  in.old_log_probs = in.log_probs - 0.3 * at::randn_like(in.log_probs);
  in.ref_log_probs = in.log_probs - 0.2 * at::randn_like(in.log_probs);
  in.rollout_log_probs = in.old_log_probs - 0.1 * at::randn_like(in.log_probs);
  in.entropy = at::rand_like(in.log_probs);
  LossOptions o;
  o.use_kl_loss = true;
  o.kl_loss_coef = 0.3;
  o.entropy_coef = 0.01;
  o.use_tis = true;

  const auto run = [&](const PolicyLossInputs& inputs, at::Tensor* grad) {
    PolicyLossInputs x = inputs;
    x.log_probs = inputs.log_probs.detach().clone().requires_grad_(true);
    const PolicyLossOutput out = PolicyLoss(x, o, LossScale{});
    out.loss.backward();
    *grad = x.log_probs.grad();
    return out;
  };
  at::Tensor grad_clean, grad_dirty;
  const PolicyLossOutput clean = run(in, &grad_clean);

  // Garbage, NaN and inf at every mask-0 position of every input.
  const at::Tensor inactive = in.loss_mask.eq(0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  PolicyLossInputs dirty = in;
  dirty.log_probs = in.log_probs.masked_fill(inactive, nan);
  dirty.old_log_probs = in.old_log_probs.masked_fill(inactive, 1e6);
  dirty.ref_log_probs = in.ref_log_probs.masked_fill(inactive, -inf);
  dirty.rollout_log_probs = in.rollout_log_probs.masked_fill(inactive, inf);
  dirty.advantages = in.advantages.masked_fill(inactive, nan);
  dirty.entropy = in.entropy.masked_fill(inactive, 1e30);
  const PolicyLossOutput out = run(dirty, &grad_dirty);

  CHECK(Item(out.loss) == Item(clean.loss));
  CheckClose(out.metric_sums, clean.metric_sums, 0.0);
  CHECK(at::equal(grad_dirty, grad_clean));
  CHECK(Item(grad_clean.masked_select(inactive).abs().sum()) == 0.0);
  CHECK(Item(grad_clean.masked_select(inactive.logical_not()).abs().sum()) > 0.0);
}

// The gradient of PolicyLoss's `loss` with respect to log_probs, by autograd and by central
// differences, agree to 1e-7 relative. Values are kept away from the clip kinks.
void CheckGradient(const LossOptions& o, const LossScale& scale, uint64_t seed) {
  at::manual_seed(seed);
  PolicyLossInputs in = FirstStepInputs(3, 6);
  in.advantages = at::randn_like(in.log_probs);
  in.old_log_probs = in.log_probs + (at::rand_like(in.log_probs) - 0.5);
  in.ref_log_probs = in.log_probs + 0.5 * at::randn_like(in.log_probs);
  in.rollout_log_probs = in.old_log_probs + 0.3 * at::randn_like(in.log_probs);
  in.entropy = at::rand_like(in.log_probs);

  const at::Tensor x = in.log_probs.clone().requires_grad_(true);
  PolicyLossInputs with_grad = in;
  with_grad.log_probs = x;
  const PolicyLossOutput out = PolicyLoss(with_grad, o, scale);
  out.loss.backward();
  const at::Tensor analytic = x.grad();
  if (o.policy_ratio == PolicyRatio::kToken) {
    // The data reach both branches of the clip, so both of their gradients are checked.
    const double clipfrac = SummarizeLossMetrics(out.metric_sums).pg_clipfrac;
    CHECK(clipfrac > 0.0);
    CHECK(clipfrac < 1.0);
  }

  const double h = 1e-6;
  at::Tensor numeric = at::zeros_like(in.log_probs);
  for (int64_t b = 0; b < in.log_probs.size(0); ++b) {
    for (int64_t t = 0; t < in.log_probs.size(1); ++t) {
      PolicyLossInputs plus = in, minus = in;
      plus.log_probs = in.log_probs.clone();
      minus.log_probs = in.log_probs.clone();
      plus.log_probs[b][t] += h;
      minus.log_probs[b][t] -= h;
      numeric[b][t] =
          (Item(PolicyLoss(plus, o, scale).loss) - Item(PolicyLoss(minus, o, scale).loss)) /
          (2 * h);
    }
  }
  const double scale_of_grad = std::max(Item(numeric.abs().max()), 1e-3);
  CheckClose(analytic, numeric, 1e-7 * scale_of_grad);
}

TEST_CASE("the policy-loss gradient matches finite differences (fp64)", "[losses]") {
  LossOptions o;
  o.eps_clip = 0.2;
  o.eps_clip_high = 0.28;
  o.eps_clip_c = 3.0;
  o.use_kl_loss = true;
  o.kl_loss_coef = 0.1;
  o.kl_loss_type = KlType::kLowVarKl;
  o.entropy_coef = 0.01;
  o.use_tis = true;
  LossScale scale;
  scale.global_batch_size = 6;
  scale.global_num_tokens = 20;
  scale.dp_size = 2;
  SECTION("per-token ratio, per-sample mean") { CheckGradient(o, scale, 11); }
  SECTION("k3 KL loss, per-token sum") {
    o.kl_loss_type = KlType::kK3;
    o.aggregation = LossAggregation::kTokenSum;
    CheckGradient(o, scale, 12);
  }
  SECTION("sequence ratio (GSPO)") {
    o.policy_ratio = PolicyRatio::kSequence;
    CheckGradient(o, scale, 13);
  }
}

TEST_CASE("metric sums add over micro-batches and divide by the total count", "[losses]") {
  // Micro-batch 1: one sample, A = 2 -> pg -2. Micro-batch 2: two samples, A = 1 and 4 -> -1, -4.
  // Mean over the three samples: -7 / 3.
  const auto micro_batch = [](std::vector<double> advantages) {
    const int64_t n = static_cast<int64_t>(advantages.size());
    PolicyLossInputs in;
    in.log_probs = -at::ones({n, 2}, kF64);
    in.old_log_probs = in.log_probs.clone();
    in.advantages = Vec(std::move(advantages)).unsqueeze(1).expand({n, 2}).contiguous();
    in.loss_mask = at::ones({n, 2}, kF64);
    return PolicyLoss(in, LossOptions{}, LossScale{}).metric_sums;
  };
  const at::Tensor total = micro_batch({2}) + micro_batch({1, 4});
  const LossMetrics m = SummarizeLossMetrics(total);
  CHECK(m.pg_loss == Approx(-7.0 / 3).margin(1e-14));
  CHECK_FALSE(m.entropy_loss.has_value());
  const auto named = NamedMetrics(m);
  REQUIRE(named.size() == 4);
  CHECK(named[0].first == "loss");
  CHECK(named[3].first == "ppo_kl");
}

TEST_CASE("missing inputs that the options need are errors", "[losses]") {
  PolicyLossInputs in;
  in.log_probs = Mat({-1, -1}, 1);
  in.old_log_probs = in.log_probs.clone();
  in.advantages = Mat({1, 1}, 1);
  in.loss_mask = Mat({1, 1}, 1);
  LossOptions o;
  o.use_kl_loss = true;
  CHECK_THROWS_WITH(PolicyLoss(in, o, LossScale{}), Catch::Contains("ref_log_probs"));
  o = LossOptions{};
  o.use_tis = true;
  CHECK_THROWS_WITH(PolicyLoss(in, o, LossScale{}), Catch::Contains("rollout_log_probs"));
  o = LossOptions{};
  in.advantages = Mat({1, 1, 1}, 1);
  CHECK_THROWS_WITH(PolicyLoss(in, o, LossScale{}), Catch::Contains("advantages is [1, 3]"));
}

TEST_CASE("loss options come from the config", "[losses]") {
  config::Config c;
  LossOptions o = LossOptionsFrom(c);
  CHECK(o.eps_clip == 0.2);
  CHECK(o.eps_clip_high == 0.2);  // unset: the lower clip
  CHECK_FALSE(o.eps_clip_c.has_value());
  CHECK(o.policy_ratio == PolicyRatio::kToken);
  CHECK(o.aggregation == LossAggregation::kSampleMean);
  CHECK(o.kl_loss_type == KlType::kK1);
  c.rl.advantage_estimator = AdvantageEstimator::kGspo;
  c.rl.eps_clip_high = 0.28;
  c.rl.eps_clip_c = 3.0;
  c.rl.calculate_per_token_loss = true;
  c.rl.kl_loss_type = KlType::kLowVarKl;
  o = LossOptionsFrom(c);
  CHECK(o.policy_ratio == PolicyRatio::kSequence);
  CHECK(o.eps_clip_high == 0.28);
  CHECK(o.eps_clip_c == 3.0);
  CHECK(o.aggregation == LossAggregation::kTokenSum);
  CHECK(o.kl_loss_type == KlType::kLowVarKl);
}

}  // namespace
}  // namespace rl::rl_algo
