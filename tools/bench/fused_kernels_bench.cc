// fused_kernels_bench [--rows 4096] [--vocab 151936] [--rounds 5] [--projection-chain-only]: our
// CUDA kernels (trainer/kernels) against the LibTorch ops they replace, on the GPU, in one process:
//  1. agreement: RMSNorm with its gradients (fp32 and bf16), RoPE (must be bit-identical) and the
//     token log-prob / entropy with their gradients (fp32 and bf16), fused vs LibTorch, with the
//     largest differences and a verdict per case;
//  2. speed: the loss head of a train step, log-prob of the targets forward + backward over
//     [rows, vocab] bf16 logits, fused vs log_softmax(logits.float()).gather, best of --rounds,
//     and the ratio;
//  3. speed of the decode step's kernels at Qwen3-0.6B widths, bf16, each timed as a CUDA graph
//     of 100 calls (no launch gaps), in us per call: DecodeAttention (batch 1 and 64, 16 query
//     heads on 8 key/value heads (Qwen3-0.6B) and 32 on 4 (Qwen3-30B-A3B), 192 of 256 keys) at
//     several blocks_per_sm (and the CUDA-core kernel at the default) against SDPA over the key
//     block with a mask, as the LibTorch decode step ran it; DecodeQkvAttention against
//     DecodeQkvPrep and DecodeAttention at the same shapes; SmallLinear against at::linear for
//     1 and 2 rows (the rows it takes) at each projection's shape, and SkinnyLinear for 8 to 64
//     (alone, and by programmatic dependent launch); DsaIndexScores against the DSA indexer's
//     LibTorch ops at GLM-5's widths (batch 1, 16, 64; 4096 to 32768 keys), and the top-2048
//     selection after it;
//  4. the batch-1 projections of 28 layers chained as a decode step runs them, from HBM and
//     from the L2 (Note [Projection chain benchmark]).
// Exit status 1 when an agreement check fails. Needs a GPU.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/autograd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "launch/device.h"
#include "tools/bench/profiling.h"
#include "trainer/kernels/cuda_kernels.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/model/layers.h"

namespace {

using Clock = std::chrono::steady_clock;

double MaxAbs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

bool Report(const std::string& what, double diff, double tolerance) {
  const bool ok = diff <= tolerance;
  std::printf("%-58s max abs diff %.3g (tolerance %.3g): %s\n", what.c_str(), diff, tolerance,
              ok ? "ok" : "FAIL");
  return ok;
}

struct LossHead {
  at::Tensor log_probs, entropy, grad;
};

// log-probs and entropy of `logits` at `targets`, and d(sum(lp * g_lp) + sum(h * g_h))/dlogits.
LossHead Run(const at::Tensor& logits_in, const at::Tensor& targets, const at::Tensor& g_lp,
             const at::Tensor& g_h, bool fused) {
  at::Tensor logits = logits_in.detach().requires_grad_(true);
  LossHead out;
  if (fused) {
    const rl::kernels::TokenLogProbStats s = rl::kernels::TokenLogProbs(logits, targets);
    out.log_probs = s.log_probs;
    out.entropy = s.entropy;
  } else {
    const at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1);
    out.log_probs = lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    out.entropy = -(lp.exp() * lp).sum(-1);
  }
  const at::Tensor loss = (out.log_probs * g_lp).sum() + (out.entropy * g_h).sum();
  out.grad = torch::autograd::grad({loss}, {logits})[0];
  return out;
}

using rl::bench::GraphMicrosPerCall;

