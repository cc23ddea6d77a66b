#include "launch/mpi_communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstring>
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
    : options_(options),
      group_(internal::WorldGroup(session.world_size())),
      probe_(std::make_shared<PeerProbe>(session.world())) {
  RL_CHECK_MPI(MPI_Comm_dup(session.world(), &comm_));
  RL_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  RL_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  RL_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions options, internal::Group group,
                                 std::shared_ptr<PeerProbe> probe)
    : comm_(comm), options_(options), group_(std::move(group)), probe_(std::move(probe)) {
  RL_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  RL_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  RL_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  if (!pending_.empty()) {
    // A timed-out collective may still complete if the late peer joins; give it a moment so that
    // MPI_Finalize does not find it pending. Otherwise leak it: the job is ending anyway.
    const auto deadline = Clock::now() + kDrainGracePeriod;
    int done = 0;
    while (!done && Clock::now() < deadline) {
      if (MPI_Testall(static_cast<int>(pending_.size()), pending_.data(), &done,
                      MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
        break;
      }
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
    throw CommError(fmt::format("{} on rank {}: the communicator was aborted earlier ({})",
                                Label(op), rank_, abort_reason_));
  }
}

void MpiCommunicator::Wait(MPI_Request request, const std::string& what,
                           std::vector<at::Tensor> in_flight) {
  WaitAll({request}, what, std::move(in_flight));
}

void MpiCommunicator::WaitAll(std::vector<MPI_Request> requests, const std::string& what,
                              std::vector<at::Tensor> in_flight) {
  probe_->Enter(group_.tag, ++sequence_);
  const auto start = Clock::now();
  int done = 0;
  int polls = 0;
  while (true) {
    RL_CHECK_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                             MPI_STATUSES_IGNORE));
    if (done) return;
    const auto elapsed = Clock::now() - start;
    if (options_.Expired(elapsed)) {
      pending_ = std::move(requests);
      pending_buffers_ = std::move(in_flight);
      abort_reason_ = fmt::format(
          "{} did not complete within its timeout of {} ms (waited {} ms): {}; the job must end",
          what, options_.timeout.count(),
          std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(),
          probe_->Diagnose(group_.world_ranks, ProbePatience(options_.timeout)));
      throw CommError(abort_reason_);
    }
    probe_->Service();
    // Spin briefly for low latency, then back off so a waiting rank leaves the core to its peer.
    if (++polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void MpiCommunicator::AllGatherInPlace(const at::Tensor& buffer) {
  ThrowIfAborted("all_gather");
  internal::CheckTensor(Label("all_gather"), buffer, c10::kCPU);
  RL_CHECK(buffer.numel() % size_ == 0, Error,
           "{}: buffer of {} elements is not a multiple of the group size {} "
           "(Note [Flat collectives])",
           Label("all_gather"), buffer.numel(), size_);
  const int64_t shard_numel = buffer.numel() / size_;
  AllGather(buffer.narrow(0, rank_ * shard_numel, shard_numel), buffer.view({-1}));
}

void MpiCommunicator::AllGather(const at::Tensor& shard, const at::Tensor& buffer) {
  ThrowIfAborted("all_gather");
  const internal::FlatShape shape =
      internal::CheckFlat(Label("all_gather"), shard, buffer, rank_, size_, c10::kCPU);
  const int count = CountOrThrow(shape.shard_numel, "all_gather");
  const MPI_Datatype type = BitwiseType(buffer);
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Iallgather(shape.in_place ? MPI_IN_PLACE : shard.data_ptr(), count, type,
                              buffer.data_ptr(), count, type, comm_, &request));
  Wait(request, Describe("all_gather", shard.nbytes(), buffer.nbytes()), {shard, buffer});
}

void MpiCommunicator::ReduceScatter(const at::Tensor& buffer, const at::Tensor& shard,
                                    ReduceOp op) {
  ThrowIfAborted("reduce_scatter");
  const internal::FlatShape shape =
      internal::CheckFlat(Label("reduce_scatter"), shard, buffer, rank_, size_, c10::kCPU);
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
  Wait(request,
       Describe(fmt::format("reduce_scatter({})", ToString(op)), buffer.nbytes(), shard.nbytes()),
       {send, receive});
  if (op == ReduceOp::kMean) receive.div_(size_);
  if (!direct) shard.view({-1}).copy_(receive);
}

void MpiCommunicator::AllReduce(const at::Tensor& tensor, ReduceOp op) {
  ThrowIfAborted("all_reduce");
  internal::CheckTensor(Label("all_reduce"), tensor, c10::kCPU);
  const at::Tensor work = ReductionWorkTensor(tensor, op, "all_reduce");
  const int count = CountOrThrow(work.numel(), "all_reduce");
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, work.data_ptr(), count,
                              ArithmeticType(work.scalar_type()), ToMpiOp(op), comm_, &request));
  Wait(request,
       Describe(fmt::format("all_reduce({})", ToString(op)), tensor.nbytes(), tensor.nbytes()),
       {work});
  if (op == ReduceOp::kMean) work.div_(size_);
  if (!work.is_same(tensor)) tensor.copy_(work);
}

