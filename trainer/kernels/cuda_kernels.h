// CUDA kernels of our own, for the places where a profile showed eager LibTorch ops doing extra
// memory passes or launching many small kernels (README "Speed on the H200"). Raw pointers and a
// stream in, nothing of LibTorch: trainer/kernels/fused_ops.h wraps them for tensors.
//
// Dtype codes: 0 = float32, 1 = bfloat16. Every launcher enqueues its work on `stream` and returns
// the cudaError_t of the launch (0 = success); it does not synchronise.
#ifndef RL_TRAINER_KERNELS_CUDA_KERNELS_H_
#define RL_TRAINER_KERNELS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace rl::kernels {

enum DtypeCode : int { kFloat32 = 0, kBFloat16 = 1 };

// transformers' RMSNorm of each row of x [rows, cols] (contiguous), with the rounding it has:
// r = rsqrt(mean(x^2) + eps), h = x * r in fp32, h rounded to the dtype, out = weight * h rounded
// to the dtype. x, weight and out share `dtype`; inv_rms [rows] receives r unless null.
cudaError_t RmsNorm(const void* x, const void* weight, void* out, float* inv_rms, int64_t rows,
                    int64_t cols, float eps, DtypeCode dtype, cudaStream_t stream);

// The gradient of RmsNorm given grad_out [rows, cols] (contiguous, `dtype`) and the forward's
// inv_rms: with g = grad_out * weight rounded to the dtype (what the weight product passes back),
// grad_x = r g - x r^3 mean(g x) (rounded to the dtype), and the weight's gradient as fp32
// partial sums over row chunks, grad_weight_partial [chunks, cols] (sum it over dim 0):
// sum over the chunk's rows of grad_out * h.
cudaError_t RmsNormBackward(const void* x, const void* weight, const float* inv_rms,
                            const void* grad_out, int64_t rows, int64_t cols, DtypeCode dtype,
                            void* grad_x, float* grad_weight_partial, int64_t chunks,
                            cudaStream_t stream);

// Rotary embedding of x [B, S, H, D] (any element strides) into out [B, S, H, D] (contiguous), with
// the rows of cos/sin [S, half] (contiguous, x's dtype) by position s: the pairs (j, j + half)
// (interleaved: (2j, 2j + 1)) become (x1 cos - x2 sin, x2 cos + x1 sin) in dims [0, 2 half), each
// product and each sum rounded to the dtype as separate LibTorch ops round them; dims from
// 2 half on are copied.
cudaError_t Rope(const void* x, int64_t stride_b, int64_t stride_s, int64_t stride_h,
                 int64_t stride_d, const void* cos, const void* sin, void* out, int64_t batch,
                 int64_t seq, int64_t heads, int64_t dim, int64_t half, bool interleaved,
                 DtypeCode dtype, cudaStream_t stream);

// Per row of logits [rows, vocab] (contiguous, `dtype`): lse = logsumexp in fp32,
// log_probs[r] = logits[r, targets[r]] - lse[r], and when `entropy` is not null the entropy of
// softmax(logits[r]). One read of the logits.
cudaError_t TokenLogProbsForward(const void* logits, const int64_t* targets, int64_t rows,
                                 int64_t vocab, DtypeCode dtype, float* log_probs, float* lse,
                                 float* entropy, cudaStream_t stream);

// The gradient of TokenLogProbsForward's outputs with respect to the logits, written as `dtype`
// into grad_logits [rows, vocab]: with p = exp(logit - lse),
//   grad = g_lp[r] * (onehot(targets[r]) - p) + g_h[r] * p * (lse[r] - entropy[r] - logit).
// grad_log_probs or grad_entropy may be null (zero); entropy is needed with grad_entropy.
cudaError_t TokenLogProbsBackward(const void* logits, const int64_t* targets, const float* lse,
                                  const float* entropy, const float* grad_log_probs,
                                  const float* grad_entropy, int64_t rows, int64_t vocab,
                                  DtypeCode dtype, void* grad_logits, cudaStream_t stream);

}  // namespace rl::kernels

#endif  // RL_TRAINER_KERNELS_CUDA_KERNELS_H_
