// The tensor-parallel mappings (Note [Tensor-parallel mappings], trainer/model/tensor_parallel.h)
// on CPU ranks, through the dense SwiGLU MLP with gate/up column-parallel and down row-parallel,
// and through GQA and MLA attention (heads column-parallel, o_proj row-parallel), against the whole
// layers on one rank: the output, the input gradient and each rank's slice of the
// weight gradients, with and without sequence parallelism, fp64 and fp32. Every rank draws the
// whole weights, input and output gradient from one seed. Runs at 2 ranks (tensor_parallel_test)
// and 4 (_np4).
//
// Tolerances: the row-parallel layer sums its inner dimension by rank (another order), so fp64
// within 1e-12 and fp32 within 1e-5 of the largest magnitude.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "launch/mpi_communicator.h"
#include "tests/mpi_test_env.h"
#include "trainer/model/layers.h"
#include "trainer/model/tensor_parallel.h"

namespace rl::model {
namespace {

constexpr int64_t kHidden = 24;
constexpr int64_t kInter = 32;  // 16 per rank at 2 ranks, 8 at 4
constexpr int64_t kTokens = 12;  // 6 per rank at 2 ranks, 3 at 4
const CommOptions kOptions{std::chrono::seconds(60)};

struct Tensors {
  at::Tensor out, x, gate, up, down;  // the output, then the gradients
};

double Scaled(const at::Tensor& got, const at::Tensor& want) {
  REQUIRE(got.sizes() == want.sizes());
  return (got - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
}

at::Tensor Trainable(const at::Tensor& t) {
  return t.defined() ? t.clone().requires_grad_() : at::Tensor();
}

// An attention layer's input and output gradient [B, S, hidden] and its RoPE table, drawn alike
// on every rank.
struct AttentionInputs {
  at::Tensor x0, out_grad;
  RopeTable rope;
};
AttentionInputs DrawInputs(const ModelConfig& c, at::Generator& gen, int64_t batch, int64_t seq) {
  AttentionInputs in;
  in.x0 = at::empty({batch, seq, kHidden}, at::kDouble).normal_(0, 1.0, gen);
  in.out_grad = at::empty({batch, seq, kHidden}, at::kDouble).normal_(0, 1.0, gen);
  in.rope = MakeRopeTable(c, 0, seq, at::kDouble, at::kCPU);
  return in;
}

// This rank's part of a [B, S, hidden] tensor: all of it, or its token rows of the flattened
// batch under sequence parallelism.
at::Tensor Mine(const at::Tensor& t, bool sequence_parallel, const Communicator& group) {
  if (!sequence_parallel) return t;
  const int64_t rows = t.numel() / kHidden / group.size();
  return t.reshape({-1, kHidden}).narrow(0, group.rank() * rows, rows);
}

// `layer` on this rank's part of in.x0, backpropagated from this rank's part of in.out_grad:
// the output and the input (with its gradient).
struct Sharded {
  at::Tensor out, x;
};
template <typename Layer>
Sharded RunSharded(const AttentionInputs& in, bool sequence_parallel, const Communicator& group,
                   Layer layer) {
  Sharded run;
  run.x = Mine(in.x0, sequence_parallel, group).clone().requires_grad_();
  run.out = layer(run.x);
  run.out.backward(Mine(in.out_grad, sequence_parallel, group));
  run.out = run.out.detach();
  return run;
}

TEST_CASE("The tensor-parallel MLP equals the whole MLP, with and without sequence parallelism") {
  MpiCommunicator world(testing::Session(), kOptions);
  const int64_t rank = world.rank();
  const int64_t inter = kInter / world.size();
  const int64_t tokens = kTokens / world.size();
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const double tolerance = dtype == at::kDouble ? 1e-12 : 1e-5;
    at::Generator gen = at::detail::createCPUGenerator(3);
    const auto normal = [&](std::vector<int64_t> shape, double std) {
      return at::empty(shape, dtype).normal_(0, std, gen);
    };
    const at::Tensor gate = normal({kInter, kHidden}, 0.2);
    const at::Tensor up = normal({kInter, kHidden}, 0.2);
    const at::Tensor down = normal({kHidden, kInter}, 0.2);
    const at::Tensor x0 = normal({kTokens, kHidden}, 1.0);
    const at::Tensor out_grad = normal({kTokens, kHidden}, 1.0);

    // The whole MLP on one rank.
    Tensors whole;
    {
      MlpWeights w{gate.clone().requires_grad_(), up.clone().requires_grad_(),
                   down.clone().requires_grad_(), {}};
      const at::Tensor x = x0.clone().requires_grad_();
      whole.out = DenseMlp(w, x);
      whole.out.backward(out_grad);
      whole.out = whole.out.detach();
      whole = {whole.out, x.grad(), w.gate_proj.grad(), w.up_proj.grad(), w.down_proj.grad()};
    }
    for (const bool sequence_parallel : {false, true}) {
      INFO(c10::toString(dtype) << ", rank " << rank << " of " << world.size()
                                << (sequence_parallel ? ", sequence parallel" : ""));
      const at::Tensor g = gate.narrow(0, rank * inter, inter).clone().requires_grad_();
      const at::Tensor u = up.narrow(0, rank * inter, inter).clone().requires_grad_();
      const at::Tensor d = down.narrow(1, rank * inter, inter).clone().requires_grad_();
      const at::Tensor x =
          (sequence_parallel ? x0.narrow(0, rank * tokens, tokens) : x0).clone().requires_grad_();
      const at::Tensor out = TensorParallelMlp(g, u, d, x, world, sequence_parallel);
      out.backward(sequence_parallel ? out_grad.narrow(0, rank * tokens, tokens) : out_grad);
      const auto mine = [&](const at::Tensor& t) {
        return sequence_parallel ? t.narrow(0, rank * tokens, tokens) : t;
      };
      CHECK(Scaled(out.detach(), mine(whole.out)) <= tolerance);
      CHECK(Scaled(x.grad(), mine(whole.x)) <= tolerance);
      CHECK(Scaled(g.grad(), whole.gate.narrow(0, rank * inter, inter)) <= tolerance);
      CHECK(Scaled(u.grad(), whole.up.narrow(0, rank * inter, inter)) <= tolerance);
      CHECK(Scaled(d.grad(), whole.down.narrow(1, rank * inter, inter)) <= tolerance);
    }
  }
}

// Note [Tensor-parallel attention]: 8 query heads over 2 key/value heads, so at 4 ranks each
// key/value head is replicated on 2 ranks; with q/k norms (Qwen3) and with q/k/v/o biases. The
// key/value gradients of the ranks that share a head are summed before the comparison, as the
// optimizer sums them.
TEST_CASE("Tensor-parallel GQA attention equals the whole attention, forward and gradients") {
  MpiCommunicator world(testing::Session(), kOptions);
  const int rank = world.rank();
  constexpr int64_t kBatch = 2;
  constexpr int64_t kSeq = 6;
  constexpr int64_t kHeadDim = 8;
  ModelConfig c;
  c.hidden_size = kHidden;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = kHeadDim;
  const int64_t heads = c.num_attention_heads / world.size();
  const HeadRange kv = KvHeadsOf(c.num_key_value_heads, rank, world.size());
  for (const bool biases : {false, true}) {
    c.use_qk_norm = !biases;
    at::Generator gen = at::detail::createCPUGenerator(5);
    const auto normal = [&](std::vector<int64_t> shape, double std) {
      return at::empty(shape, at::kDouble).normal_(0, std, gen);
    };
    GqaWeights w;
    w.q_proj = normal({8 * kHeadDim, kHidden}, 0.2);
    w.k_proj = normal({2 * kHeadDim, kHidden}, 0.2);
    w.v_proj = normal({2 * kHeadDim, kHidden}, 0.2);
    w.o_proj = normal({kHidden, 8 * kHeadDim}, 0.2);
    if (biases) {
      w.q_bias = normal({8 * kHeadDim}, 0.1);
      w.k_bias = normal({2 * kHeadDim}, 0.1);
      w.v_bias = normal({2 * kHeadDim}, 0.1);
      w.o_bias = normal({kHidden}, 0.1);
    } else {
      w.q_norm = 1 + normal({kHeadDim}, 0.1);
      w.k_norm = 1 + normal({kHeadDim}, 0.1);
    }
    const AttentionInputs in = DrawInputs(c, gen, kBatch, kSeq);
    AttentionContext ctx;
    ctx.config = &c;
    ctx.rope = &in.rope;
    GqaWeights full = w;
    for (at::Tensor* t : {&full.q_proj, &full.k_proj, &full.v_proj, &full.o_proj, &full.k_bias}) {
      *t = Trainable(*t);
    }
    const Sharded want =
        RunSharded(in, false, world, [&](const at::Tensor& x) { return GqaAttention(full, x, ctx); });

    for (const bool sequence_parallel : {false, true}) {
      INFO("rank " << rank << " of " << world.size() << (biases ? ", biases" : ", q/k norms")
                   << (sequence_parallel ? ", sequence parallel" : ""));
      const int64_t q_rows = heads * kHeadDim;
      const int64_t kv_first = kv.first * kHeadDim;
      const int64_t kv_rows = kv.count * kHeadDim;
      GqaWeights local = w;
      local.q_proj = Trainable(w.q_proj.narrow(0, rank * q_rows, q_rows));
      local.k_proj = Trainable(w.k_proj.narrow(0, kv_first, kv_rows));
      local.v_proj = Trainable(w.v_proj.narrow(0, kv_first, kv_rows));
      local.o_proj = Trainable(w.o_proj.narrow(1, rank * q_rows, q_rows));
      if (biases) {
        local.q_bias = w.q_bias.narrow(0, rank * q_rows, q_rows);
        local.k_bias = Trainable(w.k_bias.narrow(0, kv_first, kv_rows));
        local.v_bias = w.v_bias.narrow(0, kv_first, kv_rows);
      }
      const Sharded got = RunSharded(in, sequence_parallel, world, [&](const at::Tensor& x) {
        return TensorParallelGqaAttention(local, x, ctx, world, sequence_parallel, kBatch);
      });
      CHECK(Scaled(got.out, Mine(want.out, sequence_parallel, world)) <= 1e-12);
      CHECK(Scaled(got.x.grad(), Mine(want.x.grad(), sequence_parallel, world)) <= 1e-12);
      CHECK(Scaled(local.q_proj.grad(), full.q_proj.grad().narrow(0, rank * q_rows, q_rows)) <=
            1e-12);
      CHECK(Scaled(local.o_proj.grad(), full.o_proj.grad().narrow(1, rank * q_rows, q_rows)) <=
            1e-12);
      // Key/value heads: each rank's partial gradient in its heads' rows, summed over the world.
      for (const auto& [mine, whole] :
           {std::pair{local.k_proj, full.k_proj}, std::pair{local.v_proj, full.v_proj},
            std::pair{local.k_bias, full.k_bias}}) {
        if (!mine.defined()) continue;
        at::Tensor summed = at::zeros_like(whole);
        summed.narrow(0, kv_first, kv_rows).copy_(mine.grad());
        world.AllReduce(summed, ReduceOp::kSum);
        CHECK(Scaled(summed, whole.grad()) <= 1e-12);
      }
    }
  }
}

// MLA (DeepSeek-V3-like, with and without a q LoRA): 4 heads, 1 per rank at 4 ranks. The
// replicated down projections' and norms' gradients are partial per rank; their sum over the
// world must be the whole one.
TEST_CASE("Tensor-parallel MLA attention equals the whole attention, forward and gradients") {
  MpiCommunicator world(testing::Session(), kOptions);
  const int rank = world.rank();
  constexpr int64_t kBatch = 2;
  constexpr int64_t kSeq = 6;
  ModelConfig c;
  c.model_type = ModelType::kDeepseekV3;
  c.hidden_size = kHidden;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.kv_lora_rank = 12;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.head_dim = 4;
  c.v_head_dim = 8;
  const int64_t heads = c.num_attention_heads / world.size();
  const int64_t q_width = c.qk_head_dim();
  const int64_t kv_width = c.qk_nope_head_dim + c.v_head_dim;
  for (const bool q_lora : {true, false}) {
    c.q_lora_rank = q_lora ? 16 : 0;
    at::Generator gen = at::detail::createCPUGenerator(13);
    const auto normal = [&](std::vector<int64_t> shape, double std) {
      return at::empty(shape, at::kDouble).normal_(0, std, gen);
    };
    MlaWeights w;
    if (q_lora) {
      w.q_a_proj = normal({16, kHidden}, 0.2);
      w.q_a_norm = 1 + normal({16}, 0.1);
      w.q_b_proj = normal({4 * q_width, 16}, 0.2);
    } else {
      w.q_proj = normal({4 * q_width, kHidden}, 0.2);
    }
    w.kv_a_proj = normal({12 + 4, kHidden}, 0.2);
    w.kv_a_norm = 1 + normal({12}, 0.1);
    w.kv_b_proj = normal({4 * kv_width, 12}, 0.2);
    w.o_proj = normal({kHidden, 4 * c.v_head_dim}, 0.2);
    const AttentionInputs in = DrawInputs(c, gen, kBatch, kSeq);
    AttentionContext ctx;
    ctx.config = &c;
    ctx.rope = &in.rope;
    MlaWeights full = w;
    for (at::Tensor* t : {&full.q_a_proj, &full.q_a_norm, &full.q_b_proj, &full.q_proj,
                          &full.kv_a_proj, &full.kv_a_norm, &full.kv_b_proj, &full.o_proj}) {
      *t = Trainable(*t);
    }
    const Sharded want = RunSharded(in, false, world, [&](const at::Tensor& x) {
      at::Tensor topk;
      return MlaAttention(full, IndexerType::kNone, x, ctx, topk);
    });

    for (const bool sequence_parallel : {false, true}) {
      INFO("rank " << rank << " of " << world.size() << (q_lora ? ", q LoRA" : ", q_proj")
                   << (sequence_parallel ? ", sequence parallel" : ""));
      MlaWeights local = w;
      for (at::Tensor* t : {&local.q_a_proj, &local.q_a_norm, &local.kv_a_proj, &local.kv_a_norm}) {
        *t = Trainable(*t);  // replicated
      }
      at::Tensor& q_up = q_lora ? local.q_b_proj : local.q_proj;
      q_up = Trainable(q_up.narrow(0, rank * heads * q_width, heads * q_width));
      local.kv_b_proj = Trainable(w.kv_b_proj.narrow(0, rank * heads * kv_width, heads * kv_width));
      local.o_proj = Trainable(
          w.o_proj.narrow(1, rank * heads * c.v_head_dim, heads * c.v_head_dim));
      const Sharded got = RunSharded(in, sequence_parallel, world, [&](const at::Tensor& x) {
        at::Tensor topk;
        return TensorParallelMlaAttention(local, IndexerType::kNone, x, ctx, world,
                                          sequence_parallel, kBatch, topk);
      });
      CHECK(Scaled(got.out, Mine(want.out, sequence_parallel, world)) <= 1e-12);
      CHECK(Scaled(got.x.grad(), Mine(want.x.grad(), sequence_parallel, world)) <= 1e-12);
      const at::Tensor& full_q_up = q_lora ? full.q_b_proj : full.q_proj;
      CHECK(Scaled(q_up.grad(), full_q_up.grad().narrow(0, rank * heads * q_width,
                                                         heads * q_width)) <= 1e-12);
      CHECK(Scaled(local.kv_b_proj.grad(),
                   full.kv_b_proj.grad().narrow(0, rank * heads * kv_width, heads * kv_width)) <=
            1e-12);
      CHECK(Scaled(local.o_proj.grad(), full.o_proj.grad().narrow(1, rank * heads * c.v_head_dim,
                                                                  heads * c.v_head_dim)) <= 1e-12);
      for (const auto& [mine_param, whole] :
           {std::pair{local.q_a_proj, full.q_a_proj}, std::pair{local.q_a_norm, full.q_a_norm},
            std::pair{local.kv_a_proj, full.kv_a_proj},
            std::pair{local.kv_a_norm, full.kv_a_norm}}) {
        if (!mine_param.defined()) continue;
        at::Tensor summed = mine_param.grad().clone();
        world.AllReduce(summed, ReduceOp::kSum);
        CHECK(Scaled(summed, whole.grad()) <= 1e-12);
      }
    }
  }
}

TEST_CASE("Sequence parallelism refuses token rows that do not split over the group") {
  MpiCommunicator world(testing::Session(), kOptions);
  const at::Tensor x = at::zeros({2 * world.size() + 1, 4});
  CHECK_THROWS_WITH(ScatterToSequenceParallel(x, world),
                    Catch::Contains("do not split over"));
  world.Barrier();
}

}  // namespace
}  // namespace rl::model
