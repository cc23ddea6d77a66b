#include "trainer/model/vocab_parallel.h"

#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <vector>

#include "launch/check.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/model/layers.h"
#include "trainer/model/tensor_parallel.h"

namespace rl::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// fp32, or fp64 for fp64 logits.
at::Tensor Widened(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? t : t.to(at::kFloat);
}

// The statistics of this rank's shard alone, per row: its log-sum-exp, the log-prob of the
// target under the shard's own softmax (0 where the shard does not hold it) and that softmax's
// entropy; fp32 (fp64 for fp64 logits). By our fused kernel on CUDA, ATen ops otherwise; an
// empty shard has a log-sum-exp of -inf.
kernels::RowLogProbStats ShardStats(const at::Tensor& logits, const at::Tensor& local_ids,
                                    const at::Tensor& in_shard) {
  const int64_t n = logits.size(0);
  if (logits.size(1) == 0) {
    const at::Tensor zeros = at::zeros({n}, Widened(logits).options());
    return {zeros, at::full({n}, -std::numeric_limits<double>::infinity(), zeros.options()),
            zeros};
  }
  kernels::RowLogProbStats stats;
  if (kernels::Supported(logits)) {
    stats = kernels::TokenLogProbsRows(logits.contiguous(), local_ids);
  } else {
    const at::Tensor l = Widened(logits);
    stats.lse = at::logsumexp(l, 1);
    const at::Tensor log_q = l - stats.lse.unsqueeze(1);
    stats.log_probs = log_q.gather(1, local_ids.unsqueeze(1)).squeeze(1);
    stats.entropy = -(log_q.exp() * log_q).sum(1);
  }
  stats.log_probs = stats.log_probs.masked_fill(in_shard.logical_not(), 0);
  return stats;
}

