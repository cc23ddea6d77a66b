#include "launch/nccl_communicator.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <thread>

#include "launch/check.h"
#include "launch/mpi_session.h"

namespace rl {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t ToNcclType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      throw Error(fmt::format("nccl: unsupported dtype {}", c10::toString(type)));
  }
}

ncclRedOp_t ToNcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMean:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// The state of a non-blocking communicator: ncclInProgress while it initialises or enqueues.
ncclResult_t AsyncState(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
  return query == ncclSuccess ? state : query;
}

bool Started(ncclResult_t result) { return result == ncclSuccess || result == ncclInProgress; }

int64_t ElapsedMs(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

}  // namespace

NcclCommunicator::NcclCommunicator(const MpiSession& session, c10::Device device,
                                   CommOptions options)
    : device_(device),
      rank_(session.rank()),
      size_(session.world_size()),
      options_(options),
      group_(internal::WorldGroup(session.world_size())),
      probe_(std::make_shared<PeerProbe>(session.world())) {
  RL_CHECK(device.is_cuda() && device.has_index(), Error,
           "nccl communicator needs a CUDA device with an index, got {}", device.str());
  c10::cuda::CUDAGuard guard(device_);

  ncclUniqueId id{};
  if (rank_ == 0) RL_CHECK_NCCL(ncclGetUniqueId(&id));
  RL_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, session.world()));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  RL_CHECK_NCCL(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
  WaitInitialized(&comm_, fmt::format("nccl init (rank {} of {})", rank_, size_));
  FinishInit();
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, c10::Device device, CommOptions options,
                                   internal::Group group, int rank,
                                   std::shared_ptr<PeerProbe> probe)
    : comm_(comm),
      device_(device),
      rank_(rank),
      size_(static_cast<int>(group.world_ranks.size())),
      options_(options),
      group_(std::move(group)),
      probe_(std::move(probe)) {
  c10::cuda::CUDAGuard guard(device_);
  int nccl_rank = -1;
  int nccl_size = -1;
  RL_CHECK_NCCL(ncclCommUserRank(comm_, &nccl_rank));
  RL_CHECK_NCCL(ncclCommCount(comm_, &nccl_size));
  if (nccl_rank != rank_ || nccl_size != size_) {
    AbortAndThrow(fmt::format("{}: NCCL made rank {} of {}, the plan rank {} of {}", Label("split"),
                              nccl_rank, nccl_size, rank_, size_));
  }
  FinishInit();
}

void NcclCommunicator::FinishInit() {
  RL_CHECK_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  barrier_scratch_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
}

