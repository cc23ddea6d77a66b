#include "launch/communicator.h"

#include <fmt/format.h>

#include "launch/check.h"
#include "launch/mpi_communicator.h"
#include "launch/nccl_communicator.h"

namespace rl {

std::string_view ToString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::unique_ptr<Communicator> CreateCommunicator(const MpiSession& session, c10::Device device,
                                                 CommOptions options) {
  if (device.is_cuda()) {
    return std::make_unique<NcclCommunicator>(session, device, options);
  }
  return std::make_unique<MpiCommunicator>(session, options);
}

namespace internal {

void CheckTensor(std::string_view op, const at::Tensor& tensor, c10::Device device) {
  RL_CHECK(tensor.defined(), Error, "{}: tensor is undefined", op);
  RL_CHECK(tensor.device() == device, Error, "{}: tensor is on {} but the communicator is on {}",
           op, tensor.device().str(), device.str());
  RL_CHECK(tensor.is_contiguous(), Error, "{}: tensor must be contiguous", op);
}

FlatShape CheckFlat(std::string_view op, const at::Tensor& shard, const at::Tensor& buffer,
                    int rank, int size, c10::Device device) {
  CheckTensor(op, shard, device);
  CheckTensor(op, buffer, device);
  RL_CHECK(shard.scalar_type() == buffer.scalar_type(), Error,
           "{}: shard dtype {} differs from buffer dtype {}", op,
           c10::toString(shard.scalar_type()), c10::toString(buffer.scalar_type()));
  RL_CHECK(buffer.numel() == shard.numel() * size, Error,
           "{}: buffer has {} elements but {} ranks x shard of {} = {}; pad the buffer to a "
           "multiple of the group size (Note [Flat collectives])",
           op, buffer.numel(), size, shard.numel(), shard.numel() * size);
  FlatShape shape;
  shape.shard_numel = shard.numel();
  const auto* own_slice = static_cast<const char*>(buffer.data_ptr()) +
                          rank * shape.shard_numel * static_cast<int64_t>(buffer.element_size());
  shape.in_place = shard.data_ptr() == own_slice;
  if (!shape.in_place && shape.shard_numel > 0) {
    const auto* shard_begin = static_cast<const char*>(shard.data_ptr());
    const auto* buffer_begin = static_cast<const char*>(buffer.data_ptr());
    const int64_t shard_bytes = shard.nbytes();
    const int64_t buffer_bytes = buffer.nbytes();
    RL_CHECK(
        shard_begin >= buffer_begin + buffer_bytes || buffer_begin >= shard_begin + shard_bytes,
        Error, "{}: shard overlaps the buffer but is not rank {}'s slice of it", op, rank);
  }
  return shape;
}

std::string DescribeOp(std::string_view backend, std::string_view op, int64_t bytes_in,
                       int64_t bytes_out, int rank, int size) {
  return fmt::format("{} {} (rank {} of {}, {} bytes in, {} bytes out)", backend, op, rank, size,
                     bytes_in, bytes_out);
}

}  // namespace internal
}  // namespace rl
