// The decode step's kernels (fused_ops.h) against the LibTorch ops they replace, on a GPU: bit for
// bit where the header says so, DecodeAttention within bf16 rounding of an fp64 reference and
// DsaIndexScores within fp32 rounding of one.
// Skipped loudly without a CUDA device (CI has none; the GPU machine runs it).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/model/layers.h"

namespace rl::kernels {
namespace {

bool HaveGpuOrWarn() {
  if (c10::cuda::device_count() > 0) return true;
  WARN("SKIPPED: no CUDA device; the decode kernel tests did not run");
  SUCCEED();
  return false;
}

at::TensorOptions On(at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(at::kCUDA);
}

// The same shape, dtype and bits, NaN included (at::equal counts a NaN unequal to itself, and the
// caches of these tests hold NaN past each row's position).
bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const auto bits = [](const at::Tensor& t) {
    const at::Tensor flat = t.contiguous().view(-1);
    switch (t.element_size()) {
      case 2:
        return flat.view(at::kShort);
      case 4:
        return flat.view(at::kInt);
      case 8:
        return flat.view(at::kLong);
      default:
        return flat;
    }
  };
  return at::equal(bits(a), bits(b));
}

// The RoPE the inference decoder applies to MLA's and the DSA indexer's heads: cos/sin of one
// position per row ([B, 1, half], Note [Ragged decode]), of one for the batch ([1, 1, half]) and
// of a prefill ([S, half]), bit for bit ApplyRope's ops, both layouts, a partial rotation, and a
// strided input (a narrow of the heads' last dim, as MLA's rotated part is).
TEST_CASE("RopeInference takes cos/sin per row, for the batch or per position, bit for bit") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(16);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (const bool interleaved : {false, true}) {
      const model::RopeLayout layout =
          interleaved ? model::RopeLayout::kInterleaved : model::RopeLayout::kHalf;
      for (const std::vector<int64_t>& table :
           {std::vector<int64_t>{5, 1, 32}, std::vector<int64_t>{1, 1, 32},
            std::vector<int64_t>{1, 32}}) {
        const int64_t seq = table.size() == 2 ? 7 : 1;
        const std::vector<int64_t> shape =
            table.size() == 2 ? std::vector<int64_t>{seq, 32} : table;
        const at::Tensor angles = at::rand(shape, On(at::kFloat)) * 6;
        const at::Tensor cos = angles.cos().to(dtype);
        const at::Tensor sin = angles.sin().to(dtype);
        const at::Tensor x = at::randn({5, seq, 4, 192}, On(dtype)).narrow(-1, 96, 96);
        // ApplyRope against x [B, H, S, D]: [S, half] as it is, [B or 1, S, half] per row.
        const at::Tensor c = cos.dim() == 3 ? cos.unsqueeze(1) : cos;
        const at::Tensor n = sin.dim() == 3 ? sin.unsqueeze(1) : sin;
        const at::Tensor want = model::ApplyRope(x.transpose(1, 2), c, n, layout).transpose(1, 2);
        CHECK(SameBits(RopeInference(x, cos, sin, interleaved), want.contiguous()));
      }
    }
  }
}

TEST_CASE("AddRmsNorm is the add and FusedRmsNorm, bit for bit") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(1);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (const auto& shape : {std::vector<int64_t>{64, 1, 1024}, std::vector<int64_t>{3, 7168}}) {
      const at::Tensor x = at::randn(shape, On(dtype)) * 4;
      const at::Tensor add = at::randn(shape, On(dtype));
      const at::Tensor weight = at::randn({shape.back()}, On(dtype));
      const AddNormed fused = AddRmsNorm(x, add, weight, 1e-6);
      const at::Tensor sum = x + add;
      CHECK(SameBits(fused.sum, sum));
      CHECK(SameBits(fused.normed, FusedRmsNorm(sum, weight, 1e-6)));
    }
  }
}

TEST_CASE("AddPartialsRmsNorm is AddRmsNorm of the partial sums added in slice order") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(2);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    // 1024 and 2000 columns: 4 and 8 elements a thread, the last ones of 2000 past the row.
    for (const int64_t cols : {1024, 2000}) {
      const at::Tensor x = at::randn({64, 1, cols}, On(dtype)) * 4;
      const at::Tensor partials = at::randn({kPartialSlices, 64, 1, cols}, On(at::kFloat));
      const at::Tensor weight = at::randn({cols}, On(dtype));
      at::Tensor total = partials[0].clone();
      for (int64_t s = 1; s < kPartialSlices; ++s) total = total + partials[s];  // in slice order
      const AddNormed fused = AddPartialsRmsNorm(x, partials, weight, 1e-6);
      const AddNormed want = AddRmsNorm(x, total.to(dtype), weight, 1e-6);
      INFO(cols << " columns, " << c10::toString(dtype));
      CHECK(SameBits(fused.sum, want.sum));
      CHECK(SameBits(fused.normed, want.normed));
    }
  }
  // Partial sums that do not match x's shape are refused, not broadcast.
  const at::Tensor x = at::randn({8, 1024}, On(at::kBFloat16));
  const at::Tensor w = at::randn({1024}, On(at::kBFloat16));
  CHECK_FALSE(ArePartialSums(at::randn({kPartialSlices, 8, 512}, On(at::kFloat)), x));
  CHECK_FALSE(ArePartialSums(at::randn({3, 8, 1024}, On(at::kFloat)), x));
  CHECK_THROWS(AddPartialsRmsNorm(x, at::randn({kPartialSlices, 8, 512}, On(at::kFloat)), w, 1e-6));
}

TEST_CASE("SplitKPartials add up to x w^T, for 33 to 64 rows of narrow, deep projections") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(3);
  for (const int64_t rows : {33, 48, 64}) {
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{1024, 2048}, {1024, 3072}, {2048, 4096}}) {
      INFO(rows << " rows, n " << n << ", k " << k);
      const at::Tensor x = at::randn({rows, 1, k}, On(at::kBFloat16));
      const at::Tensor w = at::randn({n, k}, On(at::kBFloat16)) / std::sqrt(double(k));
      REQUIRE(SplitKPartialsPay(x, w, {}));
      const at::Tensor partials = SplitKPartials(x, w);
      REQUIRE(partials.sizes() == at::IntArrayRef({kPartialSlices, rows, 1, n}));
      REQUIRE(ArePartialSums(partials, at::empty({rows, 1, n}, On(at::kBFloat16))));
      // Each slice is its own product, within fp32 rounding.
      const int64_t width = k / kPartialSlices;
      for (int64_t s = 0; s < kPartialSlices; ++s) {
        const at::Tensor slice = at::matmul(x.narrow(-1, s * width, width).to(at::kDouble),
                                            w.narrow(1, s * width, width).to(at::kDouble).t());
        CHECK((partials[s].to(at::kDouble) - slice).abs().max().item<double>() < 1e-4);
      }
      CHECK(SameBits(partials, SplitKPartials(x, w)));
    }
  }
  const at::Tensor o = at::randn({1024, 2048}, On(at::kBFloat16));
  CHECK_FALSE(
      SplitKPartialsPay(at::randn({32, 2048}, On(at::kBFloat16)), o, {}));  // SkinnyLinear's
  CHECK_FALSE(SplitKPartialsPay(at::randn({65, 2048}, On(at::kBFloat16)), o, {}));
  CHECK_FALSE(SplitKPartialsPay(at::randn({64, 2048}, On(at::kBFloat16)), o,
                                at::randn({1024}, On(at::kBFloat16))));  // a bias
  CHECK_FALSE(SplitKPartialsPay(at::randn({64, 1024}, On(at::kBFloat16)),
                                at::randn({4096, 1024}, On(at::kBFloat16)), {}));  // q/k/v's
  CHECK_FALSE(SplitKPartialsPay(at::randn({64, 2048}, On(at::kFloat)), o.to(at::kFloat), {}));
}

TEST_CASE("SiluMul is at::silu of the gate times the up half, bit for bit") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(2);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    const at::Tensor gate_up = at::randn({64, 1, 2 * 3072}, On(dtype)) * 3;
    const at::Tensor expected = at::silu(gate_up.narrow(-1, 0, 3072)) * gate_up.narrow(-1, 3072, 3072);
    CHECK(SameBits(SiluMul(gate_up), expected));
  }
}

TEST_CASE("SmallLinear is x w^T + b up to one rounding, for up to 2 rows") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(6);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (const int64_t rows : {1, 2}) {
      // Rows of 4 vectors of 16 bytes a lane or fewer (k 1000 ends within a vector's lanes), and
      // longer ones held 8 at a time (3000 features: more blocks than SMs) or 16 (1001 features,
      // whose last block has warps without a feature), in one pass or several (6144).
      struct LinearCase {
        bool with_bias;
        int64_t n, k;
      };
      for (const LinearCase& c : {LinearCase{false, 3000, 1024}, LinearCase{true, 3000, 1024},
                                  LinearCase{true, 3000, 3072}, LinearCase{false, 1001, 1000},
                                  LinearCase{false, 1001, 3072}, LinearCase{true, 1001, 6144},
                                  LinearCase{false, 3000, 6144}}) {
        const bool with_bias = c.with_bias;
        const int64_t k = c.k;
        const at::Tensor x = at::randn({rows, 1, k}, On(dtype));
        const at::Tensor w = at::randn({c.n, k}, On(dtype)) / std::sqrt(double(k));
        const at::Tensor b = with_bias ? at::randn({c.n}, On(dtype)) : at::Tensor();
        REQUIRE(SmallLinearTakes(x, w, b));
        const at::Tensor y = SmallLinear(x, w, b);
        at::Tensor expected = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
        if (with_bias) expected = expected + b.to(at::kDouble);
        INFO(rows << " rows, n " << c.n << ", k " << k << ", bias " << with_bias << ", "
                  << c10::toString(dtype));
        CHECK(y.sizes() == expected.sizes());
        // |y| < 8: one bf16 rounding is below 3.2e-2; fp32 sums of up to 6144 terms stay near
        // 1e-5.
        const double error = (y.to(at::kDouble) - expected).abs().max().item<double>();
        CHECK(error < (dtype == at::kBFloat16 ? 3.2e-2 : 3e-5));
      }
    }
  }
  // Three rows, a misaligned width or autograd are not taken.
  const at::Tensor w = at::randn({64, 1024}, On(at::kBFloat16));
  CHECK_FALSE(SmallLinearTakes(at::randn({3, 1024}, On(at::kBFloat16)), w, {}));
  CHECK_FALSE(SmallLinearTakes(at::randn({1, 1020}, On(at::kBFloat16)),
                               at::randn({64, 1020}, On(at::kBFloat16)), {}));
  CHECK_FALSE(SmallLinearTakes(at::randn({1, 1024}, On(at::kBFloat16)).requires_grad_(), w, {}));
}

