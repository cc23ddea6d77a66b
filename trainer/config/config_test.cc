// From argv and a TOML recipe to a Config: precedence, both spellings of booleans, named errors,
// removed options, and a dump that parses back to the same config.
#include "trainer/config/config.h"

#include <catch2/catch.hpp>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "launch/check.h"

namespace rl::config {
namespace {

std::string WriteTemp(const std::string& text) {
  char path[] = "/tmp/rl_config_test_XXXXXX.toml";
  const int fd = mkstemps(path, 5);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

CommandLine Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "trainer");
  args.erase(args.begin());  // argv[0] is not part of the vector CLI11 parses
  std::ostringstream out;
  std::optional<CommandLine> result = ParseCommandLine(args, out);
  REQUIRE(result.has_value());
  return *result;
}

std::string ErrorOf(std::vector<std::string> args) {
  try {
    Parse(std::move(args));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool Contains(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

TEST_CASE("defaults come from the option declarations") {
  const CommandLine cl = Parse({});
  CHECK(cl.config.optimizer.lr == 1e-6);
  CHECK(cl.config.rollout.n_samples_per_prompt == 8);
  CHECK_FALSE(cl.config.colocate.offload_train.has_value());
  CHECK(cl.mode == Mode::kRun);
}

TEST_CASE("flags set options; every boolean has --x and --no-x") {
  const CommandLine cl = Parse({"--lr", "3e-4", "--colocate", "--no-use-distributed-optimizer",
                                "--offload-train", "--eps-clip-high", "0.28", "--init", "random"});
  CHECK(cl.config.optimizer.lr == 3e-4);
  CHECK(cl.config.colocate.colocate);
  CHECK_FALSE(cl.config.parallel.use_distributed_optimizer);
  CHECK(cl.config.colocate.offload_train == std::optional<bool>(true));
  CHECK(cl.config.rl.eps_clip_high == std::optional<double>(0.28));
  CHECK(cl.config.model.init == "random");
  CHECK(Parse({"--no-offload-train"}).config.colocate.offload_train == std::optional<bool>(false));
}

TEST_CASE("the config file sets options and command-line flags override it") {
  const std::string path = WriteTemp(
      "[optimizer]\nlr = 2e-5\n[colocate]\ncolocate = true\noffload_train = true\n"
      "[rollout]\nrollout_batch_size = 4\n");
  const CommandLine from_file = Parse({"--config", path});
  CHECK(from_file.config.optimizer.lr == 2e-5);
  CHECK(from_file.config.colocate.colocate);
  CHECK(from_file.config.rollout.rollout_batch_size == 4);

  const CommandLine overridden =
      Parse({"--config", path, "--lr", "1e-3", "--no-colocate", "--no-offload-train"});
  CHECK(overridden.config.optimizer.lr == 1e-3);
  CHECK_FALSE(overridden.config.colocate.colocate);
  CHECK(overridden.config.colocate.offload_train == std::optional<bool>(false));
  CHECK(overridden.config.rollout.rollout_batch_size == 4);
}

TEST_CASE("unknown keys, misplaced keys and wrong types are all reported with file and line") {
  const std::string path = WriteTemp(
      "[optimizer]\nlearning_rate = 1\nlr = \"fast\"\n[rollout]\nlr = 1e-5\n[nosuch]\nx = 1\n");
  const std::string error = ErrorOf({"--config", path});
  CHECK(Contains(error, "4 problem(s) in " + path));
  CHECK(Contains(error, path + ":2: unknown key 'learning_rate' in [optimizer]"));
  CHECK(Contains(error, path + ":3: [optimizer] lr: expected a number, got a string"));
  CHECK(Contains(error, path + ":5: unknown key 'lr' in [rollout] (it belongs in [optimizer])"));
  CHECK(Contains(error, path + ":7: unknown key 'x' in [nosuch]"));
}

TEST_CASE("bad flags name the flag") {
  CHECK(Contains(ErrorOf({"--lr", "fast"}), "--lr"));
  CHECK(Contains(ErrorOf({"--no-such-flag"}), "--no-such-flag"));
}

TEST_CASE("the removed --disable-weights-backuper fails and says what replaced it") {
  const std::string flag_error = ErrorOf({"--disable-weights-backuper"});
  CHECK(Contains(flag_error, "--disable-weights-backuper was removed"));
  CHECK(Contains(flag_error, "--rematerialize-param-from-master-weight"));
  const std::string path = WriteTemp("[backup]\ndisable_weights_backuper = true\n");
  CHECK(Contains(ErrorOf({"--config", path}), "--disable-weights-backuper was removed"));
}

TEST_CASE("--validate-only and --plan select the mode") {
  CHECK(Parse({"--validate-only"}).mode == Mode::kValidateOnly);
  CHECK(Parse({"--plan"}).mode == Mode::kPlan);
  CHECK(Contains(ErrorOf({"--plan", "--validate-only"}), "exclude each other"));
}

TEST_CASE("--help prints every option with its section and returns no config") {
  std::ostringstream out;
  CHECK_FALSE(ParseCommandLine({"--help"}, out).has_value());
  CHECK(Contains(out.str(), "--rematerialize-param-from-master-weight"));
  CHECK(Contains(out.str(), "--no-colocate"));
  CHECK(Contains(out.str(), "optimizer"));
}

TEST_CASE("the dump parses back to the same config") {
  Config config = Parse({"--lr", "3e-4", "--colocate", "--eps-clip-high", "0.28",
                         "--prompt-data", "a \"quoted\" path", "--seed", "7"})
                      .config;
  const std::string dump = DumpToml(config);
  Config reread;
  ApplyToml(ParseToml(dump, "dump.toml"), reread);
  CHECK(DumpToml(reread) == dump);
  CHECK(reread.optimizer.lr == 3e-4);
  CHECK(reread.rl.eps_clip_high == std::optional<double>(0.28));
  CHECK(reread.data.prompt_data == "a \"quoted\" path");
  CHECK_FALSE(reread.colocate.offload_train.has_value());
}

}  // namespace
}  // namespace rl::config
