// MPI backend of Communicator, for CPU tensors (launch/communicator.h has the contract).
//
// Every collective is started non-blocking (MPI_I*) and polled with MPI_Test until it completes
// or the timeout passes, so a rank that never joins cannot hang the others. MPI cannot cancel a
// started collective: on timeout the request is kept, the communicator is marked aborted, and
// the destructor gives the request a short grace period to complete before leaking it.
//
// Reductions of bf16/fp16 go through an fp32 copy (MPI has no 16-bit float types); gathers and
// broadcasts move the bytes as they are.
#ifndef RL_LAUNCH_MPI_COMMUNICATOR_H_
#define RL_LAUNCH_MPI_COMMUNICATOR_H_

#include <mpi.h>

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

  void AllGatherInPlace(const at::Tensor& buffer) override;
  void AllGather(const at::Tensor& shard, const at::Tensor& buffer) override;
  void ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard, ReduceOp op) override;
  void AllReduce(const at::Tensor& tensor, ReduceOp op) override;
  void Broadcast(const at::Tensor& tensor, int root) override;
  void Barrier() override;

  // The duplicated communicator the collectives run on (tests use it to play a late peer).
  MPI_Comm mpi_comm() const { return comm_; }

 private:
  void ThrowIfAborted(std::string_view op) const;
  // Polls `request` until done or timeout. On timeout marks the communicator aborted, keeps the
  // tensors MPI may still write into alive (`in_flight`), and throws.
  void Wait(MPI_Request request, const std::string& what, std::vector<at::Tensor> in_flight);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  CommOptions options_;
  MPI_Request pending_ = MPI_REQUEST_NULL;  // a timed-out collective, still owned by MPI
  std::vector<at::Tensor> pending_buffers_;  // its buffers: MPI may write them until it completes
  std::string abort_reason_;
  PeerProbe probe_;  // Note [Peer probe]
};

}  // namespace rl

#endif  // RL_LAUNCH_MPI_COMMUNICATOR_H_
