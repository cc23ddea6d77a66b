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
      probe_(session.world()) {
  RL_CHECK(device.is_cuda() && device.has_index(), Error,
           "nccl communicator needs a CUDA device with an index, got {}", device.str());
  c10::cuda::CUDAGuard guard(device_);

  ncclUniqueId id{};
  if (rank_ == 0) RL_CHECK_NCCL(ncclGetUniqueId(&id));
  RL_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, session.world()));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto start = Clock::now();
  RL_CHECK_NCCL(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    RL_CHECK_NCCL(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclInProgress) {
      if (Clock::now() - start > options_.timeout) {
        AbortAndThrow(fmt::format(
            "nccl init (rank {} of {}) did not complete within {} ms: a peer rank did not join",
            rank_, size_, options_.timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (state != ncclSuccess) {
    AbortAndThrow(fmt::format("nccl init (rank {} of {}) failed: {}", rank_, size_,
                              ncclGetErrorString(state)));
  }
  RL_CHECK_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  barrier_scratch_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
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
    throw CommError(fmt::format("nccl {} on rank {}: the communicator was aborted earlier ({})",
                                op, rank_, abort_reason_));
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
  probe_.Enter();
  const auto start = Clock::now();
  if (enqueue_result != ncclSuccess && enqueue_result != ncclInProgress) {
    AbortAndThrow(fmt::format("{} failed to start: {} ({})", what,
                              ncclGetErrorString(enqueue_result), ncclGetLastError(comm_)));
  }
  ncclResult_t state = enqueue_result;
  while (state == ncclInProgress) {
    RL_CHECK_NCCL(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclInProgress && Clock::now() - start > options_.timeout) {
      AbortAndThrow(fmt::format("{} was not enqueued within {} ms", what,
                                options_.timeout.count()));
    }
  }
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
    if (Clock::now() - start > options_.timeout) {
      const int64_t waited_ms = ElapsedMs(start);
      AbortAndThrow(fmt::format(
          "{} did not complete within its timeout of {} ms (waited {} ms): {}; the communicator "
          "is aborted and the job must end",
          what, options_.timeout.count(), waited_ms,
          probe_.Diagnose(ProbePatience(options_.timeout))));
    }
    probe_.Service();
    if (++polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclCommunicator::AllGatherInPlace(const at::Tensor& buffer) {
  ThrowIfAborted("all_gather");
  internal::CheckTensor("nccl all_gather", buffer, device_);
  RL_CHECK(buffer.numel() % size_ == 0, Error,
           "nccl all_gather: buffer of {} elements is not a multiple of the group size {} "
           "(Note [Flat collectives])",
           buffer.numel(), size_);
  const int64_t shard_numel = buffer.numel() / size_;
  AllGather(buffer.view({-1}).narrow(0, rank_ * shard_numel, shard_numel), buffer.view({-1}));
}

void NcclCommunicator::AllGather(const at::Tensor& shard, const at::Tensor& buffer) {
  ThrowIfAborted("all_gather");
  const internal::FlatShape shape =
      internal::CheckFlat("nccl all_gather", shard, buffer, rank_, size_, device_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  Complete(ncclAllGather(shard.data_ptr(), buffer.data_ptr(), shape.shard_numel,
                         ToNcclType(buffer.scalar_type()), comm_, stream),
           stream,
           internal::DescribeOp("nccl", "all_gather", shard.nbytes(), buffer.nbytes(), rank_,
                                size_));
}

void NcclCommunicator::ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard,
                                     ReduceOp op) {
  ThrowIfAborted("reduce_scatter");
  const internal::FlatShape shape =
      internal::CheckFlat("nccl reduce_scatter", shard, buffer, rank_, size_, device_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  // NCCL supports in place when the output is this rank's slice of the input.
  Complete(ncclReduceScatter(buffer.data_ptr(), shard.data_ptr(), shape.shard_numel,
                             ToNcclType(buffer.scalar_type()), ToNcclOp(op), comm_, stream),
           stream,
           internal::DescribeOp("nccl", fmt::format("reduce_scatter({})", ToString(op)),
                                buffer.nbytes(), shard.nbytes(), rank_, size_));
}

void NcclCommunicator::AllReduce(const at::Tensor& tensor, ReduceOp op) {
  ThrowIfAborted("all_reduce");
  internal::CheckTensor("nccl all_reduce", tensor, device_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  Complete(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                         ToNcclType(tensor.scalar_type()), ToNcclOp(op), comm_, stream),
           stream,
           internal::DescribeOp("nccl", fmt::format("all_reduce({})", ToString(op)),
                                tensor.nbytes(), tensor.nbytes(), rank_, size_));
}

void NcclCommunicator::Broadcast(const at::Tensor& tensor, int root) {
  ThrowIfAborted("broadcast");
  internal::CheckTensor("nccl broadcast", tensor, device_);
  RL_CHECK(root >= 0 && root < size_, Error, "nccl broadcast: root {} is outside the group of {}",
           root, size_);
  c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = CurrentStream();
  Complete(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                         ToNcclType(tensor.scalar_type()), root, comm_, stream),
           stream,
           internal::DescribeOp("nccl", fmt::format("broadcast(root {})", root), tensor.nbytes(),
                                tensor.nbytes(), rank_, size_));
}

void NcclCommunicator::Barrier() {
  ThrowIfAborted("barrier");
  AllReduce(barrier_scratch_, ReduceOp::kSum);
}

}  // namespace rl
