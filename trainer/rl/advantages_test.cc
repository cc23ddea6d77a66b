// Reward post-processing and the advantage estimators against hand-computed values, in fp64.
#include "trainer/rl/advantages.h"

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

// [rows, cols] from row-major values.
at::Tensor Mat(std::vector<double> v, int64_t rows) {
  return Vec(std::move(v)).reshape({rows, -1});
}

// Every element of `actual` within 1e-12 (absolute) of `expected`.
void CheckClose(const at::Tensor& actual, const at::Tensor& expected, double tol = 1e-12) {
  REQUIRE(actual.sizes() == expected.sizes());
  const at::Tensor a = actual.to(at::kDouble).contiguous().reshape({-1});
  const at::Tensor e = expected.to(at::kDouble).contiguous().reshape({-1});
  for (int64_t i = 0; i < a.size(0); ++i) {
    INFO("element " << i);
    CHECK(a[i].item<double>() == Approx(e[i].item<double>()).margin(tol).epsilon(0));
  }
}

RewardOptions Grpo(bool std_normalization = true) {
  RewardOptions o;
  o.estimator = AdvantageEstimator::kGrpo;
  o.grpo_std_normalization = std_normalization;
  return o;
}

TEST_CASE("GRPO normalises each group: minus the mean, over unbiased std + 1e-6", "[advantages]") {
  // Group 1: [1, 0, 0, 1]: mean 0.5, centred [.5, -.5, -.5, .5], unbiased var = 4 * .25 / 3 = 1/3.
  // Group 2: [2, 4, 6, 8]: mean 5, centred [-3, -1, 1, 3], unbiased var = 20 / 3.
  const at::Tensor raw = Vec({1, 0, 0, 1, 2, 4, 6, 8});
  const double s1 = std::sqrt(1.0 / 3.0) + 1e-6;
  const double s2 = std::sqrt(20.0 / 3.0) + 1e-6;
  const at::Tensor expected =
      Vec({.5 / s1, -.5 / s1, -.5 / s1, .5 / s1, -3 / s2, -1 / s2, 1 / s2, 3 / s2});
  CheckClose(PostProcessRewards(raw, {4, 4}, Grpo()), expected);
  // GSPO normalises the same way; unequal group sizes take the per-group path.
  RewardOptions gspo = Grpo();
  gspo.estimator = AdvantageEstimator::kGspo;
  CheckClose(PostProcessRewards(raw, {4, 4}, gspo), expected);
  CheckClose(PostProcessRewards(Vec({1, 0, 0, 1, 2, 4, 6, 8, 7, 7, 7}), {4, 4, 3}, Grpo()),
             at::cat({expected, Vec({0, 0, 0})}));  // an all-equal group becomes 0, not NaN
}

TEST_CASE("the std switch off (Dr.GRPO) only centres; REINFORCE++ baseline only centres",
          "[advantages]") {
  const at::Tensor raw = Vec({1, 0, 0, 1, 2, 4, 6, 8});
  const at::Tensor centred = Vec({.5, -.5, -.5, .5, -3, -1, 1, 3});
  CheckClose(PostProcessRewards(raw, {4, 4}, Grpo(/*std_normalization=*/false)), centred);
  RewardOptions baseline = Grpo();
  baseline.estimator = AdvantageEstimator::kReinforcePlusPlusBaseline;
  CheckClose(PostProcessRewards(raw, {4, 4}, baseline), centred);
}

TEST_CASE("without rewards_normalization, or for REINFORCE++, rewards stay raw", "[advantages]") {
  const at::Tensor raw = Vec({1, 0, 0, 1, 2, 4, 6, 8});
  RewardOptions off = Grpo();
  off.rewards_normalization = false;
  CheckClose(PostProcessRewards(raw, {4, 4}, off), raw);
  RewardOptions rpp = Grpo();
  rpp.estimator = AdvantageEstimator::kReinforcePlusPlus;
  CheckClose(PostProcessRewards(raw, {4, 4}, rpp), raw);
}

TEST_CASE("a singleton group is centred to 0 and never divided by its (undefined) std",
          "[advantages]") {
  // Group {5}: 5 - 5 = 0. Group {1, 2, 3}: centred [-1, 0, 1], unbiased std 1.
  const at::Tensor out = PostProcessRewards(Vec({5, 1, 2, 3}), {1, 3}, Grpo());
  CheckClose(out, Vec({0, -1 / (1 + 1e-6), 0, 1 / (1 + 1e-6)}));
  // All singletons (n_samples_per_prompt 1): every reward becomes 0, none NaN.
  CheckClose(PostProcessRewards(Vec({5, -2}), {1, 1}, Grpo()), Vec({0, 0}));
}

