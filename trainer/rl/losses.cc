#include "trainer/rl/losses.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "launch/check.h"
#include "trainer/rl/advantages.h"

namespace rl::rl_algo {
namespace {

std::string Shape(const at::Tensor& t) {
  return t.defined() ? fmt::format("[{}]", fmt::join(t.sizes(), ", ")) : "undefined";
}

// The dtype the loss is computed in: the policy log-probs' dtype, at least fp32.
at::ScalarType ComputeType(at::ScalarType t) {
  if (t == at::kHalf || t == at::kBFloat16 || !at::isFloatingType(t)) return at::kFloat;
  return t;
}

// mask-1 positions of `x`, 0 elsewhere (selected, so NaN/inf at mask-0 positions do not leak).
at::Tensor Masked(const at::Tensor& x, const at::Tensor& active) {
  return at::where(active, x, 0.0);
}

// Reference: torch.nan_to_num(x) maps NaN to 0 and +-inf to the dtype's extremes; the loss then
// forces inactive tokens to 0. Here both are one step, and +-inf become 0 too.
at::Tensor FiniteOrZero(const at::Tensor& x, const at::Tensor& active) {
  return at::where(active & at::isfinite(x), x, 0.0);
}

}  // namespace

at::Tensor ApproxKl(const at::Tensor& log_probs, const at::Tensor& ref_log_probs, KlType type) {
  RL_CHECK(log_probs.sizes() == ref_log_probs.sizes(), Error,
           "ApproxKl: log_probs {} and ref_log_probs {} differ in shape", Shape(log_probs),
           Shape(ref_log_probs));
  const at::ScalarType dtype = ComputeType(at::promoteTypes(
      ComputeType(log_probs.scalar_type()), ComputeType(ref_log_probs.scalar_type())));
  const at::Tensor r = log_probs.to(dtype) - ref_log_probs.to(dtype);
  switch (type) {
    case KlType::kK1:
      return r;
    case KlType::kK2:
      return r * r / 2.0;
    case KlType::kK3: {
      const at::Tensor neg_r = -r;
      return neg_r.exp() - 1.0 - neg_r;
    }
    case KlType::kLowVarKl: {
      const at::Tensor neg_r = (-r).clamp(-20.0, 20.0);
      return (neg_r.exp() - 1.0 - neg_r).clamp(-10.0, 10.0);
    }
  }
  throw Error("ApproxKl: unknown KL type");
}

ClippedPolicyLoss ComputePolicyLoss(const at::Tensor& ppo_kl, const at::Tensor& advantages,
                                    double eps_clip, double eps_clip_high,
                                    std::optional<double> eps_clip_c) {
  RL_CHECK(ppo_kl.sizes() == advantages.sizes(), Error,
           "ComputePolicyLoss: ppo_kl {} and advantages {} differ in shape", Shape(ppo_kl),
           Shape(advantages));
  const at::Tensor ratio = at::nan_to_num(-ppo_kl).clamp(-20.0, 20.0).exp();
  const at::Tensor pg1 = -advantages * ratio;
  const at::Tensor pg2 = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high);
  ClippedPolicyLoss out;
  out.pg_loss = at::maximum(pg1, pg2);
  out.clipfrac = pg2.gt(pg1).to(pg1.scalar_type());
  if (eps_clip_c.has_value()) {
    const at::Tensor pg3 = -*eps_clip_c * advantages;
    out.pg_loss = at::where(advantages.lt(0), at::minimum(pg3, out.pg_loss), out.pg_loss);
  }
  return out;
}

at::Tensor Aggregate(const at::Tensor& x, const at::Tensor& loss_mask, LossAggregation how) {
  RL_CHECK(x.dim() == 2 && x.sizes() == loss_mask.sizes(), Error,
           "Aggregate: x {} and loss_mask {} must both be [B, T]", Shape(x), Shape(loss_mask));
  const at::Tensor active = loss_mask.ne(0);
  const at::Tensor selected = Masked(x, active);
  if (how == LossAggregation::kTokenSum) return selected.sum();
  const at::Tensor counts = active.sum(/*dim=*/{1}).to(x.scalar_type()).clamp_min(1.0);
  return (selected.sum(/*dim=*/{1}) / counts).sum();
}