void DecodeKernelSpeeds(const at::Device& device) {
  const auto on = [&](at::ScalarType dtype) {
    return at::TensorOptions().dtype(dtype).device(device);
  };
  const int64_t dim = 128, keys = 256, position = 191;
  for (const auto& [batch, q_heads, kv_heads] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 16, 8}, {64, 16, 8}, {1, 32, 4}, {64, 32, 4}}) {
    const at::Tensor key = at::randn({batch, kv_heads, keys, dim}, on(at::kBFloat16));
    const at::Tensor value = at::randn_like(key);
    const at::Tensor q = at::randn({batch, q_heads, dim}, on(at::kBFloat16));
    const rl::kernels::DecodeCache cache{key, value, at::full({1}, position, on(at::kLong))};
    const at::Tensor mask = (at::arange(keys, on(at::kLong)) <= position).view({1, keys});
    const double sdpa = GraphMicrosPerCall([&] {
      at::scaled_dot_product_attention(q.view({batch, kv_heads, q_heads / kv_heads, dim}), key,
                                       value, mask, 0.0, false, 0.088);
    });
    std::printf("decode attention batch %lld, %lld/%lld heads: SDPA with a mask %.1f us",
                static_cast<long long>(batch), static_cast<long long>(q_heads),
                static_cast<long long>(kv_heads), sdpa);
    for (const int blocks_per_sm : {1, 2, 4, 8, 16, 32}) {
      std::printf(", %d blocks/SM %.1f us", blocks_per_sm, GraphMicrosPerCall([&] {
                    rl::kernels::DecodeAttention(q, cache, keys, 0.088, blocks_per_sm);
                  }));
    }
    if (batch == 64) {  // the slabs of the cache 66 KiB apart instead of 64 KiB
      const at::Tensor padded_key =
          at::randn({batch, kv_heads, keys + 8, dim}, on(at::kBFloat16)).narrow(2, 0, keys);
      const at::Tensor padded_value = at::randn_like(padded_key);
      const rl::kernels::DecodeCache padded{padded_key, padded_value, cache.position};
      std::printf(", cache rows padded %.1f us", GraphMicrosPerCall([&] {
                    rl::kernels::DecodeAttention(q, padded, keys, 0.088);
                  }));
    }
    std::printf(" (default %.1f us; CUDA cores %.1f us)\n",
                GraphMicrosPerCall([&] { rl::kernels::DecodeAttention(q, cache, keys, 0.088); }),
                GraphMicrosPerCall([&] {
                  rl::kernels::DecodeAttention(q, cache, keys, 0.088, 0, /*tensor_cores=*/false);
                }));
  }
  // The decode step's attention with its q/k/v preparation (q/k norms, RoPE, cache writes), as
  // the engine runs it: one kernel against the two it replaces.
  for (const auto& [batch, q_heads, kv_heads] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 16, 8}, {64, 16, 8}, {1, 32, 4}, {64, 32, 4}}) {
    const at::Tensor key = at::randn({batch, kv_heads, keys, dim}, on(at::kBFloat16));
    const rl::kernels::DecodeCache cache{key, at::randn_like(key),
                                         at::full({1}, position, on(at::kLong))};
    const at::Tensor qkv = at::randn({batch, 1, (q_heads + 2 * kv_heads) * dim}, on(at::kBFloat16));
    const at::Tensor norm = at::randn({dim}, on(at::kBFloat16));
    const at::Tensor cos = at::randn({keys, dim / 2}, on(at::kBFloat16));  // a RoPE table
    const at::Tensor sin = at::randn({keys, dim / 2}, on(at::kBFloat16));
    const double fused = GraphMicrosPerCall([&] {
      rl::kernels::DecodeQkvAttention(qkv, norm, norm, 1e-6, cos, sin, false, q_heads, kv_heads,
                                      dim, cache, keys, 0.088);
    });
    const double two = GraphMicrosPerCall([&] {
      const at::Tensor q = rl::kernels::DecodeQkvPrep(qkv, norm, norm, 1e-6, cos, sin, false,
                                                      q_heads, kv_heads, dim, cache);
      rl::kernels::DecodeAttention(q, cache, keys, 0.088);
    });
    std::printf("decode q/k/v preparation and attention batch %lld, %lld/%lld heads: "
                "DecodeQkvAttention %.1f us, DecodeQkvPrep + DecodeAttention %.1f us\n",
                static_cast<long long>(batch), static_cast<long long>(q_heads),
                static_cast<long long>(kv_heads), fused, two);
  }
  // The DSA indexer's decode-step scores at GLM-5's widths (32 heads of 128), every key visible:
  // the LibTorch ops of IndexerTopk (the fp32 copy of the keys, the [B, 1, H, T] products, relu,
  // the weighted sum over the heads, the mask) against DsaIndexScores, and the top-2048 selection
  // that follows either.
  for (const int64_t batch : {1, 16, 64}) {
    for (const int64_t length : {4096, 16384, 32768}) {
      const int64_t heads = 32, index_dim = 128;
      const at::Tensor q = at::randn({batch, 1, heads, index_dim}, on(at::kBFloat16));
      const at::Tensor weights = at::randn({batch, 1, heads}, on(at::kFloat)) * 0.2;
      const at::Tensor keys = at::randn({batch, length, index_dim}, on(at::kBFloat16));
      const at::Tensor position = at::full({1}, length - 1, on(at::kLong));
      const at::Tensor mask =
          (at::arange(length, on(at::kLong)) <= length - 1).view({1, 1, length});
      const double scale = 1.0 / std::sqrt(static_cast<double>(index_dim));
      const auto ops = [&] {
        const at::Tensor kf = keys.to(at::kFloat).transpose(1, 2).unsqueeze(1);  // [B, 1, D, T]
        const at::Tensor scores = at::relu(at::matmul(q.to(at::kFloat), kf) * scale);
        at::Tensor index = at::matmul(weights.unsqueeze(-2), scores).squeeze(-2);  // [B, 1, T]
        index.masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity());
        return index;
      };
      const auto kernel = [&] {
        return rl::kernels::DsaIndexScores(q.view({batch, heads, index_dim}),
                                           weights.view({batch, heads}), keys, position, length,
                                           scale);
      };
      const at::Tensor want = ops().view({batch, length});
      const double diff = MaxAbs(kernel(), want) / want.abs().max().item<double>();
      const double by_ops = GraphMicrosPerCall([&] { ops(); });
      const double by_kernel = GraphMicrosPerCall([&] { kernel(); });
      const double select = GraphMicrosPerCall([&] { want.topk(2048, -1); });
      const double bytes = static_cast<double>(batch * length * index_dim * 2);
      std::printf(
          "DSA index scores batch %lld, %lld keys: LibTorch ops %.1f us, DsaIndexScores "
          "%.1f us (%.2f TB/s of keys), %.2fx; top-2048 %.1f us; largest diff / largest "
          "score %.2g%s\n",
          static_cast<long long>(batch), static_cast<long long>(length), by_ops, by_kernel,
          bytes / by_kernel * 1e-6, by_ops / by_kernel, select, diff,
          diff <= 1e-5 ? "" : " (MORE THAN 1e-5)");
    }
  }
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}, {151936, 1024}};
  for (const int64_t rows : {1, 2}) {
    for (const auto& [n, k] : shapes) {
      const at::Tensor x = at::randn({rows, k}, on(at::kBFloat16));
      const at::Tensor w = at::randn({n, k}, on(at::kBFloat16));
      const double cublas = GraphMicrosPerCall([&] { at::linear(x, w); });
      const double small = GraphMicrosPerCall([&] { rl::kernels::SmallLinear(x, w, {}); });
      const double bytes = static_cast<double>(n * k * 2);
      std::printf("linear %lld x [%lld, %lld]: at::linear %.1f us (%.2f TB/s), SmallLinear %.1f us "
                  "(%.2f TB/s), %.2fx\n",
                  static_cast<long long>(rows), static_cast<long long>(n),
                  static_cast<long long>(k), cublas, bytes / cublas * 1e-6, small,
                  bytes / small * 1e-6, cublas / small);
    }
  }
  // SkinnyLinear against at::linear from 8 to 64 rows, launched one after another and by
  // programmatic dependent launch (each call then starts while the one ahead finishes).
  for (const int64_t rows : {8, 16, 32, 64}) {
    for (const auto& [n, k] : shapes) {
      const at::Tensor x = at::randn({rows, k}, on(at::kBFloat16));
      const at::Tensor w = at::randn({n, k}, on(at::kBFloat16));
      const double cublas = GraphMicrosPerCall([&] { at::linear(x, w); });
      const double bytes = static_cast<double>(n * k * 2);
      std::printf("linear %lld x [%lld, %lld]: at::linear %.1f us (%.2f TB/s)",
                  static_cast<long long>(rows), static_cast<long long>(n),
                  static_cast<long long>(k), cublas, bytes / cublas * 1e-6);
      // The raw kernel: also where SkinnyLinearPays leaves the shape to cuBLAS, to check that
      // choice.
      at::Tensor y = at::empty({rows, n}, x.options());
      const auto skinny = [&] {
        rl::kernels::SkinnyLinear(x.data_ptr(), w.data_ptr(), nullptr, y.data_ptr(), rows, n, k,
                                  c10::cuda::getCurrentCUDAStream());
      };
      const double alone = GraphMicrosPerCall(skinny);
      double overlapped = 0;
      {
        const rl::kernels::ProgrammaticLaunch programmatic(true);
        overlapped = GraphMicrosPerCall(skinny);
      }
      std::printf(
          "; SkinnyLinear %.1f us (%.2f TB/s, %.2fx), by programmatic launch %.1f us (%.2fx)",
          alone, bytes / alone * 1e-6, cublas / alone, overlapped, cublas / overlapped);
      std::printf("%s\n", rl::kernels::SkinnyLinearPays(x, w, {}) ? "" : " (cuBLAS's shape)");
    }
  }
}

}  // namespace