// Note [Skinny linear kernel]: against fp64 from 3 to 64 rows (each count of row groups, rows that
// end within a group), with K in one chunk of 4, 8 or 16 warps or in several, warps without a
// piece (K = 96), features that end within a tile of 16, with and without a bias; the same bits
// again; and the inputs it does not take.
TEST_CASE("SkinnyLinear is x w^T + b up to one rounding, for 3 to 64 rows") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(22);
  struct LinearCase {
    bool with_bias;
    int64_t n, k;
  };
  for (const int64_t rows : {3, 8, 9, 16, 31, 33, 64}) {
    for (const LinearCase& c : {LinearCase{false, 4096, 1024}, LinearCase{true, 1000, 2048},
                                LinearCase{false, 1024, 3072}, LinearCase{true, 24, 96},
                                LinearCase{false, 1001, 6144}, LinearCase{true, 130, 512}}) {
      INFO(rows << " rows, n " << c.n << ", k " << c.k << ", bias " << c.with_bias);
      const at::Tensor x = at::randn({rows, 1, c.k}, On(at::kBFloat16));
      const at::Tensor w = at::randn({c.n, c.k}, On(at::kBFloat16)) / std::sqrt(double(c.k));
      const at::Tensor b = c.with_bias ? at::randn({c.n}, On(at::kBFloat16)) : at::Tensor();
      REQUIRE(SkinnyLinearTakes(x, w, b));
      at::Tensor expected = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
      if (c.with_bias) expected = expected + b.to(at::kDouble);
      const at::Tensor y = SkinnyLinear(x, w, b);
      REQUIRE(y.sizes() == expected.sizes());
      // |y| < 8: one bf16 rounding is below 3.2e-2.
      CHECK((y.to(at::kDouble) - expected).abs().max().item<double>() < 3.2e-2);
      CHECK(SameBits(y, SkinnyLinear(x, w, b)));
    }
  }
  const at::Tensor w = at::randn({64, 1024}, On(at::kBFloat16));
  CHECK_FALSE(SkinnyLinearTakes(at::randn({2, 1024}, On(at::kBFloat16)), w, {}));   // SmallLinear's
  CHECK_FALSE(SkinnyLinearTakes(at::randn({65, 1024}, On(at::kBFloat16)), w, {}));  // cuBLAS's
  CHECK_FALSE(SkinnyLinearTakes(at::randn({8, 1024}, On(at::kFloat)), w.to(at::kFloat), {}));
  CHECK_FALSE(SkinnyLinearTakes(at::randn({8, 1000}, On(at::kBFloat16)),
                                at::randn({64, 1000}, On(at::kBFloat16)), {}));
  // Where it pays: up to 32 rows of up to 2048 features.
  const at::Tensor o = at::randn({2048, 1024}, On(at::kBFloat16));
  CHECK(SkinnyLinearPays(at::randn({32, 1024}, On(at::kBFloat16)), o, {}));
  CHECK_FALSE(SkinnyLinearPays(at::randn({33, 1024}, On(at::kBFloat16)), o, {}));
  CHECK_FALSE(SkinnyLinearPays(at::randn({8, 1024}, On(at::kBFloat16)),
                               at::randn({2049, 1024}, On(at::kBFloat16)), {}));
}

// Note [Gate/up projection with SiluMul on tensor cores]: against SiluMul of the fp64 products
// rounded to bf16, from 33 to 64 rows (rows that end within a warp's 16), with k's tiles all in the
// ring, cycled through a ring of 16 stages, and through the 7 of a grid of two blocks an SM, with
// features that end within a block's 24 (1000 and 26); the same bits again; each row's output the
// same bits whatever the batch's other rows; and the shapes it does not take.
TEST_CASE("GateUpSiluMma is SiluMul of x w^T rounded to bf16, for 33 to 64 rows") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(24);
  struct GateUpCase {
    int64_t inner, k;
  };
  for (const int64_t rows : {33, 40, 64}) {
    for (const GateUpCase& c : {GateUpCase{3072, 1024}, GateUpCase{240, 2048},
                                GateUpCase{9984, 1024}, GateUpCase{48, 64},
                                GateUpCase{1000, 1024}, GateUpCase{26, 128}}) {
      INFO(rows << " rows, inner " << c.inner << ", k " << c.k);
      const at::Tensor x = at::randn({rows, 1, c.k}, On(at::kBFloat16));
      const at::Tensor w =
          at::randn({2 * c.inner, c.k}, On(at::kBFloat16)) / std::sqrt(double(c.k));
      REQUIRE(GateUpSiluMmaTakes(x, w));
      const at::Tensor products = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
      const at::Tensor expected = SiluMul(products.to(at::kBFloat16));
      const at::Tensor y = GateUpSiluMma(x, w);
      REQUIRE(y.sizes() == expected.sizes());
      // fp32 sums in another order than fp64's round to another bf16 only next to a rounding
      // boundary: nearly every element has SiluMul's bits, and the rest are within a few of
      // bf16's roundings of |g u| <= ~16.
      const at::Tensor diff = (y.to(at::kDouble) - expected.to(at::kDouble)).abs();
      CHECK(diff.eq(0).to(at::kDouble).mean().item<double>() > 0.99);
      CHECK((diff / (expected.to(at::kDouble).abs() + 1)).max().item<double>() < 3e-2);
      CHECK(SameBits(y, GateUpSiluMma(x, w)));
      // The first 33 rows alone give their rows of the whole batch.
      CHECK(SameBits(GateUpSiluMma(x.narrow(0, 0, 33), w), y.narrow(0, 0, 33)));
    }
  }
  const at::Tensor w = at::randn({6144, 1024}, On(at::kBFloat16));
  CHECK_FALSE(GateUpSiluMmaTakes(at::randn({32, 1024}, On(at::kBFloat16)), w));  // Skinny's
  CHECK_FALSE(GateUpSiluMmaTakes(at::randn({65, 1024}, On(at::kBFloat16)), w));  // cuBLAS's
  CHECK_FALSE(GateUpSiluMmaTakes(at::randn({64, 1024}, On(at::kFloat)), w.to(at::kFloat)));
  CHECK_FALSE(GateUpSiluMmaTakes(at::randn({64, 1000}, On(at::kBFloat16)),
                                 at::randn({6144, 1000}, On(at::kBFloat16))));  // k % 64
  CHECK_FALSE(GateUpSiluMmaTakes(at::randn({64, 1024}, On(at::kBFloat16)),
                                 at::randn({202, 1024}, On(at::kBFloat16))));  // odd inner
}

TEST_CASE("The folded projections equal the unfolded kernels bit for bit") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(8);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (const int64_t rows : {1, 2}) {
      const at::Tensor x = at::randn({rows, 1, 1024}, On(dtype)) * 3;
      const at::Tensor add = at::randn({rows, 1, 1024}, On(dtype));
      const at::Tensor norm = at::randn({1024}, On(dtype));
      const at::Tensor w = at::randn({4096, 1024}, On(dtype)) / 32;
      const at::Tensor b = at::randn({4096}, On(dtype));
      REQUIRE(SmallLinearStagedTakes(x, 1024, w, b));
      const SummedLinear folded = SmallLinearAddRmsNorm(x, add, norm, 1e-6, w, b);
      const AddNormed unfolded = AddRmsNorm(x, add, norm, 1e-6);
      CHECK(SameBits(folded.sum, unfolded.sum));
      CHECK(SameBits(folded.out, SmallLinear(unfolded.normed, w, b)));
      // Without an add: the norm of x alone, and x as the sum.
      const SummedLinear first = SmallLinearAddRmsNorm(x, {}, norm, 1e-6, w, b);
      CHECK(SameBits(first.out, SmallLinear(FusedRmsNorm(x, norm, 1e-6), w, b)));
      CHECK(first.sum.data_ptr() == x.data_ptr());

      const at::Tensor gate_up = at::randn({rows, 1, 2 * 3072}, On(dtype)) * 3;
      const at::Tensor down = at::randn({1024, 3072}, On(dtype)) / 64;
      CHECK(SameBits(SmallLinearSiluMul(gate_up, down, {}), SmallLinear(SiluMul(gate_up), down, {})));

      // Warps without a feature still stage the input with the rest of their block (1001
      // features), and an input over several passes of 16 vectors a lane (6144).
      const at::Tensor narrow = at::randn({1001, 1024}, On(dtype)) / 32;
      CHECK(SameBits(SmallLinearAddRmsNorm(x, add, norm, 1e-6, narrow, {}).out,
                     SmallLinear(unfolded.normed, narrow, {})));
      const at::Tensor wide_gate_up = at::randn({rows, 1, 2 * 6144}, On(dtype)) * 3;
      const at::Tensor wide_down = at::randn({1001, 6144}, On(dtype)) / 64;
      CHECK(SameBits(SmallLinearSiluMul(wide_gate_up, wide_down, {}),
                     SmallLinear(SiluMul(wide_gate_up), wide_down, {})));
    }
  }
  // Inputs larger than the staging memory are not taken.
  const at::Tensor wide = at::randn({2, 1, 65536}, On(at::kFloat));
  CHECK_FALSE(SmallLinearStagedTakes(wide, 65536, at::randn({8, 65536}, On(at::kFloat)), {}));
}