at::Tensor SequencePpoKl(const at::Tensor& log_probs, const at::Tensor& old_log_probs,
                         const at::Tensor& loss_mask) {
  RL_CHECK(log_probs.dim() == 2 && log_probs.sizes() == old_log_probs.sizes() &&
               log_probs.sizes() == loss_mask.sizes(),
           Error, "SequencePpoKl: log_probs {}, old_log_probs {}, loss_mask {} must be [B, T]",
           Shape(log_probs), Shape(old_log_probs), Shape(loss_mask));
  const at::Tensor active = loss_mask.ne(0);
  const at::Tensor counts =
      active.sum(/*dim=*/{1}, /*keepdim=*/true).to(log_probs.scalar_type()).clamp_min(1.0);
  const at::Tensor per_sequence =
      Masked(old_log_probs - log_probs, active).sum(/*dim=*/{1}, /*keepdim=*/true) / counts;
  return per_sequence.expand_as(log_probs);
}

LossOptions LossOptionsFrom(const config::Config& config) {
  const config::RlOptions& rl = config.rl;
  LossOptions options;
  options.eps_clip = rl.eps_clip;
  options.eps_clip_high = rl.eps_clip_high.value_or(rl.eps_clip);
  options.eps_clip_c = rl.eps_clip_c;
  options.policy_ratio = rl.advantage_estimator == AdvantageEstimator::kGspo
                             ? PolicyRatio::kSequence
                             : PolicyRatio::kToken;
  options.use_rollout_logprobs = rl.use_rollout_logprobs;
  options.use_tis = rl.use_tis;
  options.tis_clip = rl.tis_clip;
  options.tis_clip_low = rl.tis_clip_low;
  options.entropy_coef = rl.entropy_coef;
  options.use_kl_loss = rl.use_kl_loss;
  options.kl_loss_coef = rl.kl_loss_coef;
  options.kl_loss_type = rl.kl_loss_type;
  options.aggregation =
      rl.calculate_per_token_loss ? LossAggregation::kTokenSum : LossAggregation::kSampleMean;
  return options;
}