// Note [Vocabulary-parallel log-probs]: outputs {log p(target), entropy}.
class VocabParallelFn : public torch::autograd::Function<VocabParallelFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits,
                               const at::Tensor& targets, int64_t vocab_start,
                               Communicator* group) {
    const int64_t local = logits.size(1);
    const at::Tensor in_shard = targets.ge(vocab_start).logical_and(targets.lt(vocab_start + local));
    const at::Tensor local_ids = (targets - vocab_start).clamp(0, std::max<int64_t>(local - 1, 0));
    const kernels::RowLogProbStats shard = ShardStats(logits, local_ids, in_shard);
    at::Tensor m = shard.lse.clone();  // the largest shard log-sum-exp, M
    group->AllReduce(m, ReduceOp::kMax);
    // Per shard r: s_r = exp(lse_r - M), its rows' l_y - M, and s_r (E_r[l] - M) with
    // E_r[l] = lse_r - H_r the mean logit under its own softmax; summed over the group in one
    // call, they give log Z - M = log sum s_r, log p(y) and H = log Z - E[l].
    const at::Tensor scale = (shard.lse - m).exp();  // 0 for an empty shard
    const at::Tensor target_shifted =
        (shard.log_probs + shard.lse - m).masked_fill(in_shard.logical_not(), 0);
    const at::Tensor mean_shifted = at::where(scale > 0, scale * (shard.lse - shard.entropy - m),
                                              at::zeros_like(scale));
    const at::Tensor sums = at::stack({scale, target_shifted, mean_shifted});
    group->AllReduce(sums, ReduceOp::kSum);
    const at::Tensor log_z = sums[0].log();  // log Z - M
    const at::Tensor log_probs = sums[1] - log_z;
    const at::Tensor entropy = log_z - sums[2] / sums[0];
    // The backward's target per row: its shard column, or -1 where another rank holds it.
    const at::Tensor backward_ids = local_ids.masked_fill(in_shard.logical_not(), -1);
    ctx->save_for_backward({logits, backward_ids, m + log_z, entropy});
    return {log_probs, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& ids = saved[1];
    const at::Tensor& lse = saved[2];
    const at::Tensor& entropy = saved[3];
    if (logits.size(1) == 0) return {at::zeros_like(logits), at::Tensor(), at::Tensor(), at::Tensor()};
    if (kernels::Supported(logits)) {
      return {kernels::TokenLogProbsRowsGrad(logits.contiguous(), ids, lse, entropy, grad[0],
                                             grad[1]),
              at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const at::Tensor log_p = Widened(logits) - lse.unsqueeze(1);  // [N, V_r]
    const at::Tensor p = log_p.exp();
    at::Tensor grad_logits = at::zeros_like(log_p);
    if (grad[0].defined()) {  // d log p(y) / d l_j = [j == y] - p_j
      const at::Tensor g = grad[0].to(log_p.scalar_type());
      const at::Tensor in_shard = ids.ge(0);
      grad_logits.sub_(p * g.unsqueeze(1));
      grad_logits.scatter_add_(1, ids.clamp_min(0).unsqueeze(1),
                               g.masked_fill(in_shard.logical_not(), 0).unsqueeze(1));
    }
    if (grad[1].defined()) {  // d H / d l_j = -p_j (log p_j + H)
      const at::Tensor g = grad[1].to(log_p.scalar_type());
      grad_logits.sub_(p * (log_p + entropy.unsqueeze(1)) * g.unsqueeze(1));
    }
    return {grad_logits.to(logits.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

VocabParallelStats VocabParallelLogProbs(const at::Tensor& logits, const at::Tensor& targets,
                                         int64_t vocab_start, Communicator& group) {
  RL_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
               targets.scalar_type() == at::kLong && targets.device() == logits.device() &&
               at::isFloatingType(logits.scalar_type()) && vocab_start >= 0,
           Error,
           "vocabulary-parallel log-probs over '{}': logits must be [N, V_r] floating and targets "
           "[N] int64 on the same device, vocab_start >= 0; got logits of {} dims, targets of {} "
           "dims ({}), vocab_start {}",
           group.name(), logits.dim(), targets.dim(), c10::toString(targets.scalar_type()),
           vocab_start);
  const variable_list out = VocabParallelFn::apply(logits, targets, vocab_start, &group);
  return {out[0], out[1]};
}

at::Tensor VocabParallelEmbedding(const at::Tensor& weight, const at::Tensor& tokens,
                                  int64_t vocab_start, Communicator& group,
                                  bool sequence_parallel) {
  const int64_t local = weight.size(0);
  const at::Tensor in_shard = tokens.ge(vocab_start).logical_and(tokens.lt(vocab_start + local));
  std::vector<int64_t> shape = tokens.sizes().vec();
  shape.push_back(weight.size(1));
  const at::Tensor rows =
      local > 0 ? at::embedding(weight, (tokens - vocab_start).clamp(0, local - 1)) *
                      in_shard.unsqueeze(-1).to(weight.scalar_type())
                // No rows here: zeros that still depend on the (empty) weight, so that this
                // rank's backward runs the collectives of the other ranks' backward too.
                : at::zeros(shape, weight.options()) + weight.sum();
  if (sequence_parallel) {
    return ScatterToSequenceParallel(rows.reshape({-1, weight.size(1)}), group);
  }
  return ReduceFromTensorParallel(rows, group);
}

at::Tensor VocabParallelLmHead(const at::Tensor& hidden, const at::Tensor& weight,
                               Communicator& group, bool sequence_parallel) {
  const at::Tensor input = sequence_parallel ? GatherFromSequenceParallel(hidden, group)
                                             : CopyToTensorParallel(hidden, group);
  return Linear(input, weight);
}

at::Tensor GatherVocabParallel(const at::Tensor& logits, int64_t vocab, Communicator& group) {
  const int64_t n = logits.size(0);
  const int64_t ranks = group.size();
  const int64_t longest = VocabSlice(vocab, ranks - 1, ranks).count;  // the last holds the rest
  RL_CHECK(logits.dim() == 2 &&
               logits.size(1) == VocabSlice(vocab, group.rank(), ranks).count,
           Error, "GatherVocabParallel: rank {} holds {} of the {} vocabulary ids; got logits [{}]",
           group.rank(), VocabSlice(vocab, group.rank(), ranks).count, vocab,
           fmt::join(logits.sizes(), ", "));
  at::Tensor block = at::zeros({n, longest}, logits.options());
  block.narrow(1, 0, logits.size(1)).copy_(logits);
  at::Tensor blocks = at::empty({ranks, n, longest}, logits.options());
  group.AllGather(block.view({-1}), blocks.view({-1}));
  std::vector<at::Tensor> slices;
  for (int64_t r = 0; r < ranks; ++r) {
    slices.push_back(blocks[r].narrow(1, 0, VocabSlice(vocab, r, ranks).count));
  }
  return at::cat(slices, 1);
}

}  // namespace rl::model
