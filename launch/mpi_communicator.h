// MPI backend of Communicator, for CPU tensors (launch/communicator.h has the contract).
//
// Every collective is started non-blocking (MPI_I*) and polled with MPI_Test until it completes
// or the timeout passes, so a rank that never joins cannot hang the others. MPI cannot cancel a
// started collective: on timeout the request is kept, the communicator is marked aborted, and
// the destructor gives the request a short grace period to complete before leaking it.
//
// Reductions of bf16/fp16 go through an fp32 copy (MPI has no 16-bit float types); gathers,
// broadcasts and all-to-all move the bytes as they are. Split exchanges (color, key) with a polled
// all-gather, so every member is known to have arrived before the blocking MPI_Comm_split, which
// has no non-blocking form to poll (Note [Sub-groups]).
#ifndef RL_LAUNCH_MPI_COMMUNICATOR_H_
#define RL_LAUNCH_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "launch/communicator.h"
#include "launch/peer_probe.h"

namespace rl {

class MpiCommunicator final : public Communicator {
 public:
  // Collective over the session's ranks (duplicates MPI_COMM_WORLD).
  MpiCommunicator(const MpiSession& session, CommOptions options);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  std::string_view name() const override { return group_.name; }

  void AllGatherInPlace(const at::Tensor& buffer) override;
  void AllGather(const at::Tensor& shard, const at::Tensor& buffer) override;
  void ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard, ReduceOp op) override;
  void AllReduce(const at::Tensor& tensor, ReduceOp op) override;
  void Broadcast(const at::Tensor& tensor, int root) override;
  void Barrier() override;
  void AllToAll(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                const at::Tensor& recv, const std::vector<int64_t>& recv_counts) override;
  // Note [Enqueued all-to-all]: MPI completes it before returning.
  void EnqueueAllToAll(const at::Tensor& send, const at::Tensor& recv) override;
  void WaitEnqueued() override;
  void set_enqueue_only(bool) override {}  // MPI has no stream: every call completes
  std::unique_ptr<Communicator> Split(int color, int key, std::string_view name) override;

  // The communicator the collectives run on, a duplicate of the world's or a split of it (tests
  // use it to play a late peer).
  MPI_Comm mpi_comm() const { return comm_; }

 private:
  // A child of Split: takes ownership of `comm`.
  MpiCommunicator(MPI_Comm comm, CommOptions options, internal::Group group,
                  std::shared_ptr<PeerProbe> probe);

  void ThrowIfAborted(std::string_view op) const;
  std::string Label(std::string_view op) const { return internal::Label("mpi", op, group_); }
  std::string Describe(std::string_view op, int64_t bytes_in, int64_t bytes_out) const {
    return internal::DescribeOp("mpi", op, group_, bytes_in, bytes_out, rank_);
  }
  // Polls `request` until done or timeout. On timeout marks the communicator aborted, keeps the
  // tensors MPI may still write into alive (`in_flight`), and throws.
  void Wait(MPI_Request request, const std::string& what, std::vector<at::Tensor> in_flight);
  // The same for several requests that together make one operation (AllToAll's messages).
  void WaitAll(std::vector<MPI_Request> requests, const std::string& what,
               std::vector<at::Tensor> in_flight);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  CommOptions options_;
  std::vector<MPI_Request> pending_;  // a timed-out collective's requests, still owned by MPI
  std::vector<at::Tensor> pending_buffers_;  // its buffers: MPI may write them until it completes
  std::string abort_reason_;
  internal::Group group_;             // Note [Sub-groups]
  int64_t sequence_ = 0;              // collectives entered, for the probe
  std::shared_ptr<PeerProbe> probe_;  // Note [Peer probe]: shared with the parent and children
};

}  // namespace rl

#endif  // RL_LAUNCH_MPI_COMMUNICATOR_H_
