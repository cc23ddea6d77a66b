// The config stage, part 1: from argv and a --config TOML file to a Config (trainer/config/options.h).
//
// Precedence: option defaults, then the --config file, then command-line flags (a flag given on
// the command line always wins, including `--no-x` over `x = true`). Every problem is a
// ConfigError whose message names the option (and the file and line for file values); `main`
// exits with status 2 on it. All problems of a config file are reported together.
//
// Rules between options and derived values are not checked here: trainer/config/validate.h.
#ifndef RL_TRAINER_CONFIG_CONFIG_H_
#define RL_TRAINER_CONFIG_CONFIG_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "trainer/config/options.h"
#include "trainer/config/toml.h"

namespace rl::config {

enum class Mode { kRun, kValidateOnly, kPlan };

struct CommandLine {
  Config config;
  std::string config_file;  // "" when none was given
  Mode mode = Mode::kRun;
};

// Parses argv (and the --config file it names). Returns nullopt when --help was asked for (the
// help text has been written to `out`). Throws ConfigError on any bad flag, key or value.
std::optional<CommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                            std::ostream& out);

// Applies the entries of a TOML document to `config`, skipping the options in `keep` (given on
// the command line). Throws one ConfigError listing every unknown key, removed option and type
// mismatch, each with file and line.
void ApplyToml(const TomlDocument& doc, Config& config,
               const std::vector<std::string>& keep = {});

// The config as a TOML document with one [section] per options struct, every option present
// (unset optionals as comments). Parsing it back gives the same Config.
std::string DumpToml(const Config& config);

// One line per option of kNotRunnableYet (options.h) that `config` sets to other than its
// default, and per option of kRunsOnlyAt set to other than the value it runs at (when there is
// an actor and a rollout engine), naming the flag, the value and the one that runs; empty when
// this binary can run it. Meant for the resolved config (trainer/config/validate.h).
std::vector<std::string> NotRunnable(const Config& config);

// The options that were removed on purpose: passing them is an error that says what replaced
// them. Key (TOML spelling) -> message.
const std::vector<std::pair<std::string, std::string>>& RemovedOptions();

}  // namespace rl::config

#endif  // RL_TRAINER_CONFIG_CONFIG_H_
