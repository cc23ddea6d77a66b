#include "trainer/config/validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <regex>
#include <type_traits>

namespace rl::config {

int64_t ParseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 15) return -1;
  const int64_t value = std::stoll(text.substr(0, digits));
  const std::string unit = text.substr(digits);
  int shift = 0;
  if (unit == "KiB") {
    shift = 10;
  } else if (unit == "MiB") {
    shift = 20;
  } else if (unit == "GiB") {
    shift = 30;
  } else if (!unit.empty() && unit != "B") {
    return -1;
  }
  // 15 digits of GiB do not fit in int64 (found by fuzz/toml_fuzz.cc: the shift overflowed).
  if (value > (std::numeric_limits<int64_t>::max() >> shift)) return -1;
  return value << shift;
}

namespace {

// The product of `factors`, or nullopt when it overflows int64 (a mistyped or hostile config:
// fuzz/toml_fuzz.cc found the unchecked products).
std::optional<int64_t> CheckedProduct(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (const int64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product)) return std::nullopt;
  }
  return product;
}

// libstdc++'s std::regex compiler recurses once per term and reads repetition counts and
// backreference numbers into an int without an overflow check (fuzz/toml_fuzz.cc found both), so
// a pattern is refused before it is compiled when it is longer than this or holds a number longer
// than kMaxRegexNumberDigits. Parameter-name patterns are far shorter.
constexpr size_t kMaxRegexBytes = 1024;
constexpr size_t kMaxRegexNumberDigits = 6;

// Why `pattern` is refused before compiling it, or "".
std::string RegexSizeProblem(const std::string& pattern) {
  if (pattern.size() > kMaxRegexBytes) {
    return fmt::format("is {} bytes long; at most {} are accepted", pattern.size(), kMaxRegexBytes);
  }
  size_t run = 0;
  for (const char c : pattern) {
    run = std::isdigit(static_cast<unsigned char>(c)) ? run + 1 : 0;
    if (run > kMaxRegexNumberDigits) {
      return fmt::format("holds a number of more than {} digits", kMaxRegexNumberDigits);
    }
  }
  return "";
}

// The longest --comm-timeout-s accepted (its --help says so too).
constexpr int64_t kMaxCommTimeoutS = 1'000'000;

class Rules {
 public:
  explicit Rules(std::vector<std::string>& errors) : errors_(errors) {}
  template <class... Args>
  void Require(bool ok, fmt::format_string<Args...> message, Args&&... args) {
    if (!ok) errors_.push_back(fmt::format(message, std::forward<Args>(args)...));
  }
 private:
  std::vector<std::string>& errors_;
};

