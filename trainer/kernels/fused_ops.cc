#include "trainer/kernels/fused_ops.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
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
  // cos/sin [S, half], [1, S, half] (the batch shares them) or [B, S, half] (a row each).
  const bool per_row = cos.dim() == 3 && cos.size(0) == x.size(0) && x.size(0) > 1;
  RL_CHECK(x.dim() == 4 && (cos.dim() == 2 || (cos.dim() == 3 && (cos.size(0) == 1 || per_row))) &&
               cos.sizes() == sin.sizes() && cos.size(-2) == x.size(1) &&
               2 * cos.size(-1) <= x.size(3) && cos.scalar_type() == x.scalar_type() &&
               sin.scalar_type() == x.scalar_type() && cos.device() == x.device() &&
               sin.device() == x.device(),
           Error, "RopeInference: x [{}] {} with cos/sin [{}] {} on {}", fmt::join(x.sizes(), ", "),
           c10::toString(x.scalar_type()), fmt::join(cos.sizes(), ", "),
           c10::toString(cos.scalar_type()), cos.device().str());
  const at::Tensor c = cos.contiguous();
  const at::Tensor s = sin.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  const c10::cuda::CUDAGuard guard(x.device());
  RL_CHECK_CUDA(Rope(x.data_ptr(), x.stride(0), x.stride(1), x.stride(2), x.stride(3), c.data_ptr(),
                     s.data_ptr(), per_row ? x.size(1) : 0, out.data_ptr(), x.size(0), x.size(1),
                     x.size(2), x.size(3), c.size(-1), interleaved, CodeOf(x),
                     c10::cuda::getCurrentCUDAStream()));
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

namespace {

void CheckNoGrad(std::initializer_list<const at::Tensor*> tensors, const char* op) {
  for (const at::Tensor* t : tensors) {
    RL_CHECK(!t->defined() || !t->requires_grad(), Error, "{} has no gradient; an input requires one",
             op);
  }
}

bool Aligned(const at::Tensor& t, int64_t elements) {
  const int64_t bytes = elements * t.element_size();
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % static_cast<uintptr_t>(bytes) == 0;
}

// A linear kernel's conditions on its rows of x (Supported, outside autograd, from min_rows to
// max_rows of them; x's last dim counts rows, and each row feeds k inputs) and on w [n, k] (x's
// dtype, contiguous, k a multiple of 16 bytes' elements, aligned) and b ([n] or undefined).
bool LinearFits(const at::Tensor& x, int64_t k, const at::Tensor& w, const at::Tensor& b,
                int64_t min_rows, int64_t max_rows) {
  if (!Supported(x) || x.requires_grad() || x.dim() == 0 || x.size(-1) == 0 || !w.defined() ||
      w.dim() != 2 || w.size(1) != k || w.requires_grad() || w.scalar_type() != x.scalar_type() ||
      w.device() != x.device() || !w.is_contiguous() ||
      (b.defined() && (b.requires_grad() || b.dim() != 1 || b.size(0) != w.size(0) ||
                       b.scalar_type() != x.scalar_type() || b.device() != x.device()))) {
    return false;
  }
  const int64_t rows = x.numel() / x.size(-1);
  const int64_t vec = 16 / x.element_size();
  return rows >= min_rows && rows <= max_rows && k % vec == 0 && Aligned(w, vec);
}

bool SmallLinearFits(const at::Tensor& x, int64_t k, const at::Tensor& w, const at::Tensor& b) {
  return LinearFits(x, k, w, b, 1, kSmallLinearMaxRows);
}

// y = x w^T + b by `launch(x, w, bias, y, rows)` (raw pointers) for x contiguous and aligned to
// 16 bytes (copied where it is not); y [..., n_out], n_out w's rows unless given (GateUpSiluMma's
// output is half as wide).
template <typename Launch>
at::Tensor RunLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                     const Launch& launch, int64_t n_out = -1) {
  at::Tensor in = x.contiguous();
  if (!Aligned(in, 16 / in.element_size())) in = in.clone();
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n_out >= 0 ? n_out : w.size(0);
  at::Tensor y = at::empty(shape, x.options());
  const at::Tensor bias = b.defined() ? b.contiguous() : b;
  const c10::cuda::CUDAGuard guard(x.device());
  RL_CHECK_CUDA(launch(in.data_ptr(), w.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr,
                       y.data_ptr(), in.numel() / w.size(1)));
  return y;
}

// Whether a cache tensor [B, H, T, D] has unit stride along D and every row aligned to
// `elements` elements (its start and its strides).
bool CacheRowsAligned(const at::Tensor& t, int64_t elements) {
  return t.stride(3) == 1 && Aligned(t, elements) && t.stride(0) % elements == 0 &&
         t.stride(1) % elements == 0 && t.stride(2) % elements == 0;
}

