// Collectives over a group of ranks, with two backends behind one interface: NCCL for CUDA
// tensors, MPI for CPU tensors. CreateCommunicator picks by device and gives the group of all
// ranks ("world"); Split carves sub-groups out of it (expert parallelism: "ep", "edp").
//
// Note [Flat collectives]
// The optimizer and weight sync move flat 1-D buffers. A flat buffer of `size * n` elements is
// split into `size` equal shards; rank r owns elements [r*n, (r+1)*n). AllGather fills every
// shard of `buffer` from the shard each rank passes in; ReduceScatter reduces `buffer` over the
// ranks and leaves shard r of the result on rank r. Both work in place: when the shard argument
// is the rank's own slice of the buffer (AllGatherInPlace, or ReduceScatter with `shard` being
// buffer[rank*n : (rank+1)*n]). Shapes are checked before any rank waits: a size that does not
// divide, a dtype or device mismatch or a non-contiguous tensor throws rl::Error on
// the caller's rank without entering the collective.
//
// Every collective is synchronous for the caller: it returns when the result is in place (for
// NCCL, when the kernel has finished), and waits at most `timeout`. A collective that does not
// complete in time, or a peer error, throws CommError naming the operation, the byte counts, the
// rank and the elapsed time, and leaves the communicator aborted: every later call throws
// CommError at once. The caller is expected to end the job (MpiSession::AbortJob), since the
// other ranks may be waiting in a collective this rank will never join.
//
// Every error message names the backend, the operation and the group ("mpi all_to_all over 'ep'
// (rank 1 of 2, world rank 3, ...)"), and a timeout names the peers that did not join by world
// rank (Note [Peer probe], launch/peer_probe.h).
//
// Note [Sub-groups]
// Split(color, key, name) is collective over the communicator it is called on (the parent): every
// parent rank must call it, the same number of times and in the same order as the parent's other
// collectives. The ranks that pass the same `color` (>= 0) form one new communicator; their ranks
// in it follow `key` ascending, ties by parent rank (MPI_Comm_split's rule). The parent first
// exchanges every rank's (color, key) with a collective of its own, under the parent's timeout,
// so a rank that never calls Split ends the others' call with CommError and leaves the parent
// aborted; a negative color on any rank throws rl::Error on every rank after the exchange and
// leaves the parent usable. Creating the backend's communicator (MPI_Comm_split, ncclCommSplit)
// follows, also bounded by the timeout for NCCL; a failure there aborts the parent.
// The new communicator has the parent's CommOptions and the same failure semantics, and aborting
// it does not abort the parent (the caller still ends the job). It shares the parent's peer probe,
// so a timeout in a sub-group names the missing members by world rank. Parent and child are
// independent objects: either may be destroyed first.
//
// Note [All-to-all]
// AllToAll(send, send_counts, recv, recv_counts) moves rows (everything but dim 0) between the
// ranks. `send` is [sum(send_counts), ...]; its rows [offset_j, offset_j + send_counts[j]), where
// offset_j = send_counts[0] + ... + send_counts[j-1], go to rank j. `recv` is
// [sum(recv_counts), ...] and receives recv_counts[j] rows from rank j, in rank order. Both are
// contiguous, on the communicator's device, of one dtype (any: the bytes move as they are) and
// one row shape, and do not overlap. The counts are host vectors of size() non-negative entries.
// The caller guarantees that recv_counts[j] on this rank equals send_counts[this rank] on rank j
// (typically exchanged first with an AllToAll of the counts themselves): it cannot be checked
// without communication, and a mismatch is undefined (a truncation error or a timeout). Everything
// else is checked before any rank waits and throws rl::Error on the caller's rank. Every rank
// calls AllToAll, one with no rows to exchange too (empty tensors, zero counts); such a rank may
// return without waiting for its peers.
//
// Note [Enqueued all-to-all]
// EnqueueAllToAll(send, recv) is an all-to-all of equal blocks: `send` and `recv` are [size * n,
// ...] (checked as for AllToAll, with n rows to and from every rank), block j of `send` goes to
// rank j and block j of `recv` comes from rank j. Where the backend runs on a stream it only
// enqueues the transfer: NCCL puts it on the current CUDA stream and returns, reading nothing on
// the host, so the call may be captured in a CUDA graph (a replay moves the same bytes between the
// same buffers). The caller then calls WaitEnqueued() before the host reads anything the stream
// computes after the transfer: it waits for the stream under the communicator's timeout, with its
// error polling and peer probe, where a plain host read would wait forever for a peer that never
// joins. MPI has no stream: its EnqueueAllToAll completes before it returns, and WaitEnqueued only
// checks that the communicator was not aborted. Neither counts as a collective for the peer
// probe's ordinals (a graph replays its transfers without calling here).
//
// set_enqueue_only(true) puts every collective of the communicator in that mode (NCCL: enqueued
// and not waited for, nor counted by the probe; MPI: unchanged), so that a CUDA graph may capture
// a forward whose layers call AllReduce and AllGather (the tensor-parallel decode step); the caller
// then calls WaitEnqueued() as above. EnqueueOnlyScope sets it for a scope.
//
// Not thread-safe: one thread issues the collectives, in the same order on every rank.
#ifndef RL_LAUNCH_COMMUNICATOR_H_
#define RL_LAUNCH_COMMUNICATOR_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rl {

