#include "trainer/model/layers.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "launch/check.h"
#include "trainer/fault_injection.h"
#include "trainer/kernels/fused_ops.h"

namespace rl::model {

// Note [Batch-invariant CPU kernels]
// On the CPU a row's result must not depend on how many rows it is computed with, so that the
// rollout engine (a prefill, then decode steps of a few rows over a KV cache) and training (whole
// right-padded sequences) compute the same bits, and the train/rollout log-prob mismatch of a
// dense fp32 model is exactly 0 (Note [Log-prob mismatch] in trainer/rl/losses.h). Two ops were
// not: a GEMM of fewer than 16 rows takes other kernels than a larger one (its summation order
// differs), so Linear pads such inputs to 16 rows with zeros; and SDPA's CPU kernels block the
// keys by the sequence length, so AttentionCore computes attention on the CPU from elementwise
// products and reductions over the head and key dimensions, with the keys padded to a multiple
// of 64 (masked), so that the order of every reduction per output element is the same whatever
// the number of queries or of keys; masked keys add exact zeros. The RoPE table's cos and sin are
// computed for a multiple of 64 positions (MakeRopeTable).
// The MoE block's grouped GEMM runs as a loop of such Linears on the CPU, one per expert, and
// the router's as well. RMSNorm, RoPE, the MLP's elementwise ops and log_softmax are per-row
// already. Checked by
// //tests:fidelity_test (mismatch 0, --use-rollout-logprobs changes nothing).
constexpr int64_t kMinCpuGemmRows = 16;
// The elementwise attention's [B, H, queries, T, D] product is computed in query chunks of about
// this many elements.
constexpr int64_t kCpuAttentionElements = int64_t{1} << 24;
constexpr int64_t kCpuAttentionKeyBlock = 64;

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const std::optional<at::Tensor> bias = b.defined() ? std::optional<at::Tensor>(b) : std::nullopt;
  const int64_t k = x.size(-1);
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  if (!x.is_cpu() || rows == 0 || rows >= kMinCpuGemmRows) return at::linear(x, w, bias);
  // Note [Batch-invariant CPU kernels]: a GEMM of 16 rows, of which the first `rows` are used.
  const at::Tensor padded =
      at::constant_pad_nd(x.reshape({rows, k}), {0, 0, 0, kMinCpuGemmRows - rows}, 0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return at::linear(padded, w, bias).narrow(0, 0, rows).reshape(shape);
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Kernels impl) {
  if (impl == Kernels::kFused) {
    if (kernels::SmallLinearTakes(x, w, b)) return kernels::SmallLinear(x, w, b);
    if (kernels::SkinnyLinearPays(x, w, b)) return kernels::SkinnyLinear(x, w, b);
  }
  return Linear(x, w, b);
}

const RopeTable& AttentionContext::StepRope() const {
  if (!position.defined()) return *rope;
  if (!step_->rope.cos.defined()) {
    step_->rope = {rope->cos.index_select(0, position).unsqueeze(1),  // [B or 1, 1, half]
                   rope->sin.index_select(0, position).unsqueeze(1)};
  }
  return step_->rope;
}

const at::Tensor& AttentionContext::KeyMask() const {
  RL_CHECK(position.defined() && key_length >= 1, Error,
           "a key mask needs a device-side position and a key length; got {} keys", key_length);
  if (!step_->key_mask.defined()) {
    const int64_t rows = position.size(0);
    step_->key_mask = (at::arange(key_length, position.options()) <= position.view({rows, 1}))
                          .view({rows, 1, key_length});
  }
  return step_->key_mask;
}

namespace {

// The last projection of a block, whose output the caller adds to the residual: its split-k
// partial sums where `partial_sums` allows them and they pay (Note [Split-k partial sums] in
// trainer/kernels/fused_ops.h), else Linear's output.
at::Tensor BlockOutputLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                             Kernels impl, bool partial_sums) {
  if (impl == Kernels::kFused && partial_sums && kernels::SplitKPartialsPay(x, w, b)) {
    return kernels::SplitKPartials(x, w);
  }
  return Linear(x, w, b, impl);
}

constexpr double kMlaLatentNormEps = 1e-6;  // transformers builds q_a/kv_a norms with the default
constexpr double kIndexerNormEps = 1e-6;
// The indexer's [B, chunk, heads, T] fp32 score block is bounded to about this many elements.
constexpr int64_t kIndexerScoreElements = int64_t{1} << 26;

// Keys [0, T) visible to queries at positions [start, start + S): [S, T] bool.
at::Tensor CausalMask(int64_t start, int64_t s, int64_t t, at::Device device) {
  at::Tensor q = at::arange(start, start + s, at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor k = at::arange(t, at::TensorOptions().dtype(at::kLong).device(device));
  return k.unsqueeze(0) <= q.unsqueeze(1);
}

// Which keys [0, T) the queries at the S new positions see.
struct Visibility {
  bool causal = false;  // start == 0 and S == T: SDPA's own causal mask
  // [1, S, T] bool, or [B, S, T] with a position per row (Note [Ragged decode] in layers.h);
  // undefined (and not causal): every key.
  at::Tensor mask;
};

Visibility Visible(const AttentionContext& ctx, int64_t s, int64_t t, at::Device device) {
  if (ctx.position.defined()) return {false, ctx.KeyMask()};  // device-side positions
  // One decode step: the query sees every key, so no mask (and no mask kernels) is needed.
  if (s == 1 && ctx.start + 1 == t) return {};
  if (ctx.start == 0 && s == t) return {true, {}};
  return {false, CausalMask(ctx.start, s, t, device).unsqueeze(0)};
}

// softmax(q k^T * scale + mask) v with fp32 softmax. q [B, Hq, L, Dq], k [B, Hk, T, Dq],
// v [B, Hk, T, Dv] with Hk == Hq, or Hq a multiple of Hk when `enable_gqa` (query head h reads key
// head h / (Hq / Hk)); `selected` ([B, L, T] bool, optional) further restricts the visible keys.
// Note [Batch-invariant CPU kernels]: softmax(q k^T * scale + mask) v from elementwise products
// and reductions, in fp32 (fp64 for fp64), chunked over the queries. `mask` is undefined or a
// bool tensor that broadcasts to [B, H, L, T].
at::Tensor CpuAttention(const at::Tensor& q, at::Tensor k, at::Tensor v, double scale,
                        at::Tensor mask) {
  if (k.size(1) != q.size(1)) {  // GQA: query head h reads key head h / (Hq / Hk)
    k = k.repeat_interleave(q.size(1) / k.size(1), 1);
    v = v.repeat_interleave(q.size(1) / v.size(1), 1);
  }
  // The keys padded to a multiple of 64 with masked zeros: reductions over 6 or 9 keys may round
  // differently, over 64 or 128 keys of which the same first ones are visible they do not.
  const int64_t t = k.size(2);
  const int64_t padded =
      (t + kCpuAttentionKeyBlock - 1) / kCpuAttentionKeyBlock * kCpuAttentionKeyBlock;
  if (padded != t) {
    k = at::constant_pad_nd(k, {0, 0, 0, padded - t}, 0);
    v = at::constant_pad_nd(v, {0, 0, 0, padded - t}, 0);
    if (!mask.defined()) mask = at::ones({1, t}, q.options().dtype(at::kBool));
    std::vector<int64_t> tail(mask.sizes().begin(), mask.sizes().end());
    tail.back() = padded - t;
    mask = at::cat({mask, at::zeros(tail, mask.options())}, -1);
  }
  const at::Tensor qf = AtLeastFloat(q);
  const at::Tensor kf = AtLeastFloat(k).unsqueeze(2);  // [B, H, 1, T, D]
  const at::Tensor vf = AtLeastFloat(v).unsqueeze(2);  // [B, H, 1, T, Dv]
  const int64_t queries = q.size(2);
  const int64_t per_query =
      std::max<int64_t>(1, q.size(0) * q.size(1) * k.size(2) * std::max(q.size(3), v.size(3)));
  const int64_t chunk = std::max<int64_t>(1, std::min(queries, kCpuAttentionElements / per_query));
  std::vector<at::Tensor> parts;
  for (int64_t q0 = 0; q0 < queries; q0 += chunk) {
    const int64_t n = std::min(chunk, queries - q0);
    at::Tensor scores = (qf.narrow(2, q0, n).unsqueeze(3) * kf).sum(-1) * scale;  // [B, H, n, T]
    if (mask.defined()) {
      const at::Tensor m = mask.size(-2) == 1 ? mask : mask.narrow(-2, q0, n);
      scores = scores.masked_fill(m.logical_not(), -std::numeric_limits<double>::infinity());
    }
    parts.push_back((at::softmax(scores, -1).unsqueeze(-1) * vf).sum(-2));  // [B, H, n, Dv]
  }
  return (parts.size() == 1 ? parts[0] : at::cat(parts, 2)).to(q.scalar_type());
}

at::Tensor AttentionCore(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         double scale, const Visibility& visible, const at::Tensor& selected,
                         bool enable_gqa = false) {
  at::Tensor mask = visible.mask;  // [B or 1, S, T]
  bool causal = visible.causal;
  if (selected.defined()) {
    if (causal) mask = CausalMask(0, q.size(2), k.size(2), q.device()).unsqueeze(0);
    causal = false;
    mask = mask.defined() ? at::logical_and(mask, selected) : selected;
  }
  if (mask.defined()) mask = mask.unsqueeze(1);  // [B or 1, 1, S, T] against [B, H, S, T]
  if (q.is_cpu()) {
    if (causal) mask = CausalMask(0, q.size(2), k.size(2), q.device());
    return CpuAttention(q, k, v, scale, mask);
  }
  return at::scaled_dot_product_attention(
      q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, 0.0, causal, scale,
      enable_gqa);
}

// scale * (a b) in at least fp32, a [B, M, K] and b [B, K, N]. bf16 CUDA inputs take cuBLAS's fp32
// output with the scale as its alpha: the scores are not rounded to bf16 before the softmax, and
// no separate pass scales them (it computed bmm, an fp32 copy and the product before).
at::Tensor ScaledScores(const at::Tensor& a, const at::Tensor& b, double scale) {
  if (a.is_cuda() && a.scalar_type() == at::kBFloat16) {
    at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options().dtype(at::kFloat));
    return at::baddbmm_out(out, out, a, b, at::kFloat, /*beta=*/0, /*alpha=*/scale);
  }
  return AtLeastFloat(at::bmm(a, b)).mul_(scale);
}

// Note [MLA decode in the latent space]
// MLA's keys and values are up-projections of a per-position latent c (kv_lora_rank values) by
// kv_b_proj, per head h: k_nope = W_uk[h] c, v = W_uv[h] c; the RoPE part of the key, k_pe, is
// shared by the heads. Expanding every cached position each decode step costs T x kv_lora_rank x
// heads x (nope + v) multiply-adds and a [B, heads, T, nope + rope] key per layer. Decode steps
// of an inference Decoder (Kernels::kFused) instead absorb the up-projections into the query and
// the output, as DeepSeek's own inference does:
//   q_nope . k_nope = (W_uk[h]^T q_nope) . c,   sum_t p_t v_t = W_uv[h] (sum_t p_t c_t),
// so the step attends like multi-query attention with one head of kv_lora_rank + rope dims over
// the cache as it is stored ([latent | k_pe] per position, LayerKv::latent_pe): scores are one
// GEMM per sequence of the absorbed queries of every head against the cached rows (fp32 out,
// ScaledScores), the softmax in fp32, the weighted sum of latents one GEMM, and W_uv one batched
// GEMM over the heads. Equal to the expanded attention up to rounding (another order of products;
// //trainer/model:decoder_test checks fp32 within 1e-5). Training and the CPU engine (kLibTorch)
// keep the expanded form, which the batch-invariant CPU attention needs.
// These ops stay the GPU path: a kernel fusing the scores, the softmax and the weighted latents
// (a block per 16 heads of a row, measured and removed) ran at 0.26x to 0.53x of them on the H200
// (GLM-4.7-Flash's 20 heads and GLM-5's 64, 4,096 and 16,384 keys, batch 1 and 64), since each
// block re-read the cached rows its row's other heads read; the ops' GEMMs read a row once for
// every head (about 1.7 TB/s at batch 64). A kernel that wins must hold all heads of a row.

// A step's absorbed queries and the up-projection its weighted latents go through.
struct LatentHeads {
  int64_t b = 0, heads = 0, s = 0;
  at::Tensor w_kv;   // kv_b_proj as [heads, nope + v_head_dim, kv_lora_rank]
  at::Tensor query;  // [B, heads * S, kv_lora_rank + rope]: per head q_nope W_uk[h], then q_rot
};

// q_pass [B, H, S, nope], q_rot [B, H, S, rope].
LatentHeads AbsorbQueries(const MlaWeights& w, const ModelConfig& c, const at::Tensor& q_pass,
                          const at::Tensor& q_rot) {
  LatentHeads h;
  h.b = q_pass.size(0);
  h.heads = q_pass.size(1);
  h.s = q_pass.size(2);
  const int64_t nope = c.qk_nope_head_dim;
  const int64_t rank = c.kv_lora_rank;
  h.w_kv = w.kv_b_proj.view({h.heads, nope + c.v_head_dim, rank});
  const at::Tensor q_latent =  // [heads, B * S, rank]
      at::bmm(q_pass.permute({1, 0, 2, 3}).reshape({h.heads, h.b * h.s, nope}),
              h.w_kv.narrow(1, 0, nope));
  h.query = at::cat({q_latent.view({h.heads, h.b, h.s, rank}).permute({1, 0, 2, 3}), q_rot}, -1)
                .reshape({h.b, h.heads * h.s, rank + q_rot.size(-1)});
  return h;
}

// latents [B, heads * S, kv_lora_rank] (the weighted latents of each query) -> the attention
// output [B, S, heads * v_head_dim] before o_proj.
at::Tensor ProjectLatents(const LatentHeads& h, const ModelConfig& c, const at::Tensor& latents) {
  const int64_t vd = c.v_head_dim;
  const at::Tensor out =  // [heads, B * S, vd]
      at::bmm(latents.reshape({h.b, h.heads, h.s, c.kv_lora_rank})
                  .permute({1, 0, 2, 3})
                  .reshape({h.heads, h.b * h.s, c.kv_lora_rank}),
              h.w_kv.narrow(1, c.qk_nope_head_dim, vd).transpose(1, 2));
  return out.view({h.heads, h.b, h.s, vd}).permute({1, 2, 0, 3}).reshape({h.b, h.s, h.heads * vd});
}

// The weighted latents [B, heads * S, kv_lora_rank] of the absorbed queries over the cached rows
// `cached` [B, T, kv_lora_rank + rope], the keys those of `visible` (and `selected`, [B, S, T]
// bool, when defined), by the LibTorch ops.
at::Tensor WeightedLatents(const LatentHeads& h, const ModelConfig& c, const at::Tensor& cached,
                           const Visibility& visible, const at::Tensor& selected) {
  const int64_t t = cached.size(1);
  at::Tensor scores = ScaledScores(h.query, cached.transpose(1, 2), c.attention_scale())
                          .view({h.b, h.heads, h.s, t});
  at::Tensor mask =  // [B or 1, S, T]
      visible.causal ? CausalMask(0, h.s, t, cached.device()).unsqueeze(0) : visible.mask;
  if (selected.defined()) mask = mask.defined() ? at::logical_and(mask, selected) : selected;
  if (mask.defined()) {
    scores.masked_fill_(mask.logical_not().unsqueeze(1), -std::numeric_limits<double>::infinity());
  }
  const at::Tensor probs =
      at::softmax(scores, -1).to(cached.scalar_type()).view({h.b, h.heads * h.s, t});
  return at::bmm(probs, cached.narrow(-1, 0, c.kv_lora_rank));
}

// Note [DSA decode over the selected keys]
// A DSA layer's query attends to the index_topk (K) keys its indexer selected (GLM-5: 2048),
// however long the sequence. Training (and the expanded decode) masks [B, S, T] scores to the
// selection. A decode step in the latent space over T >= 2 K cached keys instead gathers the
// selected keys' cached rows, [B, K, kv_lora_rank + rope], and attends over them alone: its
// scores and softmax are [B, heads, K], and it reads K rows of the cache (twice, after writing
// them once in the gather), not T. Below 2 K it masks to the selection as training does. Counting
// the ops' reads and writes at GLM-5's widths (64 heads), the attention moves about 4.9 KB per key
// (the 1,152-byte cached row twice, and the [B, heads, T] scores through five ops) and the gather
// adds 2.3 KB per selected key, so it pays from about 1.5 K keys on; 2 K leaves a margin. The two
// forms attend over the same keys in another order, so they agree up to rounding
// (//trainer/model:decoder_test checks the latent-space steps of both against the full forward,
// fp32, within 1e-5). A selected key the row cannot see (a row shorter than K among longer ones:
// its masked keys tie at -inf in the indexer and may be picked) stays masked: its visibility is
// gathered with it. The selection holds the visible keys with the largest index scores before any
// masked one, so a row that sees any key attends to at least one.

// The selected keys are gathered from T >= kGatherSelectedFrom x K cached keys on.
constexpr int64_t kGatherSelectedFrom = 2;

// WeightedLatents over the keys `topk` [B, 1, K] of a decode step (one position per row) only.
at::Tensor SelectedWeightedLatents(const LatentHeads& h, const ModelConfig& c,
                                   const at::Tensor& cached, const Visibility& visible,
                                   const at::Tensor& topk) {
  const int64_t b = cached.size(0);
  const int64_t t = cached.size(1);
  const int64_t k = topk.size(-1);
  RL_CHECK(h.s == 1 && topk.dim() == 3 && topk.size(0) == b && topk.size(1) == 1 && !visible.causal,
           Error, "SelectedWeightedLatents: one decode position per row, got topk of {} dims",
           topk.dim());
  const at::Tensor keys = topk.view({b, k});
  const at::Tensor rows = cached.gather(1, keys.unsqueeze(-1).expand({b, k, cached.size(-1)}));
  Visibility seen;  // [B, 1, K]: which of the selected keys each row sees
  if (visible.mask.defined()) {
    seen.mask = visible.mask.expand({b, 1, t}).gather(-1, keys.unsqueeze(1));
  }
  return WeightedLatents(h, c, rows, seen, {});
}

// Writes `value` (the S new positions on axis `dim`) into rows [0, B) of the cache tensor `cache`
// and returns those rows' cached positions [0, T) (Notes [Decode at a device position], [Ragged
// decode]).
at::Tensor AppendToCache(const at::Tensor& cache, int64_t dim, const at::Tensor& value,
                         const AttentionContext& ctx) {
  const int64_t b = value.size(0);
  const at::Tensor rows = cache.narrow(0, 0, b);
  if (ctx.position.defined()) {  // row r's one new position at position[r] (or all at one)
    std::vector<int64_t> shape(static_cast<size_t>(value.dim()), 1);
    shape[0] = ctx.position.size(0);
    rows.scatter_(dim, ctx.position.view(shape).expand(value.sizes()), value);
    return rows.narrow(dim, 0, ctx.key_length);
  }
  const int64_t s = value.size(dim);
  rows.narrow(dim, ctx.start, s).copy_(value);
  return rows.narrow(dim, 0, ctx.start + s);
}

}  // namespace

