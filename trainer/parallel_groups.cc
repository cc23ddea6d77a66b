#include "trainer/parallel_groups.h"

#include <fmt/format.h>

#include "launch/check.h"

namespace rl {

ParallelGroups::ParallelGroups(Communicator& world, int tensor_parallel_size,
                               int expert_parallel_size)
    : world_(world), tp_size_(tensor_parallel_size), ep_size_(expert_parallel_size) {
  RL_CHECK(tp_size_ >= 1 && world.size() % tp_size_ == 0, ConfigError,
           "--tensor-model-parallel-size {} does not divide the {} ranks (mpirun -np)", tp_size_,
           world.size());
  RL_CHECK(ep_size_ >= 1 && world.size() % ep_size_ == 0, ConfigError,
           "--expert-model-parallel-size {} does not divide the {} ranks (mpirun -np)", ep_size_,
           world.size());
  const int rank = world.rank();
  if (tp_size_ > 1) {
    // Note [Rank grid]: consecutive ranks form a TP group; equal TP ranks a DP group.
    tp_ = world.Split(rank / tp_size_, rank, "tp");
    dp_ = world.Split(rank % tp_size_, rank, "dp");
  }
  if (ep_size_ == 1) return;
  // Note [Rank grid]: consecutive ranks form an EP group; equal EP ranks an EDP group.
  ep_ = world.Split(rank / ep_size_, rank, "ep");
  edp_ = world.Split(rank % ep_size_, rank, "edp");
}

std::string ParallelGroups::Describe() const {
  if (tp_size_ > 1 && ep_size_ > 1) {
    return fmt::format("TP {} x DP {}, EP {} x EDP {}", tp_size_, dp().size(), ep_size_,
                       expert_dp().size());
  }
  if (tp_size_ > 1) {
    return fmt::format("TP {} x DP {} (EDP {})", tp_size_, dp().size(), expert_dp().size());
  }
  return fmt::format("EP {} x EDP {} (DP {})", ep_size_, expert_dp().size(), dp().size());
}

}  // namespace rl
