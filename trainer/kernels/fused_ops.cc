#include "trainer/kernels/fused_ops.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "launch/check.h"
#include "trainer/kernels/cuda_kernels.h"

namespace rl::kernels {
namespace {

DtypeCode CodeOf(const at::Tensor& t) {
  RL_CHECK(Supported(t), Error, "CUDA kernels take fp32 or bf16 tensors on a CUDA device; got {} on {}",
           c10::toString(t.scalar_type()), t.device().str());
  return t.scalar_type() == at::kBFloat16 ? kBFloat16 : kFloat32;
}

const float* DataOrNull(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

// Gradients from autograd come in any float dtype and layout; the kernel reads [rows] fp32.
at::Tensor RowGrad(const at::Tensor& grad) {
  return grad.defined() ? grad.reshape({-1}).to(at::kFloat).contiguous() : at::Tensor();
}

class TokenLogProbsFunction : public torch::autograd::Function<TokenLogProbsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& logits,
                                                const at::Tensor& targets) {
    const int64_t vocab = logits.size(-1);
    const at::Tensor rows = logits.reshape({-1, vocab}).contiguous();
    const at::Tensor ids = targets.reshape({-1}).to(at::kLong).contiguous();
    RL_CHECK(ids.numel() == rows.size(0) && ids.device() == rows.device(), Error,
             "TokenLogProbs: {} targets on {} for {} rows of logits on {}", ids.numel(),
             ids.device().str(), rows.size(0), rows.device().str());
    const at::TensorOptions fp32 = rows.options().dtype(at::kFloat);
    at::Tensor log_probs = at::empty({rows.size(0)}, fp32);
    at::Tensor lse = at::empty({rows.size(0)}, fp32);
    at::Tensor entropy = at::empty({rows.size(0)}, fp32);
    const c10::cuda::CUDAGuard guard(rows.device());
    RL_CHECK_CUDA(TokenLogProbsForward(rows.data_ptr(), ids.data_ptr<int64_t>(), rows.size(0),
                                       vocab, CodeOf(rows), log_probs.data_ptr<float>(),
                                       lse.data_ptr<float>(), entropy.data_ptr<float>(),
                                       c10::cuda::getCurrentCUDAStream()));
    ctx->save_for_backward({rows, ids, lse, entropy});
    ctx->saved_data["sizes"] = logits.sizes().vec();
    return {log_probs.view(targets.sizes()), entropy.view(targets.sizes())};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const at::Tensor grad_log_probs = RowGrad(grads[0]);
    const at::Tensor grad_entropy = RowGrad(grads[1]);
    at::Tensor grad = at::empty_like(rows);
    const c10::cuda::CUDAGuard guard(rows.device());
    RL_CHECK_CUDA(TokenLogProbsBackward(
        rows.data_ptr(), saved[1].data_ptr<int64_t>(), saved[2].data_ptr<float>(),
        saved[3].data_ptr<float>(), DataOrNull(grad_log_probs), DataOrNull(grad_entropy),
        rows.size(0), rows.size(1), CodeOf(rows), grad.data_ptr(),
        c10::cuda::getCurrentCUDAStream()));
    return {grad.view(ctx->saved_data["sizes"].toIntVector()), at::Tensor()};
  }
};

// Rows of the weight-gradient partial sums: about this many rows each.
constexpr int64_t kRowsPerChunk = 32;

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double eps) {
    const int64_t cols = x.size(-1);
    const at::Tensor input = x.contiguous();
    const at::Tensor w = weight.contiguous();
    const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
    at::Tensor out = at::empty_like(input);
    at::Tensor inv_rms = at::empty({rows}, input.options().dtype(at::kFloat));
    const c10::cuda::CUDAGuard guard(input.device());
    RL_CHECK_CUDA(RmsNorm(input.data_ptr(), w.data_ptr(), out.data_ptr(),
                          inv_rms.data_ptr<float>(), rows, cols, static_cast<float>(eps),
                          CodeOf(input), c10::cuda::getCurrentCUDAStream()));
    ctx->save_for_backward({input, w, inv_rms});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& w = saved[1];
    const int64_t cols = input.size(-1);
    const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
    const at::Tensor grad_out = grads[0].to(input.scalar_type()).contiguous();
    const int64_t chunks = std::max<int64_t>(1, (rows + kRowsPerChunk - 1) / kRowsPerChunk);
    at::Tensor grad_x = at::empty_like(input);
    at::Tensor partial = at::empty({chunks, cols}, input.options().dtype(at::kFloat));
    const c10::cuda::CUDAGuard guard(input.device());
    RL_CHECK_CUDA(RmsNormBackward(input.data_ptr(), w.data_ptr(), saved[2].data_ptr<float>(),
                                  grad_out.data_ptr(), rows, cols, CodeOf(input),
                                  grad_x.data_ptr(), partial.data_ptr<float>(), chunks,
                                  c10::cuda::getCurrentCUDAStream()));
    return {grad_x, partial.sum(0).to(w.scalar_type()), at::Tensor()};
  }
};

}  // namespace