PolicyLossOutput PolicyLoss(const PolicyLossInputs& in, const LossOptions& options,
                            const LossScale& scale) {
  RL_CHECK(in.log_probs.defined() && in.log_probs.dim() == 2, Error,
           "PolicyLoss: log_probs must be [B, T]; got {}", Shape(in.log_probs));
  const auto check_shape = [&](const at::Tensor& t, const char* name, bool required) {
    RL_CHECK(t.defined() || !required, Error, "PolicyLoss: {} is required by the options", name);
    RL_CHECK(!t.defined() || t.sizes() == in.log_probs.sizes(), Error,
             "PolicyLoss: {} is {}, but log_probs is {}", name, Shape(t), Shape(in.log_probs));
  };
  check_shape(in.advantages, "advantages", true);
  check_shape(in.loss_mask, "loss_mask", true);
  check_shape(in.old_log_probs, "old_log_probs (the trainer's, for TIS or as the old policy)",
              options.use_tis || !options.use_rollout_logprobs);
  check_shape(in.rollout_log_probs, "rollout_log_probs (--use-rollout-logprobs / --use-tis)",
              options.use_tis || options.use_rollout_logprobs);
  check_shape(in.ref_log_probs, "ref_log_probs (--use-kl-loss)", options.use_kl_loss);
  check_shape(in.entropy, "entropy (--entropy-coef)", options.entropy_coef != 0.0);
  RL_CHECK(scale.global_batch_size >= 1 && scale.dp_size >= 1, Error,
           "PolicyLoss: global_batch_size ({}) and dp_size ({}) must be at least 1",
           scale.global_batch_size, scale.dp_size);

  const at::ScalarType dtype = ComputeType(in.log_probs.scalar_type());
  const at::Tensor& mask = in.loss_mask;
  const at::Tensor active = mask.ne(0);
  const LossAggregation how = options.aggregation;
  // Every per-token input is set to 0 at mask-0 positions before any arithmetic, so that padding
  // garbage (NaN, inf) cannot reach a value or, through 0 * NaN in the backward pass, a gradient.
  // Everything but the policy's log-probs and entropy is a constant of this step.
  const auto token_input = [&](const at::Tensor& t, bool differentiable) {
    if (!t.defined()) return at::Tensor();
    return at::where(active, (differentiable ? t : t.detach()).to(dtype), 0.0);
  };
  const at::Tensor log_probs = token_input(in.log_probs, true);
  const at::Tensor trainer_old = token_input(in.old_log_probs, false);
  const at::Tensor rollout = token_input(in.rollout_log_probs, false);
  const at::Tensor old = options.use_rollout_logprobs ? rollout : trainer_old;
  const at::Tensor entropy = token_input(in.entropy, true);
  const at::Tensor ref = token_input(in.ref_log_probs, false);

  const at::Tensor ppo_kl_raw = options.policy_ratio == PolicyRatio::kSequence
                                    ? SequencePpoKl(log_probs, old, mask)
                                    : old - log_probs;
  const at::Tensor ppo_kl = FiniteOrZero(ppo_kl_raw, active);
  const at::Tensor advantages = FiniteOrZero(token_input(in.advantages, false), active);

  ClippedPolicyLoss clipped = ComputePolicyLoss(ppo_kl, advantages, options.eps_clip,
                                                options.eps_clip_high, options.eps_clip_c);
  at::Tensor tis, tis_weights;
  if (options.use_tis) {
    tis = (trainer_old - rollout).exp();
    tis_weights = tis.clamp(options.tis_clip_low, options.tis_clip);
    clipped.pg_loss = clipped.pg_loss * tis_weights;
  }

  const at::Tensor pg_loss = Aggregate(clipped.pg_loss, mask, how);
  at::Tensor loss = pg_loss;
  at::Tensor entropy_loss;
  if (entropy.defined()) {
    entropy_loss = Aggregate(entropy, mask, how);
    if (options.entropy_coef != 0.0) loss = loss - options.entropy_coef * entropy_loss;
  }
  at::Tensor kl_loss;
  if (options.use_kl_loss) {
    kl_loss = Aggregate(ApproxKl(log_probs, ref, options.kl_loss_type), mask, how);
    loss = loss + options.kl_loss_coef * kl_loss;
  }

  PolicyLossOutput out;
  const double denominator =
      how == LossAggregation::kSampleMean
          ? static_cast<double>(scale.global_batch_size)
          : static_cast<double>(std::max<int64_t>(scale.global_num_tokens, 1));
  out.loss = loss * (static_cast<double>(scale.dp_size) / denominator);

  // Metrics: detached, unscaled, fp64, on the input's device.
  const at::NoGradGuard no_grad;
  const at::TensorOptions metric_options = log_probs.options().dtype(at::kDouble);
  std::vector<at::Tensor> slots(kNumLossMetrics, at::zeros({}, metric_options));
  const auto set = [&](LossMetricSlot slot, const at::Tensor& value) {
    slots[slot] = value.detach().to(at::kDouble).reshape({});
  };
  const auto flag = [&](LossMetricSlot slot) { slots[slot] = at::ones({}, metric_options); };
  set(kMetricCount, how == LossAggregation::kSampleMean
                        ? at::scalar_tensor(static_cast<double>(log_probs.size(0)), metric_options)
                        : active.sum());
  set(kMetricLoss, loss);
  set(kMetricPgLoss, pg_loss);
  set(kMetricPgClipfrac, Aggregate(clipped.clipfrac, mask, how));
  set(kMetricPpoKl, Aggregate(ppo_kl, mask, how));
  if (entropy_loss.defined()) {
    set(kMetricEntropyLoss, entropy_loss);
    flag(kMetricHasEntropy);
  }
  if (kl_loss.defined()) {
    set(kMetricKlLoss, kl_loss);
    flag(kMetricHasKlLoss);
  }
  if (trainer_old.defined() && rollout.defined()) {
    set(kMetricTrainRolloutLogprobAbsDiff, Aggregate((trainer_old - rollout).abs(), mask, how));
    flag(kMetricHasRolloutLogProbs);
  }
  if (tis.defined()) {
    set(kMetricTis, Aggregate(tis, mask, how));
    set(kMetricTisClipfrac, Aggregate(tis_weights.ne(tis).to(dtype), mask, how));
    set(kMetricTisAbs, Aggregate((tis - 1.0).abs(), mask, how));
    flag(kMetricHasTis);
  }
  out.metric_sums = at::stack(slots);
  return out;
}