void MpiCommunicator::Broadcast(const at::Tensor& tensor, int root) {
  ThrowIfAborted("broadcast");
  internal::CheckTensor(Label("broadcast"), tensor, c10::kCPU);
  RL_CHECK(root >= 0 && root < size_, Error, "{}: root {} is outside the group of {}",
           Label("broadcast"), root, size_);
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Ibcast(tensor.data_ptr(), CountOrThrow(tensor.numel(), "broadcast"),
                          BitwiseType(tensor), root, comm_, &request));
  Wait(request, Describe(fmt::format("broadcast(root {})", root), tensor.nbytes(), tensor.nbytes()),
       {tensor});
}

void MpiCommunicator::Barrier() {
  ThrowIfAborted("barrier");
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Ibarrier(comm_, &request));
  Wait(request, Describe("barrier", 0, 0), {});
}

void MpiCommunicator::AllToAll(const at::Tensor& send, const std::vector<int64_t>& send_counts,
                               const at::Tensor& recv, const std::vector<int64_t>& recv_counts) {
  ThrowIfAborted("all_to_all");
  const internal::AllToAllLayout layout = internal::CheckAllToAll(
      Label("all_to_all"), send, send_counts, recv, recv_counts, size_, c10::kCPU);
  // MPI counts are int: the bytes of one peer's rows must fit (offsets are pointer arithmetic).
  const auto bytes_or_throw = [&](int64_t bytes, std::string_view what, int peer) {
    RL_CHECK(bytes <= std::numeric_limits<int>::max(), Error,
             "{}: {} for rank {} is {} bytes, beyond MPI's int count ({}); exchange the rows in "
             "several smaller calls",
             Label("all_to_all"), what, peer, bytes, std::numeric_limits<int>::max());
    return static_cast<int>(bytes);
  };
  std::vector<int> send_bytes(size_), recv_bytes(size_);
  for (int j = 0; j < size_; ++j) {
    send_bytes[j] = bytes_or_throw(send_counts[j] * layout.row_bytes, "the send count", j);
    recv_bytes[j] = bytes_or_throw(recv_counts[j] * layout.row_bytes, "the receive count", j);
  }
  const std::vector<int64_t>& send_displs = layout.send_offsets;
  const std::vector<int64_t>& recv_displs = layout.recv_offsets;
  // Note [All-to-all by point-to-point]: one receive and one send per peer with rows to move,
  // polled together, instead of MPI_Ialltoallv. Open MPI 4.1's non-blocking all-to-all (libnbc)
  // was seen to leave the communicator's next collective stuck in the transport, with every rank
  // inside it, after a step in which one rank had nothing to send or receive (GLM-5.2 CI model,
  // 4 ranks, EP 4). Point-to-point messages of one (source, tag, communicator) are matched in
  // order, so consecutive all-to-alls on a communicator cannot mix, and they never meet its
  // collectives. This rank's own rows are copied.
  constexpr int kAllToAllTag = 4242;
  const char* send_data = send.nbytes() > 0 ? static_cast<const char*>(send.data_ptr()) : nullptr;
  char* recv_data = recv.nbytes() > 0 ? static_cast<char*>(recv.data_ptr()) : nullptr;
  std::vector<MPI_Request> requests;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_ || recv_bytes[j] == 0) continue;
    requests.emplace_back(MPI_REQUEST_NULL);
    RL_CHECK_MPI(MPI_Irecv(recv_data + recv_displs[j], recv_bytes[j], MPI_BYTE, j,
                           kAllToAllTag, comm_, &requests.back()));
  }
  for (int j = 0; j < size_; ++j) {
    if (j == rank_ || send_bytes[j] == 0) continue;
    requests.emplace_back(MPI_REQUEST_NULL);
    RL_CHECK_MPI(MPI_Isend(send_data + send_displs[j], send_bytes[j], MPI_BYTE, j,
                           kAllToAllTag, comm_, &requests.back()));
  }
  if (send_bytes[rank_] > 0) {
    std::memcpy(recv_data + recv_displs[rank_], send_data + send_displs[rank_],
                static_cast<size_t>(send_bytes[rank_]));
  }
  WaitAll(std::move(requests), Describe("all_to_all", send.nbytes(), recv.nbytes()),
          {send, recv});
}

