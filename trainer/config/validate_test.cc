// Validation: one test per rule (accepted and rejected) and one per derived value.
#include "trainer/config/validate.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace rl::config {
namespace {

// A colocated rematerialize run that breaks no rule.
Config Remat() {
  Config c;
  c.model.init = InitMode::kRandom;
  c.model.model_config = "configs/models/tiny.json";
  c.colocate.colocate = true;
  c.colocate.rematerialize_param_from_master_weight = true;
  return c;
}

// Remat() training only, on recorded rollout data.
Config RematTrainOnly() {
  Config c = Remat();
  c.colocate.debug_train_only = true;
  c.data.load_debug_rollout_data = "recorded.jsonl";
  return c;
}

// The single error of `c`, or "" when it validates.
std::string OnlyError(const Config& c) {
  const ValidationResult result = Validate(c);
  if (result.errors.empty()) return "";
  INFO("all errors: " << result.errors.size());
  REQUIRE(result.errors.size() == 1);
  return result.errors[0];
}

bool Mentions(const std::string& error, const std::string& flag) {
  return error.find(flag) != std::string::npos;
}

TEST_CASE("the base rematerialize config validates") { CHECK(OnlyError(Remat()).empty()); }

// ---- rematerialize rules ----------------------------------------------------------------------

TEST_CASE("rule: --debug-train-only needs recorded data") {
  Config c = Remat();
  c.colocate.debug_train_only = true;
  CHECK(Mentions(OnlyError(c), "--debug-train-only trains on recorded data"));
}

TEST_CASE("rule: rematerialize with --debug-train-only is silently turned off") {
  Config c = RematTrainOnly();
  const ValidationResult r = Validate(c);
  CHECK(r.ok());
  CHECK_FALSE(r.resolved.config.colocate.rematerialize_param_from_master_weight);
}

TEST_CASE("rule: an explicit rematerialize check with --debug-train-only is refused") {
  Config c = RematTrainOnly();
  c.backup.check_rematerialize_param_from_master_weight = true;
  CHECK(Mentions(OnlyError(c), "--check-rematerialize-param-from-master-weight"));
  // As --ci-test asks it (not explicitly): turned off with rematerialize, no error.
  c.backup.check_rematerialize_param_from_master_weight.reset();
  c.checks.ci_test = true;
  const ValidationResult r = Validate(c);
  CHECK(r.ok());
  CHECK(r.resolved.config.backup.check_rematerialize_param_from_master_weight == false);
}

TEST_CASE("rule: --load-debug-rollout-data alone keeps rematerialize on") {
  Config c = Remat();
  c.data.load_debug_rollout_data = "recorded.jsonl";
  const ValidationResult r = Validate(c);
  CHECK(r.ok());
  CHECK(r.resolved.config.colocate.rematerialize_param_from_master_weight);
}

TEST_CASE("rule: rematerialize refuses LoRA") {
  Config c = Remat();
  c.model.lora_rank = 8;
  CHECK(Mentions(OnlyError(c), "--lora-rank 8"));
  c.model.lora_rank = 0;
  CHECK(OnlyError(c).empty());
}

TEST_CASE("rule: rematerialize refuses --debug-disable-optimizer") {
  Config c = Remat();
  c.optimizer.debug_disable_optimizer = true;
  CHECK(Mentions(OnlyError(c), "--debug-disable-optimizer"));
}

TEST_CASE("rule: rematerialize needs --colocate and --offload-train") {
  Config c = Remat();
  c.colocate.colocate = false;
  CHECK(Mentions(OnlyError(c), "needs --colocate and --offload-train"));
  c = Remat();
  c.colocate.offload_train = false;
  CHECK(Mentions(OnlyError(c), "needs --colocate and --offload-train"));
  c.colocate.offload_train = true;
  CHECK(OnlyError(c).empty());
}

TEST_CASE("rule: rematerialize needs --offload-train-target cpu") {
  Config c = Remat();
  c.colocate.offload_train_target = OffloadTarget::kDisk;
  const ValidationResult r = Validate(c);
  REQUIRE(r.errors.size() == 2);  // disk is also not supported at all
  CHECK(Mentions(r.errors[1], "needs --offload-train-target cpu"));
}

TEST_CASE("rule: rematerialize needs --use-distributed-optimizer") {
  Config c = Remat();
  c.parallel.use_distributed_optimizer = false;
  CHECK(Mentions(OnlyError(c), "--use-distributed-optimizer"));
}

TEST_CASE("rule: rematerialize refuses --keep-old-actor") {
  Config c = Remat();
  c.colocate.keep_old_actor = true;
  CHECK(Mentions(OnlyError(c), "--keep-old-actor"));
  c.colocate.rematerialize_param_from_master_weight = false;
  CHECK(OnlyError(c).empty());
}

TEST_CASE("rule: GPU precision-aware optimizer needs --optimizer-cpu-offload") {
  Config c = Remat();
  c.optimizer.use_precision_aware_optimizer = true;
  CHECK(Mentions(OnlyError(c), "Add --optimizer-cpu-offload"));
  c.optimizer.optimizer_cpu_offload = true;
  CHECK(OnlyError(c).empty());
}

TEST_CASE("rule: rematerialize refuses --overlap-param-gather") {
  Config c = Remat();
  c.parallel.overlap_param_gather = true;
  CHECK(Mentions(OnlyError(c), "--no-overlap-param-gather"));
}

TEST_CASE("rule: rematerialize needs --compute-advantages-and-returns") {
  Config c = Remat();
  c.rl.compute_advantages_and_returns = false;
  CHECK(Mentions(OnlyError(c), "--compute-advantages-and-returns"));
}

TEST_CASE("rule: rematerialize refuses critic-only steps") {
  Config c = Remat();
  c.rl.num_critic_only_steps = 2;
  CHECK(Mentions(OnlyError(c), "--num-critic-only-steps 2"));
}

TEST_CASE("rule: the rebuild check needs rematerialize") {
  Config c;
  c.model.hf_checkpoint = "ckpt";
  c.backup.check_rematerialize_param_from_master_weight = true;
  CHECK(Mentions(OnlyError(c), "needs --rematerialize-param-from-master-weight"));
}

TEST_CASE("rules: accepted combinations with rematerialize (KL, reference model)") {
  Config c = Remat();
  c.rl.use_kl_loss = true;
  c.rl.kl_loss_coef = 0.01;
  CHECK(OnlyError(c).empty());
  c.rl.kl_coef = 0.1;
  CHECK(OnlyError(c).empty());
}

TEST_CASE("all violations are reported, not just the first") {
  Config c = Remat();
  c.model.lora_rank = 4;
  c.colocate.keep_old_actor = true;
  c.parallel.overlap_param_gather = true;
  c.rollout.rollout_temperature = 0;
  CHECK(Validate(c).errors.size() == 4);
}

// ---- colocate/offload rules and derived values ------------------------------------------------

TEST_CASE("derived: --ci-test turns on the rebuild check with rematerialize") {
  Config c = Remat();
  c.checks.ci_test = true;
  const ResolvedConfig r = Validate(c).resolved;
  CHECK(r.config.backup.check_rematerialize_param_from_master_weight == true);
  CHECK(Validate(Remat()).resolved.config.backup.check_rematerialize_param_from_master_weight ==
        false);
}

TEST_CASE("derived: --ci-test turns on the weight-update check, the KL and version checks") {
  Config c = Remat();
  c.checks.ci_test = true;
  const ResolvedConfig r = Validate(c).resolved;
  CHECK(r.config.weight_sync.check_weight_update_equal == true);
  CHECK(r.check_kl == FirstStepKlCheck::kExactlyZero);
  CHECK(r.check_weight_version);
  c.checks.ci_disable_weight_update_checker = true;
  c.checks.ci_disable_kl_checker = true;
  const ResolvedConfig off = Validate(c).resolved;
  CHECK(off.config.weight_sync.check_weight_update_equal == false);
  CHECK(off.check_kl == FirstStepKlCheck::kOff);
  CHECK(Validate(Remat()).resolved.check_kl == FirstStepKlCheck::kOff);  // no --ci-test
}

TEST_CASE(
    "derived: the first step's ppo_kl is held to the rollout/train mismatch whenever the "
    "engine's log-probs are the old policy, TIS or not") {
  Config c = Remat();
  c.checks.ci_test = true;
  c.rl.use_tis = true;  // TIS alone: the old policy is the trainer's recomputation
  CHECK(Validate(c).resolved.check_kl == FirstStepKlCheck::kExactlyZero);
  c.rl.use_rollout_logprobs = true;  // the old-logprob pass still runs (TIS needs it) ...
  const ValidationResult with_tis = Validate(c);
  REQUIRE(with_tis.ok());
  // ... but the loss's old policy is the engine's, so the first step's ppo_kl is the mismatch.
  CHECK(with_tis.resolved.check_kl == FirstStepKlCheck::kWithinMismatch);
  c.rl.use_tis = false;  // no old-logprob pass at all
  CHECK(Validate(c).resolved.check_kl == FirstStepKlCheck::kWithinMismatch);
}

TEST_CASE("derived: --ci-test with --debug-train-only has no weight-update check") {
  Config c = RematTrainOnly();
  c.checks.ci_test = true;
  const ValidationResult r = Validate(c);
  CHECK(r.ok());
  CHECK(r.resolved.config.weight_sync.check_weight_update_equal == false);
  CHECK_FALSE(r.resolved.check_weight_version);
}

TEST_CASE("rule: an explicit weight-update check with --debug-train-only is refused") {
  Config c = RematTrainOnly();
  c.weight_sync.check_weight_update_equal = true;
  CHECK(Mentions(OnlyError(c), "--check-weight-update-equal"));
}

TEST_CASE("derived: --colocate defaults offload on; without it offload is off") {
  Config c;
  c.model.hf_checkpoint = "ckpt";
  c.colocate.colocate = true;
  ResolvedConfig r = Validate(c).resolved;
  CHECK(r.config.colocate.offload_train == true);
  CHECK(r.config.colocate.offload_rollout == true);
  c.colocate.colocate = false;
  r = Validate(c).resolved;
  CHECK(r.config.colocate.offload_train == false);
  CHECK(r.config.colocate.offload_rollout == false);
}

TEST_CASE("derived: --offload-train means no host backup of the param and grad buffers") {
  Config c = Remat();
  CHECK_FALSE(Validate(c).resolved.param_buffer_host_backup);
  CHECK_FALSE(Validate(c).resolved.grad_buffer_host_backup);
  c.colocate.rematerialize_param_from_master_weight = false;
  c.colocate.offload_train = false;
  CHECK(Validate(c).resolved.param_buffer_host_backup);
}

TEST_CASE("rule: --debug-rollout-only and --debug-train-only exclude each other") {
  Config c;
  c.model.hf_checkpoint = "ckpt";
  c.colocate.debug_rollout_only = true;
  c.colocate.debug_train_only = true;
  c.data.load_debug_rollout_data = "recorded.jsonl";
  CHECK(Mentions(OnlyError(c), "exclude each other"));
}

TEST_CASE("derived: --debug-rollout-only turns colocate and offload off") {
  Config c;
  c.model.hf_checkpoint = "ckpt";
  c.colocate.colocate = true;
  c.colocate.debug_rollout_only = true;
  const ResolvedConfig r = Validate(c).resolved;
  CHECK_FALSE(r.config.colocate.colocate);
  CHECK(r.config.colocate.offload_train == false);
}

TEST_CASE("derived: --eps-clip-high defaults to --eps-clip") {
  Config c = Remat();
  c.rl.eps_clip = 0.3;
  CHECK(Validate(c).resolved.config.rl.eps_clip_high == 0.3);
  c.rl.eps_clip_high = 0.28;
  CHECK(Validate(c).resolved.config.rl.eps_clip_high == 0.28);
}

TEST_CASE("derived: global batch from rollout batch, samples per prompt and steps") {
  Config c = Remat();
  c.rollout.rollout_batch_size = 8;
  c.rollout.n_samples_per_prompt = 8;
  CHECK(Validate(c).resolved.config.rollout.global_batch_size == 64);
  CHECK(Validate(c).resolved.config.rollout.num_steps_per_rollout == 1);
  c.rollout.num_steps_per_rollout = 4;
  CHECK(Validate(c).resolved.config.rollout.global_batch_size == 16);
  c.rollout.num_steps_per_rollout = 0;
  c.rollout.global_batch_size = 32;
  CHECK(Validate(c).resolved.config.rollout.num_steps_per_rollout == 2);
}

TEST_CASE("rule: global batch and steps per rollout must agree and divide") {
  Config c = Remat();
  c.rollout.global_batch_size = 32;
  c.rollout.num_steps_per_rollout = 4;
  CHECK(Mentions(OnlyError(c), "disagrees with --num-steps-per-rollout 4"));
  c.rollout.num_steps_per_rollout = 0;
  c.rollout.global_batch_size = 48;
  CHECK(Mentions(OnlyError(c), "--global-batch-size 48 does not divide"));
  c.rollout.global_batch_size = 0;
  c.rollout.num_steps_per_rollout = 3;
  CHECK(Mentions(OnlyError(c), "--num-steps-per-rollout 3 does not divide"));
}

TEST_CASE("rule: micro batch divides the global batch") {
  Config c = Remat();
  c.rollout.micro_batch_size = 0;
  CHECK(Mentions(OnlyError(c), "--micro-batch-size must be at least 1"));
  c.rollout.micro_batch_size = 5;
  CHECK(Mentions(OnlyError(c), "--micro-batch-size 5"));
  c.rollout.micro_batch_size = 4;
  CHECK(OnlyError(c).empty());
}

TEST_CASE("rule: --use-dynamic-batch-size needs --max-tokens-per-gpu") {
  Config c = Remat();
  c.rollout.use_dynamic_batch_size = true;
  const std::string error = OnlyError(c);
  CHECK(Mentions(error, "--use-dynamic-batch-size needs --max-tokens-per-gpu >= 1"));
  c.rollout.max_tokens_per_gpu = -1;
  CHECK(Mentions(OnlyError(c), "--max-tokens-per-gpu must be >= 0; got -1"));
  c.rollout.max_tokens_per_gpu = 8192;
  CHECK(OnlyError(c).empty());
  c.rollout.use_dynamic_batch_size = false;
  c.rollout.max_tokens_per_gpu = 0;  // unused without dynamic micro-batches
  CHECK(OnlyError(c).empty());
}

TEST_CASE("derived: one sample per prompt turns GRPO std normalisation off") {
  Config c = Remat();
  c.rollout.n_samples_per_prompt = 1;
  CHECK_FALSE(Validate(c).resolved.config.rl.grpo_std_normalization);
  c.rollout.n_samples_per_prompt = 2;
  CHECK(Validate(c).resolved.config.rl.grpo_std_normalization);
}

TEST_CASE("derived: a reference model is needed with a KL term") {
  Config c = Remat();
  CHECK_FALSE(Validate(c).resolved.with_ref);
  c.rl.use_kl_loss = true;
  CHECK(Validate(c).resolved.with_ref);
  c.rl.use_kl_loss = false;
  c.rl.kl_coef = 0.05;
  CHECK(Validate(c).resolved.with_ref);
}

TEST_CASE("derived: the weight-sync bucket size in bytes") {
  Config c = Remat();
  c.weight_sync.update_weight_buffer_size = "2GiB";
  CHECK(Validate(c).resolved.update_weight_buffer_bytes == (int64_t{2} << 30));
  c.weight_sync.update_weight_buffer_size = "2 gigs";
  CHECK(Mentions(OnlyError(c), "--update-weight-buffer-size"));
  CHECK(ParseByteSize("4096") == 4096);
  CHECK(ParseByteSize("3KiB") == 3072);
  CHECK(ParseByteSize("MiB") == -1);
}

TEST_CASE("derived and rule: the planned layout tiles the planned world") {
  Config c = Remat();
  c.run.actor_num_nodes = 16;
  c.run.actor_num_gpus_per_node = 8;
  c.parallel.tensor_model_parallel_size = 4;
  c.parallel.pipeline_model_parallel_size = 4;
  c.parallel.context_parallel_size = 2;
  c.parallel.expert_model_parallel_size = 32;
  const ResolvedConfig r = Validate(c).resolved;
  CHECK(r.planned_world_size == 128);
  CHECK(r.planned_dp_size == 4);
  CHECK(r.planned_expert_dp_size == 1);
  c.parallel.tensor_model_parallel_size = 3;
  CHECK(Mentions(OnlyError(c), "TP x PP x CP = 24 does not divide the 128 ranks"));
}

// ---- Single-option ranges (one representative per kind) ----------------------------------------

TEST_CASE("rule: ranges of numbers") {
  Config c = Remat();
  c.optimizer.lr = 0;
  CHECK(OnlyError(c) == "--lr must be positive; got 0");
  c = Remat();
  c.rollout.rollout_top_p = 1.5;
  CHECK(Mentions(OnlyError(c), "--rollout-top-p must be in (0, 1]"));
  c = Remat();
  c.rollout.rollout_ep_capacity_factor = -1;
  CHECK(Mentions(OnlyError(c), "--rollout-ep-capacity-factor must be >= 0"));
  c = Remat();
  c.rl.eps_clip_c = 0.5;
  CHECK(Mentions(OnlyError(c), "--eps-clip-c (dual clip) must be greater than 1"));
}

// Note [Timeout comparison] (launch/communicator.h): 10^10 s overflowed the communicators'
// nanoseconds.
TEST_CASE("rule: --comm-timeout-s is at least 1 s and at most 10^6 s") {
  Config c = Remat();
  c.parallel.comm_timeout_s = 1'000'000;
  CHECK(OnlyError(c).empty());
  c.parallel.comm_timeout_s = 10'000'000'000;
  CHECK(OnlyError(c) == "--comm-timeout-s must be in [1, 1000000] (seconds); got 10000000000");
  c.parallel.comm_timeout_s = 0;
  CHECK(Mentions(OnlyError(c), "--comm-timeout-s must be in [1, 1000000]"));
}

TEST_CASE("rule: --entropy-coef is not negative") {
  Config c = Remat();
  c.rl.entropy_coef = -0.01;
  CHECK(OnlyError(c) == "--entropy-coef must be >= 0 (0 = no entropy bonus); got -0.01");
  c.rl.entropy_coef = 0.01;
  CHECK(OnlyError(c).empty());
}

// Note [Finite numbers]: each double option in turn, set to inf, -inf and nan, is refused with a
// message naming its flag; the other options stay valid.
TEST_CASE("rule: every number option must be finite") {
  int64_t options = 0;
  for (const double bad :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN()}) {
    const Config base = Remat();
    VisitOptions(base, [&](const OptionInfo& info, const auto& member) {
      using T = std::decay_t<decltype(member)>;
      if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::optional<double>>) {
        Config c = base;
        VisitOptions(c, [&](const OptionInfo& other, auto& value) {
          if constexpr (std::is_same_v<std::decay_t<decltype(value)>, T>) {
            if (std::string_view(other.key) == info.key) value = bad;
          }
        });
        const std::string flag = FlagName(info.key);
        const std::vector<std::string> errors = Validate(c).errors;
        INFO(flag << " = " << bad);
        CHECK(std::any_of(errors.begin(), errors.end(), [&](const std::string& e) {
          return e.rfind(flag + " must be a finite number; got ", 0) == 0;
        }));
        ++options;
      }
    });
  }
  CHECK(options == 3 * 18);  // 16 double options and 2 optional ones, each with 3 values
}

