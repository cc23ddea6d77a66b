// The policy loss of one micro-batch, exactly as miles computes it: KL estimators, PPO-clip with
// optional dual clip, truncated importance sampling, entropy bonus, KL loss, per-sample or
// per-token aggregation, the scaling that makes the optimizer step minimise the reference's
// objective, and the logged metrics.
//
// Shapes: every per-token tensor is response-aligned (Note [Rollout sample layout] in
// trainer/rl/rollout_data.h) and padded to [B, T] for the B samples of the micro-batch, with
// loss_mask 0 on the padding. Values at mask-0 positions never reach the loss, its gradient or a
// metric, even when they are NaN or infinite (they are selected away, not multiplied by 0).
//
// Note [Loss scaling]
// The trainer calls PolicyLoss once per micro-batch, calls backward() on `loss`, lets gradients
// accumulate (sum) over the micro-batches of an optimizer step, and the optimizer averages them
// over the DP ranks (reduce-scatter, mean). With that, `loss` is scaled so that the step
// minimises, as in the reference (Megatron's loss scaling and DDP averaging combined):
//   per-sample (default): (1 / global_batch_size) * sum over the step's samples of
//                         sum_t(x_t * m_t) / max(sum_t m_t, 1)
//   per-token:            (1 / global_num_tokens) * sum over the step's tokens of x_t * m_t
// i.e. `loss` = dp_size / global_batch_size (or dp_size / global_num_tokens) times the
// micro-batch's sum. LossScale carries those three numbers.
//
// Note [Loss metrics]
// PolicyLoss returns the micro-batch's metrics as one detached fp64 tensor of sums
// ([kNumLossMetrics], on the input's device, no host sync): each metric aggregated like the loss
// but unscaled (per-sample: the sum over samples of each sample's masked mean; per-token: the sum
// over tokens), plus the count it is to be divided by (samples or tokens) and presence flags. The
// trainer adds these tensors over micro-batches, all-reduces the sum over DP once per step, and
// SummarizeLossMetrics divides by the count, which gives the reference's aggregate_train_losses.
//
// Failures: inconsistent shapes, or an option whose input is missing (TIS without rollout
// log-probs, the KL loss without reference log-probs), throw rl::Error; unknown option values
// throw rl::ConfigError naming the flag.
//
// Thread safety: stateless pure functions.
#ifndef RL_TRAINER_RL_LOSSES_H_
#define RL_TRAINER_RL_LOSSES_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/config/options.h"
#include "trainer/rl/choices.h"

