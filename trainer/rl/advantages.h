// From rewards to per-token advantages: reward post-processing (GRPO group normalisation) and
// the advantage estimators, exactly as miles implements them.
//
// Shapes: per-sample values are [num_samples]; per-token values are response-aligned
// (Note [Rollout sample layout] in trainer/rl/rollout_data.h) and padded to [num_samples,
// max_response_length], with loss_mask 0 on the padding. The estimators fill every position,
// padding included; the padding's values are meaningless and the loss never reads them (it forces
// advantages to 0 where loss_mask is 0).
//
// Dtypes: results are in the promoted dtype of the inputs, at least fp32. The reference computes
// reward normalisation in fp32 (pass fp32 rewards to match it bit for bit; tests use fp64).
//
// Distributed: only whitening (--normalize-advantages) needs the other DP ranks; it takes the
// all-reduce as a function, so one rank and tests pass IdentityAllReduce. Whitening needs the
// statistics of the whole rollout, so ComputeAdvantagesAndReturns takes all of a rank's
// micro-batches at once and all-reduces once per call, however many micro-batches the rank has.
//
// Failures: inconsistent shapes or group sizes, and kPpo (refused by validation), throw rl::Error.
//
// Thread safety: stateless pure functions.
#ifndef RL_TRAINER_RL_ADVANTAGES_H_
#define RL_TRAINER_RL_ADVANTAGES_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "trainer/config/options.h"
#include "trainer/rl/choices.h"

namespace rl::rl_algo {

// Added to the group std before dividing (the reference's constant).
inline constexpr double kGroupStdEpsilon = 1e-6;
// Added to the variance before the reciprocal square root in MaskedWhiten.
inline constexpr double kWhitenEpsilon = 1e-8;

struct RewardOptions {
  AdvantageEstimator estimator = AdvantageEstimator::kGrpo;
  bool rewards_normalization = true;   // subtract the group mean (GRPO, GSPO, REINFORCE++ baseline)
  bool grpo_std_normalization = true;  // then divide by std + 1e-6 (GRPO, GSPO); off = Dr.GRPO
};

struct AdvantageOptions {
  AdvantageEstimator estimator = AdvantageEstimator::kGrpo;
  double kl_coef = 0.0;               // KL penalty folded into REINFORCE++ token rewards
  double gamma = 1.0;                 // REINFORCE++ discount (the reference's default)
  bool normalize_advantages = false;  // whiten over the rollout's trainable tokens, all DP ranks'
};

// From the resolved config (trainer/config/validate.h).
RewardOptions RewardOptionsFrom(const config::Config& config);
AdvantageOptions AdvantageOptionsFrom(const config::Config& config);

// The reference's _post_process_rewards. `raw_rewards` [num_samples]; `group_sizes` are the GRPO
// groups in batch order (trainer/rl/rollout_data.h GroupSizes()), summing to num_samples. For
// GRPO, GSPO and REINFORCE++-baseline with rewards_normalization: each group's mean is
// subtracted; for GRPO and GSPO with grpo_std_normalization, each group of two or more samples is
// then divided by its unbiased std + kGroupStdEpsilon (a singleton group has no std: it is only
// centred, to 0). Otherwise the raw rewards are returned (as a new tensor). Returns [num_samples].
at::Tensor PostProcessRewards(const at::Tensor& raw_rewards,
                              const std::vector<int64_t>& group_sizes,
                              const RewardOptions& options);

// Sums a small tensor (a handful of statistics) over the DP ranks and returns the sum; every
// rank must call it. The identity on one rank.
using AllReduceSum = std::function<at::Tensor(const at::Tensor&)>;
at::Tensor IdentityAllReduce(const at::Tensor& t);

// {sum, sum of squares, count} of `values` at the positions where `mask` is 1: [3], fp64, on the
// device of `values`. Shapes: values and mask alike, any shape. Moments of several parts add up to
// the moments of their concatenation (up to the rounding of the sums).
at::Tensor MaskedMoments(const at::Tensor& values, const at::Tensor& mask);

// The reference's distributed_masked_whiten, over parts: `values` and `masks` are this rank's
// parts (micro-batches) of one whole, pairwise of the same shape, possibly none. With the global
// masked mean and variance of every part of every rank (their MaskedMoments summed here, then
// all-reduced once; Bessel-corrected when the global count of mask-1 tokens is >= 2), returns each
// part as (values - mean) * rsqrt(var + kWhitenEpsilon) at every position. Statistics are
// accumulated in fp64. Throws rl::Error (on every rank alike) when no rank has a mask-1 token.
// Every rank calls all_reduce_sum exactly once, with a [3] fp64 tensor (on the device of the
// first part; on the CPU when the rank has none).
std::vector<at::Tensor> MaskedWhiten(const std::vector<at::Tensor>& values,
                                     const std::vector<at::Tensor>& masks,
                                     const AllReduceSum& all_reduce_sum);

struct AdvantagesAndReturns {
  at::Tensor advantages;  // [num_samples, T]
  at::Tensor returns;     // [num_samples, T]
};

// The reference's compute_advantages_and_returns without the whitening, for one micro-batch:
//   grpo, gspo:                    returns = reward, broadcast to every token;
//                                  advantages = returns (kl_coef is not applied).
//   reinforce_plus_plus:           token rewards -kl_coef * kl * mask, plus the reward at the last
//                                  mask-1 token (none when the sample has no mask-1 token);
//                                  returns G_t = r_t + gamma * G_{t+1}; advantages = returns.
//   reinforce_plus_plus_baseline:  advantages = reward - kl_coef * kl; returns = advantages.
// options.normalize_advantages is not read here. `rewards` [num_samples], post-processed;
// `loss_mask` [num_samples, T] (0 on padding); `kl` [num_samples, T], the per-token KL(policy ||
// reference) from ApproxKl (trainer/rl/losses.h) with --kl-loss-type, or an undefined tensor,
// which means zeros (required when kl_coef != 0). Every sample's values depend on that sample
// alone. The results are not part of any autograd graph.
AdvantagesAndReturns RawAdvantagesAndReturns(const at::Tensor& rewards, const at::Tensor& loss_mask,
                                             const at::Tensor& kl, const AdvantageOptions& options);

// One micro-batch's inputs of RawAdvantagesAndReturns.
struct AdvantageInputs {
  at::Tensor rewards;    // [num_samples], post-processed
  at::Tensor loss_mask;  // [num_samples, T], 0 on padding
  at::Tensor kl;         // [num_samples, T], or undefined (zeros)
};

// The reference's compute_advantages_and_returns for one rank's share of a rollout, given as its
// micro-batches (all of them, every optimizer step's, possibly none): RawAdvantagesAndReturns of
// each; then, with normalize_advantages, the advantages of all of them are whitened together
// (MaskedWhiten over the loss masks), so the statistics are those of every trainable token of the
// rollout, over all DP ranks, whatever the micro-batch split. Every rank must call it, once per
// rollout, with its own micro-batches: with normalize_advantages it calls all_reduce_sum once.
// Returns one result per micro-batch, in order.
std::vector<AdvantagesAndReturns> ComputeAdvantagesAndReturns(
    const std::vector<AdvantageInputs>& micro_batches, const AdvantageOptions& options,
    const AllReduceSum& all_reduce_sum = IdentityAllReduce);

}  // namespace rl::rl_algo

#endif  // RL_TRAINER_RL_ADVANTAGES_H_
