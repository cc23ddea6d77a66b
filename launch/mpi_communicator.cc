#include "launch/mpi_communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <limits>
#include <thread>

#include "launch/check.h"
#include "launch/mpi_session.h"

namespace rl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::seconds kDrainGracePeriod(5);

// The MPI type that moves the tensor's elements unchanged.
MPI_Datatype BitwiseType(const at::Tensor& tensor) {
  switch (tensor.element_size()) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
    default:
      throw Error(fmt::format("mpi: unsupported element size {} of dtype {}", tensor.element_size(),
                              c10::toString(tensor.scalar_type())));
  }
}

// The MPI type that reduces the tensor's elements arithmetically.
MPI_Datatype ArithmeticType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    default:
      throw Error(fmt::format("mpi: no reduction for dtype {}", c10::toString(type)));
  }
}

MPI_Op ToMpiOp(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

bool IsHalfFloat(at::ScalarType type) { return type == at::kBFloat16 || type == at::kHalf; }

int CountOrThrow(int64_t numel, std::string_view op) {
  RL_CHECK(numel <= std::numeric_limits<int>::max(), Error,
           "mpi {}: {} elements exceed MPI's int count; split the buffer", op, numel);
  return static_cast<int>(numel);
}

// Reductions run on `work`: the tensor itself, or an fp32 copy for bf16/fp16.
at::Tensor ReductionWorkTensor(const at::Tensor& tensor, ReduceOp op, std::string_view name) {
  RL_CHECK(op != ReduceOp::kMean || at::isFloatingType(tensor.scalar_type()), Error,
           "mpi {}: mean of integer dtype {} is not defined", name,
           c10::toString(tensor.scalar_type()));
  return IsHalfFloat(tensor.scalar_type()) ? tensor.to(at::kFloat) : tensor;
}

}  // namespace

