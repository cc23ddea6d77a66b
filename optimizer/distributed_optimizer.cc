#include "optimizer/distributed_optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "launch/check.h"

namespace rl::optimizer {
namespace {

constexpr int kStateParts = 3;  // masters, exp_avg, exp_avg_sq
constexpr const char* kStateNames[kStateParts] = {"master", "exp_avg", "exp_avg_sq"};

// The first line where two layout descriptions differ, for error messages.
std::string FirstDifference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  int line = 1;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(sa, la));
    const bool gb = static_cast<bool>(std::getline(sb, lb));
    if (!ga && !gb) return "(no difference)";
    if (la != lb || ga != gb) {
      return fmt::format("line {}: checkpoint has '{}', this run has '{}'", line,
                         ga ? la : "(end)", gb ? lb : "(end)");
    }
    ++line;
  }
}

// The layout of the `kind` buffer: the params whose role puts them there, in use order.
BufferLayout LayoutOf(BufferKind kind, const std::vector<ParamSpec>& params_in_use_order,
                      int dp_size) {
  std::vector<ParamSpec> params;
  for (const ParamSpec& p : params_in_use_order) {
    RL_CHECK(p.role != ParamRole::kFp32Extra, Error,
             "optimizer: {} is an fp32 extra, which is not trained; leave it out of the optimizer",
             p.name);
    const BufferKind of =
        p.role == ParamRole::kRoutedExpert ? BufferKind::kExpert : BufferKind::kDense;
    if (of == kind) params.push_back(p);
  }
  return MakeBufferLayout(params, dp_size);
}

}  // namespace

std::string_view ToString(BufferKind kind) {
  return kind == BufferKind::kDense ? "dense" : "expert";
}

Allocator PlainAllocator(c10::Device device) {
  return [device](RegionTag, int64_t numel, at::ScalarType dtype) {
    return at::zeros({numel}, at::TensorOptions().dtype(dtype).device(device));
  };
}

std::map<RegionTag, int64_t> DistributedOptimizer::StorageBytes(
    const std::vector<ParamSpec>& params_in_use_order, int dp_size, at::ScalarType param_dtype,
    int expert_dp_size) {
  const int64_t param_bytes = c10::elementSize(param_dtype);
  const int64_t grad_bytes = param_dtype == at::kDouble ? 8 : 4;
  std::map<RegionTag, int64_t> bytes;
  int64_t state_numel = 0;
  for (BufferKind kind : kBufferKinds) {
    const BufferLayout layout =
        LayoutOf(kind, params_in_use_order,
                 kind == BufferKind::kExpert && expert_dp_size > 0 ? expert_dp_size : dp_size);
    bytes[RegionTag::kParamBuffer] += AlignedAllocationBytes(layout.numel * param_bytes);
    bytes[RegionTag::kGradBuffer] += AlignedAllocationBytes(layout.numel * grad_bytes);
    state_numel += kStateParts * layout.shard_numel();
  }
  bytes[RegionTag::kOptimizer] = AlignedAllocationBytes(state_numel * grad_bytes);
  return bytes;
}

