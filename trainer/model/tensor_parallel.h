// The communication of tensor parallelism (TP) as autograd functions, in Megatron's terms, and the
// tensor-parallel dense MLP built on them.
//
// Note [Tensor-parallel mappings]
// A column-parallel layer holds rows [r * N / P, (r + 1) * N / P) of its weight (its output
// features) on rank r of a TP group of P; a row-parallel layer holds the matching columns (its
// input features), so a column-parallel layer followed by a row-parallel one needs no
// communication in between, and the row-parallel layer's partial outputs are summed over the
// group. Four mappings carry activations in and out of such a pair:
//  - without sequence parallelism, every rank holds every token:
//      CopyToTensorParallel: identity forward, all-reduce (sum) of the gradient backward
//        (each rank's input gradient covers only its features);
//      ReduceFromTensorParallel: all-reduce (sum) forward, identity backward;
//  - with sequence parallelism (--sequence-parallel), rank r holds tokens [r * T / P, ...) of
//    the residual stream, where norms, residual adds and the router run on 1/P of the tokens:
//      GatherFromSequenceParallel: all-gather of the token rows forward, reduce-scatter (sum)
//        of the gradient backward;
//      ScatterToSequenceParallel: reduce-scatter (sum) of the row-parallel partial outputs
//        forward, all-gather of the gradient backward.
// Tokens are dim 0 of a contiguous [T, ...] tensor (the caller flattens batch and sequence);
// with sequence parallelism T must divide by P (the caller pads). Every rank of the group calls
// each mapping, forward and backward, in the same order: they are collectives over the group.
//
// A parameter replicated over TP (a norm, a bias of a row-parallel layer) receives a partial
// gradient on each rank under sequence parallelism (its tokens only), summed over TP before the
// optimizer step (Note [Tensor-parallel gradients]). Column-parallel parameters' gradients are
// complete on their rank.
#ifndef RL_TRAINER_MODEL_TENSOR_PARALLEL_H_
#define RL_TRAINER_MODEL_TENSOR_PARALLEL_H_

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "launch/communicator.h"
#include "launch/param_spec.h"
#include "trainer/model/layers.h"
#include "trainer/model/model_config.h"