// Note [Projection chain benchmark]
// The batch-1 projections of a decode step as the engine chains them, without the attention: per
// layer SmallLinearAddRmsNorm (q/k/v), SmallLinear (o, over the first 2048 of the q/k/v row as a
// stand-in for the attention's output), SmallLinearAddRmsNorm (gate/up) and SmallLinearSiluMul
// (down) at Qwen3-0.6B's widths, 28 layers, captured once as a graph and replayed. With a
// layer's weights of its own (880 MB, past the L2) the chain reads them from HBM; with one set
// shared by every layer (31 MB) from the L2, which leaves what the chain's dependent phases (each
// kernel's wait, its staged input, its sums) cost. Printed per layer, with the weights' TB/s, with
// the weights in shared memory and in registers, chained and launched one after another.
void ProjectionChain(const at::Device& device) {
  const at::TensorOptions bf16 = at::TensorOptions().dtype(at::kBFloat16).device(device);
  constexpr int kLayers = 28;
  struct Layer {
    at::Tensor qkv, o, gate_up, down;
  };
  const auto make = [&] {
    return Layer{at::randn({4096, 1024}, bf16) / 32, at::randn({1024, 2048}, bf16) / 45,
                 at::randn({6144, 1024}, bf16) / 32, at::randn({1024, 3072}, bf16) / 55};
  };
  std::vector<Layer> own;
  for (int i = 0; i < kLayers; ++i) own.push_back(make());
  const std::vector<Layer> shared(kLayers, own.front());
  const at::Tensor norm = at::randn({1024}, bf16);
  const at::Tensor x = at::randn({1, 1, 1024}, bf16);
  const double bytes = 2.0 * (4096 * 1024 + 1024 * 2048 + 6144 * 1024 + 1024 * 3072);
  const auto chain = [&](const std::vector<Layer>& layers) {
    at::Tensor h = x, residual = x;
    for (const Layer& l : layers) {
      const rl::kernels::SummedLinear in =
          rl::kernels::SmallLinearAddRmsNorm(h, residual, norm, 1e-6, l.qkv, {});
      const at::Tensor o = rl::kernels::SmallLinear(in.out.narrow(-1, 0, 2048), l.o, {});
      const rl::kernels::SummedLinear mlp =
          rl::kernels::SmallLinearAddRmsNorm(o, in.sum, norm, 1e-6, l.gate_up, {});
      h = rl::kernels::SmallLinearSiluMul(mlp.out, l.down, {});
      residual = mlp.sum;
    }
    return h;
  };
  // The whole chain captured once (a graph of 112 kernels), per layer.
  const auto micros_per_layer = [&](const std::vector<Layer>& layers) {
    return GraphMicrosPerCall([&] { chain(layers); }, 1) / kLayers;
  };
  for (const bool in_shared : {true, false}) {
    for (const bool chained : {true, false}) {
      const rl::kernels::SharedWeightLinear weights(in_shared);
      const rl::kernels::ProgrammaticLaunch programmatic(chained);
      const double hbm = micros_per_layer(own);
      const double l2 = micros_per_layer(shared);
      std::printf(
          "batch-1 projection chain, weights in %s, %s: %.2f us a layer from HBM (%.2f TB/s), "
          "%.2f us from the L2 (one layer's weights for all)\n",
          in_shared ? "shared memory" : "registers", chained ? "chained" : "one after another", hbm,
          bytes / hbm * 1e-6, l2);
    }
  }
}