MpiCommunicator::MpiCommunicator(const MpiSession& session, CommOptions options)
    : options_(options), probe_(session.world()) {
  RL_CHECK_MPI(MPI_Comm_dup(session.world(), &comm_));
  RL_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  RL_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  RL_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  if (pending_ != MPI_REQUEST_NULL) {
    // A timed-out collective may still complete if the late peer joins; give it a moment so that
    // MPI_Finalize does not find it pending. Otherwise leak it: the job is ending anyway.
    const auto deadline = Clock::now() + kDrainGracePeriod;
    int done = 0;
    while (!done && Clock::now() < deadline) {
      if (MPI_Test(&pending_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!done) {
      spdlog::warn("mpi communicator destroyed with a collective still pending: {}",
                   abort_reason_);
      // MPI may still write into the buffers: leak them rather than free memory it owns.
      new std::vector<at::Tensor>(std::move(pending_buffers_));
      return;  // freeing a communicator with a pending collective is erroneous in MPI
    }
  }
  if (comm_ != MPI_COMM_NULL) {
    MPI_Comm_free(&comm_);
  }
}

void MpiCommunicator::ThrowIfAborted(std::string_view op) const {
  if (!abort_reason_.empty()) {
    throw CommError(fmt::format("mpi {} on rank {}: the communicator was aborted earlier ({})", op,
                                rank_, abort_reason_));
  }
}

void MpiCommunicator::Wait(MPI_Request request, const std::string& what,
                           std::vector<at::Tensor> in_flight) {
  probe_.Enter();
  const auto start = Clock::now();
  int done = 0;
  int polls = 0;
  while (true) {
    RL_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const auto elapsed = Clock::now() - start;
    if (elapsed > options_.timeout) {
      pending_ = request;
      pending_buffers_ = std::move(in_flight);
      abort_reason_ = fmt::format(
          "{} did not complete within its timeout of {} ms (waited {} ms): {}; the job must end",
          what, options_.timeout.count(),
          std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(),
          probe_.Diagnose(ProbePatience(options_.timeout)));
      throw CommError(abort_reason_);
    }
    probe_.Service();
    // Spin briefly for low latency, then back off so a waiting rank leaves the core to its peer.
    if (++polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void MpiCommunicator::AllGatherInPlace(const at::Tensor& buffer) {
  ThrowIfAborted("all_gather");
  internal::CheckTensor("mpi all_gather", buffer, c10::kCPU);
  RL_CHECK(buffer.numel() % size_ == 0, Error,
           "mpi all_gather: buffer of {} elements is not a multiple of the group size {} "
           "(Note [Flat collectives])",
           buffer.numel(), size_);
  const int64_t shard_numel = buffer.numel() / size_;
  AllGather(buffer.narrow(0, rank_ * shard_numel, shard_numel), buffer.view({-1}));
}

void MpiCommunicator::AllGather(const at::Tensor& shard, const at::Tensor& buffer) {
  ThrowIfAborted("all_gather");
  const internal::FlatShape shape =
      internal::CheckFlat("mpi all_gather", shard, buffer, rank_, size_, c10::kCPU);
  const int count = CountOrThrow(shape.shard_numel, "all_gather");
  const MPI_Datatype type = BitwiseType(buffer);
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Iallgather(shape.in_place ? MPI_IN_PLACE : shard.data_ptr(), count, type,
                              buffer.data_ptr(), count, type, comm_, &request));
  Wait(request,
       internal::DescribeOp("mpi", "all_gather", shard.nbytes(), buffer.nbytes(), rank_, size_),
       {shard, buffer});
}

void MpiCommunicator::ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard,
                                    ReduceOp op) {
  ThrowIfAborted("reduce_scatter");
  const internal::FlatShape shape =
      internal::CheckFlat("mpi reduce_scatter", shard, buffer, rank_, size_, c10::kCPU);
  const at::Tensor send = ReductionWorkTensor(buffer, op, "reduce_scatter");
  // MPI forbids aliasing the receive buffer with the send buffer; reduce into a fresh shard when
  // the caller asked for in place or when the dtype needs an fp32 detour.
  const bool direct = !shape.in_place && send.is_same(buffer);
  at::Tensor receive = direct ? shard : at::empty({shape.shard_numel}, send.options());
  const int count = CountOrThrow(shape.shard_numel, "reduce_scatter");
  const MPI_Datatype type = ArithmeticType(send.scalar_type());
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Ireduce_scatter_block(send.data_ptr(), receive.data_ptr(), count, type,
                                         ToMpiOp(op), comm_, &request));
  Wait(request, internal::DescribeOp("mpi", fmt::format("reduce_scatter({})", ToString(op)),
                                     buffer.nbytes(), shard.nbytes(), rank_, size_),
       {send, receive});
  if (op == ReduceOp::kMean) receive.div_(size_);
  if (!direct) shard.view({-1}).copy_(receive);
}

void MpiCommunicator::AllReduce(const at::Tensor& tensor, ReduceOp op) {
  ThrowIfAborted("all_reduce");
  internal::CheckTensor("mpi all_reduce", tensor, c10::kCPU);
  const at::Tensor work = ReductionWorkTensor(tensor, op, "all_reduce");
  const int count = CountOrThrow(work.numel(), "all_reduce");
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, work.data_ptr(), count,
                              ArithmeticType(work.scalar_type()), ToMpiOp(op), comm_, &request));
  Wait(request, internal::DescribeOp("mpi", fmt::format("all_reduce({})", ToString(op)),
                                     tensor.nbytes(), tensor.nbytes(), rank_, size_),
       {work});
  if (op == ReduceOp::kMean) work.div_(size_);
  if (!work.is_same(tensor)) tensor.copy_(work);
}

void MpiCommunicator::Broadcast(const at::Tensor& tensor, int root) {
  ThrowIfAborted("broadcast");
  internal::CheckTensor("mpi broadcast", tensor, c10::kCPU);
  RL_CHECK(root >= 0 && root < size_, Error, "mpi broadcast: root {} is outside the group of {}",
           root, size_);
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Ibcast(tensor.data_ptr(), CountOrThrow(tensor.numel(), "broadcast"),
                          BitwiseType(tensor), root, comm_, &request));
  Wait(request, internal::DescribeOp("mpi", fmt::format("broadcast(root {})", root),
                                     tensor.nbytes(), tensor.nbytes(), rank_, size_),
       {tensor});
}

void MpiCommunicator::Barrier() {
  ThrowIfAborted("barrier");
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Ibarrier(comm_, &request));
  Wait(request, internal::DescribeOp("mpi", "barrier", 0, 0, rank_, size_), {});
}

}  // namespace rl