void NcclCommunicator::WaitInitialized(ncclComm_t* slot, const std::string& what) {
  // A split's child is written into its slot by NCCL, possibly only once the split's
  // asynchronous part has run (seen with NCCL 2.28: ncclCommSplit returned ncclInProgress with the
  // child still null), so the slot is read again on every poll.
  const auto current = [slot] { return *static_cast<ncclComm_t volatile*>(slot); };
  const bool child = slot != &comm_;
  const auto fail = [&](const std::string& reason) {
    if (child && current() != nullptr) ncclCommAbort(current());  // AbortAndThrow aborts comm_
    AbortAndThrow(reason);
  };
  const auto start = Clock::now();
  while (true) {
    const ncclComm_t comm = current();
    // A split's parent (comm_) takes part in it: its error is the split's error.
    ncclResult_t state = child ? AsyncState(comm_) : ncclSuccess;
    if (state == ncclSuccess) state = comm != nullptr ? AsyncState(comm) : ncclInProgress;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      fail(fmt::format("{} failed: {} ({})", what, ncclGetErrorString(state),
                       ncclGetLastError(comm != nullptr ? comm : comm_)));
    }
    if (options_.Expired(Clock::now() - start)) {
      fail(fmt::format("{} did not complete within {} ms: a peer rank did not join", what,
                       options_.timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (comm_ != nullptr && abort_reason_.empty()) {
    // Non-blocking destroy: finalize, then wait (bounded) before destroying.
    ncclResult_t state = ncclCommFinalize(comm_);
    const auto start = Clock::now();
    while (state == ncclInProgress && Clock::now() - start < std::chrono::seconds(10)) {
      ncclCommGetAsyncError(comm_, &state);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
}

void NcclCommunicator::ThrowIfAborted(std::string_view op) const {
  if (!abort_reason_.empty()) {
    throw CommError(fmt::format("{} on rank {}: the communicator was aborted earlier ({})",
                                Label(op), rank_, abort_reason_));
  }
}

cudaStream_t NcclCommunicator::CurrentStream() const {
  return c10::cuda::getCurrentCUDAStream(device_.index()).stream();
}

void NcclCommunicator::AbortAndThrow(const std::string& reason) {
  abort_reason_ = reason;
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  throw CommError(reason);
}

void NcclCommunicator::Complete(ncclResult_t enqueue_result, cudaStream_t stream,
                                const std::string& what) {
  const auto start = Clock::now();
  if (enqueue_only_) {  // Note [Enqueued all-to-all]: not waited for, nor counted by the probe
    WaitStarted(enqueue_result, what, start);
    return;
  }
  probe_->Enter(group_.tag, ++sequence_);
  WaitStarted(enqueue_result, what, start);
  WaitStream(stream, what, start);
}

void NcclCommunicator::WaitStarted(ncclResult_t enqueue_result, const std::string& what,
                                   Clock::time_point start) {
  if (enqueue_result != ncclSuccess && enqueue_result != ncclInProgress) {
    AbortAndThrow(fmt::format("{} failed to start: {} ({})", what,
                              ncclGetErrorString(enqueue_result), ncclGetLastError(comm_)));
  }
  ncclResult_t state = enqueue_result;
  while (state == ncclInProgress) {
    RL_CHECK_NCCL(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclInProgress && options_.Expired(Clock::now() - start)) {
      AbortAndThrow(fmt::format("{} was not enqueued within {} ms", what,
                                options_.timeout.count()));
    }
  }
}

void NcclCommunicator::WaitStream(cudaStream_t stream, const std::string& what,
                                  Clock::time_point start) {
  RL_CHECK_CUDA(cudaEventRecord(done_, stream));
  int polls = 0;
  while (true) {
    const cudaError_t query = cudaEventQuery(done_);
    if (query == cudaSuccess) return;
    if (query != cudaErrorNotReady) RL_CHECK_CUDA(query);
    ncclResult_t async_error = ncclSuccess;
    RL_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async_error));
    if (async_error != ncclSuccess && async_error != ncclInProgress) {
      AbortAndThrow(fmt::format("{} failed after {} ms: {} ({})", what, ElapsedMs(start),
                                ncclGetErrorString(async_error), ncclGetLastError(comm_)));
    }
    if (options_.Expired(Clock::now() - start)) {
      const int64_t waited_ms = ElapsedMs(start);
      AbortAndThrow(fmt::format(
          "{} did not complete within its timeout of {} ms (waited {} ms): {}; the communicator "
          "is aborted and the job must end",
          what, options_.timeout.count(), waited_ms,
          probe_->Diagnose(group_.world_ranks, ProbePatience(options_.timeout))));
    }
    probe_->Service();
    if (++polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclCommunicator::AllGatherInPlace(const at::Tensor& buffer) {
  ThrowIfAborted("all_gather");
  internal::CheckTensor(Label("all_gather"), buffer, device_);
  RL_CHECK(buffer.numel() % size_ == 0, Error,
           "{}: buffer of {} elements is not a multiple of the group size {} "
           "(Note [Flat collectives])",
           Label("all_gather"), buffer.numel(), size_);
  const int64_t shard_numel = buffer.numel() / size_;
  AllGather(buffer.view({-1}).narrow(0, rank_ * shard_numel, shard_numel), buffer.view({-1}));
}

void NcclCommunicator::AllGather(const at::Tensor& shard, const at::Tensor& buffer) {
  ThrowIfAborted("all_gather");
  const internal::FlatShape shape =
      internal::CheckFlat(Label("all_gather"), shard, buffer, rank_, size_, device_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  Complete(ncclAllGather(shard.data_ptr(), buffer.data_ptr(), shape.shard_numel,
                         ToNcclType(buffer.scalar_type()), comm_, stream),
           stream, Describe("all_gather", shard.nbytes(), buffer.nbytes()));
}

void NcclCommunicator::ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard,
                                     ReduceOp op) {
  ThrowIfAborted("reduce_scatter");
  const internal::FlatShape shape =
      internal::CheckFlat(Label("reduce_scatter"), shard, buffer, rank_, size_, device_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  // NCCL supports in place when the output is this rank's slice of the input.
  Complete(
      ncclReduceScatter(buffer.data_ptr(), shard.data_ptr(), shape.shard_numel,
                        ToNcclType(buffer.scalar_type()), ToNcclOp(op), comm_, stream),
      stream,
      Describe(fmt::format("reduce_scatter({})", ToString(op)), buffer.nbytes(), shard.nbytes()));
}

void NcclCommunicator::AllReduce(const at::Tensor& tensor, ReduceOp op) {
  ThrowIfAborted("all_reduce");
  internal::CheckTensor(Label("all_reduce"), tensor, device_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  Complete(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                         ToNcclType(tensor.scalar_type()), ToNcclOp(op), comm_, stream),
           stream,
           Describe(fmt::format("all_reduce({})", ToString(op)), tensor.nbytes(), tensor.nbytes()));
}

void NcclCommunicator::Broadcast(const at::Tensor& tensor, int root) {
  ThrowIfAborted("broadcast");
  internal::CheckTensor(Label("broadcast"), tensor, device_);
  RL_CHECK(root >= 0 && root < size_, Error, "{}: root {} is outside the group of {}",
           Label("broadcast"), root, size_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  Complete(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                         ToNcclType(tensor.scalar_type()), root, comm_, stream),
           stream,
           Describe(fmt::format("broadcast(root {})", root), tensor.nbytes(), tensor.nbytes()));
}

void NcclCommunicator::Barrier() {
  ThrowIfAborted("barrier");
  AllReduce(barrier_scratch_, ReduceOp::kSum);
}

ncclResult_t NcclCommunicator::EnqueueSendRecv(const at::Tensor& send,
                                               const std::vector<int64_t>& send_counts,
                                               const at::Tensor& recv,
                                               const std::vector<int64_t>& recv_counts,
                                               cudaStream_t stream) {
  const internal::AllToAllLayout layout = internal::CheckAllToAll(
      Label("all_to_all"), send, send_counts, recv, recv_counts, size_, device_);
  const auto* send_bytes = static_cast<const char*>(send.data_ptr());
  auto* recv_bytes = static_cast<char*>(recv.data_ptr());
  // One group, so NCCL progresses every pair together and no pair waits for another; the rows
  // move as bytes (ncclInt8), whatever the dtype.
  ncclResult_t result = ncclGroupStart();
  if (result == ncclSuccess) {
    for (int peer = 0; peer < size_ && Started(result); ++peer) {
      if (send_counts[peer] > 0) {
        result = ncclSend(send_bytes + layout.send_offsets[peer],
                          static_cast<size_t>(send_counts[peer] * layout.row_bytes), ncclInt8, peer,
                          comm_, stream);
      }
      if (Started(result) && recv_counts[peer] > 0) {
        result = ncclRecv(recv_bytes + layout.recv_offsets[peer],
                          static_cast<size_t>(recv_counts[peer] * layout.row_bytes), ncclInt8, peer,
                          comm_, stream);
      }
    }
    // Closed even after a failed call, so that NCCL's group state is not left open.
    const ncclResult_t ended = ncclGroupEnd();
    if (Started(result)) result = ended;
  }
  return result;
}

void NcclCommunicator::AllToAll(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                                const at::Tensor& recv, const std::vector<int64_t>& recv_counts) {
  ThrowIfAborted("all_to_all");
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  Complete(EnqueueSendRecv(send, send_counts, recv, recv_counts, stream), stream,
           Describe("all_to_all", send.nbytes(), recv.nbytes()));
}

void NcclCommunicator::EnqueueAllToAll(const at::Tensor& send, const at::Tensor& recv) {
  ThrowIfAborted("all_to_all");
  const std::vector<int64_t> counts =
      internal::EqualBlocks(Label("all_to_all"), send, recv, size_);
  c10::cuda::CUDAGuard guard(device_);
  // Note [Enqueued all-to-all]: no event and no wait, so that a CUDA graph may capture it.
  WaitStarted(EnqueueSendRecv(send, counts, recv, counts, CurrentStream()),
              Describe("enqueued all_to_all", send.nbytes(), recv.nbytes()), Clock::now());
}

void NcclCommunicator::WaitEnqueued() {
  ThrowIfAborted("wait for enqueued work");
  c10::cuda::CUDAGuard guard(device_);
  WaitStream(CurrentStream(), Describe("the work enqueued on the stream", 0, 0), Clock::now());
}

std::unique_ptr<Communicator> NcclCommunicator::Split(int color, int key, std::string_view name) {
  const std::string op = fmt::format("split(color {}, key {}) into '{}'", color, key, name);
  ThrowIfAborted(op);
  RL_CHECK(!name.empty(), Error, "{}: the new group needs a name for its messages", Label(op));
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  // Note [Sub-groups]: exchange (color, key) under the timeout first, so that a rank that never
  // calls Split is a timeout that names it rather than a hang inside ncclCommSplit.
  const at::Tensor mine = at::tensor({int64_t{color}, int64_t{key}}, at::kLong).to(device_);
  const at::Tensor all = at::empty({2 * size_}, mine.options());  // [size * 2]
  Complete(ncclAllGather(mine.data_ptr(), all.data_ptr(), 2, ncclInt64, comm_, stream), stream,
           Describe(op, mine.nbytes(), all.nbytes()));
  const at::Tensor exchanged = all.cpu();
  const int64_t* colors_keys = exchanged.data_ptr<int64_t>();
  internal::SplitPlan plan = internal::PlanSplit(
      group_, rank_, std::vector<int64_t>(colors_keys, colors_keys + exchanged.numel()), name);

  // The planned rank as the key: NCCL orders by it, so NCCL and the plan agree by construction.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  const std::string what = Describe(op, 0, 0);
  const ncclResult_t started = ncclCommSplit(comm_, color, plan.rank, &child, &config);
  if (!Started(started)) {
    if (child != nullptr) ncclCommAbort(child);
    AbortAndThrow(fmt::format("{} failed to start: {} ({})", what, ncclGetErrorString(started),
                              ncclGetLastError(comm_)));
  }
  WaitInitialized(&child, what);
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(child, device_, options_, std::move(plan.group), plan.rank, probe_));
}

}  // namespace rl