DistributedOptimizer::DistributedOptimizer(const std::vector<ParamSpec>& params_in_use_order,
                                           Communicator& comm, at::ScalarType param_dtype,
                                           c10::Device device, AdamOptions options,
                                           const Allocator& allocate, Communicator* expert_comm,
                                           Communicator* tensor_comm)
    : comm_(comm),
      tensor_comm_(tensor_comm != nullptr && tensor_comm->size() > 1 ? tensor_comm : nullptr),
      device_(device),
      options_(options),
      allocate_(allocate) {
  const at::ScalarType grad_dtype = param_dtype == at::kDouble ? at::kDouble : at::kFloat;
  std::unordered_map<std::string, bool> duplicate;  // Note [Tensor-parallel grad norm]
  for (const ParamSpec& p : params_in_use_order) duplicate[p.name] = p.tp_duplicate;
  int64_t state_numel = 0;
  for (BufferKind kind : kBufferKinds) {
    Buffer& buffer = buffers_[Index(kind)];
    buffer.comm = kind == BufferKind::kExpert && expert_comm != nullptr ? expert_comm : &comm_;
    buffer.layout = LayoutOf(kind, params_in_use_order, buffer.comm->size());
    buffer.segments = buffer.layout.Segments(buffer.comm->rank());
    buffer.params = allocate_(RegionTag::kParamBuffer, buffer.layout.numel, param_dtype);
    buffer.grads = allocate_(RegionTag::kGradBuffer, buffer.layout.numel, grad_dtype);
    state_numel += kStateParts * buffer.layout.shard_numel();
    for (const BufferEntry& entry : buffer.layout.entries) {
      // A leaf tensor aliasing the buffer; the buffer tensor keeps the storage alive.
      const at::Tensor owner = buffer.params;
      void* data = static_cast<char*>(owner.data_ptr()) + entry.offset * owner.element_size();
      at::Tensor view = at::from_blob(
          data, entry.shape, [owner](void*) {}, owner.options());
      view.set_requires_grad(true);
      params_.emplace(entry.name, view);
    }
    for (const ShardSegment& segment : buffer.segments) {
      if (tensor_comm_ == nullptr || buffer.comm != &comm_ ||
          !duplicate.at(buffer.layout.entries[segment.entry].name)) {
        continue;
      }
      if (!buffer.norm_mask.defined()) {
        buffer.norm_mask = at::ones({buffer.layout.shard_numel()},
                                    at::TensorOptions().dtype(grad_dtype).device(device_));
      }
      buffer.norm_mask.narrow(0, segment.shard_offset, segment.numel).zero_();
    }
  }
  state_ = allocate_(RegionTag::kOptimizer, state_numel, grad_dtype);
}

at::Tensor DistributedOptimizer::Shard(const at::Tensor& flat, const Buffer& buffer) const {
  return flat.narrow(0, buffer.layout.shard_offset(buffer.comm->rank()),
                     buffer.layout.shard_numel());
}

at::Tensor DistributedOptimizer::StateOf(BufferKind kind) const {
  RL_CHECK(!offloaded_, Error, "optimizer state is offloaded; call OnloadState() first");
  int64_t offset = 0;
  for (BufferKind k : kBufferKinds) {
    const int64_t shard = buffers_[Index(k)].layout.shard_numel();
    if (k == kind) return state_.narrow(0, offset, kStateParts * shard).view({kStateParts, shard});
    offset += kStateParts * shard;
  }
  return {};
}

void DistributedOptimizer::InitMastersFromParams() {
  c10::NoGradGuard no_grad;
  for (BufferKind kind : kBufferKinds) {
    at::Tensor state = StateOf(kind);
    state[0].copy_(Shard(buffers_[Index(kind)].params, buffers_[Index(kind)]));
    state[1].zero_();
    state[2].zero_();
  }
  step_ = 0;
}

at::Tensor DistributedOptimizer::grad(const std::string& name) const {
  for (const Buffer& buffer : buffers_) {
    for (const BufferEntry& entry : buffer.layout.entries) {
      if (entry.name == name) return buffer.grads.narrow(0, entry.offset, entry.numel).view(entry.shape);
    }
  }
  RL_CHECK(false, Error, "optimizer: no trained param {}", name);
  return {};
}

void DistributedOptimizer::AccumulateGrads() {
  c10::NoGradGuard no_grad;
  for (BufferKind kind : kBufferKinds) {
    const Buffer& buffer = buffers_[Index(kind)];
    int64_t written = 0;  // Note [Lazy grad zeroing]: the buffer is written up to here
    for (const BufferEntry& entry : buffer.layout.entries) {
      at::Tensor& param = params_.at(entry.name);
      const at::Tensor& grad = param.grad();
      at::Tensor slot = buffer.grads.narrow(0, entry.offset, entry.numel);
      if (grads_zero_) {
        buffer.grads.narrow(0, written, entry.offset - written).zero_();  // alignment padding
        grad.defined() ? slot.copy_(grad.reshape({-1})) : slot.zero_();
        written = entry.offset + entry.numel;
      } else if (grad.defined()) {
        slot.add_(grad.reshape({-1}));
      }
      if (grad.defined()) param.mutable_grad().reset();
    }
    if (grads_zero_) buffer.grads.narrow(0, written, buffer.grads.numel() - written).zero_();
  }
  grads_zero_ = false;
}