// Note [Small linear with weights in shared memory]: each form of SmallLinear gives the same bits
// with the weights in shared memory as in registers: at Qwen3-0.6B's projections and others that
// fit (a last block short of features, one feature a block, rows ending within a lane's vectors,
// no add), and where the register kernel runs either way (too large, a norm weight not aligned
// to 16 bytes). Each case states which kernel the default takes.
TEST_CASE("SmallLinear with its weights in shared memory gives the register kernel's bits") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(9);
  // y of `run` with the weights in shared memory (the default) and in registers, bit for bit.
  const auto same_both_ways = [](const auto& run) {
    at::Tensor shared, registers;
    {
      const SharedWeightLinear on(true);
      shared = run();
    }
    {
      const SharedWeightLinear off(false);
      registers = run();
    }
    return SameBits(shared, registers);
  };
  struct Case {
    int64_t n, k;
    bool shares_bf16, shares_fp32;  // rows 1 and 2 alike in these cases
  };
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    const DtypeCode code = dtype == at::kBFloat16 ? kBFloat16 : kFloat32;
    for (const int64_t rows : {1, 2}) {
      // The folded norm: q/k/v and gate/up of Qwen3-0.6B, others, one too large.
      for (const Case& c : {Case{4096, 1024, true, false}, Case{6144, 1024, true, false},
                            Case{2048, 1024, true, true}, Case{1001, 1024, true, true},
                            Case{100, 1000, true, true}, Case{40000, 1024, false, false}}) {
        INFO(rows << " rows, " << c10::toString(dtype) << ", AddRmsNorm, n " << c.n << ", k "
                  << c.k);
        const at::Tensor x = at::randn({rows, 1, c.k}, On(dtype)) * 3;
        const at::Tensor add = at::randn({rows, 1, c.k}, On(dtype));
        const at::Tensor norm_storage = at::randn({c.k + 1}, On(dtype));
        const at::Tensor norm = norm_storage.narrow(0, 0, c.k);
        const at::Tensor w = at::randn({c.n, c.k}, On(dtype)) / 32;
        const at::Tensor b = at::randn({c.n}, On(dtype));
        CHECK(SmallLinearSharesWeights(rows, c.n, c.k, norm.data_ptr(), true, code) ==
              (dtype == at::kBFloat16 ? c.shares_bf16 : c.shares_fp32));
        CHECK(same_both_ways([&] { return SmallLinearAddRmsNorm(x, add, norm, 1e-6, w, b).out; }));
        CHECK(same_both_ways([&] { return SmallLinearAddRmsNorm(x, add, norm, 1e-6, w, b).sum; }));
        CHECK(same_both_ways([&] { return SmallLinearAddRmsNorm(x, {}, norm, 1e-6, w, b).out; }));
        // A norm weight 2 or 4 bytes past a 16-byte boundary: the register kernel.
        const at::Tensor misaligned = norm_storage.narrow(0, 1, c.k);
        CHECK_FALSE(SmallLinearSharesWeights(rows, c.n, c.k, misaligned.data_ptr(), true, code));
        CHECK(same_both_ways(
            [&] { return SmallLinearAddRmsNorm(x, add, misaligned, 1e-6, w, b).out; }));
      }
      // The o projection (plain input) and the down projection (SiluMul folded in).
      for (const Case& c : {Case{1024, 2048, true, true}, Case{1001, 3072, true, rows == 1},
                            Case{512, 3072, true, true}, Case{100, 1000, true, true}}) {
        INFO(rows << " rows, " << c10::toString(dtype) << ", n " << c.n << ", k " << c.k);
        const at::Tensor w = at::randn({c.n, c.k}, On(dtype)) / 45;
        const at::Tensor x = at::randn({rows, 1, c.k}, On(dtype));
        const at::Tensor gate_up = at::randn({rows, 1, 2 * c.k}, On(dtype)) * 3;
        CHECK(SmallLinearSharesWeights(rows, c.n, c.k, nullptr, false, code));
        CHECK(same_both_ways([&] { return SmallLinear(x, w, {}); }));
        CHECK(SmallLinearSharesWeights(rows, c.n, c.k, nullptr, true, code) ==
              (dtype == at::kBFloat16 ? c.shares_bf16 : c.shares_fp32));
        CHECK(same_both_ways([&] { return SmallLinearSiluMul(gate_up, w, {}); }));
        // gate_up 2 or 4 bytes past a 16-byte boundary: staged element by element, not by
        // vectors; the same bits.
        const at::Tensor storage = at::empty({rows * 2 * c.k + 1}, On(dtype));
        const at::Tensor misaligned =
            storage.narrow(0, 1, rows * 2 * c.k).view({rows, 1, 2 * c.k}).copy_(gate_up);
        CHECK(same_both_ways([&] { return SmallLinearSiluMul(misaligned, w, {}); }));
        CHECK(SameBits(SmallLinearSiluMul(misaligned, w, {}), SmallLinearSiluMul(gate_up, w, {})));
      }
    }
  }
  CHECK(SharedWeightLinear::On());  // the scopes restored the default
  const SharedWeightLinear off(false);
  CHECK_FALSE(SmallLinearSharesWeights(1, 1024, 2048, nullptr, false, kBFloat16));
}

// Note [Programmatic dependent launch]: a chain of decode kernels (SmallLinear in each form,
// SkinnyLinear, DecodeQkvAttention, RoPE, the norms and SiluMul), each reading what the one before
// wrote, launched so that each may start before the one ahead has finished, gives the bits of the
// same chain launched one after another, eagerly (on the default stream) and replayed from a
// graph. A kernel that read its input before its wait would read a buffer of an earlier
// link or one about to be written (the caching allocator hands the links' buffers round).
TEST_CASE("Programmatic dependent launch gives a chain of decode kernels the same bits") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(21);
  const at::TensorOptions options = On(at::kBFloat16);
  const at::Tensor x = at::randn({1, 1, 1024}, options);
  const at::Tensor norm = at::randn({1024}, options);
  const at::Tensor w_in = at::randn({1024, 1024}, options) / 32;
  const at::Tensor w_gate_up = at::randn({3072, 1024}, options) / 32;
  const at::Tensor w_down = at::randn({1024, 1536}, options) / 40;
  const at::Tensor head = at::randn({4096, 1024}, options) / 32;
  // 64 rows (and 5) through SkinnyLinear, DecodeQkvAttention over a cache of 256 positions at a
  // position per row, RoPE and the norms.
  const at::Tensor rows = at::randn({64, 1, 1024}, options);
  const at::Tensor w_qkv = at::randn({4096, 1024}, options) / 32;
  const at::Tensor w_o = at::randn({1024, 2048}, options) / 45;
  const at::Tensor head_norm = at::randn({128}, options);
  const at::Tensor angles = at::rand({1, 64}, On(at::kFloat)) * 6;
  const at::Tensor cos = angles.cos().to(at::kBFloat16);
  const at::Tensor sin = angles.sin().to(at::kBFloat16);
  const at::Tensor table = at::rand({256, 64}, On(at::kFloat)) * 6;  // a RoPE table's angles
  const at::Tensor table_cos = table.cos().to(at::kBFloat16);
  const at::Tensor table_sin = table.sin().to(at::kBFloat16);
  std::vector<DecodeCache> caches;
  const at::Tensor positions = at::randint(256, {64}, On(at::kLong));
  for (int layer = 0; layer < 4; ++layer) {
    const at::Tensor key = at::randn({64, 8, 256, 128}, options);
    caches.push_back(DecodeCache{key, at::randn_like(key), positions});
  }
  // Layers of SmallLinearAddRmsNorm, SmallLinear, SiluMul (folded or not), AddRmsNorm, and a
  // last norm and projection, for one row; then the 64 rows' layers and 5 rows'.
  const auto chain = [&] {
    at::Tensor h = x, residual = x;
    for (int layer = 0; layer < 12; ++layer) {
      const SummedLinear in = SmallLinearAddRmsNorm(h, residual, norm, 1e-6, w_in, {});
      const at::Tensor gate_up = SmallLinear(in.out, w_gate_up, {});
      const at::Tensor down = layer % 2 == 0 ? SmallLinearSiluMul(gate_up, w_down, {})
                                             : SmallLinear(SiluMul(gate_up), w_down, {});
      const AddNormed next = AddRmsNorm(down, in.sum, norm, 1e-6);
      h = next.normed;
      residual = next.sum;
    }
    at::Tensor wide = rows;
    for (const DecodeCache& cache : caches) {
      const at::Tensor qkv = SkinnyLinear(wide, w_qkv, {});
      const at::Tensor attended = DecodeQkvAttention(qkv, head_norm, head_norm, 1e-6, table_cos,
                                                     table_sin, false, 16, 8, 128, cache, 256,
                                                     0.088);
      const at::Tensor o = SkinnyLinear(attended.view({64, 1, 2048}), w_o, {});
      const at::Tensor rotated = RopeInference(o.view({64, 1, 8, 128}), cos, sin, false);
      wide = AddRmsNorm(rotated.view({64, 1, 1024}), wide, norm, 1e-6).normed;
    }
    at::Tensor few = rows.narrow(0, 0, 5);
    for (int layer = 0; layer < 4; ++layer)
      few = FusedRmsNorm(SkinnyLinear(few, w_in, {}), norm, 1e-6);
    return at::cat({SmallLinear(FusedRmsNorm(residual, norm, 1e-6), head, {}).flatten(),
                    wide.flatten(), few.flatten()});
  };
  const at::Tensor sequential = chain();
  {
    const ProgrammaticLaunch programmatic(true);
    REQUIRE(ProgrammaticLaunch::On());  // compute capability 9.0 and later
    for (int run = 0; run < 3; ++run) CHECK(SameBits(chain(), sequential));
    REQUIRE(ProgrammaticLaunch::On());  // no launch was refused the attribute (default stream)
    at::cuda::CUDAGraph graph;
    at::Tensor replayed;
    {
      const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
      graph.capture_begin();
      replayed = chain();
      graph.capture_end();
    }
    for (int replay = 0; replay < 3; ++replay) {
      graph.replay();
      c10::cuda::device_synchronize();
      CHECK(SameBits(replayed, sequential));
    }
  }
  CHECK_FALSE(ProgrammaticLaunch::On());  // the scope restored the setting it found
}

