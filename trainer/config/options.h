// Every option of the trainer, declared once.
//
// Each X(type, name, default, help) line below is the only declaration of an option. From it
// come: the struct member and its default, the command-line flag (`--name-with-dashes`; booleans
// also `--no-name`), the TOML key (`name` in the section's `[table]` of a --config file), the
// `--help` text, the resolved-config dump at start-up and the config stored with a checkpoint
// (trainer/config/config.h does the binding). Flag names follow the reference system (miles /
// Megatron) where it has one.
//
// Values here are what the user asked for. Rules and derived values (for example: --ci-test turns
// on the checks; --colocate turns offload on) live in trainer/config/validate.h, never here.
//
// `std::optional` options are "unset" by default; validation derives their value.
#ifndef RL_TRAINER_CONFIG_OPTIONS_H_
#define RL_TRAINER_CONFIG_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "optimizer/lr_schedule.h"
#include "trainer/data/rewards.h"
#include "trainer/rl/choices.h"

namespace rl::config {

// Choice options are enums. Each has one name table, a constexpr array of {value, "name"}
// pairs that EnumNames(value) returns; trainer/config/config.h reads flags and TOML, lists the
// choices in --help and dumps the config from it. Enums of a domain package live there, next to
// the code that uses them; these have no package below the config.
enum class Device { kAuto, kCuda, kCpu };
inline constexpr std::pair<Device, const char*> kDeviceNames[] = {
    {Device::kAuto, "auto"}, {Device::kCuda, "cuda"}, {Device::kCpu, "cpu"}};
constexpr const auto& EnumNames(Device) { return kDeviceNames; }
enum class InitMode { kCheckpoint, kRandom };
inline constexpr std::pair<InitMode, const char*> kInitModeNames[] = {
    {InitMode::kCheckpoint, "checkpoint"}, {InitMode::kRandom, "random"}};
constexpr const auto& EnumNames(InitMode) { return kInitModeNames; }
enum class ParamsDtype { kBf16, kFp32 };
inline constexpr std::pair<ParamsDtype, const char*> kParamsDtypeNames[] = {
    {ParamsDtype::kBf16, "bf16"}, {ParamsDtype::kFp32, "fp32"}};
constexpr const auto& EnumNames(ParamsDtype) { return kParamsDtypeNames; }
enum class OptimizerKind { kAdam };
inline constexpr std::pair<OptimizerKind, const char*> kOptimizerKindNames[] = {
    {OptimizerKind::kAdam, "adam"}};
constexpr const auto& EnumNames(OptimizerKind) { return kOptimizerKindNames; }
enum class OffloadTarget { kCpu, kDisk };
inline constexpr std::pair<OffloadTarget, const char*> kOffloadTargetNames[] = {
    {OffloadTarget::kCpu, "cpu"}, {OffloadTarget::kDisk, "disk"}};
constexpr const auto& EnumNames(OffloadTarget) { return kOffloadTargetNames; }
enum class LogLevel { kInfo, kDebug };
inline constexpr std::pair<LogLevel, const char*> kLogLevelNames[] = {
    {LogLevel::kInfo, "info"}, {LogLevel::kDebug, "debug"}};
constexpr const auto& EnumNames(LogLevel) { return kLogLevelNames; }

using AdvantageEstimator = rl_algo::AdvantageEstimator;
using KlType = rl_algo::KlType;
using LrDecayStyle = optimizer::LrDecayStyle;
using RewardType = data::RewardType;

// The name of `value` in its table.
template <class Enum>
const char* NameOf(Enum value) {
  for (const auto& [v, name] : EnumNames(value)) {
    if (v == value) return name;
  }
  return "?";
}

// Options that validate (so that --plan plans full-scale recipes) but that this binary cannot
// run with any value other than their default yet. --help marks them; the trainer refuses to
// run with them (NotRunnable in trainer/config/config.h).
// clang-format off
inline constexpr const char* kNotRunnableYet[] = {
    "pipeline_model_parallel_size", "context_parallel_size",
    "expert_tensor_parallel_size", "lora_rank",
    "overlap_param_gather", "use_distributed_optimizer", "use_precision_aware_optimizer",
    "optimizer_cpu_offload", "debug_disable_optimizer", "debug_rollout_only", "keep_old_actor",
    "compute_advantages_and_returns", "num_critic_only_steps"};
// clang-format on

// Options that this binary runs at one value only, which is not their default (the defaults are
// miles'): with a rollout engine and an actor (neither --debug-train-only nor
// --debug-rollout-only), the two always share each device and take turns, each releasing its
// memory while the other works (docs/colocated-cycle.md). Like kNotRunnableYet, they validate
// and plan with any value, --help marks them and NotRunnable refuses the others.
inline constexpr std::pair<const char*, const char*> kRunsOnlyAt[] = {
    {"colocate", "true"}, {"offload_train", "true"}, {"offload_rollout", "true"}};

}  // namespace rl::config