void DistributedOptimizer::ZeroGrads() {
  grads_zero_ = true;
  for (auto& [name, param] : params_) {
    if (param.grad().defined()) param.mutable_grad().reset();
  }
}

StepStats DistributedOptimizer::Step() {
  c10::NoGradGuard no_grad;
  if (grads_zero_) {  // a step with no gradient accumulated: the zeros are written now
    for (Buffer& buffer : buffers_) buffer.grads.zero_();
    grads_zero_ = false;
  }
  // Mean over DP, left in place in the owned shard of each grad buffer (with one rank the mean is
  // the buffer itself, and the shard is the whole buffer: nothing to move). Note [Expert
  // gradients]: an expert buffer reduced over a smaller group is scaled to the same mean.
  for (Buffer& buffer : buffers_) {
    const at::Tensor shard = Shard(buffer.grads, buffer);
    if (buffer.comm->size() > 1) buffer.comm->ReduceScatter(buffer.grads, shard, ReduceOp::kMean);
    if (buffer.comm->size() != comm_.size()) {
      shard.mul_(static_cast<double>(buffer.comm->size()) / comm_.size());
    }
  }
  // Note [Fused AdamW]: the reference sums the squares in fp64 (a converted copy of the shard);
  // the fused path takes an fp32 norm, one read of the shard, and keeps the clip on the device so
  // that the step does not wait for the norm on the host (it is read once the step is queued).
  const bool fused = options_.fused.value_or(device_.is_cuda());
  at::Tensor sum_sq = at::zeros({1}, state_.options().dtype(at::kDouble));
  for (Buffer& buffer : buffers_) {
    at::Tensor grad = Shard(buffer.grads, buffer);
    if (buffer.norm_mask.defined()) grad = grad * buffer.norm_mask;
    sum_sq += fused ? at::linalg_vector_norm(grad, 2).to(at::kDouble).square()
                    : grad.to(at::kDouble).square().sum();
  }
  comm_.AllReduce(sum_sq, ReduceOp::kSum);
  if (tensor_comm_ != nullptr) tensor_comm_->AllReduce(sum_sq, ReduceOp::kSum);
  const at::Tensor grad_norm = sum_sq.sqrt();
  StepStats stats;
  ++step_;
  stats.step = step_;
  stats.lr = options_.schedule.At(step_);
  if (fused) {
    // The kernel divides the gradients by grad_scale: 1 / clip, where clip = min(1, clip_grad /
    // (norm + 1e-6)) as the reference computes it on the host (the same fp64 operations).
    std::optional<at::Tensor> grad_scale;
    if (options_.clip_grad > 0) {
      grad_scale = (1.0 / at::clamp_max(options_.clip_grad / (grad_norm + 1e-6), 1.0))
                       .to(at::kFloat)
                       .reshape({});
    }
    ApplyFusedAdamW(stats.lr, grad_scale);
  } else {
    double clip = 1.0;
    if (options_.clip_grad > 0) {
      const double coefficient = options_.clip_grad / (grad_norm.item<double>() + 1e-6);
      if (coefficient < 1.0) clip = coefficient;
    }
    ApplyAdamW(stats.lr, clip);
  }
  CastMainToParams();
  AllGatherParams();
  ZeroGrads();
  stats.grad_norm = grad_norm.item<double>();
  return stats;
}

void DistributedOptimizer::ApplyAdamW(double lr, double clip) {
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  const double decay = 1.0 - lr * options_.weight_decay;
  for (BufferKind kind : kBufferKinds) {
    const Buffer& buffer = buffers_[Index(kind)];
    at::Tensor state = StateOf(kind);
    at::Tensor master = state[0];
    at::Tensor exp_avg = state[1];
    at::Tensor exp_avg_sq = state[2];
    at::Tensor grad = Shard(buffer.grads, buffer);
    if (clip != 1.0) grad.mul_(clip);
    // torch.optim.AdamW: decoupled decay first, then the moments, then the update.
    if (options_.weight_decay != 0) {
      for (const ShardSegment& s : buffer.segments) {
        if (buffer.layout.entries[s.entry].weight_decay) {
          master.narrow(0, s.shard_offset, s.numel).mul_(decay);
        }
      }
    }
    exp_avg.mul_(options_.beta1).add_(grad, 1.0 - options_.beta1);
    exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
    master.addcdiv_(exp_avg, denom, -lr / bias_correction1);
  }
}

