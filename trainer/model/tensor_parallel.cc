#include "trainer/model/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "launch/check.h"
#include "trainer/model/layers.h"

namespace rl::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels as an integer (autograd's saved data holds IValues).
Communicator& GroupOf(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(ctx->saved_data["group"].toInt());
}
void SaveGroup(AutogradContext* ctx, Communicator* group) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
}

at::Tensor AllReduced(const at::Tensor& x, Communicator& group) {
  at::Tensor out = x.contiguous().clone();
  group.AllReduce(out, ReduceOp::kSum);
  return out;
}

// x [n, ...] -> [P * n, ...]: the flat all-gather is a concatenation along dim 0.
at::Tensor Gathered(const at::Tensor& x, Communicator& group) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] *= group.size();
  at::Tensor out = at::empty(shape, x.options());
  group.AllGather(x.contiguous().view({-1}), out.view({-1}));
  return out;
}

// x [P * n, ...] -> [n, ...]: this rank's rows of the sum over the group.
at::Tensor ReduceScattered(const at::Tensor& x, Communicator& group) {
  RL_CHECK(x.size(0) % group.size() == 0, Error,
           "sequence parallelism over '{}': {} token rows do not split over {} ranks (pad the "
           "tokens to a multiple)",
           group.name(), x.size(0), group.size());
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] /= group.size();
  at::Tensor out = at::empty(shape, x.options());
  group.ReduceScatter(x.contiguous().view({-1}), out.view({-1}), ReduceOp::kSum);
  return out;
}

class CopyTo : public torch::autograd::Function<CopyTo> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* group) {
    SaveGroup(ctx, group);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {AllReduced(grad[0], GroupOf(ctx)), at::Tensor()};
  }
};

class ReduceFrom : public torch::autograd::Function<ReduceFrom> {
 public:
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, Communicator* group) {
    return AllReduced(x, *group);
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {grad[0], at::Tensor()};
  }
};

class GatherFromSequence : public torch::autograd::Function<GatherFromSequence> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* group) {
    SaveGroup(ctx, group);
    return Gathered(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {ReduceScattered(grad[0], GroupOf(ctx)), at::Tensor()};
  }
};