// clang-format off
#define RL_RUN_OPTIONS(X)                                                                          \
  X(int64_t, num_rollout, 1, "Number of RL iterations (rollout + train + weight sync).")           \
  X(int64_t, seed, 1234, "Seed for initialisation, sampling and data order.")                      \
  X(Device, device, Device::kAuto, "auto = cuda:<local rank> when a GPU is present, else cpu.")    \
  X(int64_t, actor_num_nodes, 1, "Nodes of the job (for --plan at full scale).")                    \
  X(int64_t, actor_num_gpus_per_node, 2, "Ranks per node (for --plan at full scale).")

#define RL_MODEL_OPTIONS(X)                                                                        \
  X(std::string, hf_checkpoint, "", "Hugging Face checkpoint directory of the policy.")           \
  X(std::string, model_config, "", "config.json describing the architecture (default: the one in --hf-checkpoint).") \
  X(InitMode, init, InitMode::kCheckpoint, "checkpoint = load --hf-checkpoint; random = from --model-config and --seed.") \
  X(ParamsDtype, params_dtype, ParamsDtype::kBf16, "Dtype of the trained params and the engine weights (masters are fp32).") \
  X(std::string, ref_load, "", "Reference model checkpoint for the KL term (default: the initial actor weights).") \
  X(std::string, freeze_params, "", "Regex: parameters whose names match are frozen (not trained).") \
  X(int64_t, lora_rank, 0, "LoRA rank; 0 disables LoRA.")

#define RL_PARALLEL_OPTIONS(X)                                                                     \
  X(int64_t, tensor_model_parallel_size, 1, "Tensor parallel size (TP).")                          \
  X(int64_t, pipeline_model_parallel_size, 1, "Pipeline parallel size (PP).")                      \
  X(int64_t, decoder_last_pipeline_num_layers, 0, "Layers of the last pipeline stage; 0 = even split.") \
  X(int64_t, context_parallel_size, 1, "Context parallel size (CP).")                              \
  X(int64_t, expert_model_parallel_size, 1, "Expert parallel size (EP).")                          \
  X(int64_t, expert_tensor_parallel_size, 1, "Expert tensor parallel size (ETP).")                 \
  X(bool, sequence_parallel, false, "Under TP: norms, residuals and the router on 1/TP of the tokens (all-gather before, reduce-scatter after the tensor-parallel layers); always on for MoE models at TP > 1.") \
  X(bool, use_distributed_optimizer, true, "ZeRO-1: shard fp32 masters and Adam moments over DP.") \
  X(bool, overlap_param_gather, false, "Overlap the param all-gather with the next forward.")      \
  X(int64_t, comm_timeout_s, 600, "Timeout of every collective, seconds (1 to 1000000); a late rank ends the job.")

#define RL_OPTIMIZER_OPTIONS(X)                                                                    \
  X(OptimizerKind, optimizer, OptimizerKind::kAdam, "Optimizer (adam = AdamW).")                  \
  X(double, lr, 1e-6, "Peak learning rate.")                                                       \
  X(double, min_lr, 0.0, "Learning rate at the end of a linear or cosine decay.")                  \
  X(LrDecayStyle, lr_decay_style, LrDecayStyle::kConstant, "Decay after warm-up.")                \
  X(int64_t, lr_warmup_iters, 0, "Optimizer steps of linear warm-up from 0.")                      \
  X(int64_t, lr_decay_iters, 0, "Optimizer steps of decay after warm-up; 0 = all remaining steps.") \
  X(double, weight_decay, 0.1, "Decoupled weight decay (AdamW).")                                  \
  X(double, adam_beta1, 0.9, "Adam beta1.")                                                        \
  X(double, adam_beta2, 0.98, "Adam beta2.")                                                       \
  X(double, adam_eps, 1e-8, "Adam epsilon.")                                                       \
  X(double, clip_grad, 1.0, "Global gradient-norm clip; 0 disables clipping.")                     \
  X(bool, use_precision_aware_optimizer, false, "Keep masters inside the optimizer as remainders (no standalone fp32 masters).") \
  X(bool, optimizer_cpu_offload, false, "Run the optimizer step on the CPU (hybrid device optimizer).") \
  X(bool, debug_disable_optimizer, false, "Debug: no optimizer (forward/backward only).")