namespace rl::model {

at::Tensor CopyToTensorParallel(const at::Tensor& x, Communicator& group);
at::Tensor ReduceFromTensorParallel(const at::Tensor& x, Communicator& group);
// x [T / P, ...] -> [T, ...], rank order.
at::Tensor GatherFromSequenceParallel(const at::Tensor& x, Communicator& group);
// x [T, ...] (a partial sum) -> this rank's rows [T / P, ...] of the sum over the group.
at::Tensor ScatterToSequenceParallel(const at::Tensor& x, Communicator& group);

// The dense SwiGLU MLP with gate and up column-parallel ([I / P, H] each) and down row-parallel
// ([H, I / P]): x [T, H] on every rank (sequence_parallel false), or this rank's [T / P, H]
// (true); returns the same layout. Equal to the whole MLP on the whole x up to the order of the
// sums over I (//tests:tensor_parallel_test).
at::Tensor TensorParallelMlp(const at::Tensor& gate_proj, const at::Tensor& up_proj,
                             const at::Tensor& down_proj, const at::Tensor& x,
                             Communicator& group, bool sequence_parallel);

// Note [Tensor-parallel attention]
// GQA attention with q, k and v column-parallel by heads and o_proj row-parallel: rank r of P
// holds query heads [r * H / P, (r + 1) * H / P) (q_proj rows, their biases) and the key/value
// heads those read: KV / P heads [r * KV / P, ...) when P divides KV, else the one head
// r * KV / P (KV < P: each key/value head replicated on P / KV ranks, whose partial gradients of
// it the optimizer sums). The q/k norms are per head dim, replicated. o_proj holds the matching
// columns; its bias is added once, after the partial outputs are summed.
// KvHeadsOf (model_config.h) gives the key/value heads a rank holds.

// `local`: this rank's shards as above (q_proj [H / P * D, hidden] ...; o_proj [hidden, H / P * D]
// and o_bias whole). x [B, S, hidden] on every rank (sequence_parallel false), or this rank's
// token rows [B * S / P, hidden] of the flattened batch (true; `batch` = B then); returns the
// same layout. With a KV cache (ctx.cache holds this rank's key/value heads) only without
// sequence parallelism. Equal to GqaAttention over the whole weights up to the order of o_proj's
// sums (//tests:tensor_parallel_test, //tests:decoder_tp_test).
at::Tensor TensorParallelGqaAttention(const GqaWeights& local, const at::Tensor& x,
                                      const AttentionContext& ctx, Communicator& group,
                                      bool sequence_parallel, int64_t batch);

// MLA (Note [Tensor-parallel attention] for the heads): the down projections q_a_proj and
// kv_a_proj and their norms are replicated on every rank (each rank's gradient of them is partial:
// its heads' share, summed over TP by the optimizer); the up projections q_b_proj (or q_proj)
// and kv_b_proj are column-parallel by heads (rows [r * H / P * d, ...) with d = qk_head_dim,
// resp. qk_nope_head_dim + v_head_dim); o_proj is row-parallel. The DSA indexer is replicated:
// every rank computes the same top-k over every token (its input is the whole sequence, after
// the input mapping; it has no gradient) and its heads attend to the selected keys; `indexer_type`
// and `topk` as MlaAttention's. Same layouts of x and the result as TensorParallelGqaAttention.
at::Tensor TensorParallelMlaAttention(const MlaWeights& local, IndexerType indexer_type,
                                      const at::Tensor& x, const AttentionContext& ctx,
                                      Communicator& group, bool sequence_parallel, int64_t batch,
                                      at::Tensor& topk);

// Note [Tensor-parallel gradients]
// After the backward, a TP rank's gradient of a param that several TP ranks hold
// (ParamSpec::tp_replicas > 1) is either
//  - complete, the same on each of them: without sequence parallelism, whatever acts on the
//    residual stream every rank holds whole (the layer norms, the final norm, the router and the
//    experts, o_proj's bias added after the sum), since the mappings' backward all-reduces the
//    stream's gradient; or
//  - partial, this rank's share, the whole gradient being the sum over the ranks that hold it:
//    what acts inside the head-parallel part of attention (Qwen3's q/k norms, MLA's down
//    projections and their norms, which feed only this rank's heads; key/value heads shared by
//    several ranks, each of which reads them for its own query heads), and under sequence
//    parallelism every replicated param (it saw only this rank's tokens).
// TensorParallelGrads sums the partial ones once per optimizer step, on the grad buffer (as
// Megatron's finalize_model_grads does for layer norms under sequence parallelism): one
// all-reduce over TP for the params every TP rank holds, one for the shared key/value heads (each
// rank's gradient in its head's row of a [TP / replicas, n] tensor, zeros elsewhere). Not the
// routed experts: their buffer is reduced over every rank, which sums their shares.
bool TensorParallelPartialGrad(const ParamSpec& spec, bool sequence_parallel);

class TensorParallelGrads {
 public:
  // `trained`: this rank's trained params (ListParams of its tensor shard); `group`: its TP group.
  TensorParallelGrads(const std::vector<ParamSpec>& trained, bool sequence_parallel,
                      Communicator& group);
  // Replaces each partial gradient by the sum over the ranks that hold its param. `grad_of(name)`
  // gives the gradient to update in place. Collective over the group.
  void Sum(const std::function<at::Tensor(const std::string&)>& grad_of) const;
  // The params Sum adds up, for the log.
  size_t size() const { return whole_group_.members.size() + shared_.members.size(); }

 private:
  // Params summed by one all-reduce of a [rows, n] tensor, each rank's gradient in its row.
  struct Rows {
    int64_t rows = 1;
    std::vector<std::pair<std::string, int64_t>> members;  // name, this rank's row
  };
  void SumRows(const Rows& part,
               const std::function<at::Tensor(const std::string&)>& grad_of) const;

  Communicator& group_;
  Rows whole_group_;  // held by every TP rank: one row
  Rows shared_;       // shared key/value heads: a row per head
};

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_TENSOR_PARALLEL_H_
