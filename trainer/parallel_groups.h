// The rank grid and the communicators of its groups.
//
// Note [Rank grid]
// Ranks are laid out in Megatron's order (TP innermost, then CP, EP, DP, PP). This binary runs
// CP = PP = 1, so the world splits into
//  - tensor-parallel (TP) groups of --tensor-model-parallel-size consecutive ranks: world rank w is
//    TP rank w % TP of group w / TP and holds that slice of the attention heads, MLP columns and
//    vocabulary (Note [Tensor shard] in trainer/model/model_config.h);
//  - data-parallel (DP) groups of the world / TP ranks with the same TP rank (the world when
//    TP = 1): they hold the same slices, train on different samples, and shard and reduce their
//    param buffers by ZeRO-1;
//  - under TP (EP = 1), one expert data-parallel group of the whole world: the routed experts
//    (expert TP 1) are the same on every rank, and their optimizer buffer is sharded and reduced
//    over all of them, as Megatron's EDP = TP x DP / EP (Note [Expert gradients]);
//  - expert-parallel (EP) groups of --expert-model-parallel-size consecutive ranks of the world
//    (Megatron's expert grid for expert TP 1, TP or not): world rank w is EP rank w % EP of group
//    w / EP, and holds experts [(w % EP) * E / EP, ...) of every MoE layer (Note [Expert shard]
//    in trainer/model/model_config.h);
//  - expert data-parallel (EDP) groups of the world / EP ranks that hold the same experts (the
//    same EP rank): the routed-expert optimizer buffer is sharded and reduced over this group
//    (Note [Expert gradients] in optimizer/distributed_optimizer.h).
// Dense parameters are replicated over DP and sharded over it by ZeRO-1. Each group has its own
// communicator, split from the world's, with the world's timeout, error polling and peer probe.
// A group of the whole world is the world's communicator; a group of one rank is none (tp() and
// ep() are null).
#ifndef RL_TRAINER_PARALLEL_GROUPS_H_
#define RL_TRAINER_PARALLEL_GROUPS_H_

#include <memory>
#include <string>

#include "launch/communicator.h"
#include "trainer/model/model_config.h"

namespace rl {

class ParallelGroups {
 public:
  // Collective over `world` when a size is > 1. Throws ConfigError when a size does not divide
  // the world.
  ParallelGroups(Communicator& world, int tensor_parallel_size, int expert_parallel_size);

  // Every rank of the job: files (metrics, checkpoints' shared parts) are written by its rank 0.
  Communicator& world() const { return world_; }
  // The tensor-parallel group, or null with TP = 1.
  Communicator* tp() const { return tp_.get(); }
  int tp_size() const { return tp_size_; }
  int tp_rank() const { return world_.rank() % tp_size_; }
  // This rank's slices of the model (Note [Tensor shard]).
  model::ModelConfig::TensorShard tensor_shard() const { return {tp_rank(), tp_size_}; }
  // The data-parallel group: the ranks with this rank's TP rank (the world with TP = 1).
  Communicator& dp() const { return dp_ ? *dp_ : world_; }
  // The expert-parallel group, or null with EP = 1.
  Communicator* ep() const { return ep_.get(); }
  // The expert data-parallel group: the ranks holding this rank's experts (the world with EP = 1).
  Communicator& expert_dp() const { return edp_ ? *edp_ : world_; }
  int ep_size() const { return ep_size_; }
  int ep_rank() const { return world_.rank() % ep_size_; }
  // This rank's experts (Note [Expert shard]).
  model::ModelConfig::ExpertShard expert_shard() const { return {ep_rank(), ep_size_}; }
  // "TP 2 x DP 2 (EDP 4)", "EP 2 x EDP 2 (DP 4)", for the log.
  std::string Describe() const;

 private:
  Communicator& world_;
  int tp_size_;
  int ep_size_;
  std::unique_ptr<Communicator> tp_;
  std::unique_ptr<Communicator> dp_;
  std::unique_ptr<Communicator> ep_;
  std::unique_ptr<Communicator> edp_;
};

}  // namespace rl

#endif  // RL_TRAINER_PARALLEL_GROUPS_H_