TEST_CASE("rule: --init checkpoint needs --hf-checkpoint; random needs an architecture") {
  Config c;
  CHECK(Mentions(OnlyError(c), "--init checkpoint needs --hf-checkpoint"));
  c.model.init = InitMode::kRandom;
  CHECK(Mentions(OnlyError(c), "--init random needs --model-config"));
}

TEST_CASE("rule: --freeze-params must be a valid regular expression") {
  Config c = Remat();
  c.model.freeze_params = "layers.(0";
  CHECK(Mentions(OnlyError(c), "--freeze-params 'layers.(0' is not a valid regular expression"));
  c.model.freeze_params = "\\.experts\\.";
  CHECK(OnlyError(c).empty());
}

TEST_CASE("rule: ppo needs a critic this trainer does not have") {
  Config c = Remat();
  c.rl.advantage_estimator = AdvantageEstimator::kPpo;
  CHECK(Mentions(OnlyError(c), "needs a critic model"));
}

// Their spelling (comma-separated, at most int64) is the parser's: config_test.cc.
TEST_CASE("rule: stop token ids are not negative") {
  Config c = Remat();
  c.rollout.rollout_stop_token_ids = {2, 151329};
  CHECK(OnlyError(c).empty());
  c.rollout.rollout_stop_token_ids = {2, -1};
  CHECK(OnlyError(c) == "--rollout-stop-token-ids must be token ids >= 0; got -1");
}