void DistributedOptimizer::ApplyFusedAdamW(double lr, const std::optional<at::Tensor>& grad_scale) {
  // Per weight-decay group, the segments of every buffer's shard (the padding between params is
  // left alone: its gradients are zero, so the reference ops leave it zero too).
  struct Group {
    std::vector<at::Tensor> masters, grads, exp_avgs, exp_avg_sqs;
  };
  Group groups[2];  // [0]: no weight decay, [1]: weight decay
  for (BufferKind kind : kBufferKinds) {
    const Buffer& buffer = buffers_[Index(kind)];
    const at::Tensor state = StateOf(kind);
    const at::Tensor grad = Shard(buffer.grads, buffer);
    for (const ShardSegment& s : buffer.segments) {
      Group& group = groups[buffer.layout.entries[s.entry].weight_decay ? 1 : 0];
      group.masters.push_back(state[0].narrow(0, s.shard_offset, s.numel));
      group.exp_avgs.push_back(state[1].narrow(0, s.shard_offset, s.numel));
      group.exp_avg_sqs.push_back(state[2].narrow(0, s.shard_offset, s.numel));
      group.grads.push_back(grad.narrow(0, s.shard_offset, s.numel));
    }
  }
  const at::TensorOptions fp32 = state_.options().dtype(at::kFloat);
  const at::Tensor step = at::full({}, static_cast<double>(step_), fp32);
  for (int decays = 0; decays < 2; ++decays) {
    Group& group = groups[decays];
    if (group.masters.empty()) continue;
    const std::vector<at::Tensor> steps(group.masters.size(), step);
    at::_fused_adamw_(group.masters, group.grads, group.exp_avgs, group.exp_avg_sqs, {}, steps, lr,
                      options_.beta1, options_.beta2, decays ? options_.weight_decay : 0.0,
                      options_.eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale);
  }
}

void DistributedOptimizer::CastMainToParams() {
  c10::NoGradGuard no_grad;
  for (BufferKind kind : kBufferKinds) {
    const Buffer& buffer = buffers_[Index(kind)];
    Shard(buffer.params, buffer).copy_(StateOf(kind)[0]);
  }
}

void DistributedOptimizer::AllGatherParams() {
  for (Buffer& buffer : buffers_) {
    // With one rank the one shard is the whole buffer.
    if (buffer.comm->size() > 1) buffer.comm->AllGatherInPlace(buffer.params);
  }
}

int64_t DistributedOptimizer::state_bytes() const {
  return state_.defined() ? state_.nbytes() : host_state_.nbytes();
}

int64_t DistributedOptimizer::host_state_bytes() const {
  return host_state_.defined() ? host_state_.nbytes() : 0;
}

void DistributedOptimizer::OffloadState() {
  RL_CHECK(!offloaded_, Error, "optimizer state is already offloaded");
  if (!host_state_.defined()) {
    host_state_ = at::empty({state_.numel()}, state_.options().device(at::kCPU).pinned_memory(
                                                  device_.is_cuda()));
  }
  host_state_.copy_(state_);
  const at::ScalarType dtype = state_.scalar_type();
  const int64_t numel = state_.numel();
  state_ = at::Tensor();
  offloaded_ = true;
  // Keep what the allocator needs to give the storage back.
  state_numel_and_dtype_ = {numel, dtype};
}

void DistributedOptimizer::OnloadState() {
  RL_CHECK(offloaded_, Error, "optimizer state is not offloaded");
  state_ = allocate_(RegionTag::kOptimizer, state_numel_and_dtype_.first, state_numel_and_dtype_.second);
  state_.copy_(host_state_);
  offloaded_ = false;
}

BufferLayout DistributedOptimizer::Layout(BufferKind kind,
                                          const std::vector<ParamSpec>& params_in_use_order,
                                          int group_size) {
  return LayoutOf(kind, params_in_use_order, group_size);
}

