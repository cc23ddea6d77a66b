#include "trainer/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <regex>
#include <utility>
#include <vector>

#include "launch/check.h"
#include "trainer/config/config.h"
#include "trainer/model/params.h"

namespace rl {
namespace {

constexpr int64_t kBf16Bytes = 2;
constexpr int64_t kFp32Bytes = 4;
constexpr int64_t kAdamMomentBytes = 8;  // two fp32 moments

// Decoder layers of each pipeline stage.
std::vector<int64_t> StageLayers(int64_t num_layers, int64_t pp, int64_t last_stage_layers) {
  std::vector<int64_t> layers(pp, 0);
  int64_t remaining = num_layers;
  int64_t stages = pp;
  if (pp > 1 && last_stage_layers > 0) {
    layers[pp - 1] = std::min(last_stage_layers, num_layers);
    remaining -= layers[pp - 1];
    stages = pp - 1;
  }
  for (int64_t s = 0; s < stages; ++s) {
    layers[s] = remaining / stages + (s < remaining % stages ? 1 : 0);
  }
  return layers;
}

// Elements of `shape` one rank holds under the sharding model of plan.h.
int64_t LocalNumel(const ParamSpec& spec, const model::ModelConfig& m,
                   const config::ParallelOptions& p) {
  const int64_t numel = spec.numel();
  const std::string& name = spec.name;
  if (spec.role == ParamRole::kRoutedExpert) {
    // Stacked experts [E, ...] (Note [Stacked experts] in params.h): EP rank 0 holds the first
    // E / EP experts (at least one), each split over ETP.
    const int64_t experts = spec.shape.at(0);
    const int64_t local_experts =
        std::min(experts, std::max<int64_t>(1, experts / p.expert_model_parallel_size));
    return numel / experts * local_experts / p.expert_tensor_parallel_size;
  }
  if (spec.role == ParamRole::kFp32Extra || spec.shape.size() < 2) {
    // Norms and extras are replicated; column-parallel biases (q/k/v) follow their weight.
    const bool column_bias = name.find("_proj.bias") != std::string::npos &&
                             name.find("o_proj") == std::string::npos;
    if (column_bias && (name.find("q_proj") != std::string::npos ||
                        m.num_key_value_heads % p.tensor_model_parallel_size == 0)) {
      return numel / p.tensor_model_parallel_size;
    }
    return numel;
  }
  const bool replicated = name.find(".mlp.gate.weight") != std::string::npos ||
                          name.find(".indexer.") != std::string::npos ||
                          name.find("q_a_proj") != std::string::npos ||
                          name.find("kv_a_proj_with_mqa") != std::string::npos;
  if (replicated) return numel;
  const bool kv = name.find("k_proj") != std::string::npos ||
                  name.find("v_proj") != std::string::npos;
  if (kv && m.attention_kind() == model::AttentionKind::kGqa &&
      m.num_key_value_heads % p.tensor_model_parallel_size != 0) {
    return numel;
  }
  return numel / p.tensor_model_parallel_size;
}

}  // namespace

MemoryPlan PlanMemory(const config::ResolvedConfig& resolved, const model::ModelConfig& m) {
  const config::Config& c = resolved.config;
  const config::ParallelOptions& p = c.parallel;
  const std::vector<ParamSpec> specs = model::ListParams(m);
  const int64_t pp = p.pipeline_model_parallel_size;
  const std::vector<int64_t> stage_layers =
      StageLayers(m.num_hidden_layers, pp, p.decoder_last_pipeline_num_layers);
  std::vector<int64_t> first_layer(pp, 0);
  for (int64_t s = 1; s < pp; ++s) first_layer[s] = first_layer[s - 1] + stage_layers[s - 1];

  MemoryPlan plan;
  std::vector<ParamCounts> per_stage(pp);
  const std::regex layer_re(R"(^model\.layers\.(\d+)\.)");
  for (const ParamSpec& spec : specs) {
    plan.model.Of(spec.role) += spec.numel();

    int64_t stage = 0;
    std::smatch match;
    if (std::regex_search(spec.name, match, layer_re)) {
      const int64_t layer = std::stoll(match[1]);
      while (stage + 1 < pp && layer >= first_layer[stage + 1]) ++stage;
    } else if (spec.name.rfind("model.embed_tokens", 0) != 0) {
      stage = pp - 1;  // final norm, LM head
    }
    per_stage[stage].Of(spec.role) += LocalNumel(spec, m, p);
  }

  const auto heaviest = std::max_element(
      per_stage.begin(), per_stage.end(),
      [](const ParamCounts& a, const ParamCounts& b) { return a.total() < b.total(); });
  plan.stage = heaviest - per_stage.begin();
  plan.stage_layers = stage_layers[plan.stage];
  plan.rank = *heaviest;

  const int64_t trained = plan.rank.dense + plan.rank.expert;
  const int64_t shard = plan.rank.dense / resolved.planned_dp_size +
                        plan.rank.expert / resolved.planned_expert_dp_size;
  plan.gpu.param_buffer = kBf16Bytes * trained;
  plan.gpu.grad_buffer = kFp32Bytes * trained;
  const bool cpu_optimizer = c.optimizer.optimizer_cpu_offload;
  plan.gpu.masters = cpu_optimizer ? 0 : kFp32Bytes * shard;
  plan.gpu.moments = cpu_optimizer ? 0 : kAdamMomentBytes * shard;
  plan.gpu.extras = kFp32Bytes * plan.rank.extra;

  HostBytes host;
  const bool offload = c.colocate.offload_train.value_or(false);
  host.optimizer_state = (offload || cpu_optimizer) ? (kFp32Bytes + kAdamMomentBytes) * shard : 0;
  host.extras_pinned = kFp32Bytes * plan.rank.extra;
  host.ref_pinned =
      resolved.with_ref ? kBf16Bytes * trained + kFp32Bytes * plan.rank.extra : 0;
  plan.host_backup = host;
  plan.host_backup.param_backup_pinned = kBf16Bytes * trained;
  plan.host_remat = host;
  plan.host_remat.param_backup_pinned = 0;

  // Note [Runnable today]: the start-up checks of a run, for the planned world.
  plan.not_runnable = config::NotRunnable(c);
  // The rank grid's checks take the ranks as TP x DP: with PP or CP (refused just above) their
  // data-parallel count would not be the plan's.
  if (c.parallel.pipeline_model_parallel_size * c.parallel.context_parallel_size == 1) {
    for (std::string& problem : LayoutProblems(c, m, resolved.planned_world_size,
                                               "--actor-num-nodes x --actor-num-gpus-per-node")) {
      plan.not_runnable.push_back(std::move(problem));
    }
  }
  return plan;
}

std::vector<std::string> LayoutProblems(const config::Config& config,
                                        const model::ModelConfig& model, int64_t world_size,
                                        const std::string& ranks_from) {
  const int64_t tp = config.parallel.tensor_model_parallel_size;
  const int64_t ep = config.parallel.expert_model_parallel_size;
  std::vector<std::string> problems;
  if (tp < 1 || world_size % tp != 0) {
    problems.push_back(
        fmt::format("--tensor-model-parallel-size {} does not divide the {} ranks "
                    "({})",
                    tp, world_size, ranks_from));
  } else if (config.rollout.global_batch_size % (world_size / tp) != 0) {
    problems.push_back(
        fmt::format("--global-batch-size {} is not a multiple of the {} data-parallel ranks ({} / "
                    "--tensor-model-parallel-size)",
                    config.rollout.global_batch_size, world_size / tp, ranks_from));
  }
  if (ep < 1 || world_size % ep != 0) {
    problems.push_back(
        fmt::format("--expert-model-parallel-size {} does not divide the {} ranks ({})", ep,
                    world_size, ranks_from));
  }
  if (ep > 1 && !(model.is_moe() && model.n_routed_experts % ep == 0)) {
    problems.push_back(
        fmt::format("--expert-model-parallel-size {} needs an MoE model whose expert count it "
                    "divides; {} has {} routed experts",
                    ep, model.source_name, model.n_routed_experts));
  }
  if (tp > 1) {
    // Note [Tensor shard]: ListParams checks that the heads and features divide; every TP rank
    // splits them alike, so rank 0's list stands for all.
    model::ModelConfig shard = model;
    shard.tensor_shard = {0, tp};
    try {
      model::ListParams(shard);
    } catch (const ConfigError& e) {
      problems.push_back(e.what());
    }
  }
  return problems;
}

namespace {
// Bytes in the largest binary unit that keeps the number at or above 1.
std::string Gib(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (int64_t{1} << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / (int64_t{1} << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.2f} KiB", b / (int64_t{1} << 10));
  return fmt::format("{} B", bytes);
}
// A parameter count in B(illions), M or K.
std::string Billions(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.3f} B", n / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.3f} M", n / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f} K", n / 1e3);
  return fmt::format("{}", n);
}
}  // namespace