#define RL_ROLLOUT_OPTIONS(X)                                                                      \
  X(int64_t, rollout_batch_size, 8, "Prompts per rollout.")                                        \
  X(int64_t, n_samples_per_prompt, 8, "Responses sampled per prompt (the GRPO group).")           \
  X(int64_t, rollout_max_response_len, 1024, "Maximum response tokens.")                           \
  X(int64_t, rollout_max_prompt_len, 0, "Longer prompts are dropped at start-up, with a warning; 0 = the model's context less --rollout-max-response-len.") \
  X(double, rollout_temperature, 1.0, "Sampling temperature.")                                     \
  X(double, rollout_top_p, 1.0, "Nucleus sampling threshold; 1 disables it.")                      \
  X(int64_t, rollout_top_k, -1, "Top-k sampling; -1 disables it.")                                 \
  X(std::vector<int64_t>, rollout_stop_token_ids, {}, "Token ids that end a response (comma-separated; in TOML also an array).") \
  X(bool, rollout_cuda_graphs, true, "Replay the decode step as CUDA graphs (GPU; MoE models in bf16 on Hopper or newer).") \
  X(bool, rollout_mla_latent_decode, true, "MLA models on a GPU: decode steps attend in the latent space (absorbed up-projections over the cached latents); false: over expanded keys and values as in training, slower, with a smaller train/rollout log-prob mismatch.") \
  X(bool, rollout_programmatic_launch, true, "GPU (Hopper or newer): each decode-step kernel of ours may start while the kernel ahead of it finishes (programmatic dependent launch), the same bits sooner; false: launched one after another.") \
  X(bool, rollout_overlap_steps, true, "Launch each decode step before reading the one ahead on the host (its tokens go from the device to the next step), so that the device never waits on the host between steps; false: every step read before the next is launched.") \
  X(double, rollout_ep_capacity_factor, 0.0, "Expert parallelism: the rows a decode step may send one rank, as a multiple of the mean (batch x top-k / EP); more is an error. 0 = the worst case, which never overflows.") \
  X(int64_t, global_batch_size, 0, "Samples per optimizer step; 0 = derived from the rollout batch.") \
  X(int64_t, num_steps_per_rollout, 0, "Optimizer steps per rollout; 0 = derived (1 unless --global-batch-size says otherwise).") \
  X(int64_t, micro_batch_size, 1, "Samples per micro-batch (gradient accumulation within a step); not used with --use-dynamic-batch-size.") \
  X(bool, balance_data, true, "Split each step's samples over the DP ranks in equal counts with close token sums (Karmarkar-Karp); off = strided, sample i to rank i % dp.") \
  X(bool, use_dynamic_batch_size, false, "Form micro-batches by tokens instead of --micro-batch-size: at most --max-tokens-per-gpu padded tokens each, equally many on every rank.") \
  X(int64_t, max_tokens_per_gpu, 0, "Padded-token budget (samples x longest) of a micro-batch with --use-dynamic-batch-size; a longer sample trains alone.")