namespace {

// Note [Resharding optimizer state]: calls f(whole_begin, length, offset) for the runs of the
// whole parameter that elements [begin, begin + numel) of `entry` hold, `offset` counting from
// `begin`: one run, at the experts' global rows for an expert buffer's stacked experts
// (`first_expert`) or in place for a whole param; one per row of the dims before tp_dim for a TP
// slice (its rows lie tp_start into rows of tp_extent).
template <typename F>
void ForEachWholeRun(BufferKind kind, const BufferEntry& entry, int64_t first_expert,
                     int64_t begin, int64_t numel, F f) {
  if (kind == BufferKind::kExpert) {
    f(first_expert * (entry.numel / entry.shape[0]) + begin, numel, 0);
    return;
  }
  if (entry.tp_dim < 0) {
    f(begin, numel, 0);
    return;
  }
  const auto dim = static_cast<size_t>(entry.tp_dim);
  int64_t inner = 1;
  for (size_t d = dim + 1; d < entry.shape.size(); ++d) inner *= entry.shape[d];
  const int64_t row = entry.shape[dim] * inner;  // one row of the slice
  for (int64_t at = begin; at < begin + numel;) {
    const int64_t r = at / row;
    const int64_t length = std::min(begin + numel, (r + 1) * row) - at;
    f((r * entry.tp_extent + entry.tp_start) * inner + at - r * row, length, at - begin);
    at += length;
  }
}

}  // namespace