// The rematerialize rules, in the order miles checks them. Runs after the colocate/offload
// derivations, which miles also applies first.
void ValidateRematerialize(Rules& rules, ResolvedConfig& r) {
  Config& c = r.config;
  const bool asked_check = c.backup.check_rematerialize_param_from_master_weight.value_or(false);
  if (!c.colocate.rematerialize_param_from_master_weight) {
    rules.Require(!asked_check,
                  "--check-rematerialize-param-from-master-weight needs "
                  "--rematerialize-param-from-master-weight (there is no rebuild to check)");
    c.backup.check_rematerialize_param_from_master_weight = false;
    return;
  }
  // 2. No rollout engine means no weight sync, so the param buffer would never be paused.
  if (c.colocate.debug_train_only) {
    rules.Require(!asked_check,
                  "--check-rematerialize-param-from-master-weight has nothing to check with "
                  "--debug-train-only (no rollout engine, so the params are never paused and "
                  "rebuilt)");
    c.colocate.rematerialize_param_from_master_weight = false;
    c.backup.check_rematerialize_param_from_master_weight = false;
    return;
  }
  // 3 (train backend) and 6 (independent DP cells) have no counterpart here: one backend, no
  // fault-tolerant cells.
  rules.Require(c.model.lora_rank == 0,
                "--rematerialize-param-from-master-weight does not support LoRA (--lora-rank {}): "
                "the frozen base weights have no master to rebuild from; drop one of them",
                c.model.lora_rank);
  rules.Require(!c.optimizer.debug_disable_optimizer,
                "--rematerialize-param-from-master-weight with --debug-disable-optimizer leaves no "
                "master params to rematerialize from; drop one of them");
  rules.Require(c.colocate.colocate && c.colocate.offload_train.value_or(false),
                "--rematerialize-param-from-master-weight needs --colocate and --offload-train "
                "(the rebuild replaces the host backup of a released param buffer)");
  rules.Require(c.colocate.offload_train_target == OffloadTarget::kCpu,
                "--rematerialize-param-from-master-weight needs --offload-train-target cpu: the "
                "disk target streams the weights to NVMe and reads them back, so there is no "
                "backup for the rebuild to replace");
  rules.Require(c.parallel.use_distributed_optimizer,
                "--rematerialize-param-from-master-weight needs --use-distributed-optimizer (the "
                "rebuild casts each rank's master shard and all-gathers the param buffer)");
  rules.Require(!c.colocate.keep_old_actor,
                "--keep-old-actor needs a second pinned copy of the actor, which the rematerialize "
                "backuper does not keep; drop --keep-old-actor or --rematerialize-param-from-master-weight");
  rules.Require(!c.optimizer.use_precision_aware_optimizer || c.optimizer.optimizer_cpu_offload,
                "--use-precision-aware-optimizer on the GPU keeps the masters inside the optimizer "
                "as remainders of the params: there is nothing standalone to rebuild from. Add "
                "--optimizer-cpu-offload or drop --rematerialize-param-from-master-weight");
  rules.Require(!c.parallel.overlap_param_gather,
                "--rematerialize-param-from-master-weight needs --no-overlap-param-gather: the "
                "rebuild all-gathers the params outside the training step");
  rules.Require(c.rl.compute_advantages_and_returns,
                "--rematerialize-param-from-master-weight needs --compute-advantages-and-returns: "
                "the per-cycle rebuild runs in that block; without it training would run on "
                "released weights");
  rules.Require(c.rl.num_critic_only_steps == 0,
                "--num-critic-only-steps {} runs weight syncs without an actor wake-up in between, "
                "which would pause the param buffer twice; use 0 with "
                "--rematerialize-param-from-master-weight",
                c.rl.num_critic_only_steps);
  // 15. Derived.
  if (!c.backup.check_rematerialize_param_from_master_weight.has_value()) {
    c.backup.check_rematerialize_param_from_master_weight = c.checks.ci_test;
  }
}

// Note [Finite numbers]: every number option must be finite. TOML spells inf and nan, and so do
// the flags (`--lr inf`), and a NaN passes every range check written as `!(x < bound)` while an
// infinity passes every lower bound: `--lr inf` or `--weight-decay inf` would validate and turn
// the weights into NaN at the first step, and a huge factor cast to an integer is undefined. One
// rule over every double option of the table, so that an option added later is covered too; the
// range rules of single options (ValidateRanges) come on top of it.
void ValidateFinite(Rules& rules, const Config& c) {
  VisitOptions(c, [&](const OptionInfo& info, const auto& member) {
    using T = std::decay_t<decltype(member)>;
    if constexpr (std::is_same_v<T, double>) {
      rules.Require(std::isfinite(member), "{} must be a finite number; got {}", FlagName(info.key),
                    member);
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      rules.Require(!member.has_value() || std::isfinite(*member),
                    "{} must be a finite number; got {}", FlagName(info.key), member.value_or(0));
    }
  });
}