// AddRmsNorm's and AddPartialsRmsNorm's outputs for x and weight (contiguous), by `launch(x,
// weight, out, rows, stream)`, the kernel's launch over x's rows.
template <typename Launch>
AddNormed RunAddNorm(const at::Tensor& x, const at::Tensor& weight, const Launch& launch) {
  const at::Tensor a = x.contiguous();
  const at::Tensor w = weight.contiguous();
  AddNormed out{at::empty_like(a), at::empty_like(a)};
  const int64_t rows = a.size(-1) == 0 ? 0 : a.numel() / a.size(-1);
  const c10::cuda::CUDAGuard guard(a.device());
  RL_CHECK_CUDA(launch(a, w, out, rows, c10::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

AddNormed AddRmsNorm(const at::Tensor& x, const at::Tensor& add, const at::Tensor& weight,
                     double eps) {
  CheckNoGrad({&x, &add, &weight}, "AddRmsNorm");
  const int64_t cols = x.size(-1);
  RL_CHECK(add.sizes() == x.sizes() && add.scalar_type() == x.scalar_type() &&
               add.device() == x.device() && weight.dim() == 1 && weight.size(0) == cols &&
               weight.scalar_type() == x.scalar_type() && weight.device() == x.device(),
           Error, "AddRmsNorm: x [{}] and add [{}] must match, with weight [{}] of their dtype",
           fmt::join(x.sizes(), ", "), fmt::join(add.sizes(), ", "),
           fmt::join(weight.sizes(), ", "));
  const at::Tensor b = add.contiguous();
  return RunAddNorm(x, weight,
                    [&](const at::Tensor& a, const at::Tensor& w, AddNormed& out, int64_t rows,
                        cudaStream_t stream) {
                      return kernels::AddRmsNorm(a.data_ptr(), b.data_ptr(), w.data_ptr(),
                                                 out.sum.data_ptr(), out.normed.data_ptr(), rows,
                                                 cols, static_cast<float>(eps), CodeOf(a), stream);
                    });
}

bool SplitKPartialsPay(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!x.defined() || x.dim() == 0 || !w.defined() || w.dim() != 2 || b.defined()) return false;
  const int64_t k = x.size(-1);
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  return x.is_cuda() && x.scalar_type() == at::kBFloat16 && w.scalar_type() == x.scalar_type() &&
         w.device() == x.device() && !x.requires_grad() && !w.requires_grad() &&
         x.is_contiguous() && w.is_contiguous() && w.size(1) == k &&
         rows > kSkinnyLinearPaysMaxRows && rows <= kSkinnyLinearMaxRows &&
         w.size(0) <= kSkinnyLinearPaysMaxFeatures && w.size(0) <= kAddPartialsMaxCols &&
         k >= kSplitKMinDepth && k % (kPartialSlices * 8) == 0;
}

at::Tensor SplitKPartials(const at::Tensor& x, const at::Tensor& w) {
  RL_CHECK(SplitKPartialsPay(x, w, {}), Error,
           "SplitKPartials: x [{}] and w [{}] do not fit (Note [Split-k partial sums])",
           fmt::join(x.sizes(), ", "), fmt::join(w.sizes(), ", "));
  const int64_t k = x.size(-1);
  const int64_t n = w.size(0);
  const int64_t rows = x.numel() / k;
  const int64_t slice = k / kPartialSlices;
  // Views, no copies: x's slices [kPartialSlices, rows, slice] (row stride k) and w's transposed
  // [kPartialSlices, slice, n] (column stride k), a strided batch for cuBLAS with fp32 outputs.
  const at::Tensor x_slices = x.view({rows, kPartialSlices, slice}).transpose(0, 1);
  const at::Tensor w_slices = w.view({n, kPartialSlices, slice}).permute({1, 2, 0});
  std::vector<int64_t> shape{kPartialSlices};
  shape.insert(shape.end(), x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return at::bmm(x_slices, w_slices, at::kFloat).view(shape);
}

bool ArePartialSums(const at::Tensor& pending, const at::Tensor& x) {
  return pending.defined() && x.defined() && pending.scalar_type() == at::kFloat &&
         pending.dim() == x.dim() + 1 && pending.size(0) == kPartialSlices &&
         pending.sizes().slice(1) == x.sizes();
}

AddNormed AddPartialsRmsNorm(const at::Tensor& x, const at::Tensor& partials,
                             const at::Tensor& weight, double eps) {
  CheckNoGrad({&x, &partials, &weight}, "AddPartialsRmsNorm");
  const int64_t cols = x.size(-1);
  RL_CHECK(ArePartialSums(partials, x) && partials.device() == x.device() && weight.dim() == 1 &&
               weight.size(0) == cols && weight.scalar_type() == x.scalar_type() &&
               weight.device() == x.device() && cols <= kAddPartialsMaxCols,
           Error,
           "AddPartialsRmsNorm: partial sums [{}] must be fp32 [{}, ...] over x [{}] (at most "
           "{} columns), with weight [{}] of x's dtype",
           fmt::join(partials.sizes(), ", "), kPartialSlices, fmt::join(x.sizes(), ", "),
           kAddPartialsMaxCols, fmt::join(weight.sizes(), ", "));
  const at::Tensor p = partials.contiguous();
  return RunAddNorm(x, weight,
                    [&](const at::Tensor& a, const at::Tensor& w, AddNormed& out, int64_t rows,
                        cudaStream_t stream) {
                      return kernels::AddPartialsRmsNorm(
                          a.data_ptr(), p.data_ptr<float>(), w.data_ptr(), out.sum.data_ptr(),
                          out.normed.data_ptr(), rows, cols, static_cast<float>(eps), CodeOf(a),
                          stream);
                    });
}

bool SmallLinearTakes(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return x.defined() && x.dim() > 0 && SmallLinearFits(x, x.size(-1), w, b);
}

at::Tensor SmallLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  RL_CHECK(SmallLinearTakes(x, w, b), Error, "SmallLinear: x [{}] and w [{}] do not fit the kernel",
           fmt::join(x.sizes(), ", "), fmt::join(w.sizes(), ", "));
  return RunLinear(
      x, w, b, [&](const void* in, const void* weight, const void* bias, void* y, int64_t rows) {
        return kernels::SmallLinear(in, weight, bias, y, rows, w.size(0), w.size(1), CodeOf(x),
                                    c10::cuda::getCurrentCUDAStream());
      });
}

bool SkinnyLinearTakes(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return x.defined() && x.dim() > 0 && x.scalar_type() == at::kBFloat16 && x.size(-1) % 32 == 0 &&
         LinearFits(x, x.size(-1), w, b, kSmallLinearMaxRows + 1, kSkinnyLinearMaxRows);
}

bool SkinnyLinearPays(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return SkinnyLinearTakes(x, w, b) && x.numel() / x.size(-1) <= kSkinnyLinearPaysMaxRows &&
         w.size(0) <= kSkinnyLinearPaysMaxFeatures;
}

at::Tensor SkinnyLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  RL_CHECK(SkinnyLinearTakes(x, w, b), Error,
           "SkinnyLinear: x [{}] and w [{}] do not fit the kernel", fmt::join(x.sizes(), ", "),
           fmt::join(w.sizes(), ", "));
  return RunLinear(
      x, w, b, [&](const void* in, const void* weight, const void* bias, void* y, int64_t rows) {
        return kernels::SkinnyLinear(in, weight, bias, y, rows, w.size(0), w.size(1),
                                     c10::cuda::getCurrentCUDAStream());
      });
}

bool GateUpSiluMmaTakes(const at::Tensor& x, const at::Tensor& w) {
  if (!x.defined() || x.scalar_type() != at::kBFloat16 || x.dim() == 0 ||
      !LinearFits(x, x.size(-1), w, {}, kGateUpSiluMmaMinRows, kSkinnyLinearMaxRows) ||
      w.size(0) % 2 != 0) {
    return false;
  }
  return kernels::GateUpSiluMmaFits(x.numel() / x.size(-1), w.size(0) / 2, w.size(1));
}

at::Tensor GateUpSiluMma(const at::Tensor& x, const at::Tensor& w) {
  RL_CHECK(GateUpSiluMmaTakes(x, w), Error,
           "GateUpSiluMma: x [{}] and w [{}] do not fit the kernel", fmt::join(x.sizes(), ", "),
           fmt::join(w.sizes(), ", "));
  const int64_t inner = w.size(0) / 2;
  return RunLinear(
      x, w, {},
      [&](const void* in, const void* weight, const void*, void* y, int64_t rows) {
        return kernels::GateUpSiluMma(in, weight, y, rows, inner, w.size(1),
                                      c10::cuda::getCurrentCUDAStream());
      },
      inner);
}

bool SmallLinearStagedTakes(const at::Tensor& x, int64_t k, const at::Tensor& w,
                            const at::Tensor& b) {
  return SmallLinearFits(x, k, w, b) &&
         x.numel() / x.size(-1) * k * x.element_size() <= kSmallLinearMaxStagedBytes;
}

SummedLinear SmallLinearAddRmsNorm(const at::Tensor& x, const at::Tensor& add,
                                   const at::Tensor& norm_weight, double eps, const at::Tensor& w,
                                   const at::Tensor& b) {
  const int64_t k = x.size(-1);
  RL_CHECK(SmallLinearStagedTakes(x, k, w, b) &&
               (!add.defined() || (add.sizes() == x.sizes() &&
                                   add.scalar_type() == x.scalar_type() && !add.requires_grad())) &&
               norm_weight.numel() == k && norm_weight.scalar_type() == x.scalar_type(),
           Error, "SmallLinearAddRmsNorm: x [{}] and w [{}] do not fit the kernel",
           fmt::join(x.sizes(), ", "), fmt::join(w.sizes(), ", "));
  const at::Tensor in = x.contiguous();
  const at::Tensor a = add.defined() ? add.contiguous() : add;
  const at::Tensor nw = norm_weight.contiguous();
  const at::Tensor bias = b.defined() ? b.contiguous() : b;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  SummedLinear out{a.defined() ? at::empty_like(in) : in, at::empty(shape, x.options())};
  const c10::cuda::CUDAGuard guard(x.device());
  RL_CHECK_CUDA(kernels::SmallLinearAddRmsNorm(
      in.data_ptr(), a.defined() ? a.data_ptr() : nullptr, nw.data_ptr(),
      static_cast<float>(eps), a.defined() ? out.sum.data_ptr() : nullptr, w.data_ptr(),
      bias.defined() ? bias.data_ptr() : nullptr, out.out.data_ptr(), in.numel() / k, w.size(0),
      k, CodeOf(in), c10::cuda::getCurrentCUDAStream()));
  return out;
}

SummedLinear SmallLinearAddPartialsRmsNorm(const at::Tensor& x, const at::Tensor& partials,
                                           const at::Tensor& norm_weight, double eps,
                                           const at::Tensor& w, const at::Tensor& b) {
  const int64_t k = x.size(-1);
  RL_CHECK(SmallLinearStagedTakes(x, k, w, b) && x.scalar_type() == at::kBFloat16 &&
               partials.scalar_type() == at::kFloat &&
               partials.is_contiguous() && partials.dim() == x.dim() + 1 &&
               partials.size(0) >= 1 && partials.size(0) <= kMaxOPartialSlices && k % 4 == 0 &&
               partials[0].sizes() == x.sizes() &&
               partials.device() == x.device() && !partials.requires_grad() &&
               norm_weight.numel() == k && norm_weight.scalar_type() == x.scalar_type(),
           Error,
           "SmallLinearAddPartialsRmsNorm: x [{}], partial sums [{}] and w [{}] do not fit the "
           "kernel",
           fmt::join(x.sizes(), ", "), fmt::join(partials.sizes(), ", "),
           fmt::join(w.sizes(), ", "));
  const at::Tensor in = x.contiguous();
  const at::Tensor nw = norm_weight.contiguous();
  const at::Tensor bias = b.defined() ? b.contiguous() : b;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  SummedLinear out{at::empty_like(in), at::empty(shape, x.options())};
  const c10::cuda::CUDAGuard guard(x.device());
  RL_CHECK_CUDA(kernels::SmallLinearAddPartialsRmsNorm(
      in.data_ptr(), partials.data_ptr<float>(), static_cast<int>(partials.size(0)),
      nw.data_ptr(), static_cast<float>(eps), out.sum.data_ptr(), w.data_ptr(),
      bias.defined() ? bias.data_ptr() : nullptr, out.out.data_ptr(), in.numel() / k, w.size(0),
      k, CodeOf(in), c10::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor SmallLinearSiluMul(const at::Tensor& gate_up, const at::Tensor& w, const at::Tensor& b) {
  const int64_t inner = gate_up.size(-1) / 2;
  RL_CHECK(gate_up.size(-1) == 2 * inner && SmallLinearStagedTakes(gate_up, inner, w, b), Error,
           "SmallLinearSiluMul: gate_up [{}] and w [{}] do not fit the kernel",
           fmt::join(gate_up.sizes(), ", "), fmt::join(w.sizes(), ", "));
  const at::Tensor in = gate_up.contiguous();
  const at::Tensor bias = b.defined() ? b.contiguous() : b;
  std::vector<int64_t> shape = gate_up.sizes().vec();
  shape.back() = w.size(0);
  at::Tensor y = at::empty(shape, gate_up.options());
  const c10::cuda::CUDAGuard guard(gate_up.device());
  RL_CHECK_CUDA(kernels::SmallLinearSiluMul(in.data_ptr(), w.data_ptr(),
                                            bias.defined() ? bias.data_ptr() : nullptr,
                                            y.data_ptr(), in.numel() / (2 * inner), w.size(0),
                                            inner, CodeOf(in), c10::cuda::getCurrentCUDAStream()));
  return y;
}

at::Tensor SiluMul(const at::Tensor& gate_up) {
  CheckNoGrad({&gate_up}, "SiluMul");
  const int64_t inner = gate_up.size(-1) / 2;
  RL_CHECK(gate_up.size(-1) == 2 * inner, Error, "SiluMul: gate_up's last dim {} is odd",
           gate_up.size(-1));
  const at::Tensor in = gate_up.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape.back() = inner;
  at::Tensor out = at::empty(shape, in.options());
  const int64_t rows = inner == 0 ? 0 : out.numel() / inner;
  const c10::cuda::CUDAGuard guard(in.device());
  RL_CHECK_CUDA(kernels::SiluMul(in.data_ptr(), out.data_ptr(), rows, inner, CodeOf(in),
                                 c10::cuda::getCurrentCUDAStream()));
  return out;
}

namespace {

// DecodeQkvPrep's inputs, checked (errors name `what`), with the caches' layout.
struct PrepTensors {
  at::Tensor q_norm, k_norm, cos, sin;  // contiguous
  QkvPrepShape shape;

  QkvPrepInputs Inputs(const at::Tensor& qkv) const {
    return {qkv.data_ptr(), q_norm.defined() ? q_norm.data_ptr() : nullptr,
            k_norm.defined() ? k_norm.data_ptr() : nullptr, cos.data_ptr(), sin.data_ptr(),
            shape};
  }
};

// 0 where `per_row` ([1] or [batch, ...] elements of `width` each, contiguous) holds one entry
// for the whole batch, `width` where it holds one per row, -1 where it holds neither (Note [Ragged
// decode] in trainer/model/layers.h).
int64_t RowStride(const at::Tensor& per_row, int64_t batch, int64_t width) {
  if (!per_row.is_contiguous()) return -1;
  if (per_row.numel() == width) return 0;
  return per_row.numel() == batch * width ? width : -1;
}

PrepTensors CheckedPrep(const char* what, const at::Tensor& qkv, const at::Tensor& q_norm,
                        const at::Tensor& k_norm, double eps, const at::Tensor& cos,
                        const at::Tensor& sin, bool interleaved, int64_t q_heads,
                        int64_t kv_heads, int64_t dim, const DecodeCache& cache) {
  CheckNoGrad({&qkv, &q_norm, &k_norm}, what);
  const int64_t batch = qkv.size(0);
  const int64_t half = cos.size(-1);
  const at::Tensor& k = cache.key;
  const at::Tensor& v = cache.value;
  const at::Tensor& pos = cache.position;
  const int64_t position_stride = RowStride(pos, batch, 1);
  RL_CHECK(qkv.dim() == 3 && qkv.size(1) == 1 && qkv.size(2) >= (q_heads + 2 * kv_heads) * dim &&
               qkv.stride(2) == 1 && dim <= kMaxHeadDim && 2 * half <= dim && cos.dim() == 2 &&
               cos.size(0) >= 1 &&
               sin.sizes() == cos.sizes() && q_norm.defined() == k_norm.defined() && k.dim() == 4 &&
               v.dim() == 4 && k.size(0) >= batch && k.size(1) == kv_heads && k.size(3) == dim &&
               k.stride(3) == 1 && v.sizes() == k.sizes() && v.stride(3) == 1 &&
               position_stride >= 0 && pos.scalar_type() == at::kLong,
           Error,
           "{}: qkv [{}] with {} q and {} kv heads of {}, caches [{}], cos [{}], position [{}]",
           what, fmt::join(qkv.sizes(), ", "), q_heads, kv_heads, dim, fmt::join(k.sizes(), ", "),
           fmt::join(cos.sizes(), ", "), fmt::join(pos.sizes(), ", "));
  for (const at::Tensor* t : {&q_norm, &k_norm, &cos, &sin, &k, &v}) {
    RL_CHECK(!t->defined() || (t->scalar_type() == qkv.scalar_type() && t->device() == qkv.device()),
             Error, "{}: every tensor must be {} on {}", what, c10::toString(qkv.scalar_type()),
             qkv.device().str());
  }
  PrepTensors p;
  p.q_norm = q_norm.defined() ? q_norm.contiguous() : q_norm;
  p.k_norm = k_norm.defined() ? k_norm.contiguous() : k_norm;
  p.cos = cos.contiguous();
  p.sin = sin.contiguous();
  QkvPrepShape& shape = p.shape;
  shape.q_heads = q_heads;
  shape.kv_heads = kv_heads;
  shape.dim = dim;
  shape.half = half;
  shape.interleaved = interleaved;
  shape.qkv_stride = qkv.stride(0);
  shape.k_stride_b = k.stride(0);
  shape.k_stride_h = k.stride(1);
  shape.k_stride_t = k.stride(2);
  shape.v_stride_b = v.stride(0);
  shape.v_stride_h = v.stride(1);
  shape.v_stride_t = v.stride(2);
  shape.eps = static_cast<float>(eps);
  shape.position_stride = position_stride;
  return p;
}

// DecodeAttention's plan for `batch` rows of q_heads against `cache` over key_length positions,
// with the fp32 scratch of its splits.
struct AttentionPlan {
  DecodeAttentionShape shape;
  at::Tensor partial_out, partial_stats;  // undefined with one split

  float* PartialOut() const {
    return partial_out.defined() ? partial_out.data_ptr<float>() : nullptr;
  }
  float* PartialStats() const {
    return partial_stats.defined() ? partial_stats.data_ptr<float>() : nullptr;
  }
};

// PlanDecodeAttention's split, with the caches' strides.
DecodeAttentionShape CacheAttentionShape(int64_t batch, int64_t q_heads, const DecodeCache& cache,
                                         int64_t key_length, double scale, int blocks_per_sm,
                                         bool tensor_cores) {
  const bool mma = tensor_cores && cache.key.scalar_type() == at::kBFloat16 &&
                   CacheRowsAligned(cache.key, 8) && CacheRowsAligned(cache.value, 8);
  DecodeAttentionShape shape = PlanDecodeAttention(
      batch, q_heads, cache.key.size(1), key_length, static_cast<float>(scale), blocks_per_sm, mma);
  shape.k_stride_b = cache.key.stride(0);
  shape.k_stride_h = cache.key.stride(1);
  shape.k_stride_t = cache.key.stride(2);
  shape.v_stride_b = cache.value.stride(0);
  shape.v_stride_h = cache.value.stride(1);
  shape.v_stride_t = cache.value.stride(2);
  shape.position_stride = RowStride(cache.position, batch, 1);
  return shape;
}

AttentionPlan PlanAttention(int64_t batch, int64_t q_heads, const DecodeCache& cache,
                            int64_t key_length, double scale, int blocks_per_sm,
                            bool tensor_cores) {
  AttentionPlan plan;
  DecodeAttentionShape& shape = plan.shape;
  shape = CacheAttentionShape(batch, q_heads, cache, key_length, scale, blocks_per_sm,
                              tensor_cores);
  if (shape.splits > 1) {
    const at::TensorOptions fp32 = cache.key.options().dtype(at::kFloat);
    const int64_t dim = cache.key.size(3);
    plan.partial_out = at::empty({batch, q_heads, shape.splits, dim}, fp32);
    plan.partial_stats = at::empty({batch, q_heads, shape.splits, 2}, fp32);
  }
  return plan;
}

}  // namespace

at::Tensor DecodeQkvPrep(const at::Tensor& qkv, const at::Tensor& q_norm, const at::Tensor& k_norm,
                         double eps, const at::Tensor& cos, const at::Tensor& sin,
                         bool interleaved, int64_t q_heads, int64_t kv_heads, int64_t dim,
                         const DecodeCache& cache) {
  const PrepTensors prep = CheckedPrep("DecodeQkvPrep", qkv, q_norm, k_norm, eps, cos, sin,
                                       interleaved, q_heads, kv_heads, dim, cache);
  const int64_t batch = qkv.size(0);
  at::Tensor q = at::empty({batch, q_heads, dim}, qkv.options());
  const QkvPrepInputs in = prep.Inputs(qkv);
  const c10::cuda::CUDAGuard guard(qkv.device());
  RL_CHECK_CUDA(kernels::DecodeQkvPrep(in.qkv, in.q_norm, in.k_norm, in.cos, in.sin,
                                       cache.position.data_ptr<int64_t>(), q.data_ptr(),
                                       cache.key.data_ptr(), cache.value.data_ptr(), batch,
                                       prep.shape, CodeOf(qkv),
                                       c10::cuda::getCurrentCUDAStream()));
  return q;
}

bool DecodeAttentionTakes(int64_t q_heads, const DecodeCache& cache) {
  const at::Tensor& k = cache.key;
  const at::Tensor& v = cache.value;
  if (!Supported(k) || k.dim() != 4 || v.sizes() != k.sizes() ||
      v.scalar_type() != k.scalar_type() || v.device() != k.device() ||
      !DecodeAttentionSupports(q_heads, k.size(1), k.size(3))) {
    return false;
  }
  const int64_t vec = k.size(3) / 32;
  return CacheRowsAligned(k, vec) && CacheRowsAligned(v, vec);
}

bool DecodeQkvAttentionTakes(int64_t q_heads, const DecodeCache& cache) {
  return DecodeAttentionTakes(q_heads, cache) &&
         DecodeQkvAttentionSupports(q_heads, cache.key.size(1), cache.key.size(3));
}

at::Tensor DecodeAttention(const at::Tensor& q, const DecodeCache& cache, int64_t key_length,
                           double scale, int blocks_per_sm, bool tensor_cores) {
  CheckNoGrad({&q}, "DecodeAttention");
  RL_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == cache.key.scalar_type() &&
               q.device() == cache.key.device() && q.size(2) == cache.key.size(3) &&
               Aligned(q, q.size(2) / 32) && DecodeAttentionTakes(q.size(1), cache) &&
               cache.key.size(0) >= q.size(0) && key_length >= 1 &&
               key_length <= cache.key.size(2) && RowStride(cache.position, q.size(0), 1) >= 0 &&
               cache.position.scalar_type() == at::kLong,
           Error, "DecodeAttention: q [{}] against caches [{}] over {} keys, position [{}]",
           fmt::join(q.sizes(), ", "), fmt::join(cache.key.sizes(), ", "), key_length,
           fmt::join(cache.position.sizes(), ", "));
  const int64_t batch = q.size(0);
  const int64_t q_heads = q.size(1);
  const int64_t dim = q.size(2);
  const AttentionPlan plan =
      PlanAttention(batch, q_heads, cache, key_length, scale, blocks_per_sm, tensor_cores);
  at::Tensor out = at::empty({batch, q_heads * dim}, q.options());
  const c10::cuda::CUDAGuard guard(q.device());
  RL_CHECK_CUDA(kernels::DecodeAttention(
      q.data_ptr(), cache.key.data_ptr(), cache.value.data_ptr(),
      cache.position.data_ptr<int64_t>(), out.data_ptr(), plan.PartialOut(), plan.PartialStats(),
      batch, dim, plan.shape, CodeOf(q), c10::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor DecodeQkvAttention(const at::Tensor& qkv, const at::Tensor& q_norm,
                              const at::Tensor& k_norm, double eps, const at::Tensor& cos,
                              const at::Tensor& sin, bool interleaved, int64_t q_heads,
                              int64_t kv_heads, int64_t dim, const DecodeCache& cache,
                              int64_t key_length, double scale) {
  const PrepTensors prep = CheckedPrep("DecodeQkvAttention", qkv, q_norm, k_norm, eps, cos, sin,
                                       interleaved, q_heads, kv_heads, dim, cache);
  const int64_t batch = qkv.size(0);
  RL_CHECK(DecodeQkvAttentionTakes(q_heads, cache) && key_length >= 1 &&
               key_length <= cache.key.size(2) && key_length <= cos.size(0),
           Error,
           "DecodeQkvAttention: {} query heads against caches [{}] over {} keys, a RoPE table of "
           "{} positions",
           q_heads, fmt::join(cache.key.sizes(), ", "), key_length, cos.size(0));
  const AttentionPlan plan = PlanAttention(batch, q_heads, cache, key_length, scale, 0, true);
  at::Tensor out = at::empty({batch, q_heads * dim}, qkv.options());
  const c10::cuda::CUDAGuard guard(qkv.device());
  RL_CHECK_CUDA(kernels::DecodeQkvAttention(
      prep.Inputs(qkv), cache.position.data_ptr<int64_t>(), cache.key.data_ptr(),
      cache.value.data_ptr(), out.data_ptr(), plan.PartialOut(), plan.PartialStats(), batch,
      plan.shape, CodeOf(qkv), c10::cuda::getCurrentCUDAStream()));
  return out;
}

bool DecodeQkvAttentionOTakes(int64_t q_heads, const DecodeCache& cache, int64_t key_length,
                              const at::Tensor& o_proj, const at::Tensor& o_bias) {
  const at::Tensor& k = cache.key;
  return DecodeQkvAttentionTakes(q_heads, cache) && key_length <= kAttentionOMaxKeys &&
         k.scalar_type() == at::kBFloat16 &&
         CacheRowsAligned(k, 8) && CacheRowsAligned(cache.value, 8) && !o_bias.defined() &&
         o_proj.defined() && o_proj.dim() == 2 && o_proj.scalar_type() == at::kBFloat16 &&
         o_proj.is_contiguous() && o_proj.device() == k.device() && !o_proj.requires_grad() &&
         o_proj.size(1) == q_heads * k.size(3) && Aligned(o_proj, 8) &&
         DecodeQkvAttentionOSupports(q_heads, k.size(1), k.size(3), o_proj.size(0));
}

at::Tensor DecodeQkvAttentionO(const at::Tensor& qkv, const at::Tensor& q_norm,
                               const at::Tensor& k_norm, double eps, const at::Tensor& cos,
                               const at::Tensor& sin, bool interleaved, int64_t q_heads,
                               int64_t kv_heads, int64_t dim, const DecodeCache& cache,
                               int64_t key_length, double scale, const at::Tensor& o_proj) {
  const PrepTensors prep = CheckedPrep("DecodeQkvAttentionO", qkv, q_norm, k_norm, eps, cos, sin,
                                       interleaved, q_heads, kv_heads, dim, cache);
  const int64_t batch = qkv.size(0);
  RL_CHECK(DecodeQkvAttentionOTakes(q_heads, cache, key_length, o_proj, {}) && key_length >= 1 &&
               key_length <= cache.key.size(2) && key_length <= cos.size(0),
           Error,
           "DecodeQkvAttentionO: {} query heads against caches [{}] over {} keys, a RoPE table of "
           "{} positions, o projection [{}]",
           q_heads, fmt::join(cache.key.sizes(), ", "), key_length, cos.size(0),
           fmt::join(o_proj.sizes(), ", "));
  const int64_t hidden = o_proj.size(0);
  at::Tensor partials = at::empty({kv_heads, batch, 1, hidden}, qkv.options().dtype(at::kFloat));
  const c10::cuda::CUDAGuard guard(qkv.device());
  RL_CHECK_CUDA(kernels::DecodeQkvAttentionO(
      prep.Inputs(qkv), cache.position.data_ptr<int64_t>(), cache.key.data_ptr(),
      cache.value.data_ptr(), {o_proj.data_ptr(), partials.data_ptr<float>(), hidden, batch},
      CacheAttentionShape(batch, q_heads, cache, key_length, scale, 0, true),
      c10::cuda::getCurrentCUDAStream()));
  return partials;
}

bool DsaIndexScoresTakes(const at::Tensor& q, const at::Tensor& keys) {
  if (!Supported(q) || q.scalar_type() != at::kBFloat16 || q.dim() != 3 || q.size(0) < 1 ||
      q.size(0) > 65535 || !keys.defined() || keys.dim() != 3 ||
      keys.scalar_type() != at::kBFloat16 || keys.device() != q.device() ||
      keys.size(2) != q.size(2) || keys.size(0) < q.size(0) ||
      !DsaIndexScoresSupports(q.size(1), q.size(2))) {
    return false;
  }
  // The kernel reads 16-byte pieces of the query rows (contiguous() keeps a view's start) and of
  // the key rows.
  return Aligned(q, 8) && keys.stride(2) == 1 && Aligned(keys, 8) && keys.stride(0) % 8 == 0 &&
         keys.stride(1) % 8 == 0;
}

at::Tensor DsaIndexScores(const at::Tensor& q, const at::Tensor& weights, const at::Tensor& keys,
                          const at::Tensor& position, int64_t key_length, double scale) {
  CheckNoGrad({&q, &weights, &keys}, "DsaIndexScores");
  const int64_t batch = q.size(0);
  RL_CHECK(DsaIndexScoresTakes(q, keys) && weights.dim() == 2 && weights.size(0) == batch &&
               weights.size(1) == q.size(1) && weights.scalar_type() == at::kFloat &&
               weights.device() == q.device() && key_length >= 1 && key_length <= keys.size(1) &&
               position.scalar_type() == at::kLong && position.device() == q.device() &&
               RowStride(position, batch, 1) >= 0,
           Error,
           "DsaIndexScores: q {} [{}], weights [{}], keys {} [{}] over {} keys, position [{}]",
           c10::toString(q.scalar_type()), fmt::join(q.sizes(), ", "),
           fmt::join(weights.sizes(), ", "), c10::toString(keys.scalar_type()),
           fmt::join(keys.sizes(), ", "), key_length, fmt::join(position.sizes(), ", "));
  const at::Tensor query = q.contiguous();
  const at::Tensor w = weights.contiguous();
  at::Tensor out = at::empty({batch, key_length}, q.options().dtype(at::kFloat));
  DsaIndexShape shape;
  shape.batch = batch;
  shape.heads = q.size(1);
  shape.dim = q.size(2);
  shape.key_length = key_length;
  shape.key_stride_b = keys.stride(0);
  shape.key_stride_t = keys.stride(1);
  shape.position_stride = RowStride(position, batch, 1);
  shape.out_stride = key_length;
  shape.scale = static_cast<float>(scale);
  const c10::cuda::CUDAGuard guard(q.device());
  RL_CHECK_CUDA(kernels::DsaIndexScores(query.data_ptr(), w.data_ptr<float>(), keys.data_ptr(),
                                        position.data_ptr<int64_t>(), out.data_ptr<float>(), shape,
                                        c10::cuda::getCurrentCUDAStream()));
  return out;
}

bool RouterTopKTakes(const at::Tensor& logits, int64_t k, int64_t groups, int64_t topk_group) {
  return logits.defined() && logits.is_cuda() && logits.scalar_type() == at::kFloat &&
         logits.dim() == 2 && !logits.requires_grad() &&
         RouterTopKSupports(logits.size(1), k, groups, topk_group);
}

RouterChoice RouterTopK(const at::Tensor& logits, const at::Tensor& bias, bool sigmoid, int64_t k,
                        int64_t groups, int64_t topk_group, bool normalize, double scale) {
  RL_CHECK(RouterTopKTakes(logits, k, groups, topk_group) &&
               (!bias.defined() || (bias.dim() == 1 && bias.size(0) == logits.size(1) &&
                                    bias.device() == logits.device())),
           Error, "RouterTopK: logits {} [{}] on {}, top-{} of {} groups ({} kept)",
           c10::toString(logits.scalar_type()), fmt::join(logits.sizes(), ", "),
           logits.device().str(), k, groups, topk_group);
  const at::Tensor rows = logits.contiguous();
  const at::Tensor b = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
  RouterShape shape;
  shape.tokens = rows.size(0);
  shape.experts = rows.size(1);
  shape.k = k;
  shape.groups = groups;
  shape.topk_group = topk_group;
  shape.sigmoid = sigmoid;
  shape.normalize = normalize;
  shape.scale = static_cast<float>(scale);
  RouterChoice out{at::empty({shape.tokens, k}, rows.options().dtype(at::kLong)),
                   at::empty({shape.tokens, k}, rows.options())};
  const c10::cuda::CUDAGuard guard(rows.device());
  RL_CHECK_CUDA(kernels::RouterTopK(rows.data_ptr<float>(),
                                    b.defined() ? b.data_ptr<float>() : nullptr,
                                    out.ids.data_ptr<int64_t>(), out.weights.data_ptr<float>(),
                                    shape, c10::cuda::getCurrentCUDAStream()));
  return out;
}

bool SortByExpertTakes(const at::Tensor& ids, int64_t experts) {
  return ids.defined() && ids.is_cuda() && ids.scalar_type() == at::kLong && ids.dim() == 1 &&
         SortByExpertSupports(ids.size(0), experts);
}

ExpertOrder SortByExpert(const at::Tensor& ids, int64_t experts) {
  RL_CHECK(SortByExpertTakes(ids, experts), Error,
           "SortByExpert: ids {} [{}] on {} over {} experts", c10::toString(ids.scalar_type()),
           fmt::join(ids.sizes(), ", "), ids.device().str(), experts);
  const at::Tensor flat = ids.contiguous();
  const int64_t pairs = flat.size(0);
  ExpertOrder out{at::empty({pairs}, flat.options()), at::empty({pairs}, flat.options()),
                  at::empty({experts}, flat.options().dtype(at::kInt)),
                  at::empty({pairs}, flat.options())};
  const c10::cuda::CUDAGuard guard(flat.device());
  RL_CHECK_CUDA(
      kernels::SortByExpert(flat.data_ptr<int64_t>(), pairs, experts, out.order.data_ptr<int64_t>(),
                            out.sorted_ids.data_ptr<int64_t>(), out.ends.data_ptr<int32_t>(),
                            out.inverse.data_ptr<int64_t>(), c10::cuda::getCurrentCUDAStream()));
  return out;
}

bool CombineExpertsTakes(const at::Tensor& rows, const at::Tensor& weights,
                         const at::Tensor& shared) {
  return Supported(rows) && !rows.requires_grad() && rows.dim() == 2 && weights.defined() &&
         weights.dim() == 2 && weights.scalar_type() == at::kFloat &&
         weights.device() == rows.device() && !weights.requires_grad() &&
         rows.size(0) == weights.numel() &&
         (!shared.defined() ||
          (shared.scalar_type() == rows.scalar_type() && shared.device() == rows.device() &&
           !shared.requires_grad() && shared.dim() == 2 && shared.size(0) == weights.size(0) &&
           shared.size(1) == rows.size(1)));
}

at::Tensor CombineExperts(const at::Tensor& rows, const at::Tensor& inverse,
                          const at::Tensor& weights, const at::Tensor& shared) {
  RL_CHECK(CombineExpertsTakes(rows, weights, shared) && inverse.scalar_type() == at::kLong &&
               inverse.numel() == rows.size(0) && inverse.device() == rows.device(),
           Error, "CombineExperts: rows [{}], inverse [{}], weights [{}]",
           fmt::join(rows.sizes(), ", "), fmt::join(inverse.sizes(), ", "),
           fmt::join(weights.sizes(), ", "));
  const at::Tensor r = rows.contiguous();
  const at::Tensor i = inverse.contiguous();
  const at::Tensor w = weights.contiguous();
  const at::Tensor s = shared.defined() ? shared.contiguous() : at::Tensor();
  const int64_t tokens = w.size(0);
  at::Tensor out = at::empty({tokens, r.size(1)}, r.options());
  const c10::cuda::CUDAGuard guard(r.device());
  RL_CHECK_CUDA(kernels::CombineExperts(r.data_ptr(), i.data_ptr<int64_t>(), w.data_ptr<float>(),
                                        s.defined() ? s.data_ptr() : nullptr, out.data_ptr(),
                                        tokens, w.size(1), r.size(1), CodeOf(r),
                                        c10::cuda::getCurrentCUDAStream()));
  return out;
}

namespace {

// `to` as pointers, after checking that each target is a contiguous [rows] tensor of its dtype on
// `device`.
HandOnTargets HandOnPointers(const HandOn& to, int64_t rows, at::Device device) {
  const auto fits = [&](const at::Tensor& t, at::ScalarType dtype) {
    return !t.defined() || (t.device() == device && t.scalar_type() == dtype && t.is_contiguous() &&
                            t.dim() == 1 && t.size(0) == rows);
  };
  RL_CHECK(fits(to.host_tokens, at::kLong) && fits(to.host_log_probs, at::kFloat) &&
               fits(to.next_tokens, at::kLong) && fits(to.positions, at::kLong) &&
               to.next_tokens.defined() == to.positions.defined(),
           Error,
           "hand-on targets must be contiguous [{}] tensors on {} (tokens, next tokens and "
           "positions int64, log-probs fp32), the next tokens and positions both or neither",
           rows, device.str());
  const auto longs = [](const at::Tensor& t) {
    return t.defined() ? t.data_ptr<int64_t>() : nullptr;
  };
  return {longs(to.host_tokens),
          to.host_log_probs.defined() ? to.host_log_probs.data_ptr<float>() : nullptr,
          longs(to.next_tokens), longs(to.positions)};
}

}  // namespace

bool SampleRowsTakes(const at::Tensor& logits) {
  if (!Supported(logits) || logits.dim() != 2 || logits.stride(1) != 1 || logits.size(0) == 0) {
    return false;
  }
  const int64_t vec = 16 / logits.element_size();
  return logits.size(1) % vec == 0 && logits.stride(0) % vec == 0 && Aligned(logits, vec) &&
         SampleRowsSharedBytes(logits.size(1), CodeOf(logits)) <= kSampleMaxSharedBytes;
}

SampledRows SampleRows(const at::Tensor& logits, double temperature, bool greedy,
                       const at::Tensor& uniforms, const HandOn& hand_on) {
  RL_CHECK(SampleRowsTakes(logits), Error,
           "SampleRows: logits {} [{}] (strides [{}]) do not fit the kernel",
           c10::toString(logits.scalar_type()), fmt::join(logits.sizes(), ", "),
           fmt::join(logits.strides(), ", "));
  const int64_t rows = logits.size(0);
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor u;
  if (!greedy) {
    RL_CHECK(uniforms.defined() && uniforms.numel() == rows, Error,
             "SampleRows: need one uniform per row ({})", rows);
    u = uniforms.reshape({rows}).to(logits.device(), at::kDouble).contiguous();
  }
  SampledRows out;
  out.tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  out.log_probs = at::empty({rows}, logits.options().dtype(at::kFloat));
  RL_CHECK_CUDA(kernels::SampleRows(logits.data_ptr(), rows, logits.size(1), logits.stride(0),
                                    temperature, greedy, greedy ? nullptr : u.data_ptr<double>(),
                                    out.tokens.data_ptr<int64_t>(), out.log_probs.data_ptr<float>(),
                                    HandOnPointers(hand_on, rows, logits.device()), CodeOf(logits),
                                    c10::cuda::getCurrentCUDAStream()));
  return out;
}

MappedHost MappedHostEmpty(at::IntArrayRef sizes, at::ScalarType dtype, at::Device device) {
  RL_CHECK(device.is_cuda(), Error, "mapped host memory is for a CUDA device; got {}",
           device.str());
  const c10::cuda::CUDAGuard guard(device);
  int64_t count = 1;
  for (const int64_t size : sizes) count *= size;
  const auto bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * c10::elementSize(dtype);
  void* host = nullptr;
  RL_CHECK_CUDA(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  // Freed once both tensors are gone: each deleter drops one reference.
  const std::shared_ptr<void> memory(host, [](void* p) { cudaFreeHost(p); });
  void* on_device = nullptr;
  RL_CHECK_CUDA(cudaHostGetDevicePointer(&on_device, host, 0));
  const auto release = [memory](void*) {};
  MappedHost out;
  out.host = at::from_blob(host, sizes, release, at::TensorOptions().dtype(dtype));
  out.device =
      at::from_blob(on_device, sizes, release, at::TensorOptions().dtype(dtype).device(device));
  return out;
}

void HandOnSampled(const at::Tensor& tokens, const at::Tensor& log_probs, const HandOn& to) {
  const int64_t rows = tokens.numel();
  RL_CHECK(tokens.is_cuda() && tokens.scalar_type() == at::kLong && tokens.is_contiguous() &&
               log_probs.device() == tokens.device() && log_probs.scalar_type() == at::kFloat &&
               log_probs.is_contiguous() && log_probs.numel() == rows,
           Error,
           "HandOnSampled: tokens and log-probs must be contiguous [{}] int64 and fp32 "
           "tensors on one CUDA device",
           rows);
  const HandOnTargets targets = HandOnPointers(to, rows, tokens.device());
  const c10::cuda::CUDAGuard guard(tokens.device());
  RL_CHECK_CUDA(kernels::HandOnSampled(tokens.data_ptr<int64_t>(), log_probs.data_ptr<float>(),
                                       rows, targets, c10::cuda::getCurrentCUDAStream()));
}

}  // namespace rl::kernels
