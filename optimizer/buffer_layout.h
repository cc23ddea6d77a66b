// Where each parameter lives in a flat buffer, and which slice of it each DP rank owns.
//
// Note [Param buffer layout]
// Params of one kind (dense or routed-expert) live in one contiguous buffer, in the REVERSE of
// the order the forward pass first uses them (so that the backward pass, which produces grads in
// that reverse order, fills the buffer front to back, as Megatron's buckets do). Each param's
// start is aligned to 64 elements; the end of the buffer is padded to a multiple of
// lcm(dp_size, 128), so that it splits into dp_size equal shards. DP rank r owns elements
// [r * shard, (r + 1) * shard); shard boundaries ignore param boundaries (a param may be split
// between ranks). Padding elements are zero in the param and grad buffers and are never read as
// part of a param. The grad buffer has the same layout (its own dtype, fp32).
//
// A layout is a pure function of the param list and the DP size, so every rank computes the same
// one without talking. Checkpoints record it: a job of the same sizes loads the state only into
// the same layout; one of other DP, EP or TP sizes recomputes the saved job's layouts from its own
// model and reshards (Note [Resharding optimizer state] in optimizer/distributed_optimizer.h), and
// refuses a saved layout that differs from the recomputed one (another model, --freeze-params).
#ifndef RL_OPTIMIZER_BUFFER_LAYOUT_H_
#define RL_OPTIMIZER_BUFFER_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "launch/param_spec.h"

namespace rl::optimizer {

constexpr int64_t kParamAlignment = 64;
constexpr int64_t kBufferPadMultiple = 128;

struct BufferEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements from the buffer start
  int64_t numel = 0;
  bool weight_decay = true;  // false for 1-D params (norms) and biases, as Megatron does
  // Under TP, where the param is a slice of the whole one (ParamSpec's tp_dim, tp_start and
  // tp_extent; not part of Describe()).
  int64_t tp_dim = -1;
  int64_t tp_start = 0;
  int64_t tp_extent = 0;
};

// A run of elements of one param inside one rank's shard.
struct ShardSegment {
  int64_t shard_offset = 0;   // elements from the shard start
  int64_t buffer_offset = 0;  // elements from the buffer start
  int64_t numel = 0;
  size_t entry = 0;           // index into BufferLayout::entries
};

struct BufferLayout {
  std::vector<BufferEntry> entries;  // in buffer order (reverse of first use)
  int64_t numel = 0;                 // padded size
  int64_t dp_size = 1;

  int64_t shard_numel() const { return numel / dp_size; }
  int64_t shard_offset(int64_t dp_rank) const { return dp_rank * shard_numel(); }
  // The pieces of params that rank `dp_rank`'s shard covers, in order.
  std::vector<ShardSegment> Segments(int64_t dp_rank) const;
  // One line per entry plus the totals: what checkpoints record and compare.
  std::string Describe() const;
};

// `params_in_use_order`: the params of this buffer in order of first use in the forward pass
// (their roles are not looked at).
BufferLayout MakeBufferLayout(const std::vector<ParamSpec>& params_in_use_order,
                              int64_t dp_size);

// Megatron's default rule: no weight decay for biases and 1-D params.
bool DecaysWeight(const std::string& name, const std::vector<int64_t>& shape);

}  // namespace rl::optimizer

#endif  // RL_OPTIMIZER_BUFFER_LAYOUT_H_
