#include "trainer/model/vocab_parallel.h"

#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <vector>

#include "launch/check.h"
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

// Note [Vocabulary-parallel log-probs]: outputs {log p(target), entropy}.
class VocabParallelFn : public torch::autograd::Function<VocabParallelFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits,
                               const at::Tensor& targets, int64_t vocab_start,
                               Communicator* group) {
    const at::Tensor l = Widened(logits);
    const int64_t n = l.size(0);
    const int64_t local = l.size(1);
    at::Tensor m = local > 0 ? std::get<0>(l.max(1)).contiguous()
                             : at::full({n}, -std::numeric_limits<double>::infinity(), l.options());
    group->AllReduce(m, ReduceOp::kMax);
    const at::Tensor shifted = l - m.unsqueeze(1);  // <= 0
    const at::Tensor e = shifted.exp();
    const at::Tensor in_shard = targets.ge(vocab_start).logical_and(targets.lt(vocab_start + local));
    at::Tensor target_shifted = at::zeros({n}, l.options());
    if (local > 0) {
      const at::Tensor index = (targets - vocab_start).clamp(0, local - 1).unsqueeze(1);
      target_shifted = shifted.gather(1, index).squeeze(1).masked_fill(in_shard.logical_not(), 0);
    }
    // [sum exp(l - m), l_y - m, sum exp(l - m) (l - m)], summed over the group in one call.
    const at::Tensor sums = at::stack({e.sum(1), target_shifted, (e * shifted).sum(1)});
    group->AllReduce(sums, ReduceOp::kSum);
    const at::Tensor log_z = sums[0].log();
    const at::Tensor log_probs = sums[1] - log_z;
    const at::Tensor entropy = log_z - sums[2] / sums[0];
    ctx->save_for_backward({logits, targets, m, log_z, entropy});
    ctx->saved_data["vocab_start"] = vocab_start;
    return {log_probs, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& targets = saved[1];
    const int64_t vocab_start = ctx->saved_data["vocab_start"].toInt();
    const int64_t local = logits.size(1);
    const at::Tensor log_p = Widened(logits) - (saved[2] + saved[3]).unsqueeze(1);  // [N, V_r]
    const at::Tensor p = log_p.exp();
    at::Tensor grad_logits = at::zeros_like(log_p);
    if (grad[0].defined() && local > 0) {  // d log p(y) / d l_j = [j == y] - p_j
      const at::Tensor g = grad[0].to(log_p.scalar_type());
      const at::Tensor in_shard =
          targets.ge(vocab_start).logical_and(targets.lt(vocab_start + local));
      grad_logits.sub_(p * g.unsqueeze(1));
      grad_logits.scatter_add_(1, (targets - vocab_start).clamp(0, local - 1).unsqueeze(1),
                               g.masked_fill(in_shard.logical_not(), 0).unsqueeze(1));
    }
    if (grad[1].defined()) {  // d H / d l_j = -p_j (log p_j + H)
      const at::Tensor g = grad[1].to(log_p.scalar_type());
      grad_logits.sub_(p * (log_p + saved[4].unsqueeze(1)) * g.unsqueeze(1));
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
