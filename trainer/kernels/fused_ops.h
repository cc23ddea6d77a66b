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

}  // namespace rl::kernels

#endif  // RL_TRAINER_KERNELS_FUSED_OPS_H_