struct PrepCase {
  int64_t q_heads, kv_heads, dim, half;
  bool norms, interleaved;
};

TEST_CASE("DecodeQkvPrep is RmsNorm, RoPE and the cache writes, bit for bit") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(3);
  const int64_t batch = 5, max_length = 40, position = 17;
  for (const PrepCase& c : {PrepCase{16, 8, 128, 64, true, false},
                            PrepCase{32, 4, 128, 32, false, false},
                            PrepCase{8, 8, 64, 32, true, true}, PrepCase{4, 2, 256, 128, true, false}}) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      const int64_t width = (c.q_heads + 2 * c.kv_heads) * c.dim;
      const at::Tensor qkv = at::randn({batch, 1, width}, On(dtype)) * 2;
      const at::Tensor q_norm = c.norms ? at::randn({c.dim}, On(dtype)) : at::Tensor();
      const at::Tensor k_norm = c.norms ? at::randn({c.dim}, On(dtype)) : at::Tensor();
      const at::Tensor cos = at::randn({max_length, c.half}, On(dtype));  // a RoPE table
      const at::Tensor sin = at::randn({max_length, c.half}, On(dtype));
      at::Tensor key = at::zeros({batch + 1, c.kv_heads, max_length, c.dim}, On(dtype));
      at::Tensor value = at::zeros_like(key);
      const at::Tensor pos = at::full({1}, position, On(at::kLong));
      const at::Tensor q = DecodeQkvPrep(qkv, q_norm, k_norm, 1e-6, cos, sin, c.interleaved,
                                         c.q_heads, c.kv_heads, c.dim, DecodeCache{key, value, pos});

      // The ops GqaAttention runs without the decode kernels.
      at::Tensor q_ref = qkv.narrow(-1, 0, c.q_heads * c.dim).view({batch, 1, c.q_heads, c.dim});
      at::Tensor k_ref =
          qkv.narrow(-1, c.q_heads * c.dim, c.kv_heads * c.dim).view({batch, 1, c.kv_heads, c.dim});
      const at::Tensor v_ref = qkv.narrow(-1, (c.q_heads + c.kv_heads) * c.dim, c.kv_heads * c.dim)
                                   .view({batch, c.kv_heads, c.dim});
      if (c.norms) {
        q_ref = FusedRmsNorm(q_ref, q_norm, 1e-6);
        k_ref = FusedRmsNorm(k_ref, k_norm, 1e-6);
      }
      const at::Tensor row_cos = cos.narrow(0, position, 1);  // the position's angles
      const at::Tensor row_sin = sin.narrow(0, position, 1);
      q_ref = RopeInference(q_ref, row_cos, row_sin, c.interleaved)
                  .view({batch, c.q_heads, c.dim});
      k_ref = RopeInference(k_ref, row_cos, row_sin, c.interleaved)
                  .view({batch, c.kv_heads, c.dim});
      CHECK(SameBits(q, q_ref));
      CHECK(SameBits(key.narrow(0, 0, batch).select(2, position), k_ref));
      CHECK(SameBits(value.narrow(0, 0, batch).select(2, position), v_ref));
      // Nothing else was written.
      key.narrow(0, 0, batch).select(2, position).zero_();
      value.narrow(0, 0, batch).select(2, position).zero_();
      CHECK(key.abs().sum().item<double>() == 0);
      CHECK(value.abs().sum().item<double>() == 0);
    }
  }
}

// softmax(q k^T scale) v over positions [0, position] in fp64, q [B, Hq, D], caches [B, Hkv, T, D].
at::Tensor ReferenceAttention(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                              int64_t position, double scale) {
  const int64_t batch = q.size(0), q_heads = q.size(1), dim = q.size(2);
  const int64_t group = q_heads / key.size(1);
  const at::Tensor k = key.narrow(0, 0, batch).narrow(2, 0, position + 1).to(at::kDouble)
                           .repeat_interleave(group, 1);  // [B, Hq, P, D]
  const at::Tensor v = value.narrow(0, 0, batch).narrow(2, 0, position + 1).to(at::kDouble)
                           .repeat_interleave(group, 1);
  const at::Tensor scores = at::matmul(q.to(at::kDouble).unsqueeze(2), k.transpose(2, 3)) * scale;
  return at::matmul(at::softmax(scores, -1), v).view({batch, q_heads * dim});
}

struct AttentionCase {
  int64_t batch, q_heads, kv_heads, dim, key_length, position;
};

// PlanDecodeAttention is host code: this case runs without a GPU too. On tensor cores each split
// holds at least four tiles of 16 keys for every warp of its block (256 keys), so a cache of
// fewer than 512 positions is one split at any batch; the CUDA-core kernel's splits stay as short
// as one iteration of every warp.
TEST_CASE("A decode attention split on tensor cores holds at least 256 keys") {
  for (const int64_t batch : {1, 2, 8, 64}) {
    for (const int64_t key_length : {64, 256, 511, 4096, 32768}) {
      const DecodeAttentionShape p = PlanDecodeAttention(batch, 16, 8, key_length, 0.1f, 0, true);
      INFO("batch " << batch << ", " << key_length << " keys: " << p.splits << " splits of "
                    << p.chunk);
      CHECK(p.splits >= 1);
      CHECK(p.chunk * p.splits >= key_length);
      CHECK((p.splits - 1) * p.chunk < key_length);  // no split past the keys
      if (p.splits > 1) CHECK(p.chunk >= 256);
      if (key_length < 512) CHECK(p.splits == 1);
    }
  }
  CHECK(PlanDecodeAttention(1, 16, 8, 32768, 0.1f, 0, true).splits > 1);
  CHECK(PlanDecodeAttention(1, 16, 8, 256, 0.1f, 0, false).splits > 1);
}

TEST_CASE("DecodeAttention is softmax attention over the positions up to the step's") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(4);
  // Batch 1 splits the keys over many blocks (on tensor cores from 512 keys), batch 64 over few;
  // 96 / 8 and 24 / 4 heads take 4 and 2 query heads per block.
  for (const AttentionCase& c :
       {AttentionCase{1, 16, 8, 128, 256, 130}, AttentionCase{64, 16, 8, 128, 256, 200},
        AttentionCase{3, 32, 4, 128, 512, 0}, AttentionCase{2, 8, 8, 64, 64, 63},
        AttentionCase{4, 16, 2, 256, 1024, 700}, AttentionCase{2, 96, 8, 128, 256, 77},
        AttentionCase{1, 24, 4, 64, 512, 511},
        // The last key of a split and the first of the next (768 keys: 3 splits of 256 at
        // batch 1 on tensor cores).
        AttentionCase{1, 16, 8, 128, 768, 255}, AttentionCase{1, 16, 8, 128, 768, 256}}) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      at::Tensor key = at::randn({c.batch + 1, c.kv_heads, c.key_length + 8, c.dim}, On(dtype));
      at::Tensor value = at::randn_like(key);
      // Positions past the step's hold NaN: they must not be read.
      key.narrow(2, c.position + 1, c.key_length + 7 - c.position).fill_(NAN);
      value.narrow(2, c.position + 1, c.key_length + 7 - c.position).fill_(NAN);
      const at::Tensor q = at::randn({c.batch, c.q_heads, c.dim}, On(dtype));
      const DecodeCache cache{key, value, at::full({1}, c.position, On(at::kLong))};
      REQUIRE(DecodeAttentionTakes(c.q_heads, cache));
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
      const at::Tensor expected = ReferenceAttention(q, key, value, c.position, scale);
      // bf16 on tensor cores and on CUDA cores (fp32 has only the latter).
      for (const bool tensor_cores : {true, false}) {
        const at::Tensor out = DecodeAttention(q, cache, c.key_length, scale, 0, tensor_cores);
        const double error = (out.to(at::kDouble) - expected).abs().max().item<double>();
        INFO("batch " << c.batch << ", heads " << c.q_heads << "/" << c.kv_heads << ", dim "
                      << c.dim << ", position " << c.position << ", " << c10::toString(dtype)
                      << ", tensor cores " << tensor_cores);
        // bf16: one rounding of outputs of magnitude < 4 (and of the weights, on tensor cores);
        // fp32: summation order.
        CHECK(error < (dtype == at::kBFloat16 ? 1.6e-2 : 1e-5));
      }
    }
  }
}

