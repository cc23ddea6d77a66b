// The config stage, part 2: a pure function from the parsed Config to the resolved config, or to
// the list of every rule it breaks.
//
// It holds every rule of miles for --rematerialize-param-from-master-weight and those of its
// colocate, offload and debug rules that apply to this trainer, in miles' order, plus the range
// checks of single options (choice options are enums: the config parser already refused unknown
// names). Each message names the option(s) as flags and says how to fix it. Derived values are
// written into the resolved config (every std::optional option is set afterwards) or into
// ResolvedConfig's own fields. Rules that depend on the model's structure (frozen parameters) are
// checked when the model is built, not here.
//
// Not here either: whether this binary can run a layout today (NotRunnable in
// trainer/config/config.h, checked by main at start-up), because full-scale recipes must
// validate for --plan.
#ifndef RL_TRAINER_CONFIG_VALIDATE_H_
#define RL_TRAINER_CONFIG_VALIDATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainer/config/options.h"

namespace rl::config {

// The CI check of the first optimizer step's ppo_kl (--ci-test), by what the old policy is.
// - kExactlyZero: the old log-probs are the trainer's own, recomputed from the weights the first
//   step starts from on the same plan (Note [Training plan]), so ppo_kl must be exactly 0.
// - kWithinMismatch: --use-rollout-logprobs (with or without --use-tis) makes the engine's
//   log-probs the old policy, so the first step's ppo_kl is a mean of rollout - train log-prob
//   differences: it must be finite and at most the measured rollout/train mismatch.
enum class FirstStepKlCheck { kOff, kExactlyZero, kWithinMismatch };
inline constexpr std::pair<FirstStepKlCheck, const char*> kFirstStepKlCheckNames[] = {
    {FirstStepKlCheck::kOff, "off"},
    {FirstStepKlCheck::kExactlyZero, "exactly_zero"},
    {FirstStepKlCheck::kWithinMismatch, "within_mismatch"}};
constexpr const auto& EnumNames(FirstStepKlCheck) { return kFirstStepKlCheckNames; }

struct ResolvedConfig {
  Config config;  // every optional set, derived values written back

  // Derived values that are not options.
  bool with_ref = false;                  // a reference model is needed (KL)
  bool param_buffer_host_backup = true;   // false when offload_train (no host copy on pause)
  bool grad_buffer_host_backup = true;    // likewise
  FirstStepKlCheck check_kl = FirstStepKlCheck::kOff;  // CI: the first step's ppo_kl
  bool check_weight_version = false;      // CI: engine and actor agree on the weight version
  int64_t update_weight_buffer_bytes = 0;
  int64_t planned_world_size = 1;         // actor_num_nodes * actor_num_gpus_per_node
  int64_t planned_dp_size = 1;            // planned world / (TP * PP * CP)
  int64_t planned_expert_dp_size = 1;     // planned world / (EP * ETP * PP)
};

struct ValidationResult {
  ResolvedConfig resolved;           // meaningful only when errors is empty
  std::vector<std::string> errors;   // every broken rule, in rule order
  bool ok() const { return errors.empty(); }
};

ValidationResult Validate(const Config& config);

// Parses "512MiB", "2GiB", "4096" (bytes). Returns -1 when malformed or beyond int64.
int64_t ParseByteSize(const std::string& text);

}  // namespace rl::config

#endif  // RL_TRAINER_CONFIG_VALIDATE_H_