TEST_CASE("group sizes must cover the rewards", "[advantages]") {
  CHECK_THROWS_AS(PostProcessRewards(Vec({1, 2, 3}), {2, 2}, Grpo()), Error);
  CHECK_THROWS_AS(PostProcessRewards(Vec({1, 2, 3}), {3, 0}, Grpo()), Error);
}

TEST_CASE("GRPO/GSPO broadcast the normalised reward to every token; kl_coef is not applied",
          "[advantages]") {
  AdvantageOptions o;
  o.estimator = AdvantageEstimator::kGrpo;
  o.kl_coef = 0.5;
  const at::Tensor mask = Mat({1, 1, 0, 1, 0, 0}, 2);
  const at::Tensor kl = Mat({9, 9, 9, 9, 9, 9}, 2);
  const AdvantagesAndReturns out = RawAdvantagesAndReturns(Vec({0.5, -1}), mask, kl, o);
  CheckClose(out.advantages, Mat({.5, .5, .5, -1, -1, -1}, 2));
  CheckClose(out.returns, out.advantages);
}

TEST_CASE(
    "REINFORCE++: -kl_coef*kl token rewards, the reward at the last trainable token, "
    "discounted returns",
    "[advantages]") {
  AdvantageOptions o;
  o.estimator = AdvantageEstimator::kReinforcePlusPlus;
  o.kl_coef = 0.5;
  // Sample 0: mask [1, 1, 0, 1, 0], kl [.1 .2 .3 .4 .5]: token rewards -0.5*kl*mask =
  //   [-.05, -.1, 0, -.2, 0], +1 at index 3 (last mask-1 token) -> [-.05, -.1, 0, .8, 0].
  //   gamma 1: G = [.65, .7, .8, .8, 0].
  // Sample 1: mask all 0: no terminal reward, masked KL 0 -> all 0.
  const at::Tensor mask = Mat({1, 1, 0, 1, 0, 0, 0, 0, 0, 0}, 2);
  const at::Tensor kl = Mat({.1, .2, .3, .4, .5, .1, .2, .3, .4, .5}, 2);
  const at::Tensor rewards = Vec({1.0, 3.0});
  AdvantagesAndReturns out = RawAdvantagesAndReturns(rewards, mask, kl, o);
  CheckClose(out.returns, Mat({.65, .7, .8, .8, 0, 0, 0, 0, 0, 0}, 2));
  CheckClose(out.advantages, out.returns);
  // gamma 0.5: G4 = 0, G3 = .8, G2 = 0 + .4 = .4, G1 = -.1 + .2 = .1, G0 = -.05 + .05 = 0.
  o.gamma = 0.5;
  out = RawAdvantagesAndReturns(rewards, mask, kl, o);
  CheckClose(out.returns, Mat({0, .1, .4, .8, 0, 0, 0, 0, 0, 0}, 2));
}

TEST_CASE("REINFORCE++ baseline: reward - kl_coef * kl per token", "[advantages]") {
  AdvantageOptions o;
  o.estimator = AdvantageEstimator::kReinforcePlusPlusBaseline;
  o.kl_coef = 0.5;
  // 0.5 - 0.5 * 0.2 = 0.4; 0.5 - 0.5 * -0.4 = 0.7.
  const AdvantagesAndReturns out =
      RawAdvantagesAndReturns(Vec({0.5}), Mat({1, 1}, 1), Mat({0.2, -0.4}, 1), o);
  CheckClose(out.advantages, Mat({0.4, 0.7}, 1));
  CheckClose(out.returns, out.advantages);
}

TEST_CASE("kl_coef without a KL tensor is refused; an undefined KL means zeros", "[advantages]") {
  AdvantageOptions o;
  o.estimator = AdvantageEstimator::kReinforcePlusPlusBaseline;
  CheckClose(RawAdvantagesAndReturns(Vec({2}), Mat({1, 1}, 1), at::Tensor(), o).advantages,
             Mat({2, 2}, 1));
  o.kl_coef = 0.1;
  CHECK_THROWS_AS(RawAdvantagesAndReturns(Vec({2}), Mat({1, 1}, 1), at::Tensor(), o), Error);
}

// MaskedWhiten of one part.
at::Tensor WhitenOne(const at::Tensor& values, const at::Tensor& mask,
                     const AllReduceSum& all_reduce_sum = IdentityAllReduce) {
  const std::vector<at::Tensor> out = MaskedWhiten({values}, {mask}, all_reduce_sum);
  REQUIRE(out.size() == 1);
  return out[0];
}