LossMetrics SummarizeLossMetrics(const at::Tensor& metric_sums) {
  RL_CHECK(metric_sums.dim() == 1 && metric_sums.size(0) == kNumLossMetrics, Error,
           "SummarizeLossMetrics: expected [{}] metric sums; got {}",
           static_cast<int64_t>(kNumLossMetrics), Shape(metric_sums));
  const at::Tensor sums = metric_sums.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* s = sums.data_ptr<double>();
  const double count = s[kMetricCount];
  const auto mean = [&](LossMetricSlot slot) { return count > 0 ? s[slot] / count : 0.0; };
  const auto optional_mean = [&](LossMetricSlot slot, LossMetricSlot present) {
    return s[present] > 0 ? std::optional<double>(mean(slot)) : std::nullopt;
  };
  LossMetrics m;
  m.loss = mean(kMetricLoss);
  m.pg_loss = mean(kMetricPgLoss);
  m.pg_clipfrac = mean(kMetricPgClipfrac);
  m.ppo_kl = mean(kMetricPpoKl);
  m.entropy_loss = optional_mean(kMetricEntropyLoss, kMetricHasEntropy);
  m.kl_loss = optional_mean(kMetricKlLoss, kMetricHasKlLoss);
  m.train_rollout_logprob_abs_diff =
      optional_mean(kMetricTrainRolloutLogprobAbsDiff, kMetricHasRolloutLogProbs);
  m.tis = optional_mean(kMetricTis, kMetricHasTis);
  m.tis_clipfrac = optional_mean(kMetricTisClipfrac, kMetricHasTis);
  m.tis_abs = optional_mean(kMetricTisAbs, kMetricHasTis);
  return m;
}

at::Tensor MismatchSums(const at::Tensor& old, const at::Tensor& rollout,
                        const at::Tensor& loss_mask) {
  RL_CHECK(old.sizes() == rollout.sizes() && old.sizes() == loss_mask.sizes(), Error,
           "MismatchSums: old {}, rollout {} and loss_mask {} must have one shape", Shape(old),
           Shape(rollout), Shape(loss_mask));
  const at::NoGradGuard no_grad;
  const at::Tensor active = loss_mask.ne(0);
  const at::Tensor diff = at::where(active, old.to(at::kDouble) - rollout.to(at::kDouble), 0.0);
  const at::Tensor abs_diff = diff.abs();
  return at::stack({abs_diff.sum(), at::where(active, diff.exp(), 0.0).sum(),
                    active.sum().to(at::kDouble), abs_diff.max()});
}

at::Tensor AddMismatchSums(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined()) return b;
  return at::cat({a.narrow(0, 0, 3) + b.narrow(0, 0, 3), at::maximum(a[3], b[3]).reshape({1})});
}

LogProbMismatch SummarizeMismatch(const at::Tensor& sums) {
  const at::Tensor host = sums.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* s = host.data_ptr<double>();
  LogProbMismatch m;
  m.tokens = static_cast<int64_t>(s[2]);
  if (m.tokens > 0) {
    m.abs_diff_mean = s[0] / s[2];
    m.ratio_mean = s[1] / s[2];
    m.abs_diff_max = s[3];
  }
  return m;
}

std::vector<std::pair<std::string, double>> NamedMetrics(const LossMetrics& m) {
  std::vector<std::pair<std::string, double>> named = {
      {"loss", m.loss},
      {"pg_loss", m.pg_loss},
      {"pg_clipfrac", m.pg_clipfrac},
      {"ppo_kl", m.ppo_kl},
  };
  const auto add = [&](const char* name, const std::optional<double>& v) {
    if (v.has_value()) named.emplace_back(name, *v);
  };
  add("entropy_loss", m.entropy_loss);
  add("kl_loss", m.kl_loss);
  add("train_rollout_logprob_abs_diff", m.train_rollout_logprob_abs_diff);
  add("tis", m.tis);
  add("tis_clipfrac", m.tis_clipfrac);
  add("tis_abs", m.tis_abs);
  return named;
}

}  // namespace rl::rl_algo
