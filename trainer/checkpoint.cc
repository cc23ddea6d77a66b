#include "trainer/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <mutex>
#include <regex>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/sha256.h"
#include "optimizer/distributed_optimizer.h"
#include "trainer/fault_injection.h"
#include "trainer/model/params.h"
#include "trainer/model/safetensors.h"
#include "trainer/model/safetensors_writer.h"

namespace rl {
namespace {

constexpr char kManifest[] = "manifest.sha256";
constexpr char kLatest[] = "latest";
constexpr char kStateFile[] = "trainer_state.json";
constexpr char kConfigFile[] = "trainer_config.toml";
constexpr char kHfConfigFile[] = "config.json";
constexpr char kFormat[] = "rl-trainer-checkpoint";
constexpr int64_t kFormatVersion = 1;
constexpr char kRngTensor[] = "rng.cpu";
constexpr char kLayoutKeyPrefix[] = "layout.";
constexpr size_t kDigestBytes = 32;
// The files of a Hugging Face checkpoint that describe its tokenizer and generation defaults.
constexpr std::array<const char*, 8> kTokenizerFiles = {
    "tokenizer.json",   "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "generation_config.json", "vocab.json",
    "merges.txt",       "tiktoken.model"};

std::string IterationDirName(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }
// Where a re-save without RENAME_EXCHANGE keeps the earlier save meanwhile (Note [Re-saving]).
std::string OldDirName(const std::string& dir) { return dir + ".old"; }
std::string ShardFile(int rank) { return fmt::format("optimizer/rank_{:05d}.safetensors", rank); }

at::Tensor CpuRngState() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void SetCpuRngState(const at::Tensor& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// Every rank's digest (64 hex digits) of its optimizer shard, in rank order, on every rank.
std::vector<std::string> GatherDigests(const std::string& hex, Communicator& comm,
                                       c10::Device device) {
  at::Tensor mine = at::empty({static_cast<int64_t>(kDigestBytes)}, at::kByte);
  for (size_t i = 0; i < kDigestBytes; ++i) {
    mine.data_ptr<uint8_t>()[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  at::Tensor all = at::empty({static_cast<int64_t>(kDigestBytes) * comm.size()},
                             at::TensorOptions().dtype(at::kByte).device(device));
  comm.AllGather(mine.to(device), all);
  all = all.cpu();
  std::vector<std::string> out;
  for (int r = 0; r < comm.size(); ++r) {
    std::string digest;
    for (size_t i = 0; i < kDigestBytes; ++i) {
      digest += fmt::format("{:02x}", all.data_ptr<uint8_t>()[r * kDigestBytes + i]);
    }
    out.push_back(std::move(digest));
  }
  return out;
}

void CopyTokenizerFiles(const std::string& from, const std::string& to) {
  for (const char* name : kTokenizerFiles) {
    const std::string source = JoinPath(from, name);
    if (PathExists(source)) WriteFileAtomically(JoinPath(to, name), ReadWholeFile(source));
  }
}

json::Value StateJson(const LoopState& state, const config::Config& config, int dp_size,
                      int64_t ep_size, int64_t tp_size, int64_t optimizer_step) {
  return json::Value::MakeObject({
      {"format", json::Value::String(kFormat)},
      {"version", json::Value::Int(kFormatVersion)},
      {"iteration", json::Value::Int(state.iteration)},
      {"weight_version", json::Value::Int(state.weight_version)},
      {"optimizer_step", json::Value::Int(optimizer_step)},
      {"dp_size", json::Value::Int(dp_size)},
      {"expert_model_parallel_size", json::Value::Int(ep_size)},
      {"tensor_model_parallel_size", json::Value::Int(tp_size)},
      {"seed", json::Value::Int(config.run.seed)},
      {"rollout", state.rollout},
  });
}

// Checks every file this rank reads against the manifest: the shared files and the optimizer
// shards `shards` (its own, or every saved rank's when resharding).
void VerifyFiles(const std::string& dir, const std::map<std::string, std::string>& manifest,
                 const std::vector<std::string>& shards) {
  std::vector<std::string> required = {kStateFile, kConfigFile, kHfConfigFile};
  required.insert(required.end(), shards.begin(), shards.end());
  for (const std::string& file : required) {
    RL_CHECK(manifest.count(file) == 1, CheckpointError,
             "{}: the manifest does not list {}; the checkpoint is incomplete or was written by "
             "another job shape",
             JoinPath(dir, kManifest), file);
  }
  for (const auto& [name, digest] : manifest) {
    if (name.rfind("optimizer/", 0) == 0 &&
        std::find(shards.begin(), shards.end(), name) == shards.end()) {
      continue;
    }
    const std::string path = JoinPath(dir, name);
    RL_CHECK(PathExists(path), CheckpointError, "{}: listed in {} but missing", path, kManifest);
    const std::string actual = FileSha256(path);
    RL_CHECK(actual == digest, CheckpointError,
             "{}: SHA256 {} differs from {} in {}: the file is corrupt or changed since the save",
             path, actual, digest, kManifest);
  }
}

int64_t ParseMetadataInt(const model::SafetensorsFile& file, const std::string& key) {
  const auto it = file.metadata().find(key);
  RL_CHECK(it != file.metadata().end(), CheckpointError, "{}: metadata has no '{}'", file.path(),
           key);
  try {
    size_t used = 0;
    const int64_t value = std::stoll(it->second, &used);
    if (used == it->second.size()) return value;
  } catch (const std::exception&) {
  }
  throw CheckpointError(fmt::format("{}: metadata '{}' is '{}', expected an integer", file.path(),
                                    key, it->second));
}

optimizer::ShardState ReadShard(const model::SafetensorsFile& file, int64_t dp_rank,
                                int64_t dp_size, int64_t tp_rank) {
  // Shards saved before tensor parallelism carry no TP rank (TP 1).
  const int64_t saved_tp_rank =
      file.metadata().count("tp_rank") ? ParseMetadataInt(file, "tp_rank") : 0;
  RL_CHECK(saved_tp_rank == tp_rank, CheckpointError,
           "{}: holds the shard of TP rank {}, expected {}", file.path(), saved_tp_rank, tp_rank);
  RL_CHECK(ParseMetadataInt(file, "dp_rank") == dp_rank, CheckpointError,
           "{}: holds the shard of DP rank {}, expected {}", file.path(),
           ParseMetadataInt(file, "dp_rank"), dp_rank);
  RL_CHECK(ParseMetadataInt(file, "dp_size") == dp_size, CheckpointError,
           "{}: written by {} DP ranks, this job has {}", file.path(),
           ParseMetadataInt(file, "dp_size"), dp_size);
  optimizer::ShardState shard;
  shard.step = ParseMetadataInt(file, "step");
  for (const auto& [key, value] : file.metadata()) {
    if (key.rfind(kLayoutKeyPrefix, 0) == 0) {
      shard.layouts[key.substr(std::string_view(kLayoutKeyPrefix).size())] = value;
    }
  }
  for (const model::TensorInfo& info : file.tensors()) {
    if (info.name != kRngTensor) shard.tensors[info.name] = file.Get(info.name);
  }
  return shard;
}

// The layout of the job that saved a checkpoint.
struct SavedLayout {
  int64_t dp_size = 1;
  int64_t ep_size = 1;
  int64_t tp_size = 1;
};

LoopState ReadState(const std::string& dir, SavedLayout& layout) {
  const std::string path = JoinPath(dir, kStateFile);
  const json::Value state = json::ParseFile(path);
  LoopState out;
  try {
    RL_CHECK(state.at("format").AsString() == kFormat, CheckpointError,
             "{}: format '{}', expected '{}'", path, state.at("format").AsString(), kFormat);
    RL_CHECK(state.at("version").AsInt64() == kFormatVersion, CheckpointError,
             "{}: format version {}, this trainer reads version {}", path,
             state.at("version").AsInt64(), kFormatVersion);
    layout.dp_size = state.at("dp_size").AsInt64();
    // Checkpoints of the first format version were all saved at EP 1.
    const json::Value* ep = state.Find("expert_model_parallel_size");
    layout.ep_size = ep != nullptr ? ep->AsInt64() : 1;
    const json::Value* tp = state.Find("tensor_model_parallel_size");  // absent: saved at TP 1
    layout.tp_size = tp != nullptr ? tp->AsInt64() : 1;
    RL_CHECK(layout.tp_size >= 1, CheckpointError, "{}: tensor_model_parallel_size {}", path,
             layout.tp_size);
    // Note [Rank grid]: EP groups consecutive ranks of the whole DP x TP grid, as ParallelGroups
    // allows (-np 2 at TP 2 and EP 2 has DP 1), so EP divides DP x TP, not DP alone.
    RL_CHECK(layout.dp_size >= 1 && layout.ep_size >= 1 &&
                 (layout.dp_size * layout.tp_size) % layout.ep_size == 0,
             CheckpointError,
             "{}: dp_size {}, tensor_model_parallel_size {} and expert_model_parallel_size {} do "
             "not form a layout (EP must divide DP x TP)",
             path, layout.dp_size, layout.tp_size, layout.ep_size);
    out.iteration = state.at("iteration").AsInt64();
    out.weight_version = state.at("weight_version").AsInt64();
    out.rollout = state.at("rollout");
  } catch (const json::TypeError& e) {
    throw CheckpointError(fmt::format("{}: {}", path, e.what()));
  }
  return out;
}

}  // namespace

void SeedDefaultGenerator(int64_t seed, int rank) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(static_cast<uint64_t>(seed) * 1000003u + static_cast<uint64_t>(rank));
}

std::string ResolveCheckpointDir(const std::string& path) {
  if (PathExists(JoinPath(path, kManifest))) return path;
  const std::string latest = JoinPath(path, kLatest);
  if (!PathExists(latest)) {
    throw CheckpointError(fmt::format(
        "{}: not a checkpoint: it has no {} (a save that did not finish, or not written by this "
        "trainer) and no {} file naming one",
        path, kManifest, kLatest));
  }
  std::string name = ReadWholeFile(latest);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  static const std::regex kIterationDir("iter_[0-9]{7,}");
  RL_CHECK(std::regex_match(name, kIterationDir), CheckpointError,
           "{}: expected one line 'iter_NNNNNNN', found '{}'", latest, name);
  const std::string dir = JoinPath(path, name);
  if (!PathExists(JoinPath(dir, kManifest)) && PathExists(JoinPath(OldDirName(dir), kManifest))) {
    // Note [Re-saving]: a crash between the two renames of a re-save without RENAME_EXCHANGE.
    spdlog::warn("{}: names {}, which has no {}; loading the earlier save of that iteration, {}",
                 latest, dir, kManifest, OldDirName(dir));
    return OldDirName(dir);
  }
  RL_CHECK(PathExists(JoinPath(dir, kManifest)), CheckpointError,
           "{}: names {}, which has no {}", latest, dir, kManifest);
  return dir;
}

std::map<std::string, std::string> ReadManifest(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifest);
  std::istringstream lines(ReadWholeFile(path));
  static const std::regex kLine("([0-9a-f]{64})  ([^/].*)");
  std::map<std::string, std::string> out;
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    std::smatch match;
    const bool ok = std::regex_match(line, match, kLine) &&
                    match[2].str().find("..") == std::string::npos && match[2].str() != kManifest;
    RL_CHECK(ok, CheckpointError,
             "{}: line {}: expected '<64 lowercase hex digits>  <relative path>', found '{}'",
             path, number, line.substr(0, 120));
    RL_CHECK(out.emplace(match[2].str(), match[1].str()).second, CheckpointError,
             "{}: line {}: {} is listed twice", path, number, match[2].str());
  }
  RL_CHECK(!out.empty(), CheckpointError, "{}: empty", path);
  return out;
}

std::string SaveCheckpoint(const std::string& root, const LoopState& state, Actor& actor,
                           const config::Config& config, const ParallelGroups& groups) {
  // One shard per rank of the job, named by its world rank (its DP rank without TP).
  Communicator& comm = groups.world();
  Communicator& dp = groups.dp();
  const std::string final_dir = JoinPath(root, IterationDirName(state.iteration));
  const std::string partial = final_dir + ".partial";
  if (comm.rank() == 0) {
    MakeDirectories(root);
    RemoveTree(partial);  // left by a save that did not finish
    MakeDirectories(JoinPath(partial, "optimizer"));
  }
  comm.Barrier();

  // Every rank: its optimizer shard and RNG state.
  const int64_t ep_size = actor.model_config().expert_shard.size;
  const optimizer::ShardState shard = actor.optimizer().ExportState();
  NamedTensors tensors;
  for (const auto& [name, tensor] : shard.tensors) tensors.push_back({name, tensor});
  tensors.push_back({kRngTensor, CpuRngState()});
  std::map<std::string, std::string> metadata = {{"format", "rl-optimizer-shard"}};
  metadata["step"] = std::to_string(shard.step);
  metadata["dp_rank"] = std::to_string(dp.rank());
  metadata["dp_size"] = std::to_string(dp.size());
  metadata["ep_size"] = std::to_string(ep_size);
  metadata["tp_rank"] = std::to_string(groups.tp_rank());
  metadata["tp_size"] = std::to_string(groups.tp_size());
  for (const auto& [kind, layout] : shard.layouts) metadata[kLayoutKeyPrefix + kind] = layout;
  const std::string shard_path = JoinPath(partial, ShardFile(comm.rank()));
  model::WriteSafetensors(shard_path, tensors, metadata);
  if (comm.rank() != 0) MaybeInjectFault(FaultPoint::kCheckpointWrite, comm.rank(), state.iteration);
  const std::vector<std::string> shard_digests =
      GatherDigests(FileSha256(shard_path), comm, actor.device());

  // The weights of the whole model, every expert included, so that the checkpoint does not
  // depend on EP (written by rank 0, or by the ranks together under EP; collective).
  actor.WriteHfCheckpoint(partial);
  // Rank 0: the shared files, the manifest, the rename, `latest`.
  if (comm.rank() == 0) {
    if (config.model.init == config::InitMode::kCheckpoint &&
        !config.model.hf_checkpoint.empty()) {
      CopyTokenizerFiles(config.model.hf_checkpoint, partial);
    }
    WriteFileAtomically(
        JoinPath(partial, kStateFile),
        json::Dump(StateJson(state, config, dp.size(), ep_size, groups.tp_size(), shard.step), 2) +
            "\n");
    WriteFileAtomically(JoinPath(partial, kConfigFile), config::DumpToml(config));
    MaybeInjectFault(FaultPoint::kCheckpointWrite, comm.rank(), state.iteration);
    std::string manifest;
    for (const std::string& name : ListFiles(partial)) {
      std::string digest;
      for (int r = 0; r < comm.size(); ++r) {
        if (name == ShardFile(r)) digest = shard_digests[static_cast<size_t>(r)];
      }
      if (digest.empty()) digest = FileSha256(JoinPath(partial, name));
      manifest += digest + "  " + name + "\n";
    }
    WriteFileAtomically(JoinPath(partial, kManifest), manifest);
    if (PathExists(final_dir)) {  // the same iteration saved before: Note [Re-saving]
      if (ExchangePaths(partial, final_dir)) {
        RemoveTree(partial);  // the earlier save, now under the .partial name
      } else {
        const std::string old = OldDirName(final_dir);
        RemoveTree(old);
        RenamePath(final_dir, old);
        RenamePath(partial, final_dir);
        RemoveTree(old);
      }
    } else {
      RenamePath(partial, final_dir);
    }
    WriteFileAtomically(JoinPath(root, kLatest), IterationDirName(state.iteration) + "\n");
  }
  comm.Barrier();
  spdlog::info("saved checkpoint {} (iteration {}, optimizer step {})", final_dir, state.iteration,
               shard.step);
  return final_dir;
}

namespace {

// Note [Resharding optimizer state]: a reader of the saved ranks' shards, each with the layouts
// the saving job cut it from (computed from this model's params at the saved EP and DP sizes, and
// checked against the layouts the shard records).
// Saved rank w (of DP x TP) is DP rank w / TP and TP rank w % TP, EP rank w % EP and EDP rank
// w / EP (Note [Rank grid]).
optimizer::DistributedOptimizer::SavedShardReader ShardReader(const std::string& dir,
                                                              const Actor& actor,
                                                              const SavedLayout& saved) {
  using optimizer::BufferKind;
  using optimizer::DistributedOptimizer;
  const int64_t expert_dp = saved.dp_size * saved.tp_size / saved.ep_size;
  std::vector<std::array<optimizer::BufferLayout, 2>> layouts;  // by saved TP rank
  for (int64_t tp_rank = 0; tp_rank < saved.tp_size; ++tp_rank) {
    const std::vector<ParamSpec> params =
        actor.TrainedParams(saved.ep_size, {tp_rank, saved.tp_size});
    layouts.push_back(
        {DistributedOptimizer::Layout(BufferKind::kDense, params, static_cast<int>(saved.dp_size)),
         DistributedOptimizer::Layout(BufferKind::kExpert, params, static_cast<int>(expert_dp))});
  }
  const int64_t experts_per_rank = actor.model_config().n_routed_experts / saved.ep_size;
  return [=](int64_t rank) {
    const model::SafetensorsFile file =
        model::SafetensorsFile::Open(JoinPath(dir, ShardFile(static_cast<int>(rank))));
    optimizer::SavedShard shard;
    shard.state = ReadShard(file, rank / saved.tp_size, saved.dp_size, rank % saved.tp_size);
    shard.layouts = layouts[static_cast<size_t>(rank % saved.tp_size)];
    shard.index = {rank / saved.tp_size, rank / saved.ep_size};
    shard.first_expert = rank % saved.ep_size * experts_per_rank;
    for (BufferKind kind : optimizer::kBufferKinds) {
      const std::string name(optimizer::ToString(kind));
      const auto it = shard.state.layouts.find(name);
      RL_CHECK(it != shard.state.layouts.end() &&
                   it->second == shard.layouts[static_cast<size_t>(kind)].Describe(),
               CheckpointError,
               "{}: its {} buffer layout is not this model's at DP {}, EP {} and TP {} (another "
               "model or --freeze-params?): the optimizer state cannot be resharded",
               file.path(), name, saved.dp_size, saved.ep_size, saved.tp_size);
    }
    return shard;
  };
}

// Runs `import`; an rl::Error it throws (a state that does not fit the optimizer) becomes a
// CheckpointError naming `where`, the file or directory it came from.
template <class Fn>
void ReportAsCheckpointError(const std::string& where, Fn&& import) {
  try {
    import();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(fmt::format("{}: {}", where, e.what()));
  }
}

}  // namespace

LoopState LoadCheckpoint(const std::string& path, Actor& actor, const ParallelGroups& groups) {
  Communicator& comm = groups.dp();
  const std::string dir = ResolveCheckpointDir(path);
  const std::string own_shard = ShardFile(groups.world().rank());
  SavedLayout saved;
  LoopState state = ReadState(dir, saved);
  const model::ModelConfig& model = actor.model_config();
  const bool same_layout = saved.dp_size == comm.size() &&
                           saved.ep_size == model.expert_shard.size &&
                           saved.tp_size == groups.tp_size();
  const int64_t saved_ranks = saved.dp_size * saved.tp_size;
  std::vector<std::string> shards = {own_shard};
  if (!same_layout) {
    shards.clear();
    for (int64_t r = 0; r < saved_ranks; ++r) shards.push_back(ShardFile(static_cast<int>(r)));
  }
  VerifyFiles(dir, ReadManifest(dir), shards);

  model::TensorMap all = actor.AllTensors();
  model::LoadParams(model::CheckpointReader::Open(dir), model, all);
  int64_t step = 0;
  if (same_layout) {
    const model::SafetensorsFile shard_file =
        model::SafetensorsFile::Open(JoinPath(dir, own_shard));
    const optimizer::ShardState shard =
        ReadShard(shard_file, comm.rank(), comm.size(), groups.tp_rank());
    ReportAsCheckpointError(shard_file.path(), [&] { actor.optimizer().ImportState(shard); });
    RL_CHECK(shard_file.Find(kRngTensor) != nullptr, CheckpointError, "{}: no tensor '{}'",
             shard_file.path(), kRngTensor);
    SetCpuRngState(shard_file.Get(kRngTensor).clone());
    step = shard.step;
  } else {
    // Another layout: the optimizer state is resharded; the CPU generator keeps this job's seed
    // (SeedDefaultGenerator), since the saved ranks' states do not map to these ranks.
    ReportAsCheckpointError(dir, [&] {
      actor.optimizer().ImportResharded(saved_ranks, ShardReader(dir, actor, saved),
                                        model.first_local_expert(), model.n_routed_experts);
    });
    step = actor.optimizer().step();
    spdlog::info(
        "resharded the optimizer state of {} from DP {} x EP {} x TP {} to DP {} x EP {} x TP {}",
        dir, saved.dp_size, saved.ep_size, saved.tp_size, comm.size(), model.expert_shard.size,
        groups.tp_size());
  }
  // The params are the masters cast, exactly as at the end of the step that was saved.
  actor.optimizer().CastMainToParams();
  actor.optimizer().AllGatherParams();
  spdlog::info("loaded checkpoint {} (iteration {}, optimizer step {})", dir, state.iteration,
               step);
  return state;
}

}  // namespace rl