#define RL_RL_OPTIONS(X)                                                                           \
  X(AdvantageEstimator, advantage_estimator, AdvantageEstimator::kGrpo, "Advantage estimator (ppo needs a critic, which this trainer does not have).") \
  X(bool, rewards_normalization, true, "Subtract the group mean reward (GRPO family).")            \
  X(bool, grpo_std_normalization, true, "Divide by the group std + 1e-6 (off = Dr.GRPO).")        \
  X(double, eps_clip, 0.2, "PPO clip, lower side.")                                                \
  X(std::optional<double>, eps_clip_high, std::nullopt, "PPO clip, upper side (default: --eps-clip).") \
  X(std::optional<double>, eps_clip_c, std::nullopt, "Dual-clip constant (> 1) for negative advantages.") \
  X(bool, use_kl_loss, false, "Add a KL(policy || reference) loss term.")                         \
  X(double, kl_loss_coef, 0.0, "Coefficient of the KL loss.")                                      \
  X(KlType, kl_loss_type, KlType::kK1, "KL estimator of the KL loss.")                             \
  X(double, kl_coef, 0.0, "KL penalty in the reward (needs a reference model).")                   \
  X(double, entropy_coef, 0.0, "Entropy bonus coefficient.")                                       \
  X(bool, calculate_per_token_loss, false, "Aggregate the loss per token instead of per sample.")  \
  X(bool, use_rollout_logprobs, false, "Use the rollout engine's log-probs as the old policy.")     \
  X(bool, use_tis, false, "Truncated importance sampling against the rollout log-probs.")          \
  X(bool, use_routing_replay, false, "MoE (R2): training forwards replay the experts the old-logprob forward chose.") \
  X(bool, use_rollout_routing_replay, false, "MoE (R3): the rollout engine records its experts; reference, old-logprob and training forwards replay them (implies --use-routing-replay).") \
  X(bool, use_rollout_indexer_replay, false, "DSA (GLM-5): the rollout engine records each indexer's key selection; reference, old-logprob and training forwards replay it.") \
  X(double, tis_clip, 2.0, "TIS upper clip.")                                                      \
  X(double, tis_clip_low, 0.0, "TIS lower clip.")                                                  \
  X(bool, normalize_advantages, false, "Whiten the advantages with the mean and std of the whole rollout's trainable tokens (every micro-batch of every DP rank).") \
  X(bool, compute_advantages_and_returns, true, "Compute advantages in the trainer (the rebuild runs in that block).") \
  X(int64_t, num_critic_only_steps, 0, "PPO: steps that train only the critic.")

#define RL_COLOCATE_OPTIONS(X)                                                                     \
  X(bool, colocate, false, "Actor and rollout engine share each GPU and take turns.")             \
  X(std::optional<bool>, offload_train, std::nullopt, "Release the actor's memory while the engine works (default: on with --colocate).") \
  X(std::optional<bool>, offload_rollout, std::nullopt, "Release the engine's memory while the actor works (default: on with --colocate).") \
  X(OffloadTarget, offload_train_target, OffloadTarget::kCpu, "Where the actor's state goes while asleep (disk is not supported yet).") \
  X(bool, rematerialize_param_from_master_weight, false, "On wake-up, rebuild bf16 params from the fp32 master shards (cast + all-gather) instead of a pinned host copy.") \
  X(bool, keep_old_actor, false, "Keep a second pinned copy of the previous actor weights.") \
  X(bool, debug_train_only, false, "Train on recorded data; no rollout engine.")                 \
  X(bool, debug_rollout_only, false, "Generate only; no training.")

#define RL_BACKUP_OPTIONS(X)                                                                       \
  X(std::optional<bool>, check_rematerialize_param_from_master_weight, std::nullopt, "SHA256-check every rebuild against the hashes of backups 1 and 2 (default: on with --ci-test).")

#define RL_WEIGHT_SYNC_OPTIONS(X)                                                                  \
  X(std::string, update_weight_buffer_size, "512MiB", "Bucket size of the weight sync (bytes; KiB/MiB/GiB suffixes).") \
  X(std::optional<bool>, check_weight_update_equal, std::nullopt, "SHA256-compare the engine's weights with the actor's after a sync (default: on with --ci-test).")

#define RL_CHECK_OPTIONS(X)                                                                        \
  X(bool, ci_test, false, "CI mode: turns on the SHA256 rebuild check, the weight-update check, the weight version check and the first-step ppo_kl check (exactly 0; with --use-rollout-logprobs, within the rollout/train mismatch).") \
  X(bool, ci_disable_weight_update_checker, false, "CI mode without the weight-update check.")    \
  X(bool, ci_disable_kl_checker, false, "CI mode without the first-step ppo_kl check.")