TEST_CASE("DecodeQkvAttention is DecodeQkvPrep and then DecodeAttention, bit for bit") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(10);
  struct FusedCase {
    int64_t batch, q_heads, kv_heads, dim, half;
    bool norms, interleaved;
    int64_t key_length;
  };
  // Many splits (batch 1), one split (batch 64), 1, 2 and 8 query heads per key/value head.
  for (const FusedCase& c : {FusedCase{1, 16, 8, 128, 64, true, false, 256},
                             FusedCase{64, 16, 8, 128, 64, true, false, 256},
                             FusedCase{3, 32, 4, 128, 32, false, false, 512},
                             FusedCase{2, 8, 8, 64, 32, true, true, 64},
                             FusedCase{2, 4, 2, 256, 128, true, false, 96}}) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      // The first position, one in the middle, the last, and the last and first rows of a ring
      // stage, where the block puts the step's rows into its ring (Note [The step's key and
      // value in the ring] in decode_kernels.cu): 16-key tiles on tensor cores (63 / 64: the
      // last row of warp 3's first tile and the first of the next tile, warp 4's at batch 1, in
      // the 8-warp form, and warp 0's second at batch 64, in the 4-warp form), iterations of 4
      // keys on CUDA cores (35 / 36: the first warp's third and the second warp's).
      for (const int64_t position : {int64_t{0}, int64_t{16}, int64_t{35}, int64_t{36}, int64_t{63},
                                     int64_t{64}, c.key_length / 2 + 3, c.key_length - 1}) {
        if (position >= c.key_length) continue;
        const int64_t width = (c.q_heads + 2 * c.kv_heads) * c.dim;
        const at::Tensor qkv = at::randn({c.batch, 1, width}, On(dtype)) * 2;
        const at::Tensor q_norm = c.norms ? at::randn({c.dim}, On(dtype)) : at::Tensor();
        const at::Tensor k_norm = c.norms ? at::randn({c.dim}, On(dtype)) : at::Tensor();
        const at::Tensor cos = at::randn({c.key_length, c.half}, On(dtype));  // a RoPE table
        const at::Tensor sin = at::randn({c.key_length, c.half}, On(dtype));
        const at::Tensor key = at::randn({c.batch + 1, c.kv_heads, c.key_length, c.dim}, On(dtype));
        const at::Tensor value = at::randn_like(key);
        const at::Tensor pos = at::full({1}, position, On(at::kLong));
        const DecodeCache fused_cache{key.clone(), value.clone(), pos};
        const DecodeCache cache{key.clone(), value.clone(), pos};
        REQUIRE(DecodeQkvAttentionTakes(c.q_heads, cache));
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
        const at::Tensor fused =
            DecodeQkvAttention(qkv, q_norm, k_norm, 1e-6, cos, sin, c.interleaved, c.q_heads,
                               c.kv_heads, c.dim, fused_cache, c.key_length, scale);
        const at::Tensor q = DecodeQkvPrep(qkv, q_norm, k_norm, 1e-6, cos, sin, c.interleaved,
                                           c.q_heads, c.kv_heads, c.dim, cache);
        INFO("batch " << c.batch << ", heads " << c.q_heads << "/" << c.kv_heads << ", dim "
                      << c.dim << ", position " << position << ", " << c10::toString(dtype));
        CHECK(SameBits(fused, DecodeAttention(q, cache, c.key_length, scale)));
        CHECK(SameBits(fused_cache.key, cache.key));
        CHECK(SameBits(fused_cache.value, cache.value));
      }
    }
  }
  // More than 8 query heads per key/value head take two kernels.
  const at::Tensor key = at::zeros({1, 2, 64, 128}, On(at::kBFloat16));
  const DecodeCache cache{key, key.clone(), at::zeros({1}, On(at::kLong))};
  CHECK_FALSE(DecodeQkvAttentionTakes(32, cache));
}

// Note [One tile a warp for a grid of more than a wave] in decode_kernels.cu: 64 rows of 8 head
// groups (512 blocks) take two waves of the two-tile form on an H100 or H200 and one of the one-tile
// form, whose warps sum the same keys in the same order; 16 rows (128 blocks) take the two-tile
// form. So each row has the same bits in both grids, with and without the preparation, and the
// caches are written alike. 256 keys keep both grids at one split.
TEST_CASE("A decode attention row has the same bits in a grid of one wave and of more") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(12);
  const int64_t q_heads = 16, kv_heads = 8, dim = 128, half = 64, key_length = 256;
  const int64_t rows = 64, few = 16;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (const bool prep : {true, false}) {
    const auto takes = [&](int64_t batch) {
      return DecodeAttentionTakesOneTile(
          batch, dim, PlanDecodeAttention(batch, q_heads, kv_heads, key_length, 0.1f, 0, true),
          prep);
    };
    if (!takes(rows)) {
      WARN("this GPU runs 64 rows of the attention in one wave: no one-tile grid to compare");
      return;
    }
    REQUIRE_FALSE(takes(few));
  }
  // Positions: the first tile's last key; the first key of warp 1's and of warp 3's first tile (a
  // warp with one key, the step's, and one empty group of copies); a tile of one key; one in the
  // middle; the last key; then a position per row (-1).
  for (const int64_t position : {int64_t{15}, int64_t{16}, int64_t{48}, int64_t{64}, int64_t{131},
                                 key_length - 1, int64_t{-1}}) {
    INFO("position " << position);
    const at::Tensor qkv = at::randn({rows, 1, (q_heads + 2 * kv_heads) * dim}, On(at::kBFloat16));
    const at::Tensor q_norm = at::randn({dim}, On(at::kBFloat16));
    const at::Tensor k_norm = at::randn({dim}, On(at::kBFloat16));
    const at::Tensor cos = at::randn({key_length, half}, On(at::kBFloat16));
    const at::Tensor sin = at::randn({key_length, half}, On(at::kBFloat16));
    const at::Tensor key = at::randn({rows, kv_heads, key_length, dim}, On(at::kBFloat16));
    const at::Tensor value = at::randn_like(key);
    const at::Tensor pos = position >= 0 ? at::full({1}, position, On(at::kLong))
                                         : at::randint(key_length, {rows}, On(at::kLong));
    const at::Tensor first_pos = position >= 0 ? pos : pos.narrow(0, 0, few);
    const DecodeCache all{key.clone(), value.clone(), pos};
    const DecodeCache first{key.narrow(0, 0, few).clone(), value.narrow(0, 0, few).clone(),
                            first_pos};
    const at::Tensor all_out = DecodeQkvAttention(qkv, q_norm, k_norm, 1e-6, cos, sin, false,
                                                  q_heads, kv_heads, dim, all, key_length, scale);
    const at::Tensor first_out =
        DecodeQkvAttention(qkv.narrow(0, 0, few), q_norm, k_norm, 1e-6, cos, sin, false, q_heads,
                           kv_heads, dim, first, key_length, scale);
    CHECK(SameBits(all_out.narrow(0, 0, few), first_out));
    CHECK(SameBits(all.key.narrow(0, 0, few), first.key));
    CHECK(SameBits(all.value.narrow(0, 0, few), first.value));
    const at::Tensor q = at::randn({rows, q_heads, dim}, On(at::kBFloat16));
    CHECK(SameBits(DecodeAttention(q, all, key_length, scale).narrow(0, 0, few),
                   DecodeAttention(q.narrow(0, 0, few), first, key_length, scale)));
  }
}

// Note [The o projection in the attention's clusters] in decode_kernels.cu: the partial sums are
// each head group's share of the o projection of DecodeQkvAttention's output (the attention's
// keys merged over a cluster, so within rounding of it), the caches are written bit for bit as
// DecodeQkvAttention writes them, and the gate/up projection's staging adds the partial sums in
// head order, bit for bit.
TEST_CASE("DecodeQkvAttentionO is DecodeQkvAttention and the o projection, by head group") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(11);
  struct OCase {
    int64_t batch, q_heads, kv_heads, hidden, key_length;
  };
  // Qwen3-0.6B's shape; 4 query heads per key/value head at two rows, splits of 256 keys (two
  // ring tiles a warp); one query head each, over fewer keys than a cluster has blocks at the
  // first position.
  for (const OCase& c : {OCase{1, 16, 8, 1024, 256}, OCase{2, 32, 8, 512, 2048},
                         OCase{1, 8, 8, 2048, 64}}) {
    for (const int64_t position : {int64_t{0}, int64_t{5}, int64_t{33}, c.key_length / 2 + 3,
                                   c.key_length - 1}) {
      const int64_t dim = 128, half = 64;
      const at::ScalarType bf16 = at::kBFloat16;
      const at::Tensor qkv =
          at::randn({c.batch, 1, (c.q_heads + 2 * c.kv_heads) * dim}, On(bf16)) * 2;
      const at::Tensor q_norm = at::randn({dim}, On(bf16));
      const at::Tensor k_norm = at::randn({dim}, On(bf16));
      const at::Tensor cos = at::randn({c.key_length, half}, On(bf16));  // a RoPE table
      const at::Tensor sin = at::randn({c.key_length, half}, On(bf16));
      const at::Tensor key = at::randn({c.batch, c.kv_heads, c.key_length, dim}, On(bf16));
      const at::Tensor value = at::randn_like(key);
      const at::Tensor pos = at::full({1}, position, On(at::kLong));
      const at::Tensor o_proj = at::randn({c.hidden, c.q_heads * dim}, On(bf16)) / 32;
      const DecodeCache fused_cache{key.clone(), value.clone(), pos};
      const DecodeCache cache{key.clone(), value.clone(), pos};
      REQUIRE(DecodeQkvAttentionOTakes(c.q_heads, cache, c.key_length, o_proj, {}));
      const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
      const at::Tensor partials =
          DecodeQkvAttentionO(qkv, q_norm, k_norm, 1e-6, cos, sin, false, c.q_heads, c.kv_heads,
                              dim, fused_cache, c.key_length, scale, o_proj);
      const at::Tensor attention = DecodeQkvAttention(qkv, q_norm, k_norm, 1e-6, cos, sin, false,
                                                      c.q_heads, c.kv_heads, dim, cache,
                                                      c.key_length, scale);  // [B, Hq dim]
      INFO("batch " << c.batch << ", heads " << c.q_heads << "/" << c.kv_heads << ", hidden "
                    << c.hidden << ", position " << position);
      CHECK(SameBits(fused_cache.key, cache.key));
      CHECK(SameBits(fused_cache.value, cache.value));
      REQUIRE(partials.sizes() == at::IntArrayRef({c.kv_heads, c.batch, 1, c.hidden}));
      // Head group h's columns of the attention's output times those of o_proj, in fp64.
      const int64_t columns = c.q_heads / c.kv_heads * dim;
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        const at::Tensor want =
            at::matmul(attention.narrow(1, h * columns, columns).to(at::kDouble),
                       o_proj.narrow(1, h * columns, columns).to(at::kDouble).t());
        const double err = (partials[h].view({c.batch, c.hidden}).to(at::kDouble) - want)
                               .abs()
                               .max()
                               .item<double>();
        // The attention's output rounded to bf16 either way, from keys merged in another order:
        // about one rounding of the output (2^-8 of it), summed over a group's columns.
        INFO("head group " << h << ": largest error " << err << " of "
                           << want.abs().max().item<double>());
        CHECK(err <= 0.02 * want.abs().max().item<double>() + 1e-3);
      }
      // The gate/up projection's staging adds the partial sums in head order, then rounds.
      const at::Tensor x = at::randn({c.batch, 1, c.hidden}, On(bf16)) * 3;
      const at::Tensor norm = at::randn({c.hidden}, On(bf16));
      const at::Tensor w = at::randn({2048, c.hidden}, On(bf16)) / 32;
      at::Tensor total = partials[0].clone();
      for (int64_t h = 1; h < c.kv_heads; ++h) total = total + partials[h];
      const SummedLinear folded = SmallLinearAddPartialsRmsNorm(x, partials, norm, 1e-6, w, {});
      const SummedLinear want = SmallLinearAddRmsNorm(x, total.to(bf16), norm, 1e-6, w, {});
      CHECK(SameBits(folded.sum, want.sum));
      CHECK(SameBits(folded.out, want.out));
    }
  }
  // Layouts it does not take: a hidden size not a multiple of the cluster, a slice past its
  // shared memory (2048 features of 2 query heads), heads of 64 dims, an o projection with a bias,
  // more keys than kAttentionOMaxKeys.
  const at::Tensor key = at::zeros({1, 8, 4096, 128}, On(at::kBFloat16));
  const DecodeCache cache{key, key.clone(), at::zeros({1}, On(at::kLong))};
  const at::Tensor o_proj = at::zeros({1024, 2048}, On(at::kBFloat16));
  CHECK(DecodeQkvAttentionOTakes(16, cache, 64, o_proj, {}));
  CHECK(DecodeQkvAttentionOTakes(16, cache, kAttentionOMaxKeys, o_proj, {}));
  CHECK_FALSE(DecodeQkvAttentionOTakes(16, cache, kAttentionOMaxKeys + 1, o_proj, {}));
  CHECK_FALSE(
      DecodeQkvAttentionOTakes(16, cache, 64, at::zeros({1020, 2048}, On(at::kBFloat16)), {}));
  CHECK_FALSE(
      DecodeQkvAttentionOTakes(16, cache, 64, at::zeros({2048, 2048}, On(at::kBFloat16)), {}));
  CHECK_FALSE(
      DecodeQkvAttentionOTakes(16, cache, 64, o_proj, at::zeros({1024}, On(at::kBFloat16))));
  const at::Tensor small_key = at::zeros({1, 8, 64, 64}, On(at::kBFloat16));
  const DecodeCache small{small_key, small_key.clone(), at::zeros({1}, On(at::kLong))};
  CHECK_FALSE(
      DecodeQkvAttentionOTakes(16, small, 64, at::zeros({1024, 1024}, On(at::kBFloat16)), {}));
}

