// The memory planner's arithmetic on small models counted by hand.
#include "trainer/plan.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "launch/json.h"
#include "launch/region_tag.h"
#include "trainer/actor.h"
#include "trainer/config/validate.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/params.h"

namespace rl {
namespace {

// Qwen3 dense, hidden 4, 2 heads of 2 (q/k/v/o are [4, 4]), MLP 6, vocab 10, 2 layers.
// Per layer: norms 4 + 4, q_norm/k_norm 2 + 2, attention 4 x 16, MLP 3 x 24 = 148.
// Embedding 40, final norm 4, LM head 40: 380 in all.
constexpr const char* kDense = R"({
  "model_type": "qwen3", "vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 2,
  "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 2, "intermediate_size": 6,
  "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 64,
  "tie_word_embeddings": false, "attention_bias": false})";

// Qwen3-MoE, 1 layer, 4 experts of [2, 4] + [2, 4] + [4, 2] = 24 each, router [4, 4].
constexpr const char* kMoe = R"({
  "model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 1,
  "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 2, "intermediate_size": 6,
  "moe_intermediate_size": 2, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
  "max_position_embeddings": 64, "tie_word_embeddings": false, "attention_bias": false})";

config::ResolvedConfig Resolve(config::Config c) {
  c.model.init = config::InitMode::kRandom;
  c.model.model_config = "inline";
  const config::ValidationResult r = config::Validate(c);
  INFO((r.errors.empty() ? std::string() : r.errors[0]));
  REQUIRE(r.ok());
  return r.resolved;
}

model::ModelConfig Model(const char* json) {
  return model::ParseModelConfig(json::Parse(json), "inline.json");
}

TEST_CASE("dense model, TP 2 x PP 2: the last stage is the heaviest, 104 params per rank") {
  config::Config c;
  c.run.actor_num_nodes = 1;
  c.run.actor_num_gpus_per_node = 4;
  c.parallel.tensor_model_parallel_size = 2;
  c.parallel.pipeline_model_parallel_size = 2;
  c.colocate.colocate = true;
  const MemoryPlan plan = PlanMemory(Resolve(c), Model(kDense));
  CHECK(plan.model.total() == 380);
  // Stage 0: layer 0 (norms 12 replicated + 64/2 + 72/2) + embedding 40/2 = 100.
  // Stage 1: layer 1 (80) + final norm 4 + LM head 40/2 = 104.
  CHECK(plan.stage == 1);
  CHECK(plan.stage_layers == 1);
  CHECK(plan.rank.dense == 104);
  CHECK(plan.rank.expert == 0);
  CHECK(plan.gpu.param_buffer == 2 * 104);
  CHECK(plan.gpu.grad_buffer == 4 * 104);
  CHECK(plan.gpu.masters == 4 * 104);  // DP 1: the rank owns all of it
  CHECK(plan.gpu.moments == 8 * 104);
  CHECK(plan.host_backup.optimizer_state == 12 * 104);
  CHECK(plan.host_backup.param_backup_pinned == 2 * 104);
  CHECK(plan.host_remat.param_backup_pinned == 0);
  CHECK(plan.host_backup.total() - plan.host_remat.total() == 2 * 104);
  CHECK_FALSE(plan.runnable_today());
}

TEST_CASE("MoE model, DP 2 x EP 2: experts split over EP, masters over DP and expert DP") {
  config::Config c;
  c.run.actor_num_nodes = 1;
  c.run.actor_num_gpus_per_node = 2;
  c.parallel.expert_model_parallel_size = 2;
  const config::ResolvedConfig r = Resolve(c);
  REQUIRE(r.planned_dp_size == 2);
  REQUIRE(r.planned_expert_dp_size == 1);
  const MemoryPlan plan = PlanMemory(r, Model(kMoe));
  CHECK(plan.model.expert == 4 * 24);
  CHECK(plan.rank.expert == 2 * 24);
  // Dense: norms 8, q/k norm 4, attention 64, router 16, embedding 40, final norm 4, head 40.
  CHECK(plan.rank.dense == 176);
  CHECK(plan.gpu.masters == 4 * (176 / 2 + 48));
  CHECK(plan.gpu.moments == 8 * (176 / 2 + 48));
  // Not colocated: nothing is saved to the host while asleep.
  CHECK(plan.host_backup.optimizer_state == 0);
  // Expert parallelism runs; only the layout without colocation does not (kRunsOnlyAt).
  CHECK_FALSE(plan.runnable_today());
  INFO(plan.not_runnable.size() << " problems; the first: " << plan.not_runnable.at(0));
  REQUIRE(plan.not_runnable.size() == 1);
  CHECK(plan.not_runnable[0].rfind("--colocate false: only true runs yet", 0) == 0);
  c.colocate.colocate = true;
  CHECK(PlanMemory(Resolve(c), Model(kMoe)).runnable_today());
}

