// Token sampling for the rollout engine: one next token per row of a logits matrix, and the
// log-prob of that token that the trainer will recompute.
//
// Pipeline per row (Note [Rollout log-probs]):
//   scaled = logits (as fp32) / T
//   greedy (config.greedy, or T == 0): token = argmax(logits) (first index among ties)
//   else, with one uniform u in [0, 1) per row and p = softmax(scaled) in fp64:
//     nothing truncated (top_k -1 or >= vocab, top_p 1): inverse-CDF sampling over the whole
//         vocabulary in token-id order: the first token whose cumulative p exceeds u
//         (Note [Sampling without a sort]);
//     top-k or top-p: sort scaled descending (stable: ties keep index order), top-k keeps the
//         first k (top_k == -1: all), top-p keeps the minimal prefix of the top-k set whose
//         renormalised mass reaches top_p (a token is kept when the mass strictly before it is
//         < top_p), then inverse-CDF sampling over the kept prefix: the first kept position
//         whose cumulative mass exceeds u * kept mass.
//   Top-k is applied before top-p and top-p sees the distribution renormalised over the top-k set
//   (as transformers' warpers and vLLM do).
//   On a CUDA device, greedy rows and rows drawn from the whole vocabulary take one kernel
//   (kernels::SampleRows; Note [Sampling kernel] in trainer/kernels/sample_kernels.cu): the same
//   rule, with fp32 exponentials summed in fp64 in another order, so a token can differ only
//   where u lies within about 1e-7 of a boundary of the cumulative distribution.
//
// Note [Sampling without a sort]
// Inverse-CDF sampling draws token i with probability p_i in any fixed order of the tokens; the
// sorted order is needed only to cut the distribution (the top-k and top-p sets are prefixes of
// it). So a row that keeps every token is sampled in token-id order, and the stable sort of the
// [B, V] logits runs only for top-k and top-p. Every recipe samples so (temperature 1, top_p 1,
// top_k -1). The sort was most of a sampled step's sampling: on the CPU, [64, 151936] fp32
// logits take 87 ms without it and 563 ms with it (tools/bench/sampler_bench). The two orders
// map the same u to different tokens, so a seed's generations differ from those of a sampler that
// sorts; the distribution is the same.
//
// Note [Rollout log-probs]
// The log-prob returned for a sampled token is log_softmax(logits / T) at that token: the
// TEMPERATURE-SCALED but UNTRUNCATED distribution. That is what the trainer recomputes (it divides
// its logits by the rollout temperature and takes a full log-softmax, as miles does), so rollout
// and trainer log-probs agree up to numerics and the importance ratio / mismatch metrics are
// meaningful. The top-k / top-p truncation is a property of the sampler, not of the policy, and is
// deliberately not reflected. With T == 0 the scaled distribution is undefined; greedy rows then
// report log_softmax(logits) (T taken as 1), so a trainer that uses rollout temperature 1 for
// greedy rollouts matches.
//
// Randomness: only the uniforms. SampleWithUniforms takes them explicitly (the engine draws one per
// row from that row's own CPU generator, so a row's tokens do not depend on its batch-mates);
// Sample draws [batch] uniforms from one CPU generator in row order. Uniforms are always drawn on
// the CPU (at::CPUGeneratorImpl, mt19937) and moved to the logits' device, so the same seed gives
// the same uniforms on every device; the tokens then agree wherever the device's softmax/cumsum
// agree with the CPU's to within the distance of u to a CDF boundary.
//
// Failures: a config out of range throws rl::ConfigError naming the field; logits that are not
// [batch, vocab] floating, or uniforms that are not [batch], throw rl::Error.
// Thread safety: stateless functions; a generator must not be shared between threads.
#ifndef RL_TRAINER_ROLLOUT_SAMPLER_H_
#define RL_TRAINER_ROLLOUT_SAMPLER_H_

#include <ATen/ATen.h>

#include <cstdint>

#include "trainer/kernels/fused_ops.h"

namespace rl::rollout {

struct SamplerConfig {
  double temperature = 1.0;  // >= 0; 0 means greedy
  double top_p = 1.0;        // (0, 1]; 1 = off
  int64_t top_k = -1;        // -1 = off, else >= 1
  bool greedy = false;       // argmax regardless of temperature (log-probs still use T if > 0)
};

struct SampledTokens {
  at::Tensor tokens;     // [batch] int64, on the logits' device
  at::Tensor log_probs;  // [batch] fp32 log_softmax(logits / T) at tokens; Note [Rollout log-probs]
};

// Throws rl::ConfigError when a field is out of range.
void CheckSamplerConfig(const SamplerConfig& config);

// True when the config never draws a uniform (greedy or temperature 0).
bool IsGreedy(const SamplerConfig& config);

// The temperature the log-probs are computed at: config.temperature, or 1 when it is 0.
double LogProbTemperature(const SamplerConfig& config);

// A seeded CPU generator (at::CPUGeneratorImpl, mt19937).
at::Generator MakeGenerator(uint64_t seed);

// logits [batch, vocab] (any floating dtype, any device); uniforms [batch] in [0, 1) (any dtype,
// any device; ignored when greedy). `hand_on`'s targets, where defined (on the logits' device),
// also take the tokens and log-probs (kernels::HandOn; Note [Sampled tokens handed on] in
// engine.h): on a GPU written by the sampling kernel itself, or by kernels::HandOnSampled after
// the ops.
SampledTokens SampleWithUniforms(const at::Tensor& logits, const SamplerConfig& config,
                                 const at::Tensor& uniforms, const kernels::HandOn& hand_on = {});

// Draws [batch] uniforms (fp64) from `generator` (a CPU generator), unless greedy.
SampledTokens Sample(const at::Tensor& logits, const SamplerConfig& config,
                     at::Generator& generator);

}  // namespace rl::rollout

#endif  // RL_TRAINER_ROLLOUT_SAMPLER_H_