TEST_CASE(
    "whitening uses the masked mean and Bessel-corrected variance; masked tokens do not "
    "count",
    "[advantages]") {
  // Mask-1 values [1, 2, 3]: mean 2, unbiased var (1 + 0 + 1) / 2 = 1. The 100 (mask 0) is
  // whitened too but does not enter the statistics.
  const double k = 1 / std::sqrt(1 + 1e-8);
  const at::Tensor out = WhitenOne(Mat({1, 2, 3, 100}, 1), Mat({1, 1, 1, 0}, 1));
  CheckClose(out, Mat({-k, 0, k, 98 * k}, 1));
  // One token: no Bessel correction, var 0 -> (v - mean) * rsqrt(1e-8) = 0.
  CheckClose(WhitenOne(Mat({7, 5}, 1), Mat({1, 0}, 1)), Mat({0, -2 / std::sqrt(1e-8)}, 1), 1e-6);
  // No token anywhere: an error, not NaN; likewise with no parts at all.
  CHECK_THROWS_AS(WhitenOne(Mat({7, 5}, 1), Mat({0, 0}, 1)), Error);
  CHECK_THROWS_AS(MaskedWhiten({}, {}, IdentityAllReduce), Error);
}

TEST_CASE(
    "whitening over two ranks through the injected all-reduce equals whitening the "
    "concatenation",
    "[advantages]") {
  const at::Tensor values = Mat({1, 4, 2, 8, -3, 5, 0.5, 9}, 2);
  const at::Tensor mask = Mat({1, 1, 0, 1, 1, 1, 1, 0}, 2);
  const at::Tensor single = WhitenOne(values, mask);
  // Rank r holds row r. Pass 1 records each rank's local statistics; pass 2 sums them.
  std::vector<at::Tensor> local_stats(2);
  for (int rank = 0; rank < 2; ++rank) {
    WhitenOne(values[rank], mask[rank], [&](const at::Tensor& s) {
      local_stats[rank] = s.clone();
      return s;
    });
  }
  for (int rank = 0; rank < 2; ++rank) {
    const at::Tensor out = WhitenOne(
        values[rank], mask[rank], [&](const at::Tensor& s) { return s + local_stats[1 - rank]; });
    CheckClose(out, single[rank]);
  }
}

TEST_CASE(
    "a rank without micro-batches still all-reduces once, and its zero statistics change "
    "nothing",
    "[advantages]") {
  const at::Tensor values = Mat({1, 4, 2, 8}, 1);
  const at::Tensor mask = Mat({1, 1, 0, 1}, 1);
  at::Tensor mine;
  int calls = 0;
  const std::vector<at::Tensor> none = MaskedWhiten({}, {}, [&](const at::Tensor& s) {
    ++calls;
    CHECK(s.sizes() == at::IntArrayRef{3});
    CHECK(s.scalar_type() == at::kDouble);
    CHECK(s.abs().sum().item<double>() == 0);
    return s + MaskedMoments(values, mask);  // the other rank's statistics
  });
  CHECK(calls == 1);
  CHECK(none.empty());
  // The other rank: its own statistics plus the empty rank's zeros.
  CheckClose(
      WhitenOne(values, mask, [&](const at::Tensor& s) { return s + at::zeros({3}, at::kDouble); }),
      WhitenOne(values, mask));
}

TEST_CASE("normalize_advantages whitens the advantages and leaves the returns", "[advantages]") {
  AdvantageOptions o;
  o.estimator = AdvantageEstimator::kGrpo;
  o.normalize_advantages = true;
  // Tokens with mask 1: 1, 1, 3 -> mean 5/3, unbiased var ((4/9)*2 + 16/9) / 2 = 4/3.
  const at::Tensor mask = Mat({1, 1, 1, 0}, 2);
  const std::vector<AdvantagesAndReturns> out =
      ComputeAdvantagesAndReturns({{Vec({1, 3}), mask, {}}}, o);
  REQUIRE(out.size() == 1);
  const double k = 1 / std::sqrt(4.0 / 3.0 + 1e-8);
  CheckClose(out[0].advantages, Mat({-2. / 3 * k, -2. / 3 * k, 4. / 3 * k, 4. / 3 * k}, 2));
  CheckClose(out[0].returns, Mat({1, 1, 3, 3}, 2));
}

// The rollout of one rank: 4 samples with responses of 3, 1, 2 and 3 tokens (mask 0 on the
// padding to 3 and on the second token of sample 3), and their post-processed rewards.
struct Rollout {
  at::Tensor rewards = Vec({1.5, -0.5, 0.5, -1.25});
  at::Tensor loss_mask = Mat({1, 1, 1, /**/ 1, 0, 0, /**/ 1, 1, 0, /**/ 1, 0, 1}, 4);
  // Micro-batch i holds sample i alone, padded to its own response length.
  std::vector<AdvantageInputs> OnePerMicroBatch() const {
    const int64_t widths[] = {3, 1, 2, 3};
    std::vector<AdvantageInputs> out;
    for (int64_t i = 0; i < 4; ++i) {
      out.push_back({rewards.narrow(0, i, 1), loss_mask.narrow(0, i, 1).narrow(1, 0, widths[i]),
                     at::Tensor()});
    }
    return out;
  }
};