class MpiSession;

enum class ReduceOp { kSum, kMean, kMax };
std::string_view ToString(ReduceOp op);

struct CommOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(10);

  // Whether a wait of `elapsed` (a steady_clock duration, nanoseconds) has run past `timeout`.
  // Note [Timeout comparison]: `elapsed > timeout` converts the timeout to nanoseconds, which
  // overflows int64 beyond 292 years (`--comm-timeout-s 10000000000`) and wrapped to a negative
  // timeout that every collective ran past at once. The elapsed time is converted down instead,
  // which cannot overflow; --comm-timeout-s is also bounded (trainer/config/validate.cc).
  bool Expired(std::chrono::steady_clock::duration elapsed) const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(elapsed) > timeout;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;
  // "world" for CreateCommunicator's, the name given to Split otherwise.
  virtual std::string_view name() const = 0;

  // buffer: [size * n]; this rank's shard buffer[rank*n : (rank+1)*n] is sent in place.
  virtual void AllGatherInPlace(const at::Tensor& buffer) = 0;
  // shard: [n] -> buffer: [size * n].
  virtual void AllGather(const at::Tensor& shard, const at::Tensor& buffer) = 0;
  // buffer: [size * n] -> shard: [n] (may be this rank's slice of `buffer`).
  virtual void ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard, ReduceOp op) = 0;
  virtual void AllReduce(const at::Tensor& tensor, ReduceOp op) = 0;
  virtual void Broadcast(const at::Tensor& tensor, int root) = 0;
  virtual void Barrier() = 0;

  // Note [All-to-all]. send: [sum(send_counts), ...] -> recv: [sum(recv_counts), ...].
  virtual void AllToAll(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                        const at::Tensor& recv, const std::vector<int64_t>& recv_counts) = 0;

  // Note [Enqueued all-to-all]. send, recv: [size * n, ...]; block j to and from rank j.
  virtual void EnqueueAllToAll(const at::Tensor& send, const at::Tensor& recv) = 0;
  // Waits for the work enqueued on the current stream so far (Note [Enqueued all-to-all]).
  virtual void WaitEnqueued() = 0;
  // Note [Enqueued all-to-all]: every collective only enqueued while on.
  virtual void set_enqueue_only(bool on) = 0;

  // Note [Sub-groups]. Collective over this communicator; returns the communicator of the ranks
  // that passed the same `color`, ranked by `key` then by rank here. `name` (e.g. "ep") appears
  // in the new communicator's error messages.
  virtual std::unique_ptr<Communicator> Split(int color, int key, std::string_view name) = 0;
};