TEST_CASE("a reference model adds a pinned copy on both paths; CPU optimizer moves state") {
  config::Config c;
  c.run.actor_num_gpus_per_node = 1;
  c.colocate.colocate = true;
  c.rl.use_kl_loss = true;
  c.optimizer.optimizer_cpu_offload = true;
  const MemoryPlan plan = PlanMemory(Resolve(c), Model(kDense));
  CHECK(plan.not_runnable == std::vector<std::string>{"--optimizer-cpu-offload true: only false "
                                                      "runs yet"});
  CHECK(plan.rank.dense == 380);
  CHECK(plan.host_backup.ref_pinned == 2 * 380);
  CHECK(plan.host_remat.ref_pinned == 2 * 380);
  CHECK(plan.gpu.masters == 0);
  CHECK(plan.host_remat.optimizer_state == 12 * 380);
}

// The Qwen3-MoE CI model (configs/models/qwen3_30b_a3b_4layer_ci.json): 4 MoE layers of 8
// experts, hidden 64.
constexpr const char* kMoeCi = R"({
  "model_type": "qwen3_moe", "vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
  "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
  "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "max_position_embeddings": 4096, "tie_word_embeddings": false, "attention_bias": false})";

// The planned actor regions of `r` against what a rank of that job allocates (ActorRegions in
// colocated_loop.cc): `rank_model` with the rank's expert and tensor shards, its DP and expert
// DP sizes.
void CheckPlanIsAllocated(const config::ResolvedConfig& r, const MemoryPlan& plan,
                          const model::ModelConfig& rank_model, int dp, int expert_dp) {
  const std::map<RegionTag, int64_t> allocated =
      Actor::StorageBytes(r, rank_model, dp, expert_dp);
  const std::vector<ParamSpec> params = model::ListParams(rank_model);
  // Each buffer aligns every tensor's start to 64 elements, pads its end to a multiple of 128
  // elements, and each allocation is rounded to 256 bytes.
  const auto slack = [&](int64_t element_bytes, int64_t allocations) {
    return (static_cast<int64_t>(params.size()) * 63 + 2 * 127) * element_bytes +
           allocations * kAllocationAlignmentBytes;
  };
  const std::pair<int64_t, int64_t> regions[] = {
      {plan.gpu.param_buffer, allocated.at(RegionTag::kParamBuffer)},
      {plan.gpu.grad_buffer, allocated.at(RegionTag::kGradBuffer)},
      {plan.gpu.masters + plan.gpu.moments, allocated.at(RegionTag::kOptimizer)}};
  const int64_t slacks[] = {slack(2, 2), slack(4, 2), slack(12, 1)};
  for (int i = 0; i < 3; ++i) {
    INFO("region " << i << ": planned " << regions[i].first << " B, allocated " << regions[i].second
                   << " B, slack " << slacks[i] << " B");
    CHECK(regions[i].second >= regions[i].first);
    CHECK(regions[i].second - regions[i].first <= slacks[i]);
  }
}