// Note [Ragged decode] in trainer/model/layers.h: with a position per row (and so its row of the
// RoPE table), each row's preparation is bit for bit that row alone, and its attention reads its
// keys up to its own position (past it the caches hold NaN).
TEST_CASE("The decode kernels take a position and RoPE angles per row") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(12);
  const int64_t batch = 5, q_heads = 16, kv_heads = 8, dim = 128, half = 64, key_length = 256;
  const std::vector<int64_t> positions = {0, 200, 17, 255, 64};
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    INFO(c10::toString(dtype));
    const int64_t width = (q_heads + 2 * kv_heads) * dim;
    const at::Tensor qkv = at::randn({batch, 1, width}, On(dtype)) * 2;
    const at::Tensor q_norm = at::randn({dim}, On(dtype));
    const at::Tensor k_norm = at::randn({dim}, On(dtype));
    const at::Tensor cos = at::randn({key_length, half}, On(dtype));  // a RoPE table
    const at::Tensor sin = at::randn({key_length, half}, On(dtype));
    const at::Tensor pos = at::tensor(positions, at::kLong).to(On(at::kLong).device());
    at::Tensor key = at::randn({batch, kv_heads, key_length, dim}, On(dtype));
    at::Tensor value = at::randn_like(key);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t p = positions[static_cast<size_t>(b)];
      if (p + 1 < key_length) {
        key[b].narrow(1, p + 1, key_length - p - 1).fill_(NAN);
        value[b].narrow(1, p + 1, key_length - p - 1).fill_(NAN);
      }
    }
    const DecodeCache fused_cache{key.clone(), value.clone(), pos};
    const DecodeCache cache{key.clone(), value.clone(), pos};
    const at::Tensor fused = DecodeQkvAttention(qkv, q_norm, k_norm, 1e-6, cos, sin, false, q_heads,
                                                kv_heads, dim, fused_cache, key_length, scale);
    const at::Tensor q =
        DecodeQkvPrep(qkv, q_norm, k_norm, 1e-6, cos, sin, false, q_heads, kv_heads, dim, cache);
    CHECK(SameBits(fused, DecodeAttention(q, cache, key_length, scale)));
    CHECK(SameBits(fused_cache.key, cache.key));
    for (int64_t b = 0; b < batch; ++b) {
      INFO("row " << b);
      const int64_t p = positions[static_cast<size_t>(b)];
      // The row alone, at its position with its angles.
      const at::Tensor own_key = key.narrow(0, b, 1).clone();
      const at::Tensor own_value = value.narrow(0, b, 1).clone();
      const DecodeCache own{own_key, own_value, at::full({1}, p, On(at::kLong))};
      const at::Tensor own_q = DecodeQkvPrep(qkv.narrow(0, b, 1), q_norm, k_norm, 1e-6, cos, sin,
                                             false, q_heads, kv_heads, dim, own);
      CHECK(SameBits(q.narrow(0, b, 1), own_q));
      CHECK(SameBits(cache.key.narrow(0, b, 1), own.key));
      CHECK(SameBits(cache.value.narrow(0, b, 1), own.value));
      const at::Tensor expected =
          ReferenceAttention(own_q, own.key, own.value, p, scale);  // [1, Hq * dim]
      const double error =
          (fused.narrow(0, b, 1).to(at::kDouble) - expected).abs().max().item<double>();
      CHECK(error < (dtype == at::kBFloat16 ? 1.6e-2 : 1e-5));
    }
  }
}

TEST_CASE("DecodeAttention reads its position on the device, so a graph replay follows it") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(5);
  const at::Tensor key = at::randn({2, 8, 256, 128}, On(at::kBFloat16));
  const at::Tensor value = at::randn_like(key);
  const at::Tensor q = at::randn({2, 16, 128}, On(at::kBFloat16));
  const at::Tensor position = at::full({1}, 10, On(at::kLong));
  const DecodeCache cache{key, value, position};
  at::cuda::CUDAGraph graph;
  at::Tensor out;
  {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
    DecodeAttention(q, cache, 256, 0.1);  // warm-up outside the capture
    graph.capture_begin();
    out = DecodeAttention(q, cache, 256, 0.1);
    graph.capture_end();
  }
  for (const int64_t p : {int64_t{10}, int64_t{200}, int64_t{255}}) {
    position.fill_(p);
    graph.replay();
    c10::cuda::device_synchronize();
    CHECK(SameBits(out, DecodeAttention(q, cache, 256, 0.1)));
    const double error =
        (out.to(at::kDouble) - ReferenceAttention(q, key, value, p, 0.1)).abs().max().item<double>();
    CHECK(error < 1.6e-2);
  }
}

// The rows of DsaIndexScores' `scores` [B, T] against the fp64 sum of the same bf16 inputs up to
// each row's position (within 1e-5 of the row's largest), -inf past it.
void CheckDsaScores(const at::Tensor& scores, const at::Tensor& q, const at::Tensor& weights,
                    const at::Tensor& keys, const std::vector<int64_t>& positions, double scale) {
  const int64_t key_length = keys.size(1);
  const at::Tensor products =
      at::matmul(q.to(at::kDouble), keys.to(at::kDouble).transpose(1, 2));  // [B, H, T]
  const at::Tensor expected =
      (weights.to(at::kDouble).unsqueeze(-1) * at::relu(products * scale)).sum(1);  // [B, T]
  for (int64_t b = 0; b < scores.size(0); ++b) {
    INFO("row " << b);
    const int64_t seen = positions[static_cast<size_t>(b)] + 1;
    const at::Tensor got = scores[b].to(at::kDouble);
    const double largest = expected[b].narrow(0, 0, seen).abs().max().item<double>();
    const double error =
        (got.narrow(0, 0, seen) - expected[b].narrow(0, 0, seen)).abs().max().item<double>();
    CHECK(error <= 1e-5 * std::max(1.0, largest));
    if (seen < key_length) {
      CHECK(at::all(got.narrow(0, seen, key_length - seen) ==
                    -std::numeric_limits<double>::infinity())
                .item<bool>());
    }
  }
}

