// Token log-probs and entropy over a vocabulary split across the ranks of a tensor-parallel group,
// without gathering the logits (the vocabulary-parallel LM head's loss side).
//
// Note [Vocabulary-parallel log-probs]
// Rank r of the group holds the logits of vocabulary ids [vocab_start, vocab_start + V_r) of every
// position ([N, V_r]; V_r may differ between ranks and be 0). Each rank first computes its
// shard's own statistics per row (on CUDA by our fused kernel, kernels::TokenLogProbsRows, in one
// read of the shard): the log-sum-exp lse_r, the target's log-prob under the shard's softmax
// (where it holds the target) and that softmax's entropy H_r, whose mean logit is E_r = lse_r -
// H_r. For a position with logits l over the whole vocabulary and target y:
//   M = max_r lse_r                         (all-reduce max)
//   Z / e^M = sum_r exp(lse_r - M)          (all-reduce sum)
//   log p(y) = l_y - M - log(Z / e^M)       (l_y - M from the rank that holds y, 0 elsewhere)
//   H = log Z - sum_r exp(lse_r - log Z) E_r
// so the forward makes two all-reduces of [N] values (the max; then the sum of the scaled
// exponentials, the target logit and the scaled mean logits together as one [3, N]). The
// backward needs no communication: every term is local once log Z and H are known,
//   d log p(y) / d l_j = [j == y] - p_j,   d H / d l_j = -p_j (log p_j + H)
// (on CUDA by the fused backward kernel, kernels::TokenLogProbsRowsGrad, given the whole
// distribution's log-sum-exp and entropy and -1 for a target another rank holds), and the
// gradient of the logits stays on the rank that holds them (what flows back into the LM head's
// input is the column-parallel layer's business: an all-reduce over the group there).
// Arithmetic in fp32 (fp64 for fp64 logits), as the full log_softmax of the training path. The
// results equal log_softmax over the gathered logits up to the order of the sums
// (//tests:vocab_parallel_test, 2 and 4 ranks).
//
// A collective over `group`: every rank calls it with the same N. Targets must be valid global
// ids on every rank (not checked on the device).
#ifndef RL_TRAINER_MODEL_VOCAB_PARALLEL_H_
#define RL_TRAINER_MODEL_VOCAB_PARALLEL_H_

#include <ATen/ATen.h>

#include <cstdint>

#include "launch/communicator.h"

namespace rl::model {

struct VocabParallelStats {
  at::Tensor log_probs;  // [N] log p(target), fp32 (fp64 for fp64 logits)
  at::Tensor entropy;    // [N] entropy of each position's distribution
};

// `logits` [N, V_r] (this rank's vocabulary ids [vocab_start, vocab_start + V_r)), `targets` [N]
// int64 global ids. Differentiable in `logits` (both outputs).
VocabParallelStats VocabParallelLogProbs(const at::Tensor& logits, const at::Tensor& targets,
                                         int64_t vocab_start, Communicator& group);

// The vocabulary-parallel embedding: rank r holds rows [vocab_start, vocab_start + V_r) of the
// table (`weight` [V_r, hidden]); each rank looks up the tokens it holds (zeros for the others)
// and the rows are summed over the group: by an all-reduce, giving every token's row on every
// rank, or with `sequence_parallel` by a reduce-scatter over the flattened tokens, giving this
// rank's [T / P, hidden] (Note [Tensor-parallel mappings] in tensor_parallel.h). `tokens` [...]
// int64 global ids; returns [..., hidden], or [T / P, hidden]. Differentiable in `weight`.
at::Tensor VocabParallelEmbedding(const at::Tensor& weight, const at::Tensor& tokens,
                                  int64_t vocab_start, Communicator& group,
                                  bool sequence_parallel);

// The vocabulary-parallel LM head, a column-parallel layer: this rank's logits [..., V_r] of
// hidden states [..., hidden] on every rank (or this rank's tokens [T / P, hidden] with
// `sequence_parallel`, gathered first, giving [T, V_r]). `weight` [V_r, hidden] may be the
// embedding's own shard (tied embeddings): the gradients of both uses add up.
at::Tensor VocabParallelLmHead(const at::Tensor& hidden, const at::Tensor& weight,
                               Communicator& group, bool sequence_parallel);

// The whole vocabulary's logits [N, vocab] on every rank from each rank's slice [N, V_r]
// (VocabSlice), for sampling: one all-gather of the slices padded to the longest. No autograd.
at::Tensor GatherVocabParallel(const at::Tensor& logits, int64_t vocab, Communicator& group);

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_VOCAB_PARALLEL_H_