// Note [Runnable today]: "runnable by this binary today" is what a run of the planned world
// would find at start-up: the options it runs at one value only and the rank grid's checks.
TEST_CASE("runnable today: the run's own checks, for the planned world") {
  config::Config c;
  c.colocate.colocate = true;
  c.run.actor_num_gpus_per_node = 4;
  CHECK(PlanMemory(Resolve(c), Model(kMoeCi)).runnable_today());
  const auto problems = [](const config::Config& c, const char* model) {
    return PlanMemory(Resolve(c), Model(model)).not_runnable;
  };
  // The global batch of 64 over 3 DP ranks.
  config::Config three = c;
  three.run.actor_num_gpus_per_node = 3;
  CHECK(problems(three, kMoeCi) ==
        std::vector<std::string>{"--global-batch-size 64 is not a multiple of the 3 "
                                 "data-parallel ranks (--actor-num-nodes x "
                                 "--actor-num-gpus-per-node / --tensor-model-parallel-size)"});
  // EP on a dense model; EP 16 over 8 experts.
  config::Config ep = c;
  ep.parallel.expert_model_parallel_size = 2;
  CHECK(problems(ep, kDense) ==
        std::vector<std::string>{"--expert-model-parallel-size 2 needs an MoE model whose expert "
                                 "count it divides; inline.json has 0 routed experts"});
  ep.run.actor_num_gpus_per_node = 16;
  ep.parallel.expert_model_parallel_size = 16;
  CHECK(problems(ep, kMoeCi).size() == 1);
  // TP 8 over 4 attention heads.
  config::Config tp = c;
  tp.run.actor_num_gpus_per_node = 8;
  tp.parallel.tensor_model_parallel_size = 8;
  const std::vector<std::string> heads = problems(tp, kMoeCi);
  REQUIRE(heads.size() == 1);
  CHECK(heads[0] ==
        "tensor parallelism: 4 attention heads do not divide over --tensor-model-parallel-size 8");
  // And NotRunnable's options, with the reasons in the printed plan.
  config::Config critic = c;
  critic.rl.num_critic_only_steps = 1;
  const config::ResolvedConfig r = Resolve(critic);
  const std::string text = FormatPlan(r, Model(kMoeCi), PlanMemory(r, Model(kMoeCi)));
  CHECK(text.find("planned only: this binary cannot run it today") != std::string::npos);
  CHECK(text.find("not runnable by this binary today:\n  --num-critic-only-steps 1: only 0 runs "
                  "yet\n") != std::string::npos);
}

TEST_CASE("at EP 2 the plan is what a rank allocates, up to the optimizer's alignment") {
  config::Config c;
  c.run.actor_num_nodes = 1;
  c.run.actor_num_gpus_per_node = 2;
  c.parallel.expert_model_parallel_size = 2;
  const config::ResolvedConfig r = Resolve(c);
  model::ModelConfig model = Model(kMoeCi);
  const MemoryPlan plan = PlanMemory(r, model);
  // `mpirun -np 2 trainer ... --expert-model-parallel-size 2`: EP rank 0's experts, DP 2, expert
  // DP 1.
  model.expert_shard = {0, 2};
  CheckPlanIsAllocated(r, plan, model, 2, 1);
  // Half the experts: a plan or a rank that held all of them would be 98,304 params off.
  CHECK(plan.rank.expert == 4 * 8 / 2 * 3 * 64 * 32);
}

TEST_CASE("at TP 2 the plan is what a rank allocates, up to the optimizer's alignment") {
  config::Config c;
  c.run.actor_num_nodes = 1;
  c.run.actor_num_gpus_per_node = 4;
  c.parallel.tensor_model_parallel_size = 2;
  const config::ResolvedConfig r = Resolve(c);
  model::ModelConfig model = Model(kMoeCi);
  const MemoryPlan plan = PlanMemory(r, model);
  // `mpirun -np 4 trainer ... --tensor-model-parallel-size 2`: TP rank 0's slices, DP 2, the
  // experts' optimizer state over all 4 ranks.
  model.tensor_shard = {0, 2};
  CheckPlanIsAllocated(r, plan, model, 2, 4);
  // Per layer the norms (2 x 64 + 2 x 16) and the router (8 x 64) whole, q, k, v and o (128 rows
  // and 64 columns of 64) halved; the final norm; the embedding and LM head halved. A plan or a
  // rank that held every head and the whole vocabulary would be 45,056 params off.
  CHECK(plan.rank.dense == 4 * (2 * 64 + 2 * 16 + 8 * 64 + (128 + 64) * 64 / 2) + 64 +
                               2 * 320 * 64 / 2);
  c.colocate.colocate = true;  // kRunsOnlyAt: runs colocated only
  CHECK(PlanMemory(Resolve(c), Model(kMoeCi)).runnable_today());
  c.parallel.expert_model_parallel_size = 2;  // TP and EP together run too
  CHECK(PlanMemory(Resolve(c), Model(kMoeCi)).runnable_today());
}

}  // namespace
}  // namespace rl