// Note [DSA index scores kernel]: the scores of every cached key, against the fp64 sum of the
// same bf16 inputs; keys past a row's position score -inf (they hold NaN here, and the last
// visible key's row is what the kernel loads in their place). Rows at their own positions (one
// sees a single key; one sees every key) and a key length that ends within a tile of 16; then
// one position for the whole batch, and 64 rows, whose warps take several tiles each. The same
// inputs give the same bits.
TEST_CASE("DsaIndexScores is the indexer's weighted relu scores, -inf past each row's position") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(14);
  const int64_t batch = 4, key_length = 2085, cache_length = 2112;
  const std::vector<int64_t> positions = {0, 2084, 700, 16};
  struct Heads {
    int64_t heads, dim;
  };
  for (const Heads& h : {Heads{32, 128}, Heads{16, 64}, Heads{8, 128}}) {
    INFO(h.heads << " heads of " << h.dim);
    const double scale = 1.0 / std::sqrt(static_cast<double>(h.dim));
    const at::Tensor q = at::randn({batch, h.heads, h.dim}, On(at::kBFloat16));
    const at::Tensor weights = at::randn({batch, h.heads}, On(at::kFloat)) * 0.2;
    // The cache has a spare row and spare positions, as the engine's does.
    const at::Tensor cache = at::randn({batch + 1, cache_length, h.dim}, On(at::kBFloat16));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t p = positions[static_cast<size_t>(b)];
      cache[b].narrow(0, p + 1, cache_length - p - 1).fill_(NAN);
    }
    const at::Tensor keys = cache.narrow(1, 0, key_length);
    const at::Tensor pos = at::tensor(positions, at::kLong).to(On(at::kLong).device());
    REQUIRE(DsaIndexScoresTakes(q, keys));
    const at::Tensor scores = DsaIndexScores(q, weights, keys, pos, key_length, scale);
    REQUIRE(scores.sizes() == at::IntArrayRef({batch, key_length}));
    CHECK(SameBits(scores, DsaIndexScores(q, weights, keys, pos, key_length, scale)));
    CheckDsaScores(scores, q, weights, keys.narrow(0, 0, batch), positions, scale);
    // One position for the whole batch: every row as row 2 (position 700) of the above.
    const at::Tensor row_2_cache =
        cache.narrow(0, 2, 1).expand({batch, cache_length, h.dim}).contiguous();
    const at::Tensor shared =
        DsaIndexScores(q.narrow(0, 2, 1).expand({batch, h.heads, h.dim}).contiguous(),
                       weights.narrow(0, 2, 1).expand({batch, h.heads}).contiguous(),
                       row_2_cache.narrow(1, 0, key_length),
                       at::full({1}, positions[2], On(at::kLong)), key_length, scale);
    for (int64_t b = 0; b < batch; ++b) CHECK(SameBits(shared[b], scores[2]));
  }
  // 64 rows: fewer blocks per row than a row's tiles need warps, so each warp takes several tiles.
  const int64_t rows = 64;
  const at::Tensor q = at::randn({rows, 32, 128}, On(at::kBFloat16));
  const at::Tensor weights = at::randn({rows, 32}, On(at::kFloat)) * 0.2;
  const at::Tensor keys = at::randn({rows, key_length, 128}, On(at::kBFloat16));
  std::vector<int64_t> many(rows);
  for (int64_t b = 0; b < rows; ++b) many[static_cast<size_t>(b)] = (b * 331 + 17) % key_length;
  const at::Tensor pos = at::tensor(many, at::kLong).to(On(at::kLong).device());
  const double scale = 1.0 / std::sqrt(128.0);
  CheckDsaScores(DsaIndexScores(q, weights, keys, pos, key_length, scale), q, weights, keys, many,
                 scale);
}

// softmax(scale q . rows) . latents in fp64 over the keys `visible` [B, T] (bool) of each row:
// q [B, H, 576], rows [B, T, 576] -> [B, H, 512]. Rows a query does not see count as zeros (they
// may hold NaN).
// Note [Router kernel]: against the rule of Route's ops (trainer/model/layers.cc) for Qwen3-MoE's
// softmax router (with and without norm_topk_prob), DeepSeek-V3's grouped sigmoid router with a
// bias, and Kimi's 384 experts in one group: the same experts (compared as sets: the ops' order
// is unspecified; random logits have no ties) and weights within fp32 rounding.
TEST_CASE("RouterTopK chooses the experts and weights of the router's ops") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(17);
  struct Router {
    int64_t experts, k, groups, topk_group;
    bool sigmoid, normalize;
    double scale;
  };
  for (const Router& r :
       {Router{128, 8, 1, 1, false, true, 1.0}, Router{64, 4, 1, 1, false, false, 1.0},
        Router{256, 8, 8, 4, true, true, 2.5}, Router{384, 8, 1, 1, true, true, 2.827}}) {
    INFO(r.experts << " experts, top-" << r.k << (r.sigmoid ? ", sigmoid" : ", softmax"));
    const int64_t tokens = 37;
    const at::Tensor logits = at::randn({tokens, r.experts}, On(at::kFloat)) * 2;
    const at::Tensor bias = r.sigmoid ? at::randn({r.experts}, On(at::kFloat)) * 0.1 : at::Tensor();
    const RouterChoice got =
        RouterTopK(logits, bias, r.sigmoid, r.k, r.groups, r.topk_group, r.normalize, r.scale);
    at::Tensor ids, weights;  // the ops
    if (!r.sigmoid) {
      std::tie(weights, ids) = at::softmax(logits, -1).topk(r.k, -1);
      if (r.normalize) weights = weights / weights.sum(-1, true);
    } else {
      const at::Tensor scores = at::sigmoid(logits);
      at::Tensor choice = scores + bias.unsqueeze(0);
      if (r.groups > 1) {
        const int64_t per_group = r.experts / r.groups;
        const at::Tensor group_scores =
            std::get<0>(choice.view({tokens, r.groups, per_group}).topk(2, -1)).sum(-1);
        const at::Tensor group_idx = std::get<1>(group_scores.topk(r.topk_group, -1));
        const at::Tensor keep = at::zeros_like(group_scores).scatter_(1, group_idx, 1.0);
        choice = choice.masked_fill(
            keep.unsqueeze(-1).expand({tokens, r.groups, per_group}).reshape({tokens, r.experts}) ==
                0,
            -std::numeric_limits<double>::infinity());
      }
      ids = std::get<1>(choice.topk(r.k, -1));
      weights = scores.gather(1, ids);
      if (r.normalize) weights = weights / (weights.sum(-1, true) + 1e-20);
      weights = weights * r.scale;
    }
    // Both sorted by expert id.
    const auto [got_ids, got_order] = got.ids.sort(-1);
    const auto [want_ids, want_order] = ids.sort(-1);
    CHECK(at::equal(got_ids, want_ids));
    const double error = (got.weights.gather(1, got_order) - weights.gather(1, want_order))
                             .abs()
                             .max()
                             .item<double>();
    CHECK(error <= 1e-6 * r.scale);
    // Descending order of the choice: the weights of the softmax router fall along the row.
    if (!r.sigmoid)
      CHECK(at::all(got.weights.narrow(1, 0, r.k - 1) >= got.weights.narrow(1, 1, r.k - 1))
                .item<bool>());
  }
}

// Note [Sort by expert kernel]: the MoE block's sorted pairs, ends and inverse, bit for bit the
// ops', for a decode step's few pairs, several chunks of the block with long runs of one expert,
// and the most pairs and a Kimi-sized expert count.
TEST_CASE("SortByExpert is the MoE block's stable sort by expert, bit for bit") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(18);
  for (const auto& [pairs, experts] :
       {std::pair<int64_t, int64_t>{37 * 8, 128}, {300, 8}, {1000, 3}, {8192, 384}}) {
    INFO(pairs << " pairs over " << experts << " experts");
    const at::Tensor ids = at::randint(experts, {pairs}, On(at::kLong));
    REQUIRE(SortByExpertTakes(ids, experts));
    const ExpertOrder got = SortByExpert(ids, experts);
    const at::Tensor order = at::argsort(ids, /*stable=*/true);
    const at::Tensor sorted_ids = ids.index_select(0, order);
    const at::Tensor ends = at::searchsorted(sorted_ids, at::arange(experts, ids.options()),
                                             /*out_int32=*/true, /*right=*/true);
    const at::Tensor inverse =
        at::empty_like(order).scatter_(0, order, at::arange(pairs, order.options()));
    CHECK(SameBits(got.order, order));
    CHECK(SameBits(got.sorted_ids, sorted_ids));
    CHECK(SameBits(got.ends, ends));
    CHECK(SameBits(got.inverse, inverse));
  }
}

// Note [Combine kernel]: the MoE block's last steps (back to pair order, the weights, the sum over
// the slots, the cast, the shared expert), with and without a shared expert, bf16 and fp32: the
// ops' result up to the order of the slots' sum (one rounding of the output's dtype).
TEST_CASE("CombineExperts is the MoE block's weighted sum of its experts' rows") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(19);
  const int64_t tokens = 37, k = 8, hidden = 2048;
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (const bool with_shared : {false, true}) {
      INFO(c10::toString(dtype) << (with_shared ? ", with a shared expert" : ""));
      const at::Tensor rows = at::randn({tokens * k, hidden}, On(dtype));
      const at::Tensor inverse = at::randperm(tokens * k, On(at::kLong));
      const at::Tensor weights = at::rand({tokens, k}, On(at::kFloat));
      const at::Tensor shared = with_shared ? at::randn({tokens, hidden}, On(dtype)) : at::Tensor();
      REQUIRE(CombineExpertsTakes(rows, weights, shared));
      const at::Tensor got = CombineExperts(rows, inverse, weights, shared);
      const at::Tensor routed =
          (rows.index_select(0, inverse).view({tokens, k, hidden}) * weights.unsqueeze(-1))
              .sum(1)
              .to(dtype);
      const at::Tensor want = with_shared ? routed + shared : routed;
      // One rounding of the routed sum (a bf16 step is at most 2^-7 of the value; fp32 sums in
      // another order differ by a few 2^-24), carried through the shared expert's add, and that
      // add's own rounding: relative to the magnitudes added, not to their (cancelling) sum.
      const double step = dtype == at::kBFloat16 ? 1.0 / 64 : 1e-6;
      at::Tensor scale = routed.to(at::kDouble).abs();
      if (with_shared) scale = scale + shared.to(at::kDouble).abs();
      const at::Tensor excess = (got.to(at::kDouble) - want.to(at::kDouble)).abs() - scale * step;
      CHECK(excess.max().item<double>() <= 1e-6);
    }
  }
}

