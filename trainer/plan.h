// The per-rank memory plan of a recipe at its full scale and parallel layout (`trainer --plan`).
//
// For the recipe's TP, PP, CP, EP, ETP and planned world size, it counts the parameters one rank
// holds (from the model's own parameter list, so the plan and the model never disagree), and
// turns them into bytes per region, for the pinned-backup path and the rematerialize path side by
// side. The rank shown is the one on the heaviest pipeline stage.
//
// Sharding model (Megatron's): 2-D weights of attention, dense MLPs, shared experts, embeddings
// and the LM head are split over TP (k/v projections only when the KV heads divide over TP);
// norms, biases of row-parallel layers, the router, the MLA down projections and the DSA indexer
// are replicated; routed experts are split over EP (whole experts) and ETP (within an expert).
// Layers are split over PP evenly, or with --decoder-last-pipeline-num-layers on the last stage;
// the embedding sits on the first stage, the final norm and LM head on the last.
//
// Bytes (bf16 training, fp32 gradient accumulation, ZeRO-1):
//   param buffer  2 B x local trained params        grad buffer  4 B x local trained params
//   masters       4 B x (dense / DP + expert / expert DP)   moments  8 B x the same
//   extras        4 B x local fp32 extras (e_score_correction_bias)
// Host while the actor sleeps (offload_train): the optimizer state (masters and moments) is saved
// to the host, extras are pinned; the pinned-backup path also pins 2 B x local trained params,
// which rematerialize does not. A reference model (KL) adds a pinned copy of the params and
// extras on both paths. With --optimizer-cpu-offload the optimizer state lives on the host.
#ifndef RL_TRAINER_PLAN_H_
#define RL_TRAINER_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/validate.h"
#include "trainer/model/model_config.h"
#include "trainer/model/params.h"

namespace rl {

struct ParamCounts {
  int64_t dense = 0;   // trained, dense param buffer
  int64_t expert = 0;  // trained, routed-expert param buffer
  int64_t extra = 0;   // fp32, not trained
  int64_t total() const { return dense + expert + extra; }
  // The counter a parameter of `role` adds to.
  int64_t& Of(ParamRole role) {
    return role == ParamRole::kRoutedExpert ? expert
           : role == ParamRole::kFp32Extra  ? extra
                                                   : dense;
  }
};

struct RegionBytes {
  int64_t param_buffer = 0;
  int64_t grad_buffer = 0;
  int64_t masters = 0;
  int64_t moments = 0;
  int64_t extras = 0;
  int64_t gpu_total() const { return param_buffer + grad_buffer + masters + moments + extras; }
};

struct HostBytes {
  int64_t optimizer_state = 0;  // masters + moments saved while asleep (or CPU-offloaded)
  int64_t extras_pinned = 0;
  int64_t param_backup_pinned = 0;  // 0 with rematerialize
  int64_t ref_pinned = 0;
  int64_t total() const { return optimizer_state + extras_pinned + param_backup_pinned + ref_pinned; }
};

struct MemoryPlan {
  ParamCounts model;           // whole model
  ParamCounts rank;            // one rank on the heaviest stage
  int64_t stage = 0;           // that stage
  int64_t stage_layers = 0;    // decoder layers on it
  RegionBytes gpu;             // same on both paths
  HostBytes host_backup;       // pinned-backup path
  HostBytes host_remat;        // rematerialize path
  // Note [Runnable today]: why a run of this recipe on the planned world would stop at start-up,
  // one line each; runnable today when there is nothing.
  std::vector<std::string> not_runnable;
  bool runnable_today() const { return not_runnable.empty(); }
};

// Note [Runnable today]
// Why this binary cannot run `config` with `model` on `world_size` ranks (`ranks_from` says where
// that number comes from, for the messages), one line each, or nothing: the checks of the rank
// grid a run makes at start-up (trainer/main.cc), before any rank builds its model. TP and EP
// divide the ranks, the global batch divides over DP = ranks / TP, EP divides the routed experts
// of an MoE model, and the attention heads and features divide over TP (model::ListParams). With
// config::NotRunnable (the options that run at one value only, checked in the config stage) they
// are what --plan reports as "runnable by this binary today" for the planned world.
std::vector<std::string> LayoutProblems(const config::Config& config,
                                        const model::ModelConfig& model, int64_t world_size,
                                        const std::string& ranks_from);

MemoryPlan PlanMemory(const config::ResolvedConfig& resolved, const model::ModelConfig& model);

// The plan as a table for people, with the layout and which path the recipe uses.
std::string FormatPlan(const config::ResolvedConfig& resolved, const model::ModelConfig& model,
                       const MemoryPlan& plan);

}  // namespace rl

#endif  // RL_TRAINER_PLAN_H_
