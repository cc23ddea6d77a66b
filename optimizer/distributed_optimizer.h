// ZeRO-1 distributed optimizer: flat param and grad buffers, fp32 master shards, AdamW on the
// owned shard, and the collectives that tie the ranks together.
//
// Ownership: the optimizer owns the param buffers (the training dtype, bf16 in production) and
// grad buffers (fp32), one of each per buffer kind (dense, routed-expert; Note [Param buffer
// layout] in buffer_layout.h), and the optimizer state of its shard: fp32 masters and the two
// Adam moments. Their storage comes from a caller-provided allocator, so the trainer can place
// them in pausable memory regions. params() hands out one tensor per parameter that aliases the
// param buffer (at::from_blob, not an autograd view, so it is a leaf that can require grad); the
// model computes from those tensors, and every in-place write to the buffer (step, rebuild,
// restore) is seen by the model without telling it.
//
// Note [Expert gradients]
// Under expert parallelism the routed-expert buffer holds only this rank's experts and is sharded
// over the expert data-parallel group (EDP: the ranks that hold the same experts) instead of DP.
// An expert's gradient on its rank already sums the contributions of every token its EP group
// sent to it (the exchange's backward brings them), so the sum over EDP covers every DP rank's
// tokens; the mean over EDP is scaled by EDP / DP to give the mean over DP, the dense buffer's
// scaling, so a run at EP > 1 trains as the same run at EP = 1. Under tensor parallelism the
// experts are the same on every rank and EDP is the world: each TP rank's gradient covers its
// own tokens (sequence parallelism), so the same sum over EDP adds the TP ranks' shares too. The grad norm adds both buffers'
// squares over the world: every element of both is owned by exactly one rank.
//
// Note [Tensor-parallel grad norm]
// Under tensor parallelism the optimizer of a rank holds its TP rank's params (slices, and the
// params every TP rank holds whole) and is sharded over the DP group of that TP rank. The grad
// norm sums the squares over DP, then over TP, counting each value once: in a buffer sharded over
// DP, a param held by several TP ranks (ParamSpec::tp_duplicate) is left out on all but the
// lowest, as Megatron does (the expert buffer, sharded over every rank, owns each value once). Their
// gradients must already be equal over those ranks (the caller sums the partial ones first: Note
// [Tensor-parallel gradients] in trainer/model/tensor_parallel.h).
//
// One step (Step()): reduce-scatter the grad buffers (mean over DP) into the owned shard; global
// grad norm (all-reduce of the sum of squares) and clipping; AdamW on the owned shard (torch's
// AdamW arithmetic: decoupled weight decay, bias-corrected moments; no weight decay for biases
// and 1-D params, as Megatron); CastMainToParams() writes the fp32 masters into the owned slice
// of the param buffer; AllGatherParams() gathers the param buffer. The last two are public
// because rematerialize replays exactly them to rebuild the params after a pause.
//
// Every rank must make the same calls in the same order (they are collectives). Not thread-safe.
// Failures: CommError from the collectives; rl::Error on misuse (a layout mismatch on import).
#ifndef RL_OPTIMIZER_DISTRIBUTED_OPTIMIZER_H_
#define RL_OPTIMIZER_DISTRIBUTED_OPTIMIZER_H_

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "launch/communicator.h"
#include "launch/param_spec.h"
#include "launch/region_tag.h"
#include "optimizer/buffer_layout.h"
#include "optimizer/lr_schedule.h"

