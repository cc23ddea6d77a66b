// Tensor entry points of our CUDA kernels (trainer/kernels/cuda_kernels.h): where they apply
// (Supported), RMSNorm (with its gradient), the RoPE the rollout engine decodes with, and the
// token log-prob / entropy of the training loss with its gradient.
//
// Failures: tensors on another device or of another dtype than the kernels take throw rl::Error
// (callers ask Supported first); a failed launch throws rl::CudaError.
// Thread safety: stateless; the work goes to the calling thread's current CUDA stream.
#ifndef RL_TRAINER_KERNELS_FUSED_OPS_H_
#define RL_TRAINER_KERNELS_FUSED_OPS_H_

#include <ATen/ATen.h>

namespace rl::kernels {

// True when `t` is on a CUDA device and fp32 or bf16.
bool Supported(const at::Tensor& t);

// transformers' RMSNorm over the last dim in one kernel (cuda_kernels.h RmsNorm): x [..., cols],
// weight [cols], both Supported and of one dtype. Differentiable in x and the weight: the backward
// is one kernel for x's gradient and one for the weight's (partial sums over row chunks).
at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotary embedding of x [B, S, H, D] with cos/sin [S, half] (x's dtype) in one kernel, no
// autograd; the same bits as layers.h ApplyRope of x.transpose(1, 2) (each product and sum
// rounded like the LibTorch ops). Returns a contiguous [B, S, H, D].
at::Tensor RopeInference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         bool interleaved);

// Per position: log_softmax(logits)[target] and the entropy of softmax(logits), both fp32, from
// one read of the logits [..., vocab] (Supported) with targets [...] int64 on the same device.
// Differentiable with respect to the logits: the backward writes the logits' gradient in one
// pass from the logits and the saved per-row log-sum-exp, without the fp32 [..., vocab] copies
// that log_softmax(logits.float()) keeps for its backward.
struct TokenLogProbStats {
  at::Tensor log_probs;  // [...] fp32
  at::Tensor entropy;    // [...] fp32
};
TokenLogProbStats TokenLogProbs(const at::Tensor& logits, const at::Tensor& targets);

// The two passes of TokenLogProbs without autograd, for the vocabulary-parallel log-probs (Note
// [Vocabulary-parallel log-probs] in trainer/model/vocab_parallel.h), which combine the per-row
// statistics of every shard. Rows: logits [N, V] (Supported, contiguous), targets [N] int64 on
// the same device.
// Forward: log_softmax(rows)[target], the log-sum-exp and the entropy of each row, fp32 [N];
// targets must lie in [0, V).
struct RowLogProbStats {
  at::Tensor log_probs;
  at::Tensor lse;
  at::Tensor entropy;
};
RowLogProbStats TokenLogProbsRows(const at::Tensor& rows, const at::Tensor& targets);
// Backward, in the rows' dtype: with p = exp(row - lse), g_lp * (onehot(target) - p) +
// g_h * p * (lse - entropy - row), for the `lse` and `entropy` [N] fp32 of the whole
// distribution; a target outside [0, V) adds no one-hot term. Either gradient may be undefined
// (and the entropy with its gradient).
at::Tensor TokenLogProbsRowsGrad(const at::Tensor& rows, const at::Tensor& targets,
                                 const at::Tensor& lse, const at::Tensor& entropy,
                                 const at::Tensor& grad_log_probs,
                                 const at::Tensor& grad_entropy);

}  // namespace rl::kernels

#endif  // RL_TRAINER_KERNELS_FUSED_OPS_H_