void MpiCommunicator::EnqueueAllToAll(const at::Tensor& send, const at::Tensor& recv) {
  ThrowIfAborted("all_to_all");
  const std::vector<int64_t> counts =
      internal::EqualBlocks(Label("all_to_all"), send, recv, size_);
  AllToAll(send, counts, recv, counts);
}

void MpiCommunicator::WaitEnqueued() { ThrowIfAborted("wait for enqueued work"); }

std::unique_ptr<Communicator> MpiCommunicator::Split(int color, int key, std::string_view name) {
  const std::string op = fmt::format("split(color {}, key {}) into '{}'", color, key, name);
  ThrowIfAborted(op);
  RL_CHECK(!name.empty(), Error, "{}: the new group needs a name for its messages", Label(op));
  // Note [Sub-groups]: exchange (color, key) under the timeout first; MPI_Comm_split cannot be
  // polled, and after the exchange every rank is known to be in this Split.
  const at::Tensor mine = at::tensor({int64_t{color}, int64_t{key}}, at::kLong);  // [2]
  const at::Tensor all = at::empty({2 * size_}, at::kLong);                       // [size * 2]
  MPI_Request request = MPI_REQUEST_NULL;
  RL_CHECK_MPI(MPI_Iallgather(mine.data_ptr(), 2, MPI_INT64_T, all.data_ptr(), 2, MPI_INT64_T,
                              comm_, &request));
  Wait(request, Describe(op, mine.nbytes(), all.nbytes()), {mine, all});
  const int64_t* exchanged = all.data_ptr<int64_t>();
  internal::SplitPlan plan = internal::PlanSplit(
      group_, rank_, std::vector<int64_t>(exchanged, exchanged + all.numel()), name);
  // The planned rank as the key: MPI orders by it, so MPI and the plan agree by construction.
  MPI_Comm child = MPI_COMM_NULL;
  const int status = MPI_Comm_split(comm_, color, plan.rank, &child);
  if (status != MPI_SUCCESS) {
    abort_reason_ = fmt::format("{}: MPI_Comm_split failed (MPI error {}); the job must end",
                                Describe(op, 0, 0), status);
    throw CommError(abort_reason_);
  }
  auto communicator = std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(child, options_, std::move(plan.group), probe_));
  RL_CHECK(communicator->rank() == plan.rank &&
               communicator->size() == static_cast<int>(communicator->group_.world_ranks.size()),
           CommError, "{}: MPI made rank {} of {}, the plan rank {} of {}", Label(op),
           communicator->rank(), communicator->size(), plan.rank,
           communicator->group_.world_ranks.size());
  return communicator;
}

}  // namespace rl
