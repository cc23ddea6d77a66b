#include "trainer/rollout/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "launch/check.h"
#include "trainer/kernels/fused_ops.h"

namespace rl::rollout {

void CheckSamplerConfig(const SamplerConfig& config) {
  RL_CHECK(std::isfinite(config.temperature) && config.temperature >= 0, ConfigError,
           "sampling temperature must be >= 0 (0 = greedy); got {}", config.temperature);
  RL_CHECK(config.top_p > 0 && config.top_p <= 1, ConfigError,
           "sampling top_p must be in (0, 1] (1 = off); got {}", config.top_p);
  RL_CHECK(config.top_k == -1 || config.top_k >= 1, ConfigError,
           "sampling top_k must be -1 (off) or >= 1; got {}", config.top_k);
}

bool IsGreedy(const SamplerConfig& config) { return config.greedy || config.temperature == 0; }

double LogProbTemperature(const SamplerConfig& config) {
  return config.temperature > 0 ? config.temperature : 1.0;
}

namespace {

// Whether top-k or top-p leaves out any token of a vocabulary of `vocab`.
bool Truncates(const SamplerConfig& config, int64_t vocab) {
  return (config.top_k != -1 && config.top_k < vocab) || config.top_p < 1;
}

// Inverse-CDF sampling over mass [B, V] (fp64, >= 0, in the order to sample in) with u [B, 1]
// in [0, 1): per row the first position whose cumulative mass exceeds u times the row's total,
// found by binary search (the cumulative mass does not decrease). [B, 1] int64, at most V (callers
// clamp it to their last candidate).
at::Tensor InverseCdf(const at::Tensor& mass, const at::Tensor& u) {
  const at::Tensor cdf = at::cumsum(mass, -1);                          // [B, V]
  const at::Tensor threshold = u * cdf.narrow(1, mass.size(1) - 1, 1);  // [B, 1]
  return at::searchsorted(cdf, threshold, /*out_int32=*/false, /*right=*/true);
}

// `sampled` to hand_on's targets (SampleWithUniforms, where the sampling kernel did not run).
void HandOnAfterOps(const SampledTokens& sampled, const kernels::HandOn& to) {
  if (sampled.tokens.is_cuda()) {
    if (to.host_tokens.defined() || to.host_log_probs.defined() || to.next_tokens.defined() ||
        to.positions.defined()) {
      kernels::HandOnSampled(sampled.tokens, sampled.log_probs, to);
    }
    return;
  }
  RL_CHECK(to.next_tokens.defined() == to.positions.defined(), Error,
           "sampler: the hand-on's next tokens and positions go together");
  if (to.host_tokens.defined()) to.host_tokens.copy_(sampled.tokens);
  if (to.host_log_probs.defined()) to.host_log_probs.copy_(sampled.log_probs);
  if (to.next_tokens.defined()) {
    to.next_tokens.copy_(sampled.tokens);
    to.positions.add_(1);
  }
}

}  // namespace

at::Generator MakeGenerator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

SampledTokens SampleWithUniforms(const at::Tensor& logits, const SamplerConfig& config,
                                 const at::Tensor& uniforms, const kernels::HandOn& hand_on) {
  CheckSamplerConfig(config);
  RL_CHECK(logits.dim() == 2 && at::isFloatingType(logits.scalar_type()) && logits.size(1) > 0,
           Error, "sampler: logits must be floating [batch, vocab]; got {} of shape [{}]",
           c10::toString(logits.scalar_type()), fmt::join(logits.sizes(), ", "));
  const int64_t batch = logits.size(0);
  const int64_t vocab = logits.size(1);
  if (!IsGreedy(config)) {
    RL_CHECK(uniforms.dim() == 1 && uniforms.size(0) == batch, Error,
             "sampler: need one uniform per row ({}); got shape [{}]", batch,
             fmt::join(uniforms.sizes(), ", "));
  }
  // On the GPU a row drawn from the whole vocabulary takes one kernel (Note [Sampling kernel] in
  // trainer/kernels/sample_kernels.cu): the same rule, its sums in another order.
  if ((IsGreedy(config) || !Truncates(config, vocab)) && kernels::SampleRowsTakes(logits)) {
    const kernels::SampledRows rows =
        kernels::SampleRows(logits, config.temperature, IsGreedy(config), uniforms, hand_on);
    return {rows.tokens, rows.log_probs};
  }
  // Note [Rollout log-probs]: the scaled, untruncated distribution. (Each pass over [B, V] costs
  // tens of microseconds a decode step at batch 64: the fp32 logits are made once, and a
  // temperature of 1 divides nothing.)
  const at::Tensor logits_fp32 = logits.to(at::kFloat);  // [B, V]
  const double temperature = LogProbTemperature(config);
  const at::Tensor scaled = temperature == 1.0 ? logits_fp32 : logits_fp32 / temperature;
  const at::Tensor log_probs_all = at::log_softmax(scaled, -1);  // [B, V]

  at::Tensor tokens;  // [B] int64
  if (IsGreedy(config)) {
    tokens = logits_fp32.argmax(-1);
  } else {
    const at::Tensor u = uniforms.to(logits.device()).to(at::kDouble).unsqueeze(1);  // [B, 1]
    if (!Truncates(config, vocab)) {
      // The whole distribution, in token-id order: no sort (Note [Sampling without a sort]).
      const at::Tensor probs = at::softmax(scaled.to(at::kDouble), -1);  // [B, V] fp64
      tokens = InverseCdf(probs, u).clamp_max_(vocab - 1).squeeze(1);
    } else {
      const auto sorted = at::sort(scaled, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
      const at::Tensor& sorted_logits = std::get<0>(sorted);                    // [B, V]
      const at::Tensor& sorted_index = std::get<1>(sorted);                     // [B, V]
      const at::Tensor probs = at::softmax(sorted_logits.to(at::kDouble), -1);  // [B, V] fp64
      const at::Tensor position =
          at::arange(vocab, at::TensorOptions().dtype(at::kLong).device(logits.device()));
      const int64_t k = config.top_k == -1 ? vocab : std::min(config.top_k, vocab);
      at::Tensor keep = (position < k).unsqueeze(0).expand({batch, vocab});  // [B, V] bool
      if (config.top_p < 1) {
        const at::Tensor topk_probs = probs * keep;
        const at::Tensor renorm = topk_probs / topk_probs.sum(-1, /*keepdim=*/true);
        const at::Tensor mass_before = at::cumsum(renorm, -1) - renorm;
        keep = keep.logical_and(mass_before < config.top_p);
      }
      // Kept positions are a prefix of the sorted order (both filters keep prefixes).
      const at::Tensor last_kept = keep.sum(-1, /*keepdim=*/true) - 1;  // [B, 1]
      const at::Tensor choice = at::minimum(InverseCdf(probs * keep, u), last_kept);
      tokens = sorted_index.gather(1, choice).squeeze(1);
    }
  }
  SampledTokens out;
  out.log_probs = log_probs_all.gather(1, tokens.unsqueeze(1)).squeeze(1).contiguous();
  out.tokens = tokens.contiguous();
  HandOnAfterOps(out, hand_on);
  return out;
}

SampledTokens Sample(const at::Tensor& logits, const SamplerConfig& config,
                     at::Generator& generator) {
  at::Tensor uniforms;
  if (!IsGreedy(config)) {
    RL_CHECK(logits.dim() == 2, Error, "sampler: logits must be [batch, vocab]; got {} dims",
             logits.dim());
    uniforms = at::rand({logits.size(0)}, generator, at::TensorOptions().dtype(at::kDouble));
  }
  return SampleWithUniforms(logits, config, uniforms);
}

}  // namespace rl::rollout