// Every collective of `comm` (when not null) only enqueued for the scope (Note [Enqueued
// all-to-all]).
class EnqueueOnlyScope {
 public:
  explicit EnqueueOnlyScope(Communicator* comm) : comm_(comm) {
    if (comm_ != nullptr) comm_->set_enqueue_only(true);
  }
  ~EnqueueOnlyScope() {
    if (comm_ != nullptr) comm_->set_enqueue_only(false);
  }
  EnqueueOnlyScope(const EnqueueOnlyScope&) = delete;
  EnqueueOnlyScope& operator=(const EnqueueOnlyScope&) = delete;

 private:
  Communicator* comm_;
};

// NCCL when `device` is CUDA, MPI otherwise. Collective over all ranks of the session.
std::unique_ptr<Communicator> CreateCommunicator(const MpiSession& session, c10::Device device,
                                                 CommOptions options);

namespace internal {

// Shared by the backends: argument checks (Note [Flat collectives], Note [All-to-all]), the
// bookkeeping of Note [Sub-groups] and message pieces.
struct FlatShape {
  int64_t shard_numel = 0;
  bool in_place = false;  // the shard is this rank's slice of the buffer
};
FlatShape CheckFlat(std::string_view op, const at::Tensor& shard, const at::Tensor& buffer,
                    int rank, int size, c10::Device device);
void CheckTensor(std::string_view op, const at::Tensor& tensor, c10::Device device);

// Byte layout of a checked all-to-all: peer j's rows start at byte send_offsets[j] of `send`
// and recv_offsets[j] of `recv`.
struct AllToAllLayout {
  int64_t row_bytes = 0;
  std::vector<int64_t> send_offsets;  // [size] bytes
  std::vector<int64_t> recv_offsets;  // [size] bytes
};
AllToAllLayout CheckAllToAll(std::string_view op, const at::Tensor& send,
                             const std::vector<int64_t>& send_counts, const at::Tensor& recv,
                             const std::vector<int64_t>& recv_counts, int size, c10::Device device);

// The counts of an EnqueueAllToAll (Note [Enqueued all-to-all]): n = send.size(0) / size rows
// for every rank; throws rl::Error when the rows do not split into `size` blocks or the two
// tensors differ in rows.
std::vector<int64_t> EqualBlocks(std::string_view op, const at::Tensor& send,
                                 const at::Tensor& recv, int size);

// Who a communicator's ranks are, beyond rank and size.
struct Group {
  std::string name;              // "world", or the name given to Split
  int64_t tag = 0;               // Note [Peer probe]: equal on the members, 0 for the world
  std::vector<int> world_ranks;  // [size]: the world rank of each rank of the group
  int64_t splits = 0;            // Split calls made on this group so far (they seed the tags)
};
Group WorldGroup(int world_size);

// A child of Split on this rank: its group and this rank's rank in it.
struct SplitPlan {
  Group group;
  int rank = 0;
};
// Decides the child of the parent rank `parent_rank` from every parent rank's (color, key)
// (`colors_keys`: [parent size * 2], as exchanged by the parent), Note [Sub-groups]. Counts the
// split on `parent`. Throws rl::Error, identically on every rank, when a color is negative.
SplitPlan PlanSplit(Group& parent, int parent_rank, const std::vector<int64_t>& colors_keys,
                    std::string_view name);

// "mpi all_to_all over 'ep'": the prefix of argument errors.
std::string Label(std::string_view backend, std::string_view op, const Group& group);
// "mpi all_reduce(sum) over 'ep' (rank 1 of 2, world rank 3, 64 bytes in, 64 bytes out)"; the
// world rank only for a sub-group.
std::string DescribeOp(std::string_view backend, std::string_view op, const Group& group,
                       int64_t bytes_in, int64_t bytes_out, int rank);

}  // namespace internal
}  // namespace rl

#endif  // RL_LAUNCH_COMMUNICATOR_H_