// The sampling rule of SampleRows (cuda_kernels.h) on the CPU in fp64: per row the first token
// whose cumulative softmax(logits / T) exceeds t = u x total, log_softmax there, and the
// cumulative distribution and t, to judge a differing token.
struct ReferenceDraw {
  at::Tensor tokens, log_probs, cdf, t;
};
ReferenceDraw ReferenceSample(const at::Tensor& logits, double temperature,
                              const at::Tensor& uniforms) {
  const at::Tensor s = (logits.cpu().to(at::kFloat) / temperature).to(at::kDouble);
  ReferenceDraw r;
  r.cdf = at::cumsum(at::softmax(s, -1), -1);
  r.t = uniforms.cpu().to(at::kDouble).unsqueeze(1) * r.cdf.narrow(1, r.cdf.size(1) - 1, 1);
  r.tokens =
      at::searchsorted(r.cdf, r.t, false, /*right=*/true).clamp_max(logits.size(1) - 1).squeeze(1);
  r.log_probs = at::log_softmax(s, -1).gather(1, r.tokens.unsqueeze(1)).squeeze(1);
  return r;
}

// Rows whose token differs from the reference's where u does not lie within 1e-6 of a boundary
// of the cumulative distribution (the kernel sums fp32 masses in another order: ~1e-7 apart).
int64_t FarMismatches(const at::Tensor& tokens, const ReferenceDraw& r) {
  const at::Tensor got = tokens.cpu();
  int64_t far = 0;
  for (int64_t i = 0; i < got.size(0); ++i) {
    const int64_t a = got[i].item<int64_t>(), b = r.tokens[i].item<int64_t>();
    if (a == b) continue;
    const double boundary = r.cdf[i][std::min(a, b)].item<double>();
    if (std::abs(boundary - r.t[i][0].item<double>()) > 1e-6) ++far;
  }
  return far;
}

TEST_CASE("SampleRows draws the inverse-CDF token of the whole vocabulary, and its log-prob") {
  if (!HaveGpuOrWarn()) return;
  at::manual_seed(12);
  for (const int64_t vocab : {int64_t{151936}, int64_t{1024}}) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      for (const double temperature : {1.0, 0.7}) {
        at::Tensor logits = (at::randn({64, vocab}, On(at::kFloat)) * 3).to(dtype);
        // A third of the words masked (zero mass): the first third, or the last (whole warps'
        // runs of steps without mass); uniforms at both ends.
        logits.narrow(0, 0, 32).narrow(1, 0, vocab / 3).fill_(-INFINITY);
        logits.narrow(0, 32, 32).narrow(1, vocab - vocab / 3, vocab / 3).fill_(-INFINITY);
        at::Tensor uniforms = at::rand({64}, On(at::kDouble));
        uniforms[0] = 0.0;
        uniforms[1] = 1.0 - 1e-12;
        uniforms[40] = 1.0 - 1e-12;
        REQUIRE(SampleRowsTakes(logits));
        const SampledRows got = SampleRows(logits, temperature, false, uniforms);
        const ReferenceDraw r = ReferenceSample(logits, temperature, uniforms);
        INFO("vocab " << vocab << ", " << c10::toString(dtype) << ", temperature " << temperature);
        CHECK(FarMismatches(got.tokens, r) == 0);
        CHECK((got.log_probs.cpu().to(at::kDouble) - r.log_probs).abs().max().item<double>() <
              1e-5);
        // No masked word.
        const at::Tensor tokens = got.tokens.cpu();
        CHECK(tokens.narrow(0, 0, 32).ge(vocab / 3).all().item<bool>());
        CHECK(tokens.narrow(0, 32, 32).lt(vocab - vocab / 3).all().item<bool>());
        // A row's result does not depend on its batch (nor on its cluster: 64 rows take
        // clusters of 4 or 2 blocks where 64 clusters of 8 would not run at once, one row 8).
        const SampledRows alone =
            SampleRows(logits.narrow(0, 5, 1), temperature, false, uniforms.narrow(0, 5, 1));
        CHECK(SameBits(alone.tokens, got.tokens.narrow(0, 5, 1)));
        CHECK(SameBits(alone.log_probs, got.log_probs.narrow(0, 5, 1)));
        // Greedy: the first largest logit.
        const SampledRows greedy = SampleRows(logits, temperature, true, {});
        CHECK(at::equal(greedy.tokens, logits.to(at::kFloat).argmax(-1)));
      }
    }
  }
  // Greedy at temperature 0: log-probs at temperature 1; ties go to the first index, across
  // warps and unrolled steps; a row with a NaN gives its first NaN's index, as at::argmax.
  at::Tensor logits = at::randn({3, 151936}, On(at::kFloat));
  for (const int64_t at_index : {int64_t{70000}, int64_t{9000}, int64_t{150000}}) {
    logits[0][at_index] = 50.0f;
  }
  logits[1][4096] = NAN;
  logits[1][100] = NAN;
  const SampledRows greedy = SampleRows(logits, 0.0, true, {});
  const at::Tensor tokens = greedy.tokens.cpu();
  CHECK(tokens[0].item<int64_t>() == 9000);
  CHECK(tokens[1].item<int64_t>() == 100);
  CHECK(tokens[2].item<int64_t>() == logits[2].argmax().item<int64_t>());
  const at::Tensor expected = at::log_softmax(logits.cpu().to(at::kDouble), -1);
  CHECK(std::abs(greedy.log_probs[2].item<double>() -
                 expected[2][tokens[2].item<int64_t>()].item<double>()) < 1e-5);
  // Sampling a row with a NaN still gives a valid id.
  const SampledRows sampled = SampleRows(logits, 1.0, false, at::full({3}, 0.5, On(at::kDouble)));
  const at::Tensor sampled_tokens = sampled.tokens.cpu();
  CHECK(sampled_tokens.ge(0).all().item<bool>());
  CHECK(sampled_tokens.lt(151936).all().item<bool>());
  // Widths that are not whole 16-byte vectors, and three dims, are not taken.
  CHECK_FALSE(SampleRowsTakes(at::randn({2, 1001}, On(at::kBFloat16))));
  CHECK_FALSE(SampleRowsTakes(at::randn({2, 1, 1024}, On(at::kBFloat16))));
}

TEST_CASE("The sampled tokens are handed on to mapped host memory and the next step's input") {
  if (!HaveGpuOrWarn()) return;
  const int64_t rows = 300;  // more than one block of HandOnSampled
  const at::Tensor logits = at::randn({rows, 1024}, On(at::kBFloat16));
  const at::Tensor uniforms = at::rand({rows}, On(at::kDouble));
  const at::Device device = logits.device();
  const MappedHost host_tokens = MappedHostEmpty({rows}, at::kLong, device);
  const MappedHost host_log_probs = MappedHostEmpty({rows}, at::kFloat, device);
  REQUIRE(host_tokens.host.device().is_cpu());
  REQUIRE(host_tokens.device.device() == device);
  for (const bool greedy : {true, false}) {
    INFO("greedy " << greedy);
    // The next tokens and positions of a step buffer [2, rows + 4]: columns past `rows` untouched.
    const at::Tensor step = at::randint(0, 1000, {2, rows + 4}, On(at::kLong));
    const at::Tensor before = step.cpu();
    const HandOn to{host_tokens.device, host_log_probs.device, step[0].narrow(0, 0, rows),
                    step[1].narrow(0, 0, rows)};
    // By the sampling kernel itself.
    const SampledRows sampled = SampleRows(logits, 1.0, greedy, uniforms, to);
    REQUIRE(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream()) == cudaSuccess);
    CHECK(at::equal(host_tokens.host, sampled.tokens.cpu()));
    CHECK(SameBits(host_log_probs.host, sampled.log_probs.cpu()));
    const at::Tensor after = step.cpu();
    CHECK(at::equal(after[0].narrow(0, 0, rows), sampled.tokens.cpu()));
    CHECK(at::equal(after[1].narrow(0, 0, rows), before[1].narrow(0, 0, rows) + 1));
    CHECK(at::equal(after.narrow(1, rows, 4), before.narrow(1, rows, 4)));
    // By HandOnSampled, of tokens sampled otherwise: to the host only (a prefill's).
    HandOnSampled(sampled.tokens.flip(0), sampled.log_probs.flip(0),
                  HandOn{host_tokens.device, host_log_probs.device, {}, {}});
    REQUIRE(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream()) == cudaSuccess);
    CHECK(at::equal(host_tokens.host, sampled.tokens.flip(0).cpu()));
    CHECK(SameBits(host_log_probs.host, sampled.log_probs.flip(0).cpu()));
    CHECK(at::equal(step.cpu(), after));
    // And to the next step's input.
    HandOnSampled(sampled.tokens.flip(0), sampled.log_probs.flip(0), to);
    REQUIRE(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream()) == cudaSuccess);
    CHECK(at::equal(step.cpu()[0].narrow(0, 0, rows), sampled.tokens.flip(0).cpu()));
    CHECK(at::equal(step.cpu()[1].narrow(0, 0, rows), before[1].narrow(0, 0, rows) + 2));
  }
  // Targets of another shape or dtype, or next tokens without positions, are refused.
  const at::Tensor tokens = at::zeros({rows}, On(at::kLong));
  const at::Tensor log_probs = at::zeros({rows}, On(at::kFloat));
  CHECK_THROWS_AS(
      HandOnSampled(tokens, log_probs, HandOn{host_tokens.device.narrow(0, 0, 5), {}, {}, {}}),
      Error);
  CHECK_THROWS_AS(HandOnSampled(tokens, log_probs, HandOn{{}, host_tokens.device, {}, {}}), Error);
  CHECK_THROWS_AS(HandOnSampled(tokens, log_probs, HandOn{{}, {}, tokens.clone(), {}}), Error);
}

}  // namespace
}  // namespace rl::kernels