namespace rl::optimizer {

enum class BufferKind { kDense = 0, kExpert = 1 };
constexpr std::array<BufferKind, 2> kBufferKinds = {BufferKind::kDense, BufferKind::kExpert};
std::string_view ToString(BufferKind kind);

struct AdamOptions {
  LrSchedule schedule;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double clip_grad = 0.0;  // global grad-norm clip; 0 disables
  // Note [Fused AdamW]: one fused kernel per weight-decay group (at::_fused_adamw_, what
  // torch.optim.AdamW(fused=True) runs, with the clip folded in as its grad_scale) and an fp32
  // grad norm, instead of the reference sequence of ops and an fp64 sum of squares. Default:
  // fused on CUDA, where it reads and writes the state once instead of about six times; the
  // reference on the CPU, bit-identical to torch::optim::AdamW. Both compute the same AdamW;
  // they differ in rounding.
  std::optional<bool> fused;
};

// Storage for a flat tensor of `numel` elements of `dtype`, in the region `tag` (the optimizer
// asks for kParamBuffer, kGradBuffer and kOptimizer). Must be contiguous and zero-filled.
using Allocator = std::function<at::Tensor(RegionTag tag, int64_t numel, at::ScalarType)>;
// at::zeros on `device`.
Allocator PlainAllocator(c10::Device device);


struct StepStats {
  double grad_norm = 0;  // before clipping
  double lr = 0;
  int64_t step = 0;      // 1-based, after this step
};

// The state of one rank's shards, for checkpoints. `layouts` describe the buffers it belongs to.
struct ShardState {
  int64_t step = 0;
  std::map<std::string, std::string> layouts;  // "dense"/"expert" -> BufferLayout::Describe()
  std::map<std::string, at::Tensor> tensors;   // "dense.master", "dense.exp_avg", ... (CPU)
};

// Note [Resharding optimizer state]
// A checkpoint holds one shard per rank, cut from the layouts of the job that saved it (its DP
// size, its EP size, which shapes the expert buffer and its EDP group, and its TP size, which
// slices the dense params). ImportResharded rebuilds this rank's shards from every saved shard of
// another layout: it puts each saved segment back into the whole parameter it belongs to (an
// expert buffer's segments at their experts' global rows, a TP slice's elements at its place
// along the split dim: one run of the whole parameter per row of the dims before it) and copies
// the pieces that overlap this rank's own segments, for the masters and both Adam moments. The saved shards are read one at a time, so a rank holds its
// own shard and one saved shard at once; each rank reads every saved shard (loading into the
// same layout reads only the rank's own). Every element this rank owns must come from a saved
// segment; one that no saved shard covers is an error naming its parameter.
struct SavedShard {
  ShardState state;
  std::array<BufferLayout, 2> layouts;  // by BufferKind: the layouts the shard was cut from
  std::array<int64_t, 2> index{};       // its shard of each layout (DP rank, EDP rank)
  int64_t first_expert = 0;             // global id of the first expert of its expert buffer
};

class DistributedOptimizer {
 public:
  // `params_in_use_order`: the trained params in order of first use in the forward pass; their
  // role picks the buffer (kRoutedExpert: kExpert, kDense: kDense; kFp32Extra is refused with
  // rl::Error). `param_dtype`: dtype of the param buffers (the model's compute dtype).
  // `comm`: the data-parallel group (every rank of the job while TP = PP = CP = 1).
  // `expert_comm`: the expert data-parallel group of the routed-expert buffer (Note [Expert
  // gradients]); null: `comm`. `tensor_comm`: the tensor-parallel group the grad norm also sums
  // over (Note [Tensor-parallel grad norm]); null without TP.
  DistributedOptimizer(const std::vector<ParamSpec>& params_in_use_order, Communicator& comm,
                       at::ScalarType param_dtype, c10::Device device, AdamOptions options,
                       const Allocator& allocate, Communicator* expert_comm = nullptr,
                       Communicator* tensor_comm = nullptr);
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Bytes the allocator will be asked for, per region tag (kParamBuffer, kGradBuffer,
  // kOptimizer), each allocation rounded up to kAllocationAlignmentBytes: lets the caller size
  // its memory regions before constructing the optimizer.
  // `expert_dp_size`: the expert buffer's group size (0: dp_size).
  static std::map<RegionTag, int64_t> StorageBytes(
      const std::vector<ParamSpec>& params_in_use_order, int dp_size, at::ScalarType param_dtype,
      int expert_dp_size = 0);

  // name -> tensor aliasing the param buffer (shaped; requires grad).
  const std::unordered_map<std::string, at::Tensor>& params() const { return params_; }
  const BufferLayout& layout(BufferKind kind) const { return buffers_[Index(kind)].layout; }
  const at::Tensor& param_buffer(BufferKind kind) const { return buffers_[Index(kind)].params; }
  const at::Tensor& grad_buffer(BufferKind kind) const { return buffers_[Index(kind)].grads; }
  int64_t step() const { return step_; }
  int dp_rank() const { return comm_.rank(); }
  int dp_size() const { return comm_.size(); }

  // Masters := the owned slice of the param buffer, in fp32 (fresh runs, after loading weights).
  void InitMastersFromParams();

  // The fp32 gradient of param `name` in its grad buffer, a view to read or update in place
  // (meaningful after AccumulateGrads: Note [Lazy grad zeroing]).
  at::Tensor grad(const std::string& name) const;

  // Adds each param's .grad into the grad buffer (fp32) and clears .grad. Call after every
  // micro-batch's backward.
  //
  // Note [Lazy grad zeroing]
  // ZeroGrads does not write the grad buffers; it marks them zero, and the next AccumulateGrads
  // copies each .grad into its slot (and zeroes the slots with no .grad and the alignment padding)
  // instead of adding: one pass over the fp32 buffer less, and no read of it, per step (for a
  // 3 B-param MoE model on the H200, about 7 ms of a 94 ms step). A Step with nothing accumulated
  // writes the zeros first. grad_buffer() is therefore only meaningful after AccumulateGrads.
  // The result is the same as zero-then-add (0 + g == g; a -0 gradient stays -0, which no later
  // operation tells from +0).
  void AccumulateGrads();
  void ZeroGrads();

  // Reduce-scatter, clip, AdamW, cast, all-gather. Collective.
  StepStats Step();
  // The owned fp32 master slice into the owned slice of the param buffer (dtype cast).
  void CastMainToParams();
  // Every rank's owned slice into every rank's param buffer. Collective.
  void AllGatherParams();

  // Optimizer state (masters, moments) to host memory allocated once at its exact size (pinned
  // for CUDA) and back; the device storage is released in between, and OnloadState asks the
  // Allocator for it again: an allocator that gives storage back (PlainAllocator). The trainer
  // does not call these: its optimizer region is paused and resumed in place (trainer/memory/),
  // and its region allocator carves each region once, so a second allocation would not fit.
  void OffloadState();
  void OnloadState();
  bool state_offloaded() const { return offloaded_; }
  int64_t state_bytes() const;       // masters + moments of this rank
  int64_t host_state_bytes() const;  // host copy allocated (0 until the first offload)

  ShardState ExportState() const;
  // Loads a shard cut from this optimizer's own layouts (a checkpoint of this job's DP, EP and TP
  // sizes; one of other sizes goes through ImportResharded). Throws rl::Error naming the first
  // difference when a layout differs.
  void ImportState(const ShardState& state);
  // Note [Resharding optimizer state]: the `count` saved shards, read one at a time by `read`.
  // `first_expert`: the global id of this rank's first expert; `experts`: the model's expert
  // count. Throws rl::Error naming a parameter no saved shard covers, or saved shards of
  // different steps (and whatever `read` throws).
  using SavedShardReader = std::function<SavedShard(int64_t index)>;
  void ImportResharded(int64_t count, const SavedShardReader& read, int64_t first_expert,
                       int64_t experts);

  // The layout of the `kind` buffer of `params_in_use_order` sharded over `group_size` ranks: what
  // an optimizer of that job builds (for resharding a checkpoint of another layout).
  static BufferLayout Layout(BufferKind kind, const std::vector<ParamSpec>& params_in_use_order,
                             int group_size);

 private:
  struct Buffer {
    Communicator* comm = nullptr;  // the group it is sharded over
    BufferLayout layout;
    std::vector<ShardSegment> segments;  // of this rank's shard
    at::Tensor params;                   // [numel] param dtype
    at::Tensor grads;                    // [numel] fp32
    // [shard] fp32, 0 over the elements the grad norm leaves to another TP rank and 1 elsewhere
    // (Note [Tensor-parallel grad norm]); undefined when it counts every element.
    at::Tensor norm_mask;
  };
  static size_t Index(BufferKind kind) { return static_cast<size_t>(kind); }
  at::Tensor Shard(const at::Tensor& flat, const Buffer& buffer) const;
  // [3, shard] fp32: masters, exp_avg, exp_avg_sq.
  at::Tensor StateOf(BufferKind kind) const;
  // AdamW on the owned shards: the reference ops, or one fused kernel per weight-decay group
  // (Note [Fused AdamW]). `clip` scales the gradients first (1 = no clipping); the fused kernel
  // divides them by `grad_scale` ([] fp32 on the device; none = no clipping).
  void ApplyAdamW(double lr, double clip);
  void ApplyFusedAdamW(double lr, const std::optional<at::Tensor>& grad_scale);

  Communicator& comm_;
  Communicator* tensor_comm_ = nullptr;  // null without TP
  c10::Device device_;
  AdamOptions options_;
  Allocator allocate_;
  std::array<Buffer, 2> buffers_;
  std::unordered_map<std::string, at::Tensor> params_;
  at::Tensor state_;       // [3 * (dense shard + expert shard)] fp32 on the device
  at::Tensor host_state_;  // same size on the host, allocated at the first offload
  bool offloaded_ = false;
  std::pair<int64_t, at::ScalarType> state_numel_and_dtype_{0, at::kFloat};
  int64_t step_ = 0;
  bool grads_zero_ = true;  // Note [Lazy grad zeroing]; a fresh buffer holds anything
};

}  // namespace rl::optimizer

#endif  // RL_OPTIMIZER_DISTRIBUTED_OPTIMIZER_H_