bool Supported(const at::Tensor& t) {
  return t.defined() && t.is_cuda() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t cols = x.size(-1);
  RL_CHECK(weight.dim() == 1 && weight.size(0) == cols && weight.scalar_type() == x.scalar_type() &&
               weight.device() == x.device(),
           Error, "FusedRmsNorm: weight [{}] {} on {} for x [..., {}] {} on {}",
           fmt::join(weight.sizes(), ", "), c10::toString(weight.scalar_type()),
           weight.device().str(), cols, c10::toString(x.scalar_type()), x.device().str());
  return RmsNormFunction::apply(x, weight, eps);
}

at::Tensor RopeInference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         bool interleaved) {
  RL_CHECK(x.dim() == 4 && cos.dim() == 2 && cos.sizes() == sin.sizes() &&
               cos.size(0) == x.size(1) && 2 * cos.size(1) <= x.size(3) &&
               cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
               cos.device() == x.device() && sin.device() == x.device(),
           Error, "RopeInference: x [{}] {} with cos/sin [{}] {} on {}", fmt::join(x.sizes(), ", "),
           c10::toString(x.scalar_type()), fmt::join(cos.sizes(), ", "),
           c10::toString(cos.scalar_type()), cos.device().str());
  const at::Tensor c = cos.contiguous();
  const at::Tensor s = sin.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  const c10::cuda::CUDAGuard guard(x.device());
  RL_CHECK_CUDA(Rope(x.data_ptr(), x.stride(0), x.stride(1), x.stride(2), x.stride(3), c.data_ptr(),
                     s.data_ptr(), out.data_ptr(), x.size(0), x.size(1), x.size(2), x.size(3),
                     c.size(1), interleaved, CodeOf(x), c10::cuda::getCurrentCUDAStream()));
  return out;
}

TokenLogProbStats TokenLogProbs(const at::Tensor& logits, const at::Tensor& targets) {
  const torch::autograd::variable_list out = TokenLogProbsFunction::apply(logits, targets);
  return {out[0], out[1]};
}

RowLogProbStats TokenLogProbsRows(const at::Tensor& rows, const at::Tensor& targets) {
  RL_CHECK(rows.dim() == 2 && rows.is_contiguous() && targets.dim() == 1 &&
               targets.size(0) == rows.size(0) && targets.scalar_type() == at::kLong &&
               targets.device() == rows.device(),
           Error, "TokenLogProbsRows: rows must be [N, V] contiguous, targets [N] int64 with them");
  const at::TensorOptions fp32 = rows.options().dtype(at::kFloat);
  RowLogProbStats out{at::empty({rows.size(0)}, fp32), at::empty({rows.size(0)}, fp32),
                      at::empty({rows.size(0)}, fp32)};
  const at::Tensor ids = targets.contiguous();
  const c10::cuda::CUDAGuard guard(rows.device());
  RL_CHECK_CUDA(TokenLogProbsForward(rows.data_ptr(), ids.data_ptr<int64_t>(), rows.size(0),
                                     rows.size(1), CodeOf(rows), out.log_probs.data_ptr<float>(),
                                     out.lse.data_ptr<float>(), out.entropy.data_ptr<float>(),
                                     c10::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor TokenLogProbsRowsGrad(const at::Tensor& rows, const at::Tensor& targets,
                                 const at::Tensor& lse, const at::Tensor& entropy,
                                 const at::Tensor& grad_log_probs,
                                 const at::Tensor& grad_entropy) {
  at::Tensor grad = at::empty_like(rows);
  const at::Tensor ids = targets.contiguous();
  const at::Tensor row_lse = lse.to(at::kFloat).contiguous();
  // The entropy is read only with its gradient.
  const at::Tensor row_entropy = entropy.defined() ? entropy.to(at::kFloat).contiguous() : row_lse;
  const at::Tensor g_lp = RowGrad(grad_log_probs);
  const at::Tensor g_h = RowGrad(grad_entropy);
  const c10::cuda::CUDAGuard guard(rows.device());
  RL_CHECK_CUDA(TokenLogProbsBackward(rows.data_ptr(), ids.data_ptr<int64_t>(),
                                      row_lse.data_ptr<float>(), row_entropy.data_ptr<float>(),
                                      DataOrNull(g_lp), DataOrNull(g_h), rows.size(0),
                                      rows.size(1), CodeOf(rows), grad.data_ptr(),
                                      c10::cuda::getCurrentCUDAStream()));
  return grad;
}

}  // namespace rl::kernels