#define RL_DATA_OPTIONS(X)                                                                         \
  X(std::string, prompt_data, "", "JSONL file of prompts.")                                        \
  X(std::string, input_key, "prompt", "Key of the prompt in each JSONL line.")                     \
  X(std::string, label_key, "label", "Key of the label (the verifier's answer) in each JSONL line.") \
  X(bool, apply_chat_template, false, "Wrap prompts in the tokenizer's chat template.")           \
  X(RewardType, rm_type, RewardType::kMath, "Reward verifier: math = \\boxed{} / final number, toy = the embedded task.")\
  X(std::string, load_debug_rollout_data, "", "Replay recorded rollout data (JSONL) instead of generating.") \
  X(std::string, save_debug_rollout_data, "", "Record each rollout's data to this JSONL file.")

#define RL_LOGGING_OPTIONS(X)                                                                      \
  X(std::string, metrics_out, "", "JSON-lines file: one object of metrics per iteration.")        \
  X(std::string, save_hf, "", "Save the final actor weights as a Hugging Face checkpoint here.")   \
  X(std::string, save, "", "Checkpoint directory (actor, optimizer, RNG, data position).")        \
  X(int64_t, save_interval, 0, "Save every N iterations; 0 = only at the end when --save is set.") \
  X(std::string, load, "", "Resume from this checkpoint directory.")                              \
  X(LogLevel, log_level, LogLevel::kInfo, "Log verbosity.")

// Section name, struct name, option list.
#define RL_CONFIG_SECTIONS(S)                          \
  S(run, RunOptions, RL_RUN_OPTIONS)                   \
  S(model, ModelOptions, RL_MODEL_OPTIONS)             \
  S(parallel, ParallelOptions, RL_PARALLEL_OPTIONS)    \
  S(optimizer, OptimizerOptions, RL_OPTIMIZER_OPTIONS) \
  S(rollout, RolloutOptions, RL_ROLLOUT_OPTIONS)       \
  S(rl, RlOptions, RL_RL_OPTIONS)                      \
  S(colocate, ColocateOptions, RL_COLOCATE_OPTIONS)    \
  S(backup, BackupOptions, RL_BACKUP_OPTIONS)          \
  S(weight_sync, WeightSyncOptions, RL_WEIGHT_SYNC_OPTIONS) \
  S(checks, CheckOptions, RL_CHECK_OPTIONS)            \
  S(data, DataOptions, RL_DATA_OPTIONS)                \
  S(logging, LoggingOptions, RL_LOGGING_OPTIONS)
// clang-format on

namespace rl::config {

#define RL_DECLARE_MEMBER(type, name, default_value, help) type name = default_value;
#define RL_DECLARE_SECTION_STRUCT(section, Struct, OPTIONS) \
  struct Struct {                                           \
    OPTIONS(RL_DECLARE_MEMBER)                              \
  };
RL_CONFIG_SECTIONS(RL_DECLARE_SECTION_STRUCT)
#undef RL_DECLARE_SECTION_STRUCT
#undef RL_DECLARE_MEMBER

// What the user asked for: defaults, then the --config file, then command-line flags.
struct Config {
#define RL_DECLARE_SECTION_MEMBER(section, Struct, OPTIONS) Struct section;
  RL_CONFIG_SECTIONS(RL_DECLARE_SECTION_MEMBER)
#undef RL_DECLARE_SECTION_MEMBER
};

// Identifies one option for visitors: TOML `[section] key`, flag `--key-with-dashes`.
struct OptionInfo {
  const char* section;
  const char* key;
  const char* help;
};

// Calls visitor(info, member) for every option, in declaration order.
template <class Config_, class Visitor>
void VisitOptions(Config_& config, Visitor&& visitor) {
#define RL_VISIT_OPTION(type, name, default_value, help) \
  visitor(OptionInfo{section_name, #name, help}, section_ref.name);
#define RL_VISIT_SECTION(section, Struct, OPTIONS) \
  {                                                \
    const char* section_name = #section;           \
    auto& section_ref = config.section;            \
    OPTIONS(RL_VISIT_OPTION)                       \
  }
  RL_CONFIG_SECTIONS(RL_VISIT_SECTION)
#undef RL_VISIT_SECTION
#undef RL_VISIT_OPTION
}

// "rollout_batch_size" -> "--rollout-batch-size"
std::string FlagName(const char* key);

}  // namespace rl::config

#endif  // RL_TRAINER_CONFIG_OPTIONS_H_
