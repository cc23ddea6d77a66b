// NCCL backend of Communicator, for CUDA tensors (launch/communicator.h has the contract).
//
// The communicator is non-blocking (ncclConfig_t.blocking = 0): initialisation and every
// collective return at once, and the host polls ncclCommGetAsyncError and a CUDA event until the
// work is done or the timeout passes. On timeout or a NCCL error the communicator is aborted
// (ncclCommAbort), which frees the GPU from the stuck kernel, and CommError is thrown. The unique
// id travels from rank 0 over MPI.
//
// Collectives run on the current CUDA stream of the device and the call returns when they have
// finished, so the caller can read the result with any stream. AllToAll is one NCCL group of
// ncclSend/ncclRecv of bytes, one pair per peer with rows to move. Split exchanges (color, key)
// with an ncclAllGather, then calls ncclCommSplit (NCCL >= 2.18) with the same non-blocking
// config and polls the new communicator like the initialisation (Note [Sub-groups]).
#ifndef RL_LAUNCH_NCCL_COMMUNICATOR_H_
#define RL_LAUNCH_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "launch/communicator.h"
#include "launch/peer_probe.h"

namespace rl {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const MpiSession& session, c10::Device device, CommOptions options);
  ~NcclCommunicator() override;  // ncclCommDestroy, or nothing when already aborted
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
  std::string_view name() const override { return group_.name; }

  void AllGatherInPlace(const at::Tensor& buffer) override;
  void AllGather(const at::Tensor& shard, const at::Tensor& buffer) override;
  void ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard, ReduceOp op) override;
  void AllReduce(const at::Tensor& tensor, ReduceOp op) override;
  void Broadcast(const at::Tensor& tensor, int root) override;
  void Barrier() override;
  void AllToAll(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                const at::Tensor& recv, const std::vector<int64_t>& recv_counts) override;
  // Note [Enqueued all-to-all]: enqueued on the current stream without waiting (capturable).
  void EnqueueAllToAll(const at::Tensor& send, const at::Tensor& recv) override;
  void WaitEnqueued() override;
  void set_enqueue_only(bool on) override { enqueue_only_ = on; }
  std::unique_ptr<Communicator> Split(int color, int key, std::string_view name) override;

 private:
  using Clock = std::chrono::steady_clock;

  // A child of Split: takes ownership of `comm`, a split of the parent that has finished
  // initialising.
  NcclCommunicator(ncclComm_t comm, c10::Device device, CommOptions options, internal::Group group,
                   int rank, std::shared_ptr<PeerProbe> probe);
  // What both constructors do once `comm_` is ready.
  void FinishInit();
  // Polls the initialisation of the communicator in `slot` (comm_ after ncclCommInitRankConfig,
  // or a split's child after ncclCommSplit, which NCCL may write into the slot only later) until
  // it is done or the timeout passes; on failure aborts it and this communicator and throws.
  void WaitInitialized(ncclComm_t* slot, const std::string& what);

  void ThrowIfAborted(std::string_view op) const;
  std::string Label(std::string_view op) const { return internal::Label("nccl", op, group_); }
  std::string Describe(std::string_view op, int64_t bytes_in, int64_t bytes_out) const {
    return internal::DescribeOp("nccl", op, group_, bytes_in, bytes_out, rank_);
  }
  cudaStream_t CurrentStream() const;
  // Enters the probe's next collective, then WaitStarted and WaitStream.
  void Complete(ncclResult_t enqueue_result, cudaStream_t stream, const std::string& what);
  // Waits for the enqueue of a non-blocking call to finish (ncclInProgress); throws on failure.
  void WaitStarted(ncclResult_t enqueue_result, const std::string& what, Clock::time_point start);
  // Waits for the work on `stream` so far, polling NCCL's errors, under the timeout from `start`.
  void WaitStream(cudaStream_t stream, const std::string& what, Clock::time_point start);
  // The checked send/recv group of an all-to-all (Note [All-to-all]), enqueued on `stream`.
  ncclResult_t EnqueueSendRecv(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                               const at::Tensor& recv, const std::vector<int64_t>& recv_counts,
                               cudaStream_t stream);
  [[noreturn]] void AbortAndThrow(const std::string& reason);

  ncclComm_t comm_ = nullptr;
  cudaEvent_t done_ = nullptr;
  c10::Device device_;
  int rank_ = 0;
  int size_ = 1;
  CommOptions options_;
  at::Tensor barrier_scratch_;  // [1] fp32 on the device
  std::string abort_reason_;
  internal::Group group_;             // Note [Sub-groups]
  int64_t sequence_ = 0;              // collectives entered, for the probe
  bool enqueue_only_ = false;         // Note [Enqueued all-to-all]
  std::shared_ptr<PeerProbe> probe_;  // Note [Peer probe]: shared with the parent and children
};

}  // namespace rl

#endif  // RL_LAUNCH_NCCL_COMMUNICATOR_H_
