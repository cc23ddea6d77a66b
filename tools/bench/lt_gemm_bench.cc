// lt_gemm_bench: whether another of cuBLASLt's algorithms beats the one LibTorch's GEMM takes,
// for the decode step's projections of 33 to 64 rows (Qwen3-0.6B's q/k/v, o, gate/up and down at
// 64, 48 and 33 rows; bf16, fp32 sums). For each shape it times at::mm and every candidate of
// cuBLASLt's heuristic (up to 64) as a CUDA graph over 28 weights of their own (880 MB at most,
// past the L2, as a decode step reads them), and prints each candidate's time, configuration
// (tile, split-k, stages, reduction), largest difference from at::mm and whether a second call
// gives the same bits, then per shape at::mm, the heuristic's first choice and the best. Then per
// shape and split of k into 2 to 8 slices, the same GEMM as a batch over the slices with fp32
// outputs ("k in N slices"): cuBLASLt's best candidate and at::bmm with an fp32 out_dtype, as
// kernels::SplitKPartials runs it. Needs a GPU. docs/decode-performance.md has its figures.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tools/bench/profiling.h"

namespace {

using rl::bench::GraphMicrosPerCall;

// Exits with the status where a cuBLASLt call fails.
void Check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "lt_gemm_bench: %s failed: status %d\n", what, static_cast<int>(status));
    std::exit(1);
  }
}

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kMaxCandidates = 64;

// y [rows, n] = x [rows, k] w^T in bf16 with fp32 sums as cuBLASLt sees it (column-major: y^T =
// w x^T, w transposed), and its heuristic's candidates for that GEMM. With `splits` > 1, k is
// split in that many slices and the GEMM is a batch of one per slice, each writing its fp32
// partial sums: y [splits, rows, n] fp32, whose slices a kernel after would add.
class LtGemm {
 public:
  LtGemm(cublasLtHandle_t handle, int64_t rows, int64_t n, int64_t k, int64_t splits = 1)
      : handle_(handle) {
    Check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    Check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                         sizeof(transpose)),
          "cublasLtMatmulDescSetAttribute");
    Check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)),
          "cublasLtMatmulDescSetAttribute");
    const int64_t slice = k / splits;
    Check(cublasLtMatrixLayoutCreate(&w_, CUDA_R_16BF, slice, n, k), "cublasLtMatrixLayoutCreate");
    Check(cublasLtMatrixLayoutCreate(&x_, CUDA_R_16BF, slice, rows, k),
          "cublasLtMatrixLayoutCreate");
    Check(cublasLtMatrixLayoutCreate(&y_, splits > 1 ? CUDA_R_32F : CUDA_R_16BF, n, rows, n),
          "cublasLtMatrixLayoutCreate");
    if (splits > 1) {
      const int32_t count = static_cast<int32_t>(splits);
      const int64_t y_stride = n * rows;
      for (cublasLtMatrixLayout_t layout : {w_, x_, y_}) {
        Check(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                               sizeof(count)),
              "cublasLtMatrixLayoutSetAttribute");
        const int64_t& stride = layout == y_ ? y_stride : slice;
        Check(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &stride, sizeof(stride)),
              "cublasLtMatrixLayoutSetAttribute");
      }
    }
    cublasLtMatmulPreference_t preference;
    Check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    Check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &kWorkspaceBytes, sizeof(kWorkspaceBytes)),
          "cublasLtMatmulPreferenceSetAttribute");
    candidates_.resize(kMaxCandidates);
    int found = 0;
    Check(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, w_, x_, y_, y_, preference, kMaxCandidates,
                                         candidates_.data(), &found),
          "cublasLtMatmulAlgoGetHeuristic");
    candidates_.resize(static_cast<size_t>(found));
    cublasLtMatmulPreferenceDestroy(preference);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(w_);
    cublasLtMatrixLayoutDestroy(x_);
    cublasLtMatrixLayoutDestroy(y_);
    cublasLtMatmulDescDestroy(desc_);
  }

  int candidates() const { return static_cast<int>(candidates_.size()); }

  // y = x w^T by candidate `i`, on the current stream.
  void Run(int i, const at::Tensor& w, const at::Tensor& x, at::Tensor& y,
           at::Tensor& workspace) const {
    const float one = 1.0f, zero = 0.0f;
    Check(cublasLtMatmul(handle_, desc_, &one, w.data_ptr(), w_, x.data_ptr(), x_, &zero,
                         y.data_ptr(), y_, y.data_ptr(), y_, &candidates_[i].algo,
                         workspace.data_ptr(), kWorkspaceBytes, c10::cuda::getCurrentCUDAStream()),
          "cublasLtMatmul");
  }

  // Candidate `i`'s tile, split-k, stages and reduction scheme (cuBLASLt's enum values).
  std::string Config(int i) const {
    const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attribute) {
      int32_t value = 0;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&candidates_[i].algo, attribute, &value, sizeof(value),
                                           &written);
      return std::to_string(value);
    };
    return "tile " + get(CUBLASLT_ALGO_CONFIG_TILE_ID) + ", split-k " +
           get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM) + ", stages " +
           get(CUBLASLT_ALGO_CONFIG_STAGES_ID) + ", reduction " +
           get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
  }

 private:
  cublasLtHandle_t handle_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t w_ = nullptr, x_ = nullptr, y_ = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> candidates_;
};