class ScatterToSequence : public torch::autograd::Function<ScatterToSequence> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* group) {
    SaveGroup(ctx, group);
    return ReduceScattered(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Gathered(grad[0], GroupOf(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor CopyToTensorParallel(const at::Tensor& x, Communicator& group) {
  return CopyTo::apply(x, &group);
}
at::Tensor ReduceFromTensorParallel(const at::Tensor& x, Communicator& group) {
  return ReduceFrom::apply(x, &group);
}
at::Tensor GatherFromSequenceParallel(const at::Tensor& x, Communicator& group) {
  return GatherFromSequence::apply(x, &group);
}
at::Tensor ScatterToSequenceParallel(const at::Tensor& x, Communicator& group) {
  return ScatterToSequence::apply(x, &group);
}

at::Tensor TensorParallelMlp(const at::Tensor& gate_proj, const at::Tensor& up_proj,
                             const at::Tensor& down_proj, const at::Tensor& x,
                             Communicator& group, bool sequence_parallel) {
  const at::Tensor input = sequence_parallel ? GatherFromSequenceParallel(x, group)
                                             : CopyToTensorParallel(x, group);
  const at::Tensor partial =
      Linear(at::silu(Linear(input, gate_proj)) * Linear(input, up_proj), down_proj);
  return sequence_parallel ? ScatterToSequenceParallel(partial, group)
                           : ReduceFromTensorParallel(partial, group);
}

namespace {

// Note [Tensor-parallel attention]: the input mapping, `attend` over this rank's heads (a partial
// output without o_proj's bias), the output mapping, then the bias.
template <typename Attend>
at::Tensor HeadParallel(const at::Tensor& x, Communicator& group, bool sequence_parallel,
                        int64_t batch, const at::Tensor& o_bias, Attend attend) {
  at::Tensor input;
  if (sequence_parallel) {
    const at::Tensor gathered = GatherFromSequenceParallel(x, group);  // [B * S, hidden]
    input = gathered.view({batch, gathered.size(0) / batch, gathered.size(1)});
  } else {
    input = CopyToTensorParallel(x, group);
  }
  const at::Tensor out = attend(input);  // [B, S, hidden], partial
  const at::Tensor summed = sequence_parallel
                                ? ScatterToSequenceParallel(out.reshape({-1, out.size(-1)}), group)
                                : ReduceFromTensorParallel(out, group);
  return o_bias.defined() ? summed + o_bias : summed;
}

// The config of this rank's `heads` query heads (and `kv_heads` key/value heads), checked.
ModelConfig HeadShard(const ModelConfig& whole, int64_t heads, int64_t kv_heads,
                      Communicator& group) {
  const int64_t want_kv = whole.attention_kind() == AttentionKind::kGqa
                              ? KvHeadsOf(whole.num_key_value_heads, group.rank(), group.size()).count
                              : heads;
  RL_CHECK(heads * group.size() == whole.num_attention_heads && kv_heads == want_kv, Error,
           "tensor-parallel attention over '{}': {} query and {} key/value heads on rank {} of "
           "{} do not shard {} and {} (Note [Tensor-parallel attention])",
           group.name(), heads, kv_heads, group.rank(), group.size(), whole.num_attention_heads,
           whole.num_key_value_heads);
  ModelConfig shard = whole;
  shard.num_attention_heads = heads;
  shard.num_key_value_heads = kv_heads;
  return shard;
}

}  // namespace

at::Tensor TensorParallelGqaAttention(const GqaWeights& local, const at::Tensor& x,
                                      const AttentionContext& ctx, Communicator& group,
                                      bool sequence_parallel, int64_t batch) {
  RL_CHECK(!local.qkv_proj.defined(), Error,
           "tensor-parallel attention takes q, k and v apart (no fused qkv_proj)");
  RL_CHECK(ctx.cache == nullptr || !sequence_parallel, Error,
           "tensor-parallel attention with a KV cache runs without sequence parallelism");
  const int64_t d = ctx.config->head_dim;
  const ModelConfig shard =
      HeadShard(*ctx.config, local.q_proj.size(0) / d, local.k_proj.size(0) / d, group);
  GqaWeights partial = local;
  partial.o_bias = at::Tensor();  // added once, after the sum
  AttentionContext shard_ctx = ctx;
  shard_ctx.config = &shard;
  return HeadParallel(x, group, sequence_parallel, batch, local.o_bias,
                      [&](const at::Tensor& input) {
                        return GqaAttention(partial, input, shard_ctx);
                      });
}

at::Tensor TensorParallelMlaAttention(const MlaWeights& local, IndexerType indexer_type,
                                      const at::Tensor& x, const AttentionContext& ctx,
                                      Communicator& group, bool sequence_parallel, int64_t batch,
                                      at::Tensor& topk) {
  RL_CHECK(ctx.cache == nullptr || !sequence_parallel, Error,
           "tensor-parallel attention with a KV cache runs without sequence parallelism");
  const ModelConfig& whole = *ctx.config;
  const at::Tensor& q_up = local.q_b_proj.defined() ? local.q_b_proj : local.q_proj;
  const int64_t heads = q_up.size(0) / whole.qk_head_dim();
  RL_CHECK(local.kv_b_proj.size(0) == heads * (whole.qk_nope_head_dim + whole.v_head_dim), Error,
           "tensor-parallel MLA over '{}': kv_b_proj has {} rows for {} local heads",
           group.name(), local.kv_b_proj.size(0), heads);
  const ModelConfig shard = HeadShard(whole, heads, heads, group);
  MlaWeights partial = local;
  partial.o_bias = at::Tensor();
  AttentionContext shard_ctx = ctx;
  shard_ctx.config = &shard;
  return HeadParallel(x, group, sequence_parallel, batch, local.o_bias,
                      [&](const at::Tensor& input) {
                        return MlaAttention(partial, indexer_type, input, shard_ctx, topk);
                      });
}

bool TensorParallelPartialGrad(const ParamSpec& spec, bool sequence_parallel) {
  if (spec.tp_replicas <= 1) return false;  // a slice of its own
  if (spec.tp_dim >= 0 || sequence_parallel) return true;
  // Replicated, without sequence parallelism: partial inside the head-parallel attention only.
  const bool attention = spec.name.find(".self_attn.") != std::string::npos;
  const bool after_sum = spec.name.find(".o_proj.") != std::string::npos;
  return attention && !after_sum;
}

TensorParallelGrads::TensorParallelGrads(const std::vector<ParamSpec>& trained,
                                         bool sequence_parallel, Communicator& group)
    : group_(group) {
  for (const ParamSpec& spec : trained) {
    // The routed experts' shares are summed by their buffer's reduction over every rank (Note
    // [Expert gradients] in optimizer/distributed_optimizer.h).
    if (spec.role == ParamRole::kRoutedExpert) continue;
    if (!TensorParallelPartialGrad(spec, sequence_parallel)) continue;
    if (spec.tp_dim < 0) {
      whole_group_.members.emplace_back(spec.name, 0);
      continue;
    }
    RL_CHECK(group.size() % spec.tp_replicas == 0, Error,
             "{} is held by {} of the {} TP ranks, which does not divide them", spec.name,
             spec.tp_replicas, group.size());
    shared_.members.emplace_back(spec.name, group.rank() / spec.tp_replicas);
    shared_.rows = group.size() / spec.tp_replicas;
  }
}

void TensorParallelGrads::Sum(const std::function<at::Tensor(const std::string&)>& grad_of) const {
  SumRows(whole_group_, grad_of);
  SumRows(shared_, grad_of);
}

void TensorParallelGrads::SumRows(
    const Rows& part, const std::function<at::Tensor(const std::string&)>& grad_of) const {
  if (part.members.empty()) return;
  std::vector<at::Tensor> grads;
  int64_t numel = 0;
  for (const auto& [name, row] : part.members) {
    grads.push_back(grad_of(name));
    numel += grads.back().numel();
  }
  at::Tensor rows = at::zeros({part.rows, numel}, grads.front().options());
  int64_t offset = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    rows[part.members[i].second].narrow(0, offset, grads[i].numel()).copy_(grads[i].reshape({-1}));
    offset += grads[i].numel();
  }
  group_.AllReduce(rows, ReduceOp::kSum);
  offset = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    grads[i].copy_(
        rows[part.members[i].second].narrow(0, offset, grads[i].numel()).view(grads[i].sizes()));
    offset += grads[i].numel();
  }
}

}  // namespace rl::model
