#include "trainer/parallel_groups.h"

#include <fmt/format.h>

#include "launch/check.h"

namespace rl {

ParallelGroups::ParallelGroups(Communicator& world, int expert_parallel_size)
    : world_(world), ep_size_(expert_parallel_size) {
  RL_CHECK(ep_size_ >= 1 && world.size() % ep_size_ == 0, ConfigError,
           "--expert-model-parallel-size {} does not divide the {} ranks (mpirun -np)", ep_size_,
           world.size());
  if (ep_size_ == 1) return;
  const int rank = world.rank();
  // Note [Rank grid]: consecutive ranks form an EP group; equal EP ranks an EDP group.
  ep_ = world.Split(rank / ep_size_, rank, "ep");
  edp_ = world.Split(rank % ep_size_, rank, "edp");
}

std::string ParallelGroups::Describe() const {
  return fmt::format("EP {} x EDP {} (DP {})", ep_size_, expert_dp().size(), world_.size());
}

}  // namespace rl
