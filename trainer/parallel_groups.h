// The rank grid and the communicators of its groups.
//
// Note [Rank grid]
// Ranks are laid out in Megatron's order (TP innermost, then CP, EP, DP, PP). This binary runs
// TP = CP = PP = 1, so every rank of the job is a data-parallel rank, and the world splits into
//  - expert-parallel (EP) groups of --expert-model-parallel-size consecutive ranks: world rank w
//    is EP rank w % EP of group w / EP, and holds experts [(w % EP) * E / EP, ...) of every MoE
//    layer (Note [Expert shard] in trainer/model/model_config.h);
//  - expert data-parallel (EDP) groups of the DP / EP ranks that hold the same experts (the same
//    EP rank): the routed-expert optimizer buffer is sharded and reduced over this group (Note
//    [Expert gradients] in optimizer/distributed_optimizer.h).
// Dense parameters are replicated over the world and sharded over it by ZeRO-1, as before. Each
// group has its own communicator, split from the world's, with the world's timeout, error polling
// and peer probe. With EP = 1 no communicator is split: the EP group is this rank alone and the
// EDP group is the world.
#ifndef RL_TRAINER_PARALLEL_GROUPS_H_
#define RL_TRAINER_PARALLEL_GROUPS_H_

#include <memory>
#include <string>

#include "launch/communicator.h"
#include "trainer/model/model_config.h"

namespace rl {

class ParallelGroups {
 public:
  // Collective over `world` when expert_parallel_size > 1. Throws ConfigError when the size does
  // not divide the world.
  ParallelGroups(Communicator& world, int expert_parallel_size);

  // The data-parallel group: every rank (TP = CP = PP = 1).
  Communicator& dp() const { return world_; }
  // The expert-parallel group, or null with EP = 1.
  Communicator* ep() const { return ep_.get(); }
  // The expert data-parallel group (the world with EP = 1).
  Communicator& expert_dp() const { return edp_ ? *edp_ : world_; }
  int ep_size() const { return ep_size_; }
  int ep_rank() const { return world_.rank() % ep_size_; }
  // This rank's experts (Note [Expert shard]).
  model::ModelConfig::ExpertShard expert_shard() const { return {ep_rank(), ep_size_}; }
  // "EP 2 x EDP 2 (DP 4)", for the log.
  std::string Describe() const;

 private:
  Communicator& world_;
  int ep_size_;
  std::unique_ptr<Communicator> ep_;
  std::unique_ptr<Communicator> edp_;
};

}  // namespace rl

#endif  // RL_TRAINER_PARALLEL_GROUPS_H_