void ValidateRanges(Rules& rules, const Config& c) {
  rules.Require(c.run.num_rollout >= 1, "--num-rollout must be at least 1; got {}",
                c.run.num_rollout);
  rules.Require(c.run.actor_num_nodes >= 1 && c.run.actor_num_gpus_per_node >= 1,
                "--actor-num-nodes and --actor-num-gpus-per-node must be at least 1; got {} and {}",
                c.run.actor_num_nodes, c.run.actor_num_gpus_per_node);

  if (c.model.init == InitMode::kCheckpoint) {
    rules.Require(!c.model.hf_checkpoint.empty(),
                  "--init checkpoint needs --hf-checkpoint DIR (or use --init random with "
                  "--model-config FILE)");
  } else {
    rules.Require(!c.model.model_config.empty() || !c.model.hf_checkpoint.empty(),
                  "--init random needs --model-config FILE (a config.json) or --hf-checkpoint DIR "
                  "to take the architecture from");
  }
  rules.Require(c.model.lora_rank >= 0, "--lora-rank must be >= 0; got {}", c.model.lora_rank);
  if (!c.model.freeze_params.empty()) {
    const std::string problem = RegexSizeProblem(c.model.freeze_params);
    rules.Require(problem.empty(), "--freeze-params '{}' {}", c.model.freeze_params, problem);
    if (problem.empty()) {
      try {
        std::regex check(c.model.freeze_params);
      } catch (const std::regex_error& e) {
        rules.Require(false, "--freeze-params '{}' is not a valid regular expression: {}",
                      c.model.freeze_params, e.what());
      }
    }
  }

  const auto& p = c.parallel;
  for (const auto& [flag, value] :
       {std::pair{"--tensor-model-parallel-size", p.tensor_model_parallel_size},
        {"--pipeline-model-parallel-size", p.pipeline_model_parallel_size},
        {"--context-parallel-size", p.context_parallel_size},
        {"--expert-model-parallel-size", p.expert_model_parallel_size},
        {"--expert-tensor-parallel-size", p.expert_tensor_parallel_size}}) {
    rules.Require(value >= 1, "{} must be at least 1; got {}", flag, value);
  }
  rules.Require(p.decoder_last_pipeline_num_layers >= 0,
                "--decoder-last-pipeline-num-layers must be >= 0; got {}",
                p.decoder_last_pipeline_num_layers);
  // Note [Timeout comparison] (launch/communicator.h): the communicators hold the timeout in
  // milliseconds and compare it with steady_clock durations; 10^6 s (11.6 days) is far from
  // either's limit and far beyond any collective.
  rules.Require(p.comm_timeout_s >= 1 && p.comm_timeout_s <= kMaxCommTimeoutS,
                "--comm-timeout-s must be in [1, {}] (seconds); got {}", kMaxCommTimeoutS,
                p.comm_timeout_s);

  const auto& o = c.optimizer;
  rules.Require(o.lr > 0, "--lr must be positive; got {}", o.lr);
  rules.Require(o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr must be in [0, --lr]; got {}",
                o.min_lr);
  rules.Require(o.lr_warmup_iters >= 0 && o.lr_decay_iters >= 0,
                "--lr-warmup-iters and --lr-decay-iters must be >= 0");
  rules.Require(o.weight_decay >= 0, "--weight-decay must be >= 0; got {}", o.weight_decay);
  rules.Require(o.adam_beta1 >= 0 && o.adam_beta1 < 1, "--adam-beta1 must be in [0, 1); got {}",
                o.adam_beta1);
  rules.Require(o.adam_beta2 >= 0 && o.adam_beta2 < 1, "--adam-beta2 must be in [0, 1); got {}",
                o.adam_beta2);
  rules.Require(o.adam_eps > 0, "--adam-eps must be positive; got {}", o.adam_eps);
  rules.Require(o.clip_grad >= 0, "--clip-grad must be >= 0 (0 disables); got {}", o.clip_grad);

  const auto& ro = c.rollout;
  rules.Require(ro.rollout_batch_size >= 1, "--rollout-batch-size must be at least 1; got {}",
                ro.rollout_batch_size);
  rules.Require(ro.n_samples_per_prompt >= 1, "--n-samples-per-prompt must be at least 1; got {}",
                ro.n_samples_per_prompt);
  rules.Require(ro.rollout_max_prompt_len >= 0,
                "--rollout-max-prompt-len must be at least 0 (0 = the model's context less the "
                "response); got {}",
                ro.rollout_max_prompt_len);
  rules.Require(ro.rollout_max_response_len >= 1,
                "--rollout-max-response-len must be at least 1; got {}",
                ro.rollout_max_response_len);
  rules.Require(ro.rollout_temperature > 0, "--rollout-temperature must be positive; got {}",
                ro.rollout_temperature);
  rules.Require(ro.rollout_ep_capacity_factor >= 0,
                "--rollout-ep-capacity-factor must be >= 0 (0 = the worst case); got {}",
                ro.rollout_ep_capacity_factor);
  rules.Require(ro.rollout_top_p > 0 && ro.rollout_top_p <= 1,
                "--rollout-top-p must be in (0, 1]; got {}", ro.rollout_top_p);
  rules.Require(ro.rollout_top_k == -1 || ro.rollout_top_k >= 1,
                "--rollout-top-k must be -1 (off) or at least 1; got {}", ro.rollout_top_k);
  for (const int64_t id : ro.rollout_stop_token_ids) {
    rules.Require(id >= 0, "--rollout-stop-token-ids must be token ids >= 0; got {}", id);
  }
  rules.Require(ro.global_batch_size >= 0 && ro.num_steps_per_rollout >= 0,
                "--global-batch-size and --num-steps-per-rollout must be >= 0 (0 = derived)");
  rules.Require(ro.micro_batch_size >= 1, "--micro-batch-size must be at least 1; got {}",
                ro.micro_batch_size);
  rules.Require(ro.max_tokens_per_gpu >= 0, "--max-tokens-per-gpu must be >= 0; got {}",
                ro.max_tokens_per_gpu);
  rules.Require(!ro.use_dynamic_batch_size || ro.max_tokens_per_gpu != 0,
                "--use-dynamic-batch-size needs --max-tokens-per-gpu >= 1 (the padded-token budget "
                "of a micro-batch); set it or drop --use-dynamic-batch-size");

  const auto& rl = c.rl;
  rules.Require(rl.advantage_estimator != AdvantageEstimator::kPpo,
                "--advantage-estimator ppo needs a critic model, which this trainer does not have; "
                "use grpo, gspo, reinforce_plus_plus or reinforce_plus_plus_baseline");
  rules.Require(rl.eps_clip > 0, "--eps-clip must be positive; got {}", rl.eps_clip);
  rules.Require(!rl.eps_clip_high.has_value() || *rl.eps_clip_high > 0,
                "--eps-clip-high must be positive; got {}", rl.eps_clip_high.value_or(0));
  rules.Require(!rl.eps_clip_c.has_value() || *rl.eps_clip_c > 1,
                "--eps-clip-c (dual clip) must be greater than 1; got {}",
                rl.eps_clip_c.value_or(0));
  rules.Require(rl.kl_loss_coef >= 0 && rl.kl_coef >= 0,
                "--kl-loss-coef and --kl-coef must be >= 0; got {} and {}", rl.kl_loss_coef,
                rl.kl_coef);
  rules.Require(rl.tis_clip_low >= 0 && rl.tis_clip > rl.tis_clip_low,
                "--tis-clip-low must be >= 0 and below --tis-clip; got {} and {}", rl.tis_clip_low,
                rl.tis_clip);
  rules.Require(rl.entropy_coef >= 0, "--entropy-coef must be >= 0 (0 = no entropy bonus); got {}",
                rl.entropy_coef);
  rules.Require(rl.num_critic_only_steps >= 0, "--num-critic-only-steps must be >= 0");

  rules.Require(c.colocate.offload_train_target != OffloadTarget::kDisk,
                "--offload-train-target disk is not supported by this trainer yet; use cpu");

  rules.Require(!c.colocate.debug_train_only || !c.data.load_debug_rollout_data.empty(),
                "--debug-train-only trains on recorded data: pass --load-debug-rollout-data FILE");
  rules.Require(c.logging.save_interval >= 0, "--save-interval must be >= 0; got {}",
                c.logging.save_interval);
  rules.Require(c.logging.save_interval == 0 || !c.logging.save.empty(),
                "--save-interval {} needs --save DIR", c.logging.save_interval);
}

}  // namespace

