// Collectives over the data-parallel group, with two backends behind one interface:
// NCCL for CUDA tensors, MPI for CPU tensors. CreateCommunicator picks by device.
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
// Not thread-safe: one thread issues the collectives, in the same order on every rank.
#ifndef RL_LAUNCH_COMMUNICATOR_H_
#define RL_LAUNCH_COMMUNICATOR_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace rl {

class MpiSession;

enum class ReduceOp { kSum, kMean, kMax };
std::string_view ToString(ReduceOp op);

struct CommOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;

  // buffer: [size * n]; this rank's shard buffer[rank*n : (rank+1)*n] is sent in place.
  virtual void AllGatherInPlace(const at::Tensor& buffer) = 0;
  // shard: [n] -> buffer: [size * n].
  virtual void AllGather(const at::Tensor& shard, const at::Tensor& buffer) = 0;
  // buffer: [size * n] -> shard: [n] (may be this rank's slice of `buffer`).
  virtual void ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard, ReduceOp op) = 0;
  virtual void AllReduce(const at::Tensor& tensor, ReduceOp op) = 0;
  virtual void Broadcast(const at::Tensor& tensor, int root) = 0;
  virtual void Barrier() = 0;
};

// NCCL when `device` is CUDA, MPI otherwise. Collective over all ranks of the session.
std::unique_ptr<Communicator> CreateCommunicator(const MpiSession& session, c10::Device device,
                                                 CommOptions options);

namespace internal {

// Shared by the backends: argument checks (Note [Flat collectives]) and message pieces.
struct FlatShape {
  int64_t shard_numel = 0;
  bool in_place = false;  // the shard is this rank's slice of the buffer
};
FlatShape CheckFlat(std::string_view op, const at::Tensor& shard, const at::Tensor& buffer,
                    int rank, int size, c10::Device device);
void CheckTensor(std::string_view op, const at::Tensor& tensor, c10::Device device);
std::string DescribeOp(std::string_view backend, std::string_view op, int64_t bytes_in,
                       int64_t bytes_out, int rank, int size);

}  // namespace internal
}  // namespace rl

#endif  // RL_LAUNCH_COMMUNICATOR_H_
