#include "trainer/rl/advantages.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "launch/check.h"

namespace rl::rl_algo {
namespace {

std::string Shape(const at::Tensor& t) {
  return t.defined() ? fmt::format("[{}]", fmt::join(t.sizes(), ", ")) : "undefined";
}

bool CentresRewards(AdvantageEstimator e) {
  return e == AdvantageEstimator::kGrpo || e == AdvantageEstimator::kGspo ||
         e == AdvantageEstimator::kReinforcePlusPlusBaseline;
}

bool DividesByStd(AdvantageEstimator e) {
  return e == AdvantageEstimator::kGrpo || e == AdvantageEstimator::kGspo;
}

// The dtype results are computed in: the inputs' promoted type, at least fp32.
at::ScalarType ComputeType(at::ScalarType a, at::ScalarType b) {
  at::ScalarType t = at::promoteTypes(a, b);
  if (!at::isFloatingType(t) || t == at::kHalf || t == at::kBFloat16) {
    t = at::promoteTypes(t, at::kFloat);
  }
  return t;
}

// Normalises one [num_groups, group_size] block of equal-sized groups.
at::Tensor NormaliseGroups(const at::Tensor& groups, const RewardOptions& options) {
  at::Tensor out = groups - groups.mean(/*dim=*/{1}, /*keepdim=*/true);
  if (DividesByStd(options.estimator) && options.grpo_std_normalization && groups.size(1) > 1) {
    out = out / (out.std(/*dim=*/{1}, /*unbiased=*/true, /*keepdim=*/true) + kGroupStdEpsilon);
  }
  return out;
}

}  // namespace

RewardOptions RewardOptionsFrom(const config::Config& config) {
  RewardOptions options;
  options.estimator = config.rl.advantage_estimator;
  options.rewards_normalization = config.rl.rewards_normalization;
  options.grpo_std_normalization = config.rl.grpo_std_normalization;
  return options;
}

AdvantageOptions AdvantageOptionsFrom(const config::Config& config) {
  AdvantageOptions options;
  options.estimator = config.rl.advantage_estimator;
  options.kl_coef = config.rl.kl_coef;
  options.normalize_advantages = config.rl.normalize_advantages;
  return options;
}

at::Tensor PostProcessRewards(const at::Tensor& raw_rewards,
                              const std::vector<int64_t>& group_sizes,
                              const RewardOptions& options) {
  RL_CHECK(raw_rewards.dim() == 1, Error, "rewards must be [num_samples]; got {} dimensions",
           raw_rewards.dim());
  const int64_t num_samples = raw_rewards.size(0);
  const int64_t total = std::accumulate(group_sizes.begin(), group_sizes.end(), int64_t{0});
  RL_CHECK(total == num_samples, Error,
           "the GRPO groups hold {} samples in all, but there are {} rewards", total, num_samples);
  for (const int64_t size : group_sizes) {
    RL_CHECK(size >= 1, Error, "a GRPO group has {} samples; every group needs at least one", size);
  }
  const at::Tensor rewards =
      raw_rewards.to(ComputeType(raw_rewards.scalar_type(), raw_rewards.scalar_type()));
  if (!CentresRewards(options.estimator) || !options.rewards_normalization) {
    return rewards.clone();
  }
  if (num_samples == 0) return rewards.clone();

  const bool equal_sizes = std::all_of(group_sizes.begin(), group_sizes.end(),
                                       [&](int64_t s) { return s == group_sizes.front(); });
  if (equal_sizes) {  // the reference's reshape(-1, n_samples_per_prompt)
    return NormaliseGroups(rewards.reshape({-1, group_sizes.front()}), options).reshape({-1});
  }
  std::vector<at::Tensor> parts;
  parts.reserve(group_sizes.size());
  for (const at::Tensor& group : rewards.split_with_sizes(group_sizes)) {
    parts.push_back(NormaliseGroups(group.unsqueeze(0), options).squeeze(0));
  }
  return at::cat(parts);
}

at::Tensor IdentityAllReduce(const at::Tensor& t) { return t; }

at::Tensor MaskedMoments(const at::Tensor& values, const at::Tensor& mask) {
  RL_CHECK(values.sizes() == mask.sizes(), Error,
           "MaskedMoments: values {} and mask {} differ in shape", Shape(values), Shape(mask));
  const at::Tensor active = mask.to(at::kBool);
  const at::Tensor v = at::where(active, values.to(at::kDouble), 0.0);
  return at::stack({v.sum(), (v * v).sum(), active.sum().to(at::kDouble)});
}

std::vector<at::Tensor> MaskedWhiten(const std::vector<at::Tensor>& values,
                                     const std::vector<at::Tensor>& masks,
                                     const AllReduceSum& all_reduce_sum) {
  RL_CHECK(values.size() == masks.size(), Error, "MaskedWhiten: {} parts of values but {} masks",
           values.size(), masks.size());
  at::Tensor moments;
  for (size_t i = 0; i < values.size(); ++i) {
    const at::Tensor part = MaskedMoments(values[i], masks[i]);
    moments = moments.defined() ? moments + part : part;
  }
  // A rank without parts still takes part in the all-reduce.
  if (!moments.defined()) moments = at::zeros({3}, at::kDouble);
  const at::Tensor stats = all_reduce_sum(moments).to(at::kCPU, at::kDouble);
  const double sum = stats[0].item<double>();
  const double sum_sq = stats[1].item<double>();
  const double count = stats[2].item<double>();
  RL_CHECK(count > 0, Error,
           "--normalize-advantages: no rank has a token with loss_mask 1, so the advantages have "
           "no mean to whiten with");
  const double mean = sum / count;
  double var = sum_sq / count - mean * mean;
  if (count >= 2) var *= count / (count - 1);  // Bessel's correction
  // Rounding can push a zero variance slightly negative; the reference would return NaN there.
  var = std::max(var, 0.0);
  const double scale = 1.0 / std::sqrt(var + kWhitenEpsilon);
  std::vector<at::Tensor> out;
  out.reserve(values.size());
  for (const at::Tensor& v : values) out.push_back((v - mean) * scale);
  return out;
}

AdvantagesAndReturns RawAdvantagesAndReturns(const at::Tensor& rewards, const at::Tensor& loss_mask,
                                             const at::Tensor& kl,
                                             const AdvantageOptions& options) {
  const at::NoGradGuard no_grad;
  RL_CHECK(rewards.dim() == 1 && loss_mask.dim() == 2 && rewards.size(0) == loss_mask.size(0),
           Error,
           "advantages: rewards must be [num_samples] and loss_mask [num_samples, T]; got "
           "{} and {}",
           Shape(rewards), Shape(loss_mask));
  RL_CHECK(!kl.defined() || kl.sizes() == loss_mask.sizes(), Error,
           "advantages: kl {} and loss_mask {} differ in shape", Shape(kl), Shape(loss_mask));
  RL_CHECK(kl.defined() || options.kl_coef == 0.0, Error,
           "advantages: --kl-coef is {}, but no per-token KL was given", options.kl_coef);

  const at::ScalarType dtype =
      ComputeType(rewards.scalar_type(), kl.defined() ? kl.scalar_type() : rewards.scalar_type());
  const at::TensorOptions tensor_options = loss_mask.options().dtype(dtype);
  const at::Tensor mask = loss_mask.to(tensor_options);
  const at::Tensor reward = rewards.to(tensor_options).unsqueeze(1);  // [B, 1]
  const at::Tensor token_kl = kl.defined() ? kl.to(tensor_options) : at::zeros_like(mask);

  AdvantagesAndReturns out;
  switch (options.estimator) {
    case AdvantageEstimator::kGrpo:
    case AdvantageEstimator::kGspo:
      out.returns = at::ones_like(mask) * reward;
      out.advantages = out.returns;
      break;
    case AdvantageEstimator::kReinforcePlusPlusBaseline:
      out.advantages = at::ones_like(mask) * reward - options.kl_coef * token_kl;
      out.returns = out.advantages;
      break;
    case AdvantageEstimator::kReinforcePlusPlus: {
      const int64_t length = mask.size(1);
      // Token rewards; masked KL as in the reference (-kl_coef * kl * mask).
      at::Tensor token_rewards = -options.kl_coef * (token_kl * mask);
      if (length > 0) {
        // The terminal reward goes to each sample's last mask-1 token.
        const at::Tensor positions = at::arange(length, loss_mask.options().dtype(at::kLong));
        const at::Tensor active = loss_mask.to(at::kBool);
        const at::Tensor last = at::where(active, positions, -1).amax(/*dim=*/{1});  // [B]
        const at::Tensor has_token = last.ge(0);
        token_rewards = token_rewards.scatter_add(1, last.clamp_min(0).unsqueeze(1),
                                                  reward * has_token.unsqueeze(1).to(dtype));
      }
      if (options.gamma == 1.0) {
        out.returns = token_rewards.flip({1}).cumsum(1).flip({1});
      } else {
        out.returns = at::empty_like(token_rewards);
        at::Tensor running = at::zeros({mask.size(0)}, tensor_options);
        for (int64_t t = length - 1; t >= 0; --t) {
          running = token_rewards.select(1, t) + options.gamma * running;
          out.returns.select(1, t).copy_(running);
        }
      }
      out.advantages = out.returns;
      break;
    }
    case AdvantageEstimator::kPpo:
      throw Error("advantages: ppo needs a critic; validation should have refused it");
  }
  return out;
}

std::vector<AdvantagesAndReturns> ComputeAdvantagesAndReturns(
    const std::vector<AdvantageInputs>& micro_batches, const AdvantageOptions& options,
    const AllReduceSum& all_reduce_sum) {
  const at::NoGradGuard no_grad;
  std::vector<AdvantagesAndReturns> out;
  out.reserve(micro_batches.size());
  for (const AdvantageInputs& mb : micro_batches) {
    out.push_back(RawAdvantagesAndReturns(mb.rewards, mb.loss_mask, mb.kl, options));
  }
  if (options.normalize_advantages) {
    std::vector<at::Tensor> advantages, masks;
    for (size_t i = 0; i < out.size(); ++i) {
      advantages.push_back(out[i].advantages);
      masks.push_back(micro_batches[i].loss_mask);
    }
    const std::vector<at::Tensor> whitened = MaskedWhiten(advantages, masks, all_reduce_sum);
    for (size_t i = 0; i < out.size(); ++i) out[i].advantages = whitened[i];
  }
  return out;
}

}  // namespace rl::rl_algo