TEST_CASE(
    "rule: rollout routing replay implies routing replay; R2 alone needs the old-logprob "
    "pass") {
  Config c = Remat();
  c.rl.use_rollout_routing_replay = true;
  const ValidationResult r = Validate(c);
  CHECK(r.errors.empty());
  CHECK(r.resolved.config.rl.use_routing_replay);
  c = Remat();
  c.rl.use_routing_replay = true;
  c.rl.use_rollout_logprobs = true;
  CHECK(Mentions(OnlyError(c), "use --use-rollout-routing-replay"));
  c.rl.use_rollout_routing_replay = true;
  CHECK(OnlyError(c).empty());
}

// ---- hostile values (found by fuzz/toml_fuzz.cc) ------------------------------------------------

TEST_CASE("rule: a byte size too large for int64 is refused, not shifted into overflow") {
  CHECK(ParseByteSize("8589934591GiB") == (int64_t{8589934591} << 30));
  CHECK(ParseByteSize("8589934592GiB") == -1);
  CHECK(ParseByteSize("999999999999999GiB") == -1);
  Config c = Remat();
  c.weight_sync.update_weight_buffer_size = "999999999999999GiB";
  CHECK(Mentions(OnlyError(c), "--update-weight-buffer-size"));
}

TEST_CASE("rule: products of sizes that overflow int64 are errors") {
  Config c = Remat();
  c.rollout.rollout_batch_size = int64_t{1} << 62;
  c.rollout.n_samples_per_prompt = 4;
  CHECK(Mentions(OnlyError(c),
                 "--rollout-batch-size 4611686018427387904 x --n-samples-per-prompt "
                 "4 does not fit in int64"));
  c = Remat();
  c.run.actor_num_nodes = int64_t{1} << 40;
  c.run.actor_num_gpus_per_node = int64_t{1} << 40;
  CHECK(Mentions(OnlyError(c), "--actor-num-nodes 1099511627776 x --actor-num-gpus-per-node"));
  c = Remat();
  c.parallel.tensor_model_parallel_size = int64_t{1} << 32;
  c.parallel.context_parallel_size = int64_t{1} << 32;
  const ValidationResult r = Validate(c);
  CHECK(std::any_of(r.errors.begin(), r.errors.end(), [](const std::string& e) {
    return Mentions(e, "TP x PP x CP or EP x ETP x PP do not fit in int64");
  }));
}

TEST_CASE("rule: --freeze-params that std::regex cannot compile safely is refused unread") {
  Config c = Remat();
  c.model.freeze_params = "a{99999999999999999999}";  // libstdc++ reads the count into an int
  CHECK(Mentions(OnlyError(c), "holds a number of more than 6 digits"));
  c.model.freeze_params = std::string(1025, 'a');  // libstdc++ recurses once per term
  CHECK(Mentions(OnlyError(c), "is 1025 bytes long; at most 1024 are accepted"));
  c.model.freeze_params = "layers\\.(1[0-9]{2})\\.mlp";
  CHECK(OnlyError(c).empty());
}

}  // namespace
}  // namespace rl::config
