// From argv and a TOML recipe to a Config: precedence, both spellings of booleans, named errors,
// removed options, and a dump that parses back to the same config.
#include "trainer/config/config.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>
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
  CHECK(cl.config.model.init == InitMode::kRandom);
  CHECK(Parse({"--no-offload-train"}).config.colocate.offload_train == std::optional<bool>(false));
}

TEST_CASE("training-plan flags: balance on by default, dynamic micro-batches opt-in") {
  const CommandLine defaults = Parse({});
  CHECK(defaults.config.rollout.balance_data);
  CHECK_FALSE(defaults.config.rollout.use_dynamic_batch_size);
  CHECK(defaults.config.rollout.max_tokens_per_gpu == 0);
  const CommandLine cl =
      Parse({"--no-balance-data", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192"});
  CHECK_FALSE(cl.config.rollout.balance_data);
  CHECK(cl.config.rollout.use_dynamic_batch_size);
  CHECK(cl.config.rollout.max_tokens_per_gpu == 8192);
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

TEST_CASE("choice options take the names of their table; others name the option and the choices") {
  const CommandLine cl = Parse({"--advantage-estimator", "gspo", "--lr-decay-style", "cosine",
                                "--kl-loss-type", "low_var_kl", "--device", "cpu"});
  CHECK(cl.config.rl.advantage_estimator == AdvantageEstimator::kGspo);
  CHECK(cl.config.optimizer.lr_decay_style == LrDecayStyle::kCosine);
  CHECK(cl.config.rl.kl_loss_type == KlType::kLowVarKl);
  CHECK(cl.config.run.device == Device::kCpu);
  CHECK(ErrorOf({"--kl-loss-type", "k4"}) ==
        "--kl-loss-type: expected one of k1, k2, k3, low_var_kl; got 'k4'");
  CHECK(Contains(ErrorOf({"--lr-decay-style", "exponential"}), "--lr-decay-style"));
  CHECK(Contains(ErrorOf({"--advantage-estimator", "grpoo"}), "--advantage-estimator"));
  CHECK(Contains(ErrorOf({"--rm-type", "rm_model"}), "exact_match, math, toy; got 'rm_model'"));
  const std::string path = WriteTemp("[rl]\nkl_loss_type = \"k4\"\nadvantage_estimator = 1\n");
  const std::string error = ErrorOf({"--config", path});
  CHECK(Contains(error, path + ":2: [rl] kl_loss_type: expected one of k1, k2, k3, low_var_kl; "
                               "got 'k4'"));
  CHECK(Contains(error, path + ":3: [rl] advantage_estimator: expected one of \"grpo, gspo,"));
}

TEST_CASE("stop token ids: comma-separated on the command line, array or string in TOML") {
  const std::vector<int64_t> ids = {2, 151329};
  CHECK(Parse({"--rollout-stop-token-ids", "2,151329"}).config.rollout.rollout_stop_token_ids ==
        ids);
  for (const char* value : {"\"2,151329\"", "[2, 151329]"}) {
    const std::string path =
        WriteTemp(fmt::format("[rollout]\nrollout_stop_token_ids = {}\n", value));
    CHECK(Parse({"--config", path}).config.rollout.rollout_stop_token_ids == ids);
  }
  CHECK(Parse({}).config.rollout.rollout_stop_token_ids.empty());
  // 19 digits may not fit in int64; a sign, a space or an empty item is not an id.
  for (const char* bad : {"2, x", "2,", "2,9999999999999999999", "-2", "x"}) {
    CHECK(Contains(ErrorOf({"--rollout-stop-token-ids", bad}), "-stop-token-ids: expected"));
    const std::string path =
        WriteTemp(fmt::format("[rollout]\nrollout_stop_token_ids = \"{}\"\n", bad));
    CHECK(Contains(ErrorOf({"--config", path}), "rollout_stop_token_ids: expected"));
  }
  const std::string path = WriteTemp("[rollout]\nrollout_stop_token_ids = [2, \"x\"]\n");
  CHECK(Contains(ErrorOf({"--config", path}), "expected integers in the array, got a string"));
}

TEST_CASE("options that validate but cannot run yet: marked in --help, listed by NotRunnable") {
  std::ostringstream out;
  ParseCommandLine({"--help"}, out);
  const std::string help = out.str();
  const size_t pp = help.find("--pipeline-model-parallel-size");
  REQUIRE(pp != std::string::npos);
  CHECK(help.find("only the default runs yet", pp) < help.find("--decoder-last-pipeline-num-layers"));
  CHECK(Contains(help, "One of: auto, cuda, cpu."));

  Config runnable;
  runnable.colocate.colocate = true;  // kRunsOnlyAt: the binary always colocates
  CHECK(NotRunnable(runnable).empty());
  Config c = runnable;
  c.parallel.pipeline_model_parallel_size = 8;
  c.optimizer.optimizer_cpu_offload = true;
  c.rl.compute_advantages_and_returns = false;
  c.rollout.rollout_batch_size = 3;  // runnable with any value
  const std::vector<std::string> expected = {
      "--pipeline-model-parallel-size 8: only 1 runs yet",
      "--optimizer-cpu-offload true: only false runs yet",
      "--compute-advantages-and-returns false: only true runs yet"};
  CHECK(NotRunnable(c) == expected);
}

// Accepted and ignored before: the cycle always colocated and released both sides' memory, and
// there is no critic.
TEST_CASE("NotRunnable: --colocate, --offload-train/-rollout, --num-critic-only-steps") {
  std::ostringstream out;
  ParseCommandLine({"--help"}, out);
  const std::string help = out.str();
  for (const char* flag : {"--colocate", "--offload-train", "--offload-rollout"}) {
    const size_t at = help.find(std::string(flag) + ",");
    REQUIRE(at != std::string::npos);
    CHECK(help.find("only true runs yet", at) < help.find("\n  -", at + 1));
  }
  const char* turns = " (the actor and the rollout engine share each device and take turns)";
  Config c;
  CHECK(NotRunnable(c) == std::vector<std::string>{std::string("--colocate false: only true "
                                                               "runs yet") +
                                                   turns});
  c.colocate.colocate = true;
  c.colocate.offload_train = false;
  c.colocate.offload_rollout = false;
  c.rl.num_critic_only_steps = 2;
  CHECK(NotRunnable(c) == std::vector<std::string>{
                              "--num-critic-only-steps 2: only 0 runs yet",
                              std::string("--offload-train false: only true runs yet") + turns,
                              std::string("--offload-rollout false: only true runs yet") + turns});
  // No rollout engine (or no actor): nothing to colocate.
  Config train_only;
  train_only.colocate.debug_train_only = true;
  CHECK(NotRunnable(train_only).empty());
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
                         "--prompt-data", "a \"quoted\" path", "--seed", "7",
                         "--rollout-stop-token-ids", "2,5", "--kl-loss-type", "k3"})
                      .config;
  const std::string dump = DumpToml(config);
  Config reread;
  ApplyToml(ParseToml(dump, "dump.toml"), reread);
  CHECK(DumpToml(reread) == dump);
  CHECK(reread.optimizer.lr == 3e-4);
  CHECK(reread.rl.eps_clip_high == std::optional<double>(0.28));
  CHECK(reread.data.prompt_data == "a \"quoted\" path");
  CHECK_FALSE(reread.colocate.offload_train.has_value());
  CHECK(reread.rollout.rollout_stop_token_ids == std::vector<int64_t>{2, 5});
  CHECK(reread.rl.kl_loss_type == KlType::kK3);
  CHECK(Contains(dump, "rollout_stop_token_ids = [2, 5]\nrollout_cuda_graphs"));
  CHECK(Contains(dump, "kl_loss_type = \"k3\"\n"));
}

}  // namespace
}  // namespace rl::config