namespace rl::rl_algo {

// ---- KL estimators ----

// Per-token KL estimate of --kl-loss-type (KlType, trainer/rl/choices.h); same shape as the
// inputs, dtype at least fp32. Differentiable in both.
at::Tensor ApproxKl(const at::Tensor& log_probs, const at::Tensor& ref_log_probs, KlType type);

// ---- The PPO-clip formula and its parts ----

struct ClippedPolicyLoss {
  at::Tensor pg_loss;   // per token
  at::Tensor clipfrac;  // per token: 1 where the clipped term won (pg2 > pg1), else 0
};

// The reference's compute_policy_loss. ratio = exp(clamp(nan_to_num(-ppo_kl), -20, 20));
// pg1 = -A * ratio; pg2 = -A * clamp(ratio, 1 - eps_clip, 1 + eps_clip_high); pg = max(pg1, pg2);
// with eps_clip_c (> 1), where A < 0: pg = min(pg, -eps_clip_c * A). No masking here.
ClippedPolicyLoss ComputePolicyLoss(const at::Tensor& ppo_kl, const at::Tensor& advantages,
                                    double eps_clip, double eps_clip_high,
                                    std::optional<double> eps_clip_c);

// How per-token values become one number per micro-batch.
enum class LossAggregation {
  kSampleMean,  // sum over samples of sum_t(x * m) / max(sum_t m, 1)   (default)
  kTokenSum,    // sum over tokens of x * m                            (--calculate-per-token-loss)
};

// `x` and `loss_mask` [B, T]; returns a 0-dim tensor. Differentiable in x.
at::Tensor Aggregate(const at::Tensor& x, const at::Tensor& loss_mask, LossAggregation how);

// GSPO's per-sequence ppo_kl: sum_t((old - logp) * m) / max(sum_t m, 1), broadcast to [B, T].
at::Tensor SequencePpoKl(const at::Tensor& log_probs, const at::Tensor& old_log_probs,
                         const at::Tensor& loss_mask);

// ---- One micro-batch ----

// Which ratio PPO clips: per token (GRPO, REINFORCE++) or per sequence (GSPO).
enum class PolicyRatio { kToken, kSequence };

struct LossOptions {
  double eps_clip = 0.2;
  double eps_clip_high = 0.2;
  std::optional<double> eps_clip_c;  // dual clip for A < 0; > 1 when set
  PolicyRatio policy_ratio = PolicyRatio::kToken;
  bool use_rollout_logprobs = false;  // old policy = the engine's log-probs
  bool use_tis = false;               // pg *= clamp(exp(old - rollout), tis_clip_low, tis_clip)
  double tis_clip = 2.0;
  double tis_clip_low = 0.0;
  double entropy_coef = 0.0;  // loss -= entropy_coef * aggregate(entropy)
  bool use_kl_loss = false;   // loss += kl_loss_coef * aggregate(ApproxKl(logp, ref))
  double kl_loss_coef = 0.0;
  KlType kl_loss_type = KlType::kK1;
  LossAggregation aggregation = LossAggregation::kSampleMean;
};

// From the resolved config (trainer/config/validate.h).
LossOptions LossOptionsFrom(const config::Config& config);

// See Note [Loss scaling]. Fixed for one optimizer step.
struct LossScale {
  int64_t global_batch_size = 1;  // samples in the step, all DP ranks (per-sample aggregation)
  int64_t global_num_tokens = 1;  // loss-mask-1 tokens in the step, all DP ranks (per-token)
  int64_t dp_size = 1;            // ranks the optimizer averages gradients over
};

// Inputs of one micro-batch; all [B, T] and alike in shape. Optional ones may be undefined.
struct PolicyLossInputs {
  at::Tensor log_probs;          // current policy, with autograd
  at::Tensor old_log_probs;      // trainer's log-probs before this step's updates; optional only
                                 // with use_rollout_logprobs and no TIS
  at::Tensor ref_log_probs;      // reference policy; needed by use_kl_loss
  at::Tensor rollout_log_probs;  // the engine's; needed by use_rollout_logprobs and use_tis
  at::Tensor advantages;
  at::Tensor loss_mask;  // 0 or 1 (any dtype)
  at::Tensor entropy;    // per-token entropy; needed when entropy_coef != 0, and then
                         // with autograd for the bonus to have a gradient
};

// Slots of PolicyLossOutput::metric_sums; see Note [Loss metrics].
enum LossMetricSlot : int64_t {
  kMetricCount = 0,  // samples (per-sample aggregation) or mask-1 tokens (per-token)
  kMetricLoss,
  kMetricPgLoss,
  kMetricEntropyLoss,
  kMetricPgClipfrac,
  kMetricPpoKl,
  kMetricKlLoss,
  kMetricTrainRolloutLogprobAbsDiff,
  kMetricTis,
  kMetricTisClipfrac,
  kMetricTisAbs,
  kMetricHasEntropy,  // presence flags: 1 per micro-batch that had the metric
  kMetricHasKlLoss,
  kMetricHasRolloutLogProbs,
  kMetricHasTis,
  kNumLossMetrics,
};

struct PolicyLossOutput {
  at::Tensor loss;         // 0-dim; call backward() on it (Note [Loss scaling])
  at::Tensor metric_sums;  // [kNumLossMetrics] fp64, detached (Note [Loss metrics])
};

// The reference's policy_loss_function for one micro-batch:
//   old      = use_rollout_logprobs ? rollout_log_probs : old_log_probs
//   ppo_kl   = old - log_probs (per token), or SequencePpoKl for PolicyRatio::kSequence;
//              ppo_kl and advantages are 0 where loss_mask is 0 and wherever they are NaN/inf
//   pg       = ComputePolicyLoss(ppo_kl, advantages, ...), times the TIS weights with use_tis
//              (exp(old_log_probs - rollout_log_probs), clamped; no gradient)
//   loss     = agg(pg) - entropy_coef * agg(entropy) + kl_loss_coef * agg(ApproxKl(logp, ref))
// and `loss` is scaled by LossScale (Note [Loss scaling]). Metrics: loss, pg_loss, entropy_loss,
// pg_clipfrac, ppo_kl, kl_loss (with use_kl_loss), train_rollout_logprob_abs_diff
// (|old_log_probs - rollout_log_probs|, when both are given), tis / tis_clipfrac / tis_abs (with
// use_tis).
PolicyLossOutput PolicyLoss(const PolicyLossInputs& inputs, const LossOptions& options,
                            const LossScale& scale);

// The step's metrics, from metric_sums added over micro-batches and all-reduced over DP: each
// sum divided by the count. Absent metrics are nullopt.
struct LossMetrics {
  double loss = 0.0;
  double pg_loss = 0.0;
  double pg_clipfrac = 0.0;
  double ppo_kl = 0.0;
  std::optional<double> entropy_loss;
  std::optional<double> kl_loss;
  std::optional<double> train_rollout_logprob_abs_diff;
  std::optional<double> tis;
  std::optional<double> tis_clipfrac;
  std::optional<double> tis_abs;
};
LossMetrics SummarizeLossMetrics(const at::Tensor& metric_sums);

// Note [Log-prob mismatch]
// The rollout engine and the training forward compute the same policy with different kernels and
// batch shapes, so the engine's log-probs (`rollout`) and the trainer's recomputation before the
// first step (`old`) differ a little. Over the response tokens with mask != 0, MismatchSums gives
// the [4] fp64 partial sums {sum |old - rollout|, sum exp(old - rollout), token count,
// max |old - rollout|} of one micro-batch (on the inputs' device); AddMismatchSums combines two
// (sums add, the max is a max), and SummarizeMismatch turns the total into the metrics:
// the mean absolute difference, its maximum and the mean importance ratio exp(old - rollout).
at::Tensor MismatchSums(const at::Tensor& old, const at::Tensor& rollout,
                        const at::Tensor& loss_mask);
at::Tensor AddMismatchSums(const at::Tensor& a, const at::Tensor& b);
struct LogProbMismatch {
  double abs_diff_mean = 0.0;  // train_rollout_logprob_abs_diff
  double abs_diff_max = 0.0;   // train_rollout_logprob_abs_diff_max
  double ratio_mean = 1.0;     // train_rollout_ratio_mean: mean of exp(old - rollout)
  int64_t tokens = 0;
};
LogProbMismatch SummarizeMismatch(const at::Tensor& sums);

// The present metrics as (reference name, value) pairs, in the order above, for the metrics file.
std::vector<std::pair<std::string, double>> NamedMetrics(const LossMetrics& metrics);

}  // namespace rl::rl_algo

#endif  // RL_TRAINER_RL_LOSSES_H_