TEST_CASE(
    "whitening does not depend on the micro-batch split: micro-batches of one sample give "
    "the advantages of one micro-batch of all",
    "[advantages]") {
  AdvantageOptions o;
  o.estimator = AdvantageEstimator::kGrpo;
  o.normalize_advantages = true;
  const Rollout rollout;
  const std::vector<AdvantagesAndReturns> whole =
      ComputeAdvantagesAndReturns({{rollout.rewards, rollout.loss_mask, {}}}, o);
  REQUIRE(whole.size() == 1);
  // Mask-1 tokens: 1.5 x3, -0.5, 0.5 x2, -1.25 x2: sum 2.5, sum of squares 10.625, count 8;
  // mean 0.3125, unbiased var (10.625 - 8 * 0.3125^2) / 7.
  const double mean = 2.5 / 8;
  const double k = 1 / std::sqrt((10.625 - 8 * mean * mean) / 7 + 1e-8);
  const at::Tensor expected = (at::ones({4, 3}, kF64) * rollout.rewards.unsqueeze(1) - mean) * k;
  CheckClose(whole[0].advantages, expected);
  CHECK(whole[0].advantages.abs().min().item<double>() > 0.1);  // nonzero: |0.5 - mean| * k

  int calls = 0;
  const std::vector<AdvantagesAndReturns> split =
      ComputeAdvantagesAndReturns(rollout.OnePerMicroBatch(), o, [&](const at::Tensor& s) {
        ++calls;
        return s;
      });
  CHECK(calls == 1);  // one all-reduce for the rollout, not one per micro-batch
  REQUIRE(split.size() == 4);
  for (int64_t i = 0; i < 4; ++i) {
    INFO("micro-batch " << i);
    const at::Tensor advantages = split[i].advantages;
    CheckClose(advantages, whole[0].advantages.narrow(0, i, 1).narrow(1, 0, advantages.size(1)));
  }
}

TEST_CASE("without whitening, splitting into micro-batches leaves GRPO advantages unchanged",
          "[advantages]") {
  AdvantageOptions o;
  o.estimator = AdvantageEstimator::kGrpo;
  const Rollout rollout;
  int calls = 0;
  const AllReduceSum counting = [&](const at::Tensor& s) {
    ++calls;
    return s;
  };
  const std::vector<AdvantagesAndReturns> split =
      ComputeAdvantagesAndReturns(rollout.OnePerMicroBatch(), o, counting);
  CHECK(calls == 0);  // no collective without --normalize-advantages
  REQUIRE(split.size() == 4);
  for (int64_t i = 0; i < 4; ++i) {
    INFO("micro-batch " << i);
    const AdvantageInputs mb = rollout.OnePerMicroBatch()[i];
    // The post-processed reward at every token, bit for bit, as each micro-batch gave alone.
    CHECK(at::equal(split[i].advantages, at::ones_like(mb.loss_mask) * mb.rewards.unsqueeze(1)));
    CHECK(at::equal(split[i].returns,
                    RawAdvantagesAndReturns(mb.rewards, mb.loss_mask, mb.kl, o).returns));
  }
}

// ppo and unknown names are refused by the config stage: trainer/config/*_test.cc.
TEST_CASE("options come from the config; ppo never reaches the advantages", "[advantages]") {
  config::Config c;
  c.rl.advantage_estimator = AdvantageEstimator::kReinforcePlusPlus;
  c.rl.kl_coef = 0.25;
  c.rl.normalize_advantages = true;
  c.rl.grpo_std_normalization = false;
  const AdvantageOptions a = AdvantageOptionsFrom(c);
  CHECK(a.estimator == AdvantageEstimator::kReinforcePlusPlus);
  CHECK(a.kl_coef == 0.25);
  CHECK(a.normalize_advantages);
  const RewardOptions r = RewardOptionsFrom(c);
  CHECK_FALSE(r.grpo_std_normalization);
  CHECK(r.rewards_normalization);
  AdvantageOptions ppo;
  ppo.estimator = AdvantageEstimator::kPpo;
  CHECK_THROWS_AS(RawAdvantagesAndReturns(Vec({1}), Mat({1}, 1), {}, ppo), Error);
}

}  // namespace
}  // namespace rl::rl_algo