int main(int argc, char** argv) {
  CLI::App app{"Our CUDA kernels vs the LibTorch ops they replace: agreement and speed."};
  int64_t rows = 4096, vocab = 151936;
  int rounds = 5;
  app.add_option("--rows", rows, "token positions of the loss-head timing");
  app.add_option("--vocab", vocab, "vocabulary size");
  app.add_option("--rounds", rounds, "timed rounds; the best counts");
  bool chain_only = false;
  app.add_flag("--projection-chain-only", chain_only,
               "run only the batch-1 projection chain (part 4)");
  CLI11_PARSE(app, argc, argv);
  const at::Device device = rl::BindDevice(0, rl::DevicePreference::kCudaIfAvailable);
  if (!device.is_cuda()) {
    std::fprintf(stderr, "fused_kernels_bench needs a GPU\n");
    return 2;
  }
  at::manual_seed(3);
  const auto on = [&](at::ScalarType dtype) {
    return at::TensorOptions().dtype(dtype).device(device);
  };
  if (chain_only) {
    ProjectionChain(device);
    return 0;
  }
  bool ok = true;

  // RMSNorm with its gradients: hidden-size rows and head-dim rows, as the decoder uses them.
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [n, cols] : {std::pair<int64_t, int64_t>{4096, 1024}, {1024, 128}}) {
      const at::Tensor x = at::randn({n, cols}, on(dtype)) * 3;
      const at::Tensor w = at::rand({cols}, on(dtype)) + 0.5;
      const at::Tensor g = at::randn({n, cols}, on(dtype));
      const auto run = [&](rl::model::Kernels impl) {
        const at::Tensor xl = x.detach().requires_grad_(true);
        const at::Tensor wl = w.detach().requires_grad_(true);
        const at::Tensor y = rl::model::RmsNorm(xl, wl, 1e-6, impl);
        const auto grads = torch::autograd::grad({(y.to(at::kFloat) * g).sum()}, {xl, wl});
        return std::vector<at::Tensor>{y, grads[0], grads[1]};
      };
      const std::vector<at::Tensor> ref = run(rl::model::Kernels::kLibTorch);
      const std::vector<at::Tensor> got = run(rl::model::Kernels::kFused);
      const std::string name = "rms_norm " + std::string(c10::toString(dtype)) + " [" +
                               std::to_string(n) + ", " + std::to_string(cols) + "]";
      // fp32: rounding of the sum order; bf16: one bf16 step of the output (|y| < 16), of
      // d x (|d x| < 8) and of d weight (a sum over n rows of |g h| ~ 3: |d w| < 2^8 for n 4096).
      const bool fp32 = dtype == at::kFloat;
      ok &= Report(name, MaxAbs(got[0], ref[0]), fp32 ? 1e-5 : 0.0625);
      ok &= Report("  d x", MaxAbs(got[1], ref[1]), fp32 ? 1e-4 : 0.0625);
      ok &= Report("  d weight (relative)",
                   MaxAbs(got[2], ref[2]) / ref[2].abs().max().item<double>(),
                   fp32 ? 1e-4 : 1.6e-2);
    }
  }

  // RoPE: bit-identical to ApplyRope, both layouts, full and partial rotation, strided input.
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const bool interleaved : {false, true}) {
      for (const int64_t half : {64, 32}) {
        const at::Tensor x = at::randn({4, 7, 16, 256}, on(dtype)).narrow(-1, 0, 128);
        const at::Tensor angles = at::rand({7, half}, on(at::kFloat)) * 6;
        const at::Tensor cos = angles.cos().to(dtype);
        const at::Tensor sin = angles.sin().to(dtype);
        const at::Tensor ref =
            rl::model::ApplyRope(x.transpose(1, 2), cos, sin,
                                 interleaved ? rl::model::RopeLayout::kInterleaved
                                             : rl::model::RopeLayout::kHalf)
                .transpose(1, 2);
        const at::Tensor got = rl::kernels::RopeInference(x, cos, sin, interleaved);
        ok &= Report("rope " + std::string(c10::toString(dtype)) +
                         (interleaved ? " interleaved" : " half") + " rotary " +
                         std::to_string(2 * half) + " of 128",
                     MaxAbs(got, ref), 0.0);
      }
    }
  }

  // Token log-probs and entropy with gradients, against LibTorch autograd.
  {
    const int64_t n = 256;
    const at::Tensor targets = at::randint(vocab, {n}, on(at::kLong));
    const at::Tensor g_lp = at::randn({n}, on(at::kFloat));
    const at::Tensor g_h = at::randn({n}, on(at::kFloat));
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor logits = (at::randn({n, vocab}, on(at::kFloat)) * 4).to(dtype);
      const LossHead ref = Run(logits, targets, g_lp, g_h, false);
      const LossHead got = Run(logits, targets, g_lp, g_h, true);
      const std::string name = std::string(c10::toString(dtype));
      ok &= Report("token log-probs " + name, MaxAbs(got.log_probs, ref.log_probs), 1e-4);
      ok &= Report("entropy " + name, MaxAbs(got.entropy, ref.entropy), 1e-4);
      // |grad| <= |g| * p with |g| up to ~4: fp32, the relative rounding of p (~1e-6, from the
      // log-sum-exp) times that; bf16, one bf16 step of the largest entry.
      ok &= Report("d logits " + name, MaxAbs(got.grad, ref.grad),
                   dtype == at::kFloat ? 2e-5 : 1.6e-2);
    }
  }

  // Speed of the loss head: -mean log-prob, forward and backward, bf16 logits.
  const at::Tensor logits = (at::randn({rows, vocab}, on(at::kFloat)) * 4).to(at::kBFloat16);
  const at::Tensor targets = at::randint(vocab, {rows}, on(at::kLong));
  const auto time = [&](bool fused) {
    double best = 1e30;
    for (int r = 0; r <= rounds; ++r) {  // round 0 warms up
      at::Tensor leaf = logits.detach().requires_grad_(true);
      c10::cuda::device_synchronize();
      const auto start = Clock::now();
      at::Tensor log_probs;
      if (fused) {
        log_probs = rl::kernels::TokenLogProbs(leaf, targets).log_probs;
      } else {
        log_probs = at::log_softmax(leaf.to(at::kFloat), -1).gather(-1, targets.unsqueeze(-1));
      }
      log_probs.mean().neg().backward();
      c10::cuda::device_synchronize();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (r > 0) best = std::min(best, seconds);
    }
    return best;
  };
  const double libtorch = time(false);
  const double fused = time(true);
  std::printf("loss head [%lld, %lld] bf16, forward + backward: LibTorch %.2f ms, fused %.2f ms, "
              "%.2fx\n",
              static_cast<long long>(rows), static_cast<long long>(vocab), 1e3 * libtorch,
              1e3 * fused, libtorch / fused);
  DecodeKernelSpeeds(device);
  ProjectionChain(device);
  return ok ? 0 : 1;
}