ValidationResult Validate(const Config& input) {
  ValidationResult result;
  ResolvedConfig& r = result.resolved;
  r.config = input;
  Config& c = r.config;
  Rules rules(result.errors);

  ValidateFinite(rules, c);
  ValidateRanges(rules, c);

  // The colocate/offload/backup rules and derived values, in the order miles applies them.
  if (c.colocate.debug_rollout_only) {
    rules.Require(!c.colocate.debug_train_only,
                  "--debug-rollout-only and --debug-train-only exclude each other; pass one");
    c.colocate.colocate = false;
    c.colocate.offload_train = false;
    c.colocate.offload_rollout = false;
  }
  // Replaying recorded data without --debug-train-only keeps the colocated cycle running; only
  // --debug-train-only removes the rollout engine.
  const bool ci_checks_sync = c.checks.ci_test && !c.colocate.debug_rollout_only &&
                              !c.colocate.debug_train_only &&
                              !c.checks.ci_disable_weight_update_checker;
  if (!c.weight_sync.check_weight_update_equal.has_value()) {
    c.weight_sync.check_weight_update_equal = ci_checks_sync;
  }
  rules.Require(!(*c.weight_sync.check_weight_update_equal && c.colocate.debug_train_only),
                "--check-weight-update-equal has nothing to check with --debug-train-only (no "
                "rollout engine)");
  if (c.colocate.colocate) {
    if (!c.colocate.offload_train.has_value()) c.colocate.offload_train = true;
    if (!c.colocate.offload_rollout.has_value()) c.colocate.offload_rollout = true;
  }
  if (!c.colocate.offload_train.has_value()) c.colocate.offload_train = false;
  if (!c.colocate.offload_rollout.has_value()) c.colocate.offload_rollout = false;
  r.param_buffer_host_backup = !*c.colocate.offload_train;
  r.grad_buffer_host_backup = !*c.colocate.offload_train;

  ValidateRematerialize(rules, r);

  // Note [Routing replay modes] (trainer/routing_replay.h): R3 implies R2; R2 alone replays what
  // the old-logprob pass chose, which --use-rollout-logprobs skips.
  if (c.rl.use_rollout_routing_replay) c.rl.use_routing_replay = true;
  rules.Require(!c.rl.use_routing_replay || c.rl.use_rollout_routing_replay ||
                    !c.rl.use_rollout_logprobs || c.rl.use_tis,
                "--use-routing-replay replays the experts of the old-logprob pass, which "
                "--use-rollout-logprobs skips; use --use-rollout-routing-replay (the engine's "
                "experts) instead");

  r.with_ref = c.rl.kl_coef != 0 || c.rl.use_kl_loss;
  if (!c.rl.eps_clip_high.has_value()) c.rl.eps_clip_high = c.rl.eps_clip;

  // Batch geometry: global batch = rollout batch * samples per prompt / steps per rollout.
  const std::optional<int64_t> checked_samples =
      CheckedProduct({c.rollout.rollout_batch_size, c.rollout.n_samples_per_prompt});
  rules.Require(checked_samples.has_value(),
                "--rollout-batch-size {} x --n-samples-per-prompt {} does not fit in int64",
                c.rollout.rollout_batch_size, c.rollout.n_samples_per_prompt);
  const int64_t samples = checked_samples.value_or(0);
  if (samples > 0) {
    int64_t& gbs = c.rollout.global_batch_size;
    int64_t& steps = c.rollout.num_steps_per_rollout;
    if (steps > 0) {
      rules.Require(samples % steps == 0,
                    "--num-steps-per-rollout {} does not divide the {} samples of a rollout "
                    "(--rollout-batch-size x --n-samples-per-prompt)",
                    steps, samples);
      const int64_t derived = samples / steps;
      rules.Require(gbs == 0 || gbs == derived,
                    "--global-batch-size {} disagrees with --num-steps-per-rollout {}: a rollout "
                    "has {} samples, so the global batch is {}; set only one of them",
                    gbs, steps, samples, derived);
      gbs = derived;
    } else if (gbs > 0) {
      rules.Require(samples % gbs == 0,
                    "--global-batch-size {} does not divide the {} samples of a rollout "
                    "(--rollout-batch-size x --n-samples-per-prompt)",
                    gbs, samples);
      steps = std::max<int64_t>(1, samples / gbs);
    } else {
      steps = 1;
      gbs = samples;
    }
    rules.Require(c.rollout.micro_batch_size < 1 || gbs % c.rollout.micro_batch_size == 0,
                  "--micro-batch-size {} does not divide the global batch of {} samples",
                  c.rollout.micro_batch_size, gbs);
  }
  if (c.rollout.n_samples_per_prompt == 1) c.rl.grpo_std_normalization = false;

  if (c.checks.ci_test && !c.checks.ci_disable_kl_checker && !c.colocate.debug_rollout_only) {
    // The loss's old policy is the engine's whenever --use-rollout-logprobs is on, even when
    // --use-tis still runs the old-logprob pass (trainer/rl/losses.h PolicyLoss).
    r.check_kl = c.rl.use_rollout_logprobs ? FirstStepKlCheck::kWithinMismatch
                                           : FirstStepKlCheck::kExactlyZero;
  }
  r.check_weight_version = c.checks.ci_test && !c.colocate.debug_train_only &&
                           !c.colocate.debug_rollout_only;

  r.update_weight_buffer_bytes = ParseByteSize(c.weight_sync.update_weight_buffer_size);
  rules.Require(r.update_weight_buffer_bytes > 0,
                "--update-weight-buffer-size must be a positive size like 512MiB or 2GiB; got '{}'",
                c.weight_sync.update_weight_buffer_size);

  // The planned layout must tile the planned world.
  const auto& p = c.parallel;
  const std::optional<int64_t> world =
      CheckedProduct({c.run.actor_num_nodes, c.run.actor_num_gpus_per_node});
  const std::optional<int64_t> checked_model_parallel = CheckedProduct(
      {p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size});
  const std::optional<int64_t> checked_expert_parallel =
      CheckedProduct({p.expert_model_parallel_size, p.expert_tensor_parallel_size,
                      p.pipeline_model_parallel_size});
  rules.Require(world.has_value(),
                "--actor-num-nodes {} x --actor-num-gpus-per-node {} does not fit in int64",
                c.run.actor_num_nodes, c.run.actor_num_gpus_per_node);
  rules.Require(checked_model_parallel.has_value() && checked_expert_parallel.has_value(),
                "the parallel sizes TP x PP x CP or EP x ETP x PP do not fit in int64");
  r.planned_world_size = world.value_or(0);
  const int64_t model_parallel = checked_model_parallel.value_or(0);
  const int64_t expert_parallel = checked_expert_parallel.value_or(0);
  if (model_parallel > 0 && expert_parallel > 0) {
    rules.Require(r.planned_world_size % model_parallel == 0,
                  "TP x PP x CP = {} does not divide the {} ranks of --actor-num-nodes x "
                  "--actor-num-gpus-per-node",
                  model_parallel, r.planned_world_size);
    rules.Require(r.planned_world_size % expert_parallel == 0,
                  "EP x ETP x PP = {} does not divide the {} ranks of --actor-num-nodes x "
                  "--actor-num-gpus-per-node",
                  expert_parallel, r.planned_world_size);
    r.planned_dp_size = std::max<int64_t>(1, r.planned_world_size / model_parallel);
    r.planned_expert_dp_size = std::max<int64_t>(1, r.planned_world_size / expert_parallel);
  }
  return result;
}

}  // namespace rl::config