// at::mm and each candidate for one shape, over kLayers weights of their own.
void CompareShape(cublasLtHandle_t handle, at::Tensor& workspace, int64_t rows, int64_t n,
                  int64_t k) {
  constexpr int kLayers = 28;
  const auto options = workspace.options().dtype(at::kBFloat16);
  std::vector<at::Tensor> w;
  for (int l = 0; l < kLayers; ++l) w.push_back(at::randn({n, k}, options) / 32);
  const at::Tensor x = at::randn({rows, k}, options);
  at::Tensor y = at::empty({rows, n}, options);
  // Microseconds per layer of `gemm(weight)` run for every layer's weight, captured as one graph.
  const auto per_layer = [&](const std::function<void(const at::Tensor&)>& gemm) {
    return GraphMicrosPerCall(
               [&] {
                 for (const at::Tensor& weight : w) gemm(weight);
               },
               1) /
           kLayers;
  };
  const double base = per_layer([&](const at::Tensor& weight) { at::mm_out(y, x, weight.t()); });
  const at::Tensor reference = at::mm(x, w.back().t());
  const LtGemm gemm(handle, rows, n, k);
  const std::string shape =
      std::to_string(rows) + " rows x [" + std::to_string(n) + ", " + std::to_string(k) + "]";
  double best = 1e30, first = 0;
  int best_i = -1;
  for (int i = 0; i < gemm.candidates(); ++i) {
    gemm.Run(i, w.back(), x, y, workspace);
    const double diff = (y.to(at::kFloat) - reference.to(at::kFloat)).abs().max().item<double>();
    const at::Tensor once = y.clone();
    gemm.Run(i, w.back(), x, y, workspace);
    const bool same = at::equal(once, y);
    const double us =
        per_layer([&](const at::Tensor& weight) { gemm.Run(i, weight, x, y, workspace); });
    std::printf(
        "  %s candidate %d: %.2f us, largest difference from at::mm %.3g, same bits "
        "again: %s; %s\n",
        shape.c_str(), i, us, diff, same ? "yes" : "no", gemm.Config(i).c_str());
    if (i == 0) first = us;
    if (us < best) {
      best = us;
      best_i = i;
    }
  }
  std::printf(
      "%s: at::mm %.2f us (%.2f TB/s), the heuristic's first %.2f us, the best (%d) %.2f "
      "us (%.2fx at::mm), %d candidates\n",
      shape.c_str(), base, static_cast<double>(n * k * 2) / base * 1e-6, first, best_i, best,
      base / best, gemm.candidates());
  // k split into slices, a batch of GEMMs writing fp32 partial sums: whether more blocks reading
  // the weights beat at::mm's kernel (its sums alone: the partials' addition would go to the
  // kernel after the GEMM, which reads its output anyway). Each slice's sums are checked against
  // the same slice by at::mm in fp32.
  for (const int64_t splits : {2, 3, 4, 6, 8}) {
    if (k % splits != 0 || (k / splits) % 8 != 0) continue;
    const LtGemm split(handle, rows, n, k, splits);
    at::Tensor partial = at::empty({splits, rows, n}, options.dtype(at::kFloat));
    double split_best = 1e30;
    int split_best_i = -1;
    for (int i = 0; i < split.candidates(); ++i) {
      split.Run(i, w.back(), x, partial, workspace);
      const double diff = (partial.sum(0) - reference.to(at::kFloat)).abs().max().item<double>();
      if (diff > 0.1) {
        std::printf("  %s, %ld slices, candidate %d: wrong sums (%.3g off)\n", shape.c_str(),
                    static_cast<long>(splits), i, diff);
        continue;
      }
      const double us =
          per_layer([&](const at::Tensor& weight) { split.Run(i, weight, x, partial, workspace); });
      if (us < split_best) {
        split_best = us;
        split_best_i = i;
      }
    }
    // The same batch by at::bmm with fp32 outputs, over views of x and w (the engine's
    // kernels::SplitKPartials).
    const int64_t slice = k / splits;
    const at::Tensor x_slices = x.view({rows, splits, slice}).transpose(0, 1);
    const double bmm = per_layer([&](const at::Tensor& weight) {
      at::bmm_out(partial, x_slices, weight.view({n, splits, slice}).permute({1, 2, 0}),
                  at::kFloat);
    });
    std::printf(
        "%s, k in %ld slices: the best (%d of %d) %.2f us (%.2fx at::mm); %s; at::bmm %.2f us "
        "(%.2fx)\n",
        shape.c_str(), static_cast<long>(splits), split_best_i, split.candidates(), split_best,
        base / split_best, split_best_i >= 0 ? split.Config(split_best_i).c_str() : "none", bmm,
        base / bmm);
  }
}

}  // namespace

int main() {
  const auto options = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0);
  at::Tensor workspace = at::empty({static_cast<int64_t>(kWorkspaceBytes)}, options);
  c10::cuda::device_synchronize();  // the device's context, before LibTorch's cuBLASLt handle
  const cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  for (const int64_t rows : {64, 48, 33}) {
    // Qwen3-0.6B's q/k/v, o, gate/up and down projections.
    for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{
             {4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}}) {
      CompareShape(handle, workspace, rows, n, k);
    }
  }
  return 0;
}