std::string FormatPlan(const config::ResolvedConfig& resolved, const model::ModelConfig& m,
                       const MemoryPlan& plan) {
  const config::Config& c = resolved.config;
  const auto& p = c.parallel;
  const bool remat = c.colocate.rematerialize_param_from_master_weight;
  std::string out;
  out += fmt::format(
      "memory plan: {} ({}), {} layers, {} ranks ({} nodes x {})\n", m.source_name,
      model::ModelTypeName(m.model_type), m.num_hidden_layers, resolved.planned_world_size,
      c.run.actor_num_nodes, c.run.actor_num_gpus_per_node);
  out += fmt::format(
      "layout: TP {} PP {} CP {} EP {} ETP {} -> DP {}, expert DP {}; {}\n",
      p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
      p.expert_model_parallel_size, p.expert_tensor_parallel_size, resolved.planned_dp_size,
      resolved.planned_expert_dp_size,
      plan.runnable_today() ? "runnable by this binary today (data, tensor and expert parallel)"
                            : "planned only: this binary cannot run it today (the reasons below)");
  out += fmt::format("model: {} params ({} dense, {} routed-expert, {} fp32 extras)\n",
                     Billions(plan.model.total()), Billions(plan.model.dense),
                     Billions(plan.model.expert), Billions(plan.model.extra));
  out += fmt::format(
      "one rank (pipeline stage {} of {}, {} layers): {} params ({} dense, {} expert, {} "
      "extras)\n\n",
      plan.stage, p.pipeline_model_parallel_size, plan.stage_layers, Billions(plan.rank.total()),
      Billions(plan.rank.dense), Billions(plan.rank.expert), Billions(plan.rank.extra));
  out += "GPU bytes per rank (awake)\n";
  out += fmt::format("  {:<30}{:>14}\n", "param buffer (bf16)", Gib(plan.gpu.param_buffer));
  out += fmt::format("  {:<30}{:>14}\n", "grad buffer (fp32)", Gib(plan.gpu.grad_buffer));
  out += fmt::format("  {:<30}{:>14}\n", "optimizer masters (fp32)", Gib(plan.gpu.masters));
  out += fmt::format("  {:<30}{:>14}\n", "optimizer moments (2 x fp32)", Gib(plan.gpu.moments));
  out += fmt::format("  {:<30}{:>14}\n", "extras (fp32)", Gib(plan.gpu.extras));
  out += fmt::format("  {:<30}{:>14}\n\n", "total", Gib(plan.gpu.gpu_total()));
  out += fmt::format("host bytes per rank while the actor sleeps   {:>14}{:>16}{:>14}\n",
                     "pinned backup", "rematerialize", "difference");
  auto row = [&](const char* what, int64_t a, int64_t b) {
    out += fmt::format("  {:<43}{:>14}{:>16}{:>14}\n", what, Gib(a), Gib(b), Gib(a - b));
  };
  row("optimizer state (masters + moments)", plan.host_backup.optimizer_state,
      plan.host_remat.optimizer_state);
  row("extras (pinned)", plan.host_backup.extras_pinned, plan.host_remat.extras_pinned);
  row("param backup (pinned bf16)", plan.host_backup.param_backup_pinned,
      plan.host_remat.param_backup_pinned);
  row("reference model (pinned)", plan.host_backup.ref_pinned, plan.host_remat.ref_pinned);
  row("total", plan.host_backup.total(), plan.host_remat.total());
  out += fmt::format("\nthis recipe uses: {}\n",
                     remat ? "rematerialize (--rematerialize-param-from-master-weight)"
                           : "the pinned backup");
  if (!plan.not_runnable.empty()) {
    out += "\nnot runnable by this binary today:\n";
    for (const std::string& problem : plan.not_runnable) out += "  " + problem + "\n";
  }
  return out;
}

}  // namespace rl