at::Tensor AtLeastFloat(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) return t;
  return t.to(at::kFloat);
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps, Kernels impl) {
  if (impl == Kernels::kFused && kernels::Supported(x) &&
      weight.scalar_type() == x.scalar_type() && weight.device() == x.device()) {
    return kernels::FusedRmsNorm(x, weight, eps);
  }
  at::Tensor xf = AtLeastFloat(x);
  at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * y.to(x.scalar_type());
}

at::Tensor RopeInvFreq(const ModelConfig& c) {
  const int64_t dim = c.rope_dim();
  const double base = c.rope.theta;
  at::Tensor exponents = at::arange(0, dim, 2, at::kFloat) / static_cast<double>(dim);
  at::Tensor pos_freqs = at::pow(base, exponents);
  if (c.rope.type == RopeType::kDefault) return 1.0 / pos_freqs;

  // YaRN (transformers _compute_yarn_parameters).
  const double factor = c.rope.factor;
  const double l0 = static_cast<double>(c.rope.original_max_position_embeddings);
  auto find_dim = [&](double rotations) {
    return (dim * std::log(l0 / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = find_dim(c.rope.beta_fast);
  double high = find_dim(c.rope.beta_slow);
  if (c.rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  at::Tensor ramp = at::clamp((at::arange(dim / 2, at::kFloat) - low) / (high - low), 0, 1);
  at::Tensor extrapolation_factor = 1 - ramp;
  at::Tensor inv_extrapolation = 1.0 / pos_freqs;
  at::Tensor inv_interpolation = 1.0 / (factor * pos_freqs);
  return inv_interpolation * (1 - extrapolation_factor) + inv_extrapolation * extrapolation_factor;
}

RopeTable MakeRopeTable(const ModelConfig& c, int64_t start, int64_t length, at::ScalarType dtype,
                        at::Device device) {
  at::Tensor inv_freq = RopeInvFreq(c).to(device);
  // Note [Batch-invariant CPU kernels]: cos and sin are computed for a multiple of 64 positions,
  // so that no entry falls in the scalar tail of the vectorised loop (whose results may differ in
  // the last bit): a position's entries are then the same in a table of any length.
  const int64_t padded = (length + 63) / 64 * 64;
  at::Tensor pos =
      at::arange(start, start + padded, at::TensorOptions().dtype(at::kFloat).device(device));
  at::Tensor freqs = pos.unsqueeze(1) * inv_freq.unsqueeze(0);  // [padded, rope_dim / 2]
  const double factor = c.rope_attention_factor();
  return {(freqs.cos() * factor).to(dtype).narrow(0, 0, length),
          (freqs.sin() * factor).to(dtype).narrow(0, 0, length)};
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     RopeLayout layout) {
  const int64_t half = cos.size(-1);
  const int64_t d = x.size(-1);
  at::Tensor rot = 2 * half == d ? x : x.narrow(-1, 0, 2 * half);
  at::Tensor x1, x2;
  if (layout == RopeLayout::kHalf) {
    x1 = rot.narrow(-1, 0, half);
    x2 = rot.narrow(-1, half, half);
  } else {
    x1 = rot.slice(-1, 0, 2 * half, 2);
    x2 = rot.slice(-1, 1, 2 * half, 2);
  }
  at::Tensor out = at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  if (2 * half == d) return out;
  return at::cat({out, x.narrow(-1, 2 * half, d - 2 * half)}, -1);
}

namespace {

// ApplyRope of x [B, S, H, D] (heads after positions) by ctx.StepRope() ([S, half], or [B or 1,
// S, half] with a position per row): in an inference decoder on CUDA, the RoPE kernel (the same
// bits in one kernel, where the ops take about eight: kernels::RopeInference), else the ops.
// Returns [B, S, H, D].
at::Tensor RopeHeadsLast(const at::Tensor& x, const AttentionContext& ctx, RopeLayout layout) {
  const RopeTable& rope = ctx.StepRope();
  const at::Tensor& cos = rope.cos;
  const at::Tensor& sin = rope.sin;
  if (ctx.kernels == Kernels::kFused && kernels::Supported(x) && !x.requires_grad() &&
      cos.scalar_type() == x.scalar_type()) {
    return kernels::RopeInference(x, cos, sin, layout == RopeLayout::kInterleaved);
  }
  return ApplyRope(x, cos.unsqueeze(-2), sin.unsqueeze(-2), layout);
}

}  // namespace

// Note [Decode kernels]
// A decode step of the rollout engine (Kernels::kFused, one new position at a device-side
// position, on CUDA) runs each GQA layer as
//   AddRmsNorm (the previous block's residual add and this norm), the q/k/v GEMM,
//   DecodeQkvAttention (q/k norms, RoPE, the cache writes and the attention), the o GEMM,
//   AddRmsNorm, the gate/up GEMM, SiluMul, the down GEMM:
// 8 kernels (and a reduction where cuBLAS splits a GEMM's sums), where the LibTorch ops took 27
// (tools/bench/decode_bench counts them). Where more than 8 query heads share a key/value head,
// DecodeQkvPrep and DecodeAttention run as two kernels. For one or two rows the GEMMs (and the
// LM head) are SmallLinear, a warp per output feature (a block's weights copied into shared memory
// where they fit: Note [Small linear with weights in shared memory] in
// trainer/kernels/decode_kernels.cu), and a dense layer
// (Decoder::SmallDecodeLayer) folds each AddRmsNorm into the projection after it and SiluMul into
// the down projection (each block of those computes its input rows itself): 5 kernels; at one row
// the o projection is folded into the attention as well (DecodeQkvAttentionO, Note [The o
// projection in the attention's clusters] in trainer/kernels/decode_kernels.cu): 4. From 3 to
// 32 bf16 rows the projections of up to 2048 features are SkinnyLinear (Note [Skinny linear
// kernel] in trainer/kernels/linear_kernels.cu: 16 features a block on tensor cores, where it
// beat cuBLAS); the rest keep cuBLAS. From 33 to 64 rows the o and down projections of up to 2048
// features over k >= 2048 leave their sums to the AddRmsNorm after them (Note [Split-k partial
// sums] in trainer/kernels/fused_ops.h: a batch of cuBLAS GEMMs over 4 slices of k writes fp32
// partial sums, which AddPartialsRmsNorm adds up; the block's output is those partial sums, and
// Decoder::Layers's add_norm takes them), and on the H100 and H200 the gate/up GEMM and SiluMul are
// one kernel (GateUpSiluMma: Note [Gate/up projection with SiluMul on tensor cores] in
// trainer/kernels/linear_kernels.cu): 7 kernels. All but the attention, SmallLinear,
// SkinnyLinear, GateUpSiluMma and the split-k sums compute bit for bit what the ops computed, and
// the fused kernels what the unfused ones compute (trainer/kernels/fused_ops.h); the attention
// reads only the positions up to the step's (SDPA read the whole key block under a mask), and
// those five may sum in another order than SDPA and cuBLAS, so they may differ from them by
// rounding. Graph replays and eager steps run the same kernels, so they stay bit-identical.
// trainer/kernels/decode_kernels_test.cc checks each kernel on the GPU.
bool GqaDecodeKernelsApply(const GqaWeights& w, const AttentionContext& ctx, const at::Tensor& x) {
  return ctx.kernels == Kernels::kFused && ctx.position.defined() && ctx.cache != nullptr &&
         x.dim() == 3 && x.size(1) == 1 && kernels::Supported(x) && !x.requires_grad() &&
         w.qkv_proj.defined() && w.q_norm.defined() == w.k_norm.defined() &&
         ctx.rope->cos.scalar_type() == x.scalar_type() &&
         ctx.cache->key.scalar_type() == x.scalar_type() &&
         kernels::DecodeAttentionTakes(
             ctx.config->num_attention_heads,
             kernels::DecodeCache{ctx.cache->key, ctx.cache->value, ctx.position});
}

at::Tensor GqaDecodeAttention(const GqaWeights& w, const at::Tensor& qkv,
                              const AttentionContext& ctx) {
  const ModelConfig& c = *ctx.config;
  const kernels::DecodeCache cache{ctx.cache->key, ctx.cache->value, ctx.position};
  const at::Tensor rows = qkv.stride(-1) == 1 ? qkv : qkv.contiguous();
  const int64_t key_length = ctx.key_length;
  const std::vector<int64_t> shape{qkv.size(0), 1, c.num_attention_heads * c.head_dim};
  if (kernels::DecodeQkvAttentionTakes(c.num_attention_heads, cache)) {
    return kernels::DecodeQkvAttention(rows, w.q_norm, w.k_norm, c.rms_norm_eps, ctx.rope->cos,
                                       ctx.rope->sin, c.rope_interleave, c.num_attention_heads,
                                       c.num_key_value_heads, c.head_dim, cache, key_length,
                                       c.attention_scale())
        .view(shape);
  }
  const at::Tensor query = kernels::DecodeQkvPrep(
      rows, w.q_norm, w.k_norm, c.rms_norm_eps, ctx.rope->cos, ctx.rope->sin, c.rope_interleave,
      c.num_attention_heads, c.num_key_value_heads, c.head_dim, cache);
  return kernels::DecodeAttention(query, cache, key_length, c.attention_scale()).view(shape);
}

at::Tensor GqaDecodeAttentionO(const GqaWeights& w, const at::Tensor& qkv,
                               const AttentionContext& ctx) {
  const ModelConfig& c = *ctx.config;
  const kernels::DecodeCache cache{ctx.cache->key, ctx.cache->value, ctx.position};
  const int64_t key_length = ctx.key_length;
  if (!kernels::DecodeQkvAttentionOTakes(c.num_attention_heads, cache, key_length, w.o_proj,
                                         w.o_bias)) {
    return {};
  }
  const at::Tensor rows = qkv.stride(-1) == 1 ? qkv : qkv.contiguous();
  return kernels::DecodeQkvAttentionO(rows, w.q_norm, w.k_norm, c.rms_norm_eps, ctx.rope->cos,
                                      ctx.rope->sin, c.rope_interleave, c.num_attention_heads,
                                      c.num_key_value_heads, c.head_dim, cache, key_length,
                                      c.attention_scale(), w.o_proj);
}

at::Tensor GqaAttention(const GqaWeights& w, const at::Tensor& x, const AttentionContext& ctx) {
  const ModelConfig& c = *ctx.config;
  const int64_t b = x.size(0);
  const int64_t s = x.size(1);
  const int64_t heads = c.num_attention_heads;
  const int64_t kv_heads = c.num_key_value_heads;
  const int64_t d = c.head_dim;
  at::Tensor q, k, v;
  if (w.qkv_proj.defined()) {
    const at::Tensor qkv = Linear(x, w.qkv_proj, w.qkv_bias, ctx.kernels);
    if (GqaDecodeKernelsApply(w, ctx, x)) {  // Note [Decode kernels]
      return BlockOutputLinear(GqaDecodeAttention(w, qkv, ctx), w.o_proj, w.o_bias, ctx.kernels,
                               ctx.partial_sums);
    }
    q = qkv.narrow(-1, 0, heads * d).view({b, s, heads, d});
    k = qkv.narrow(-1, heads * d, kv_heads * d).view({b, s, kv_heads, d});
    v = qkv.narrow(-1, (heads + kv_heads) * d, kv_heads * d).view({b, s, kv_heads, d});
  } else {
    q = Linear(x, w.q_proj, w.q_bias).view({b, s, heads, d});
    k = Linear(x, w.k_proj, w.k_bias).view({b, s, kv_heads, d});
    v = Linear(x, w.v_proj, w.v_bias).view({b, s, kv_heads, d});
  }
  if (w.q_norm.defined()) {
    q = RmsNorm(q, w.q_norm, c.rms_norm_eps);
    k = RmsNorm(k, w.k_norm, c.rms_norm_eps);
  }
  const RopeLayout layout = c.rope_interleave ? RopeLayout::kInterleaved : RopeLayout::kHalf;
  q = RopeHeadsLast(q, ctx, layout).transpose(1, 2);  // [B, Hq, S, D]
  k = RopeHeadsLast(k, ctx, layout).transpose(1, 2);  // [B, Hkv, S, D]
  v = v.transpose(1, 2);
  if (ctx.cache != nullptr) {
    k = AppendToCache(ctx.cache->key, 2, k, ctx);
    v = AppendToCache(ctx.cache->value, 2, v, ctx);
  }
  const int64_t groups = heads / kv_heads;
  const Visibility visible = Visible(ctx, s, k.size(2), x.device());
  at::Tensor out;
  if (s == 1 && groups > 1) {
    // Note [Decode GQA]: a single query per row, so the G query heads that share a KV head can
    // stand in for G query positions against that head's keys ([B, Hkv, G, D]); the keys are
    // read once instead of being repeated for every query head, and the mask over keys (the same
    // for all G) broadcasts.
    out = AttentionCore(q.reshape({b, kv_heads, groups, d}), k, v, c.attention_scale(), visible,
                        at::Tensor())
              .reshape({b, heads, 1, d});
  } else {
    out = AttentionCore(q, k, v, c.attention_scale(), visible, at::Tensor(),
                        /*enable_gqa=*/groups > 1);
  }
  out = out.transpose(1, 2).reshape({b, s, heads * d});
  return Linear(out, w.o_proj, w.o_bias);
}

at::Tensor IndexerTopk(const IndexerWeights& w, const at::Tensor& x, const at::Tensor& q_resid,
                       const AttentionContext& ctx) {
  at::NoGradGuard no_grad;
  const ModelConfig& c = *ctx.config;
  const int64_t b = x.size(0);
  const int64_t s = x.size(1);
  const int64_t heads = c.index_n_heads;
  const int64_t d = c.index_head_dim;
  const at::Tensor xd = x.detach();

  // Keys: LayerNorm(wk x), RoPE (interleaved, GLM-5) on the first qk_rope_head_dim dims.
  at::Tensor k = at::layer_norm(Linear(xd, w.wk), {d}, w.k_norm_weight, w.k_norm_bias,
                                kIndexerNormEps);  // [B, S, D]
  const RopeLayout layout =
      c.indexer_rope_interleave ? RopeLayout::kInterleaved : RopeLayout::kHalf;
  k = RopeHeadsLast(k.unsqueeze(2), ctx, layout).squeeze(2);
  if (ctx.cache != nullptr) k = AppendToCache(ctx.cache->index_key, 1, k, ctx);
  const int64_t t = k.size(1);
  if (t <= c.index_topk) return at::Tensor();  // every key is selected: dense causal attention

  at::Tensor q = Linear(q_resid.detach(), w.wq_b).view({b, s, heads, d});
  q = RopeHeadsLast(q, ctx, layout);  // [B, S, heads, D]

  at::Tensor weights = at::linear(AtLeastFloat(xd), AtLeastFloat(w.weights_proj)) *
                       std::pow(static_cast<double>(heads), -0.5);  // [B, S, heads]
  const double softmax_scale = std::pow(static_cast<double>(d), -0.5);
  const int64_t topk = std::min(c.index_topk, t);
  if (s == 1 && ctx.kernels == Kernels::kFused && ctx.position.defined()) {
    const at::Tensor q_rows = q.reshape({b, heads, d});
    if (kernels::DsaIndexScoresTakes(q_rows, k)) {  // Note [DSA index scores kernel]
      const at::Tensor index = kernels::DsaIndexScores(q_rows, weights.view({b, heads}), k,
                                                       ctx.position, t, softmax_scale);
      return std::get<1>(index.topk(topk, -1)).unsqueeze(1);  // [B, 1, K]
    }
  }
  at::Tensor kf = AtLeastFloat(k).transpose(1, 2).unsqueeze(1);  // [B, 1, D, T]
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>(s, kIndexerScoreElements / std::max<int64_t>(1, b * heads * t)));
  const at::Tensor causal =  // [B or 1, S, T]
      ctx.position.defined() ? ctx.KeyMask() : CausalMask(ctx.start, s, t, x.device()).unsqueeze(0);
  std::vector<at::Tensor> parts;
  for (int64_t q0 = 0; q0 < s; q0 += chunk) {
    const int64_t n = std::min(chunk, s - q0);
    at::Tensor qc = AtLeastFloat(q.narrow(1, q0, n));                  // [B, n, heads, D]
    at::Tensor scores = at::relu(at::matmul(qc, kf) * softmax_scale);  // [B, n, heads, T]
    at::Tensor index = at::matmul(weights.narrow(1, q0, n).unsqueeze(-2), scores).squeeze(-2);
    index.masked_fill_(causal.narrow(1, q0, n).logical_not(),
                       -std::numeric_limits<double>::infinity());  // [B, n, T]
    parts.push_back(std::get<1>(index.topk(topk, -1)));
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 1);
}

at::Tensor MlaAttention(const MlaWeights& w, IndexerType indexer_type, const at::Tensor& x,
                        const AttentionContext& ctx, at::Tensor& topk) {
  const ModelConfig& c = *ctx.config;
  const int64_t b = x.size(0);
  const int64_t s = x.size(1);
  const int64_t heads = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim;
  const int64_t rope = c.qk_rope_head_dim;
  const int64_t vd = c.v_head_dim;
  const int64_t kv_rank = c.kv_lora_rank;
  const RopeLayout layout = c.rope_interleave ? RopeLayout::kInterleaved : RopeLayout::kHalf;

  at::Tensor q_resid;
  at::Tensor q;
  if (w.q_a_proj.defined()) {
    q_resid = RmsNorm(Linear(x, w.q_a_proj, w.q_a_bias), w.q_a_norm, kMlaLatentNormEps);
    q = Linear(q_resid, w.q_b_proj);
  } else {
    q = Linear(x, w.q_proj);
  }
  q = q.view({b, s, heads, nope + rope}).transpose(1, 2);  // [B, Hq, S, nope + rope]
  at::Tensor q_pass = q.narrow(-1, 0, nope);
  at::Tensor q_rot =  // [B, Hq, S, rope]
      RopeHeadsLast(q.narrow(-1, nope, rope).transpose(1, 2), ctx, layout).transpose(1, 2);

  at::Tensor ckv = Linear(x, w.kv_a_proj, w.kv_a_bias);  // [B, S, kv_rank + rope]
  at::Tensor latent = RmsNorm(ckv.narrow(-1, 0, kv_rank), w.kv_a_norm, kMlaLatentNormEps);
  at::Tensor k_rot = RopeHeadsLast(ckv.narrow(-1, kv_rank, rope).unsqueeze(2), ctx, layout)
                         .squeeze(2);  // [B, S, rope]
  if (ctx.cache != nullptr) {
    latent = AppendToCache(ctx.cache->latent, 1, latent, ctx);
    k_rot = AppendToCache(ctx.cache->k_pe, 1, k_rot, ctx);
  }
  const int64_t t = latent.size(1);

  if (indexer_type == IndexerType::kFull) {
    topk = IndexerTopk(w.indexer, x, q_resid, ctx);
  }
  const bool sparse = indexer_type != IndexerType::kNone && topk.defined();
  const bool latent_decode =
      ctx.cache != nullptr && s == 1 && ctx.kernels == Kernels::kFused && ctx.latent_mla_decode;
  // Note [DSA decode over the selected keys]: gathered, or masked to.
  const auto selection = [&] {  // [B, S, T] bool, where the attention masks to the DSA keys
    return sparse ? at::zeros({b, s, t}, at::TensorOptions().dtype(at::kBool).device(x.device()))
                        .scatter_(-1, topk, true)
                  : at::Tensor();
  };
  const Visibility visible = Visible(ctx, s, t, x.device());
  at::Tensor out;  // [B, S, heads * vd]
  if (latent_decode) {
    const at::Tensor cached = ctx.cache->latent_pe.narrow(0, 0, b).narrow(1, 0, t);
    const LatentHeads absorbed = AbsorbQueries(w, c, q_pass, q_rot);
    at::Tensor latents;  // [B, heads * S, kv_lora_rank]
    if (sparse && t >= kGatherSelectedFrom * topk.size(-1)) {
      latents = SelectedWeightedLatents(absorbed, c, cached, visible, topk);
    } else {
      latents = WeightedLatents(absorbed, c, cached, visible, selection());
    }
    out = ProjectLatents(absorbed, c, latents);
  } else {
    const at::Tensor selected = selection();
    at::Tensor kv = Linear(latent, w.kv_b_proj).view({b, t, heads, nope + vd}).transpose(1, 2);
    at::Tensor k_nope = kv.narrow(-1, 0, nope);
    at::Tensor v = kv.narrow(-1, nope, vd);
    at::Tensor key = at::cat({k_nope, k_rot.unsqueeze(1).expand({b, heads, t, rope})}, -1);
    at::Tensor query = at::cat({q_pass, q_rot}, -1);
    out = AttentionCore(query, key, v, c.attention_scale(), visible, selected);
    out = out.transpose(1, 2).reshape({b, s, heads * vd});
  }
  return latent_decode ? BlockOutputLinear(out, w.o_proj, w.o_bias, ctx.kernels, ctx.partial_sums)
                       : Linear(out, w.o_proj, w.o_bias);
}

at::Tensor DenseMlp(const MlpWeights& w, const at::Tensor& x, Kernels impl, bool partial_sums) {
  if (w.gate_up_proj.defined()) {
    if (impl == Kernels::kFused && kernels::GateUpSiluMmaTakes(x, w.gate_up_proj)) {
      // Note [Decode kernels]
      return BlockOutputLinear(kernels::GateUpSiluMma(x, w.gate_up_proj), w.down_proj, {}, impl,
                               partial_sums);
    }
    const at::Tensor gate_up = Linear(x, w.gate_up_proj, {}, impl);
    if (impl == Kernels::kFused && kernels::Supported(gate_up) && !gate_up.requires_grad()) {
      // Note [Decode kernels]
      return BlockOutputLinear(kernels::SiluMul(gate_up), w.down_proj, {}, impl, partial_sums);
    }
    const int64_t inner = w.down_proj.size(1);
    return Linear(at::silu(gate_up.narrow(-1, 0, inner)) * gate_up.narrow(-1, inner, inner),
                  w.down_proj);
  }
  return Linear(at::silu(Linear(x, w.gate_proj)) * Linear(x, w.up_proj), w.down_proj);
}

Routing Route(const MoeWeights& w, const ModelConfig& c, const at::Tensor& x,
              const at::Tensor& replay, Kernels impl) {
  const bool inference = impl == Kernels::kFused && x.is_cuda() && !x.requires_grad() &&
                         x.scalar_type() == at::kBFloat16 &&
                         w.router.scalar_type() == at::kBFloat16 && !w.router.requires_grad();
  const int64_t k = c.num_experts_per_tok;
  RL_CHECK(!replay.defined() || (replay.dim() == 2 && replay.size(0) == x.size(0) &&
                                 replay.size(1) == k && replay.scalar_type() == at::kLong),
           Error, "routing replay: expert ids must be [{}, {}] int64; got {} of {} dims", x.size(0),
           k, c10::toString(replay.scalar_type()), replay.dim());
  at::Tensor logits;  // [T, E] in at least fp32
  if (inference) {
    logits = at::mm(x, w.router.t(), at::kFloat);
  } else {
    const at::Tensor xf = AtLeastFloat(x);
    logits = Linear(xf, w.router.to(xf.scalar_type()));
  }
  const bool sigmoid = c.router != RouterKind::kSoftmax;
  const int64_t groups = sigmoid ? c.n_group : 1;  // a softmax router: one group, kept
  const int64_t kept_groups = sigmoid ? c.topk_group : 1;
  if (inference && !replay.defined() && kernels::RouterTopKTakes(logits, k, groups, kept_groups)) {
    const kernels::RouterChoice r =
        kernels::RouterTopK(logits, sigmoid ? w.router_bias : at::Tensor(), sigmoid, k, groups,
                            kept_groups, c.norm_topk_prob, sigmoid ? c.routed_scaling_factor : 1.0);
    return {r.ids, r.weights};
  }
  if (c.router == RouterKind::kSoftmax) {
    const at::Tensor probs = at::softmax(logits, -1);
    at::Tensor top_w, top_i;
    if (replay.defined()) {
      top_i = replay;
      top_w = probs.gather(1, replay);
    } else {
      std::tie(top_w, top_i) = probs.topk(k, -1);
    }
    if (c.norm_topk_prob) top_w = top_w / top_w.sum(-1, /*keepdim=*/true);
    return {top_i, top_w};
  }
  // Sigmoid noaux_tc (DeepSeek-V3's router): the bias only steers the selection.
  const int64_t tokens = logits.size(0);
  const int64_t experts = c.n_routed_experts;
  at::Tensor scores = at::sigmoid(logits);
  at::Tensor choice;
  if (!replay.defined()) {
    at::NoGradGuard no_grad;
    choice = scores.detach() + w.router_bias.to(scores.scalar_type()).unsqueeze(0);
    if (c.n_group > 1) {
      const int64_t per_group = experts / c.n_group;
      at::Tensor group_scores =
          std::get<0>(choice.view({tokens, c.n_group, per_group}).topk(2, -1)).sum(-1);
      at::Tensor group_idx =
          std::get<1>(group_scores.topk(c.topk_group, -1, /*largest=*/true, /*sorted=*/false));
      at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, group_idx, 1.0);
      at::Tensor score_mask = group_mask.unsqueeze(-1)
                                  .expand({tokens, c.n_group, per_group})
                                  .reshape({tokens, experts});
      choice = choice.masked_fill(score_mask == 0, -std::numeric_limits<double>::infinity());
    }
  }
  at::Tensor idx = replay.defined()
                       ? replay
                       : std::get<1>(choice.topk(k, -1, /*largest=*/true, /*sorted=*/false));
  at::Tensor weights = scores.gather(1, idx);
  if (c.norm_topk_prob) weights = weights / (weights.sum(-1, /*keepdim=*/true) + 1e-20);
  weights = weights * c.routed_scaling_factor;
  return {idx, weights};
}

namespace {

// True when at::_grouped_mm takes w [E, N, K] (transposed) against rows of `dtype` and width K:
// a dtype it has, K a multiple of 16 bytes (ATen's GroupedMMUtils.h), w contiguous and, on CUDA,
// 16-byte aligned.
bool GroupedMmTakesWeight(const at::Tensor& w, at::ScalarType dtype) {
  if (dtype != w.scalar_type() ||
      (dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kFloat)) {
    return false;
  }
  const int64_t align = 16 / static_cast<int64_t>(w.element_size());
  return w.dim() == 3 && w.is_contiguous() && w.size(2) % align == 0 &&
         (!w.is_cuda() || reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0);
}

// And x [R, K]: rows of 16-byte multiples, unit column stride, aligned on CUDA.
bool GroupedMmTakes(const at::Tensor& x, const at::Tensor& w) {
  const int64_t align = 16 / static_cast<int64_t>(x.element_size());
  return GroupedMmTakesWeight(w, x.scalar_type()) && x.dim() == 2 && x.stride(1) == 1 &&
         x.stride(0) % align == 0 && x.stride(0) >= x.size(1) &&
         (!x.is_cuda() || reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows `rows` (a permutation) of x [R, H]; the backward gathers the gradient by the inverse
// permutation instead of scattering it (index_select's backward is an atomic index_add: slower,
// and its order of additions is not fixed).
class PermuteRows : public torch::autograd::Function<PermuteRows> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& rows,
                            const at::Tensor& inverse) {
    ctx->save_for_backward({inverse});
    return x.index_select(0, rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const at::Tensor inverse = ctx->get_saved_variables()[0];
    return {grad[0].index_select(0, inverse), at::Tensor(), at::Tensor()};
  }
};

// Row i of the result is token order[i] / k of x [T, H] (the T * k (token, slot) pairs in the
// order `order`); the backward puts the gradient rows back in pair order (`inverse`) and sums each
// token's k slots.
class GatherTokens : public torch::autograd::Function<GatherTokens> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& order,
                            const at::Tensor& inverse, int64_t k) {
    ctx->save_for_backward({inverse});
    ctx->saved_data["k"] = k;
    return x.index_select(0, at::floor_divide(order, k));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const at::Tensor inverse = ctx->get_saved_variables()[0];
    const int64_t k = ctx->saved_data["k"].toInt();
    const at::Tensor by_pair = grad[0].index_select(0, inverse);
    return {by_pair.view({-1, k, by_pair.size(1)}).sum(1), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// Rows of x moved between the ranks of an expert group (Note [Expert-parallel MoE]):
// send_counts[j] rows to rank j, recv_counts[j] rows from rank j; the backward sends the gradient
// back the reverse way. The group travels as an integer (autograd's saved data holds IValues).
at::Tensor ExchangeRowsOnce(const at::Tensor& x, Communicator& group,
                            const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& recv_counts) {
  int64_t rows = 0;
  for (int64_t n : recv_counts) rows += n;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  at::Tensor out = at::empty(shape, x.options());
  group.AllToAll(x.contiguous(), send_counts, out, recv_counts);
  return out;
}

class ExchangeRows : public torch::autograd::Function<ExchangeRows> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* group,
                            const std::vector<int64_t>& send_counts,
                            const std::vector<int64_t>& recv_counts) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["send"] = send_counts;
    ctx->saved_data["recv"] = recv_counts;
    return ExchangeRowsOnce(x, *group, send_counts, recv_counts);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto* group = reinterpret_cast<Communicator*>(ctx->saved_data["group"].toInt());
    return {ExchangeRowsOnce(grad[0], *group, ctx->saved_data["recv"].toIntVector(),
                             ctx->saved_data["send"].toIntVector()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The local experts over rows grouped by expert (`ends`: cumulative row counts).
at::Tensor RunExperts(const MoeWeights& w, const at::Tensor& rows, const at::Tensor& ends) {
  const int64_t inter = w.down.size(2);
  const at::Tensor gate_up = GroupedLinear(rows, w.gate_up, ends);  // [R, 2I]
  // Outside autograd on CUDA, silu(gate) * up in one kernel, the same bits (kernels::SiluMul).
  const at::Tensor act =
      kernels::Supported(gate_up) && !gate_up.requires_grad() && gate_up.size(0) > 0
          ? kernels::SiluMul(gate_up)
          : at::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter);
  return GroupedLinear(act, w.down, ends);
}

// Note [Expert-parallel MoE]: rows `xs` [R, H] sorted by global expert, `ends` [E] their
// cumulative counts; returns the experts' outputs in the same order.
at::Tensor RunExpertsParallel(const MoeWeights& w, const at::Tensor& xs, const at::Tensor& ends) {
  Communicator& group = *w.expert_group;
  const int64_t ranks = group.size();
  const int64_t local = w.gate_up.size(0);
  const at::TensorOptions longs = ends.options().dtype(at::kLong);
  // 1. Per-expert counts, sent to the experts' ranks; both tables read on the host at once.
  const at::Tensor sent = at::diff(ends.to(at::kLong), 1, 0, at::zeros({1}, longs));  // [E]
  const at::Tensor received = at::empty({ranks, local}, longs);  // [source rank, local expert]
  const std::vector<int64_t> ones(static_cast<size_t>(ranks), 1);
  group.AllToAll(sent.view({ranks, local}), ones, received, ones);
  const at::Tensor host = at::cat({sent, received.view({-1})}).cpu();  // the split sizes
  const int64_t* sent_n = host.data_ptr<int64_t>();
  const int64_t* recv_n = sent_n + ranks * local;
  std::vector<int64_t> send_counts(static_cast<size_t>(ranks), 0);
  std::vector<int64_t> recv_counts(static_cast<size_t>(ranks), 0);
  for (int64_t j = 0; j < ranks; ++j) {
    for (int64_t e = 0; e < local; ++e) {
      send_counts[static_cast<size_t>(j)] += sent_n[j * local + e];
      recv_counts[static_cast<size_t>(j)] += recv_n[j * local + e];
    }
  }
  // 2. Rows to the experts' ranks; regrouped from (source, expert) to (expert, source) order.
  MaybeInjectFault(FaultPoint::kExpertExchange);  // Note [Fault injection]
  const at::Tensor arrived = ExchangeRows::apply(xs, &group, send_counts, recv_counts);
  int64_t arrived_rows = 0;
  for (int64_t n : recv_counts) arrived_rows += n;
  // On the device: each arrived row's local expert (the count table is in arrival order), a
  // stable sort by it (row i of the expert order is arrived row to_experts[i]) and its inverse.
  const at::Tensor row_expert = at::repeat_interleave(
      at::arange(local, longs).repeat({ranks}), received.view({-1}), 0, arrived_rows);
  const at::Tensor to_experts = at::argsort(row_expert, /*stable=*/true);
  const at::Tensor to_arrival = at::empty_like(to_experts).scatter_(
      0, to_experts, at::arange(arrived_rows, to_experts.options()));
  const at::Tensor local_ends = received.sum(0).cumsum(0).to(at::kInt);  // [local]
  const at::Tensor by_expert = PermuteRows::apply(arrived, to_experts, to_arrival);
  // 3. The local experts, back to arrival order, back to the tokens' ranks.
  const at::Tensor out = RunExperts(w, by_expert, local_ends);
  return ExchangeRows::apply(PermuteRows::apply(out, to_arrival, to_experts), &group, recv_counts,
                             send_counts);
}

// Note [Fixed-capacity dispatch]: rows `xs` [R, H] sorted by global expert, `sorted_ids` [R]
// their experts, `ends` [E] their cumulative counts; returns the experts' outputs in the same
// order (zero for the rows that did not fit).
at::Tensor RunExpertsFixed(const MoeWeights& w, const at::Tensor& xs, const at::Tensor& sorted_ids,
                           const at::Tensor& ends, const ExpertDispatch& dispatch) {
  RL_CHECK(!at::GradMode::is_enabled(), Error,
           "MoE block: the fixed-capacity dispatch has no backward; run it under no_grad");
  RL_CHECK(dispatch.capacity >= 1 && dispatch.overflow.defined() &&
               dispatch.overflow.scalar_type() == at::kInt && dispatch.overflow.numel() == 1,
           Error, "MoE block: a fixed-capacity dispatch needs capacity >= 1 (got {}) and an int32 "
           "overflow flag of one element", dispatch.capacity);
  Communicator& group = *w.expert_group;
  const int64_t ranks = group.size();
  const int64_t local = w.gate_up.size(0);
  const int64_t capacity = dispatch.capacity;
  const int64_t slots = ranks * capacity;
  const int64_t rows = xs.size(0);
  const at::TensorOptions longs = xs.options().dtype(at::kLong);
  const at::TensorOptions ints = xs.options().dtype(at::kInt);
  // 1. Each row's slot: block dest, place = its index minus the first row for dest.
  const at::Tensor dest = at::floor_divide(sorted_ids, local);
  const at::Tensor rank_ends = ends.view({ranks, local}).select(1, local - 1).to(at::kLong);
  const at::Tensor rank_begins =
      at::cat({at::zeros({1}, longs), rank_ends.narrow(0, 0, ranks - 1)});
  const at::Tensor place = at::arange(rows, longs) - rank_begins.index_select(0, dest);
  const at::Tensor fits = place < capacity;
  dispatch.overflow.bitwise_or_(fits.logical_not().any().to(at::kInt));
  // Rows that do not fit take the spare slots [slots, slots + R), one each (index_copy_ with
  // distinct indices is deterministic), which are not sent.
  const at::Tensor slot =
      at::where(fits, dest * capacity + place, at::arange(slots, slots + rows, longs));
  const at::Tensor send = at::empty({slots + rows, xs.size(1)}, xs.options()).index_copy_(0, slot, xs);
  const at::Tensor send_ids =
      at::full({slots + rows}, local, ints).index_copy_(0, slot, (sorted_ids % local).to(at::kInt));
  // 2. Expert ids, then rows, to their ranks.
  const at::Tensor recv_ids = at::empty({slots}, ints);
  const at::Tensor recv = at::empty({slots, xs.size(1)}, xs.options());
  MaybeInjectFault(FaultPoint::kExpertExchange);  // Note [Fault injection]
  group.EnqueueAllToAll(send_ids.narrow(0, 0, slots), recv_ids);
  group.EnqueueAllToAll(send.narrow(0, 0, slots), recv);
  // 3. The local experts over the filled slots, grouped by expert; back in slot order; returned.
  const at::Tensor to_experts = at::argsort(recv_ids, /*stable=*/true);
  const at::Tensor local_ends =
      at::searchsorted(recv_ids.index_select(0, to_experts), at::arange(local, ints),
                       /*out_int32=*/true, /*right=*/true);
  const at::Tensor out = RunExperts(w, recv.index_select(0, to_experts), local_ends);
  const at::Tensor back = at::empty_like(out).index_copy_(0, to_experts, out);
  const at::Tensor returned = at::empty_like(back);
  group.EnqueueAllToAll(back, returned);
  return at::where(fits.unsqueeze(1), returned.index_select(0, slot.clamp_max(slots - 1)),
                   at::zeros({}, returned.options()));
}

}  // namespace

int64_t DispatchCapacity(const ModelConfig& config, int64_t max_tokens, int64_t group_size,
                         double factor) {
  const int64_t k = config.num_experts_per_tok;
  const int64_t worst = max_tokens * std::min(k, config.n_routed_experts / group_size);
  if (factor <= 0) return std::max<int64_t>(worst, 1);
  const auto mean_share = static_cast<double>(max_tokens * k) / static_cast<double>(group_size);
  // Compared as doubles before the cast: a factor like 1e300 gives a product beyond int64 (or
  // infinite), whose cast to an integer is undefined (on x86 it gives INT64_MIN, clamped to one
  // slot). Whatever is not below the worst case is the worst case; NaN fails the comparison too.
  const double wanted = std::ceil(factor * mean_share);
  if (!(wanted < static_cast<double>(worst))) return std::max<int64_t>(worst, 1);
  return std::max<int64_t>(static_cast<int64_t>(wanted), 1);
}

bool MoeBlockSyncFree(const MoeWeights& w) {
  // MoeBlock's rows (the gathered tokens, the SwiGLU output) are fresh contiguous tensors of
  // the weights' widths, so the weights decide.
  return w.gate_up.is_cuda() && w.gate_up.scalar_type() == at::kBFloat16 &&
         GroupedMmTakesWeight(w.gate_up, at::kBFloat16) &&
         GroupedMmTakesWeight(w.down, at::kBFloat16);
}

at::Tensor GroupedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ends) {
  // On the CPU our loop of batch-invariant Linears (Note [Batch-invariant CPU kernels]).
  if (!x.is_cpu() && x.size(0) > 0 && GroupedMmTakes(x, w)) {
    return at::_grouped_mm(x, w.transpose(1, 2), ends);
  }
  const at::Tensor host_ends = ends.to(at::kCPU).to(at::kLong);
  const int64_t* end = host_ends.data_ptr<int64_t>();
  std::vector<at::Tensor> parts;
  int64_t begin = 0;
  for (int64_t e = 0; e < w.size(0); ++e) {
    if (end[e] > begin) parts.push_back(Linear(x.narrow(0, begin, end[e] - begin), w[e]));
    begin = end[e];
  }
  // No rows: an empty product that still depends on x and w, so that the backward reaches
  // whatever produced x (an expert group's exchange must run its backward on every rank).
  if (parts.empty() && x.size(0) == 0) return at::matmul(x.narrow(0, 0, 0), w[0].t());
  if (begin < x.size(0)) parts.push_back(at::zeros({x.size(0) - begin, w.size(1)}, x.options()));
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

at::Tensor MoeBlock(const MoeWeights& w, const ModelConfig& c, const at::Tensor& x,
                    at::Tensor* chosen, const at::Tensor& replay, const ExpertDispatch* dispatch,
                    Kernels impl) {
  const int64_t hidden = x.size(-1);
  const at::Tensor x2 = x.reshape({-1, hidden});  // [T, H]
  const int64_t tokens = x2.size(0);
  const Routing r = Route(w, c, x2, replay, impl);
  if (chosen != nullptr) *chosen = r.indices;
  const int64_t k = r.indices.size(1);
  const int64_t experts = c.n_routed_experts;
  RL_CHECK(dispatch == nullptr || w.expert_group != nullptr, Error,
           "MoE block: a fixed-capacity dispatch needs an expert group");
  const bool parallel = w.expert_group != nullptr && w.expert_group->size() > 1;
  RL_CHECK(w.gate_up.size(0) * (parallel ? w.expert_group->size() : 1) == experts, Error,
           "MoE block: {} local experts on each of {} ranks, but the model has {} experts",
           w.gate_up.size(0), parallel ? w.expert_group->size() : 1, experts);

  // Note [MoE block]: (token, slot) pairs sorted by expert; row i of the sorted order is pair
  // order[i], and pair p goes back from row inverse[p].
  const at::Tensor flat = r.indices.reshape({-1});  // [T * k]
  at::Tensor order, sorted_ids, ends, inverse;
  if (impl == Kernels::kFused && !replay.defined() && kernels::SortByExpertTakes(flat, experts)) {
    // The router's ids (in range), sorted in one kernel, bit for bit the ops below (Note [Sort by
    // expert kernel] in trainer/kernels/moe_kernels.cu).
    kernels::ExpertOrder sorted = kernels::SortByExpert(flat, experts);
    order = std::move(sorted.order);
    sorted_ids = std::move(sorted.sorted_ids);
    ends = std::move(sorted.ends);
    inverse = std::move(sorted.inverse);
  } else {
    order = at::argsort(flat, /*stable=*/true);
    sorted_ids = flat.index_select(0, order);
    ends = at::searchsorted(sorted_ids, at::arange(experts, flat.options()), /*out_int32=*/true,
                            /*right=*/true);
    inverse = at::empty_like(order).scatter_(0, order, at::arange(order.numel(), order.options()));
  }
  const at::Tensor xs = GatherTokens::apply(x2, order, inverse, k);  // [T * k, H]
  const at::Tensor by_expert = dispatch != nullptr
                                   ? RunExpertsFixed(w, xs, sorted_ids, ends, *dispatch)
                               : parallel ? RunExpertsParallel(w, xs, ends)
                                          : RunExperts(w, xs, ends);  // [T * k, H], sorted
  const at::Tensor shared = w.has_shared ? DenseMlp(w.shared, x2, impl) : at::Tensor();
  if (impl == Kernels::kFused && kernels::CombineExpertsTakes(by_expert, r.weights, shared)) {
    // Note [Combine kernel] in trainer/kernels/moe_kernels.cu.
    return kernels::CombineExperts(by_expert, inverse, r.weights, shared).view(x.sizes());
  }
  const at::Tensor ys = PermuteRows::apply(by_expert, inverse, order);
  at::Tensor out =
      (ys.view({tokens, k, hidden}) * r.weights.unsqueeze(-1)).sum(1).to(x.scalar_type());
  if (shared.defined()) out = out + shared;
  return out.view(x.sizes());
}

void ExpertGroupIdle(const MoeWeights& w, const ModelConfig& config,
                     const ExpertDispatch* dispatch) {
  if (w.expert_group == nullptr || (w.expert_group->size() == 1 && dispatch == nullptr)) return;
  at::NoGradGuard no_grad;
  const at::Tensor no_rows = at::empty({0, config.hidden_size}, w.gate_up.options());
  const at::Tensor ends = at::zeros({config.n_routed_experts}, w.gate_up.options().dtype(at::kInt));
  if (dispatch != nullptr) {
    RunExpertsFixed(w, no_rows, at::empty({0}, ends.options().dtype(at::kLong)), ends, *dispatch);
  } else {
    RunExpertsParallel(w, no_rows, ends);
  }
}

}  // namespace rl::model