void DistributedOptimizer::ImportResharded(int64_t count, const SavedShardReader& read,
                                           int64_t first_expert, int64_t experts) {
  c10::NoGradGuard no_grad;
  RL_CHECK(count > 0, Error, "optimizer state: no saved shards to reshard");
  const at::ScalarType dtype = StateOf(BufferKind::kDense).scalar_type();
  struct Piece {
    int64_t begin;         // in the whole parameter
    int64_t numel;
    int64_t shard_offset;  // in this rank's shard
  };
  // By kind, by parameter, sorted by `begin` (the pieces of one parameter do not overlap).
  std::array<std::map<std::string, std::vector<Piece>>, 2> mine;
  std::array<at::Tensor, 2> host;                                  // [parts, shard] by kind
  std::array<at::Tensor, 2> filled;                                // [shard] bool by kind
  for (BufferKind kind : kBufferKinds) {
    const Buffer& buffer = buffers_[Index(kind)];
    for (const ShardSegment& seg : buffer.segments) {
      const BufferEntry& entry = buffer.layout.entries[seg.entry];
      ForEachWholeRun(kind, entry, first_expert, seg.buffer_offset - entry.offset, seg.numel,
                      [&](int64_t whole, int64_t numel, int64_t offset) {
                        mine[Index(kind)][entry.name].push_back(
                            {whole, numel, seg.shard_offset + offset});
                      });
    }
    for (auto& [name, pieces] : mine[Index(kind)]) {
      std::sort(pieces.begin(), pieces.end(),
                [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    }
    host[Index(kind)] = at::zeros({kStateParts, buffer.layout.shard_numel()}, dtype);
    filled[Index(kind)] = at::zeros({buffer.layout.shard_numel()}, at::kBool);
  }
  std::optional<int64_t> step;
  // One saved shard at a time: only the pieces that overlap this rank's segments are copied.
  for (int64_t index = 0; index < count; ++index) {
    const SavedShard s = read(index);
    RL_CHECK(!step || *step == s.state.step, Error,
             "optimizer state: the saved shards are of different steps ({} and {})", *step,
             s.state.step);
    step = s.state.step;
    for (BufferKind kind : kBufferKinds) {
      const std::string prefix(ToString(kind));
      const BufferLayout& layout = s.layouts[Index(kind)];
      std::vector<at::Tensor> parts;
      for (const char* part : kStateNames) {
        const auto it = s.state.tensors.find(prefix + "." + part);
        RL_CHECK(it != s.state.tensors.end(), Error, "optimizer state has no tensor '{}.{}'",
                 prefix, part);
        parts.push_back(it->second.reshape({-1}).to(dtype));
      }
      const at::Tensor saved = at::stack(parts);  // [parts, saved shard]
      for (const ShardSegment& seg : layout.Segments(s.index[Index(kind)])) {
        const BufferEntry& entry = layout.entries[seg.entry];
        const auto found = mine[Index(kind)].find(entry.name);
        if (found == mine[Index(kind)].end()) continue;
        const std::vector<Piece>& pieces = found->second;
        ForEachWholeRun(
            kind, entry, s.first_expert, seg.buffer_offset - entry.offset, seg.numel,
            [&](int64_t begin, int64_t numel, int64_t offset) {
              // The first piece that may overlap [begin, begin + numel), then the next ones.
              auto it = std::upper_bound(
                  pieces.begin(), pieces.end(), begin,
                  [](int64_t value, const Piece& piece) { return value < piece.begin; });
              if (it != pieces.begin()) --it;
              for (; it != pieces.end() && it->begin < begin + numel; ++it) {
                const int64_t lo = std::max(begin, it->begin);
                const int64_t hi = std::min(begin + numel, it->begin + it->numel);
                if (lo >= hi) continue;
                const int64_t to = it->shard_offset + lo - it->begin;
                host[Index(kind)].narrow(1, to, hi - lo).copy_(
                    saved.narrow(1, seg.shard_offset + offset + lo - begin, hi - lo));
                filled[Index(kind)].narrow(0, to, hi - lo).fill_(true);
              }
            });
      }
    }
  }
  for (BufferKind kind : kBufferKinds) {
    if (filled[Index(kind)].all().item<bool>()) {
      StateOf(kind).copy_(host[Index(kind)]);
      continue;
    }
    for (const auto& [name, pieces] : mine[Index(kind)]) {
      for (const Piece& piece : pieces) {
        RL_CHECK(filled[Index(kind)].narrow(0, piece.shard_offset, piece.numel).all().item<bool>(),
                 Error,
                 "optimizer state cannot be resharded: no saved shard holds all of {} (elements "
                 "[{}, {}) of the whole parameter)",
                 name, piece.begin, piece.begin + piece.numel);
      }
    }
    StateOf(kind).copy_(host[Index(kind)]);
  }
  step_ = *step;
}

ShardState DistributedOptimizer::ExportState() const {
  ShardState out;
  out.step = step_;
  for (BufferKind kind : kBufferKinds) {
    const std::string prefix(ToString(kind));
    out.layouts[prefix] = buffers_[Index(kind)].layout.Describe();
    const at::Tensor state = StateOf(kind);
    for (int part = 0; part < kStateParts; ++part) {
      out.tensors[prefix + "." + kStateNames[part]] = state[part].to(at::kCPU).clone();
    }
  }
  return out;
}

void DistributedOptimizer::ImportState(const ShardState& in) {
  c10::NoGradGuard no_grad;
  for (BufferKind kind : kBufferKinds) {
    const std::string prefix(ToString(kind));
    const std::string mine = buffers_[Index(kind)].layout.Describe();
    const auto theirs = in.layouts.find(prefix);
    RL_CHECK(theirs != in.layouts.end(), Error,
             "optimizer state has no {} buffer layout; it was written by a different trainer",
             prefix);
    // Called for a checkpoint of this job's DP, EP and TP sizes (another size is resharded by
    // ImportResharded), so a different layout means another model or other frozen params.
    RL_CHECK(theirs->second == mine, Error,
             "optimizer state was saved with a different {} buffer layout ({}) at this job's "
             "parallel sizes: load it with the model and --freeze-params it was saved with",
             prefix, FirstDifference(theirs->second, mine));
    at::Tensor state = StateOf(kind);
    for (int part = 0; part < kStateParts; ++part) {
      const std::string name = prefix + "." + kStateNames[part];
      const auto tensor = in.tensors.find(name);
      RL_CHECK(tensor != in.tensors.end(), Error, "optimizer state has no tensor '{}'", name);
      RL_CHECK(tensor->second.numel() == state[part].numel(), Error,
               "optimizer state tensor '{}' has {} elements, expected {}", name,
               tensor->second.numel(), state[part].numel());
      state[part].copy_(tensor->second.reshape({-1}));
    }
  }
  step_ = in.step;
}

}  // namespace rl::optimizer
