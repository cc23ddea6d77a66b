#include "trainer/engine_rollout.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <sstream>
#include <unordered_map>

#include "launch/check.h"
#include "trainer/data/chat_template.h"
#include "trainer/data/prompt_dataset.h"
#include "trainer/data/rewards.h"
#include "trainer/data/tokenizer.h"
#include "trainer/memory/region_manager.h"
#include "trainer/rollout/engine.h"
#include "trainer/rollout_split.h"
#include "trainer/routing_replay.h"
#include "weight_sync/weight_sync.h"

namespace rl {
namespace {

using memory::RegionTag;

class EngineRollout final : public Rollout {
 public:
  EngineRollout(const config::ResolvedConfig& resolved, const model::ModelConfig& model,
                const ParallelGroups& groups, c10::Device device, memory::RegionManager& regions)
      : resolved_(resolved),
        comm_(groups.dp()),
        device_(device),
        tokenizer_(model.hf_config.is_null() || resolved.config.model.hf_checkpoint.empty()
                       ? std::unique_ptr<data::Tokenizer>(new data::ByteTokenizer())
                       : data::LoadTokenizer(resolved.config.model.hf_checkpoint)),
        reward_(data::MakeRewardFn(resolved.config.data.rm_type)),
        regions_(regions) {
    const config::Config& c = resolved.config;
    RL_CHECK(!c.data.prompt_data.empty(), ConfigError,
             "generation needs prompts: pass --prompt-data FILE (JSONL), or replay recorded data "
             "with --load-debug-rollout-data FILE");
    RL_CHECK(tokenizer_->vocab_size() <= model.vocab_size, ConfigError,
             "the tokenizer has {} tokens but the model's vocabulary is {}",
             tokenizer_->vocab_size(), model.vocab_size);
    if (c.data.apply_chat_template) {
      template_ = std::make_unique<data::ChatTemplate>(
          data::ChatTemplate::Recognize(tokenizer_->chat_template()));
    }
    const int64_t longest_prompt = LoadPrompts(c, model);
    // This rank's rows: its share of the prompts (the first rank's is the largest), n samples each.
    const int64_t max_batch =
        std::max<int64_t>(1, PromptShare(c.rollout.rollout_batch_size, 0, comm_.size()).size() *
                                 c.rollout.n_samples_per_prompt);
    const int64_t max_length = longest_prompt + c.rollout.rollout_max_response_len;
    stop_ids_ = tokenizer_->stop_ids();
    stop_ids_.insert(stop_ids_.end(), c.rollout.rollout_stop_token_ids.begin(),
                     c.rollout.rollout_stop_token_ids.end());

    const auto allocate = [&](RegionTag tag, int64_t bytes) {
      try {
        regions_.Create(tag, bytes, memory::HostBackup::kNone);
      } catch (const Error& e) {
        // Say which options size the region that does not fit.
        throw ConfigError(fmt::format(
            "{}; the {} region of {} holds {}", e.what(), memory::RegionTagName(tag),
            memory::FormatBytes(bytes),
            tag == RegionTag::kKvCache
                ? fmt::format("{} rows x {} tokens: this rank's share of --rollout-batch-size {} "
                              "x --n-samples-per-prompt {}, and the longest prompt kept ({} "
                              "tokens, at most --rollout-max-prompt-len) + "
                              "--rollout-max-response-len {}",
                              max_batch, max_length, c.rollout.rollout_batch_size,
                              c.rollout.n_samples_per_prompt, longest_prompt,
                              c.rollout.rollout_max_response_len)
                : std::string("the model's weights (--hf-checkpoint / --model-config, "
                              "--params-dtype)")));
      }
      return regions_.Carve(tag, bytes, at::kByte);
    };
    const at::ScalarType dtype =
        c.model.params_dtype == config::ParamsDtype::kFp32 ? at::kFloat : at::kBFloat16;
    engine_ = std::make_unique<rollout::RolloutEngine>(
        model, dtype, device, max_batch, max_length, allocate,
        rollout::Records{c.rl.use_rollout_routing_replay, c.rl.use_rollout_indexer_replay},
        rollout::ExpertParallel{groups.ep(), c.rollout.rollout_ep_capacity_factor}, groups.tp());
    RL_CHECK(!c.rl.use_rollout_routing_replay || engine_->records_routing(), ConfigError,
             "--use-rollout-routing-replay needs a model with MoE layers");
    RL_CHECK(!c.rl.use_rollout_indexer_replay || !model.indexer_types.empty(), ConfigError,
             "--use-rollout-indexer-replay needs a model with a DSA indexer (GLM-5, GLM-5.2)");
    engine_->set_cuda_graphs(c.rollout.rollout_cuda_graphs);
    engine_->set_latent_mla_decode(c.rollout.rollout_mla_latent_decode);
    engine_->set_programmatic_launch(c.rollout.rollout_programmatic_launch);
    engine_->set_overlapped_steps(c.rollout.rollout_overlap_steps);
    engine_->SetMemoryHooks(
        [this] {
          regions_.Pause(RegionTag::kKvCache);
          if (!regions_.GetOrThrow(RegionTag::kRolloutWeights).is_paused()) {
            regions_.Pause(RegionTag::kRolloutWeights);
          }
        },
        [this] { regions_.Resume(RegionTag::kKvCache); });
    spdlog::info(
        "rollout engine: {} prompts, batch {} x {} tokens, stop ids {}, reward {}, decode {}",
        dataset_->size(), max_batch, max_length, fmt::join(stop_ids_, ","),
        config::NameOf(c.data.rm_type),
        engine_->uses_cuda_graphs() ? "by CUDA graphs" : "eager");
  }

  // Note [Data-parallel rollout]: this rank generates its share of the prompts; the batch
  // returned is everyone's.
  rl_algo::RolloutBatch Generate(int64_t iteration) override {
    const config::Config& c = resolved_.config;
    const int64_t n = c.rollout.n_samples_per_prompt;
    const std::vector<data::PromptExample> prompts =
        dataset_->NextBatch(c.rollout.rollout_batch_size);
    const PromptRange mine =
        PromptShare(static_cast<int64_t>(prompts.size()), comm_.rank(), comm_.size());
    std::vector<std::vector<int64_t>> inputs;
    for (int64_t p = mine.begin; p < mine.end; ++p) {
      const std::vector<int64_t>& ids = prompt_ids_.at(prompts[p].line);
      for (int64_t k = 0; k < n; ++k) inputs.push_back(ids);
    }
    rollout::SamplingParams sampling;
    sampling.temperature = c.rollout.rollout_temperature;
    sampling.top_p = c.rollout.rollout_top_p;
    sampling.top_k = c.rollout.rollout_top_k;
    sampling.max_new_tokens = c.rollout.rollout_max_response_len;
    sampling.stop_token_ids = stop_ids_;
    // Sample k of prompt p draws with base + p * n + k; the bases of two iterations are a whole
    // batch (plus one) apart, so no two samples of a run share a seed.
    const int64_t batch_rows = static_cast<int64_t>(prompts.size()) * n;
    const uint64_t base = static_cast<uint64_t>(c.run.seed) * 1000003u +
                          static_cast<uint64_t>(iteration) * static_cast<uint64_t>(batch_rows + 1);
    sampling.seed = base + static_cast<uint64_t>(mine.begin * n);
    // Also with no prompts: under expert parallelism Generate is a collective over the EP group
    // (Note [Expert-parallel decode]), and an engine with nothing to generate serves the others.
    const std::vector<rollout::Generation> generations = engine_->Generate(inputs, sampling);

    std::vector<rl_algo::Sample> local;
    for (size_t i = 0; i < generations.size(); ++i) {
      const rollout::Generation& g = generations[i];
      const int64_t group = mine.begin + static_cast<int64_t>(i) / n;
      rl_algo::Sample s;
      s.tokens = g.prompt;
      s.tokens.insert(s.tokens.end(), g.response.begin(), g.response.end());
      s.response_length = static_cast<int64_t>(g.response.size());
      s.loss_mask.assign(g.response.size(), 1);
      s.reward = reward_(tokenizer_->Decode(g.response, data::SkipSpecial::kYes),
                         prompts[group].label);
      s.rollout_log_probs = g.log_probs;
      s.group_index = group;
      if (engine_->records_routing()) {  // Note [Routing record]
        s.routed_experts = MakeRoutingRecord(
            g.routed_experts, static_cast<int64_t>(engine_->moe_layers().size()),
            static_cast<int64_t>(s.tokens.size()) - 1, 0, engine_->config().num_experts_per_tok,
            engine_->config().n_routed_experts);
      }
      if (c.rl.use_rollout_indexer_replay) {
        const model::ModelConfig& m = engine_->config();
        s.indexer_topk = MakeRoutingRecord(
            g.indexer_topk, static_cast<int64_t>(m.indexer_layers().size()),
            static_cast<int64_t>(s.tokens.size()) - 1, m.index_topk, m.index_topk,
            engine_->max_length());
      }
      local.push_back(std::move(s));
    }
    rl_algo::RolloutBatch batch;
    shares_ = GenerationShares();
    const rollout::GenerateStats& stats = engine_->last_generate_stats();
    shares_.prefills = stats.prefills;
    shares_.decode_steps = stats.decode_steps;
    shares_.row_steps = stats.row_steps;
    for (std::vector<rl_algo::Sample>& part : AllGatherSamples(local, comm_, device_)) {
      int64_t tokens = 0;
      for (const rl_algo::Sample& s : part) tokens += s.response_length;
      shares_.samples.push_back(static_cast<int64_t>(part.size()));
      shares_.response_tokens.push_back(tokens);
      std::move(part.begin(), part.end(), std::back_inserter(batch.samples));
    }
    return batch;
  }

  GenerationShares last_shares() const override { return shares_; }

  void Sleep() override { engine_->Sleep(); }
  void WakeWeights() override {
    if (regions_.GetOrThrow(RegionTag::kRolloutWeights).is_paused()) {
      regions_.Resume(RegionTag::kRolloutWeights);
    }
  }
  void WakeKvCache() override {
    if (engine_->asleep()) engine_->WakeUp();
  }

  weight_sync::SyncStats ReceiveWeights(const NamedTensors& weights, int64_t version) override {
    const weight_sync::SyncStats stats =
        weight_sync::Sync(weights, engine_->layout(), engine_->weight_storage(),
                          resolved_.update_weight_buffer_bytes);
    engine_->set_weight_version(version);
    return stats;
  }

  void CheckWeights(const NamedTensors& weights, int64_t version) override {
    weight_sync::CheckWeightVersion(version, engine_->weight_version());
    weight_sync::CheckWeightsEqual(weights, engine_->layout(), engine_->weight_storage());
  }

  json::Value ExportState() const override { return dataset_->ExportState(); }
  void ImportState(const json::Value& state) override {
    RL_CHECK(!state.is_null(), CheckpointError,
             "the checkpoint has no prompt dataset position (it was saved by a run that replayed "
             "recorded rollout data); it cannot resume generation from --prompt-data");
    dataset_->ImportState(state);
  }

 private:
  // Note [Prompt length limit]
  // Reads --prompt-data, tokenises every prompt once (Generate reuses the ids) and drops, with one
  // warning, the prompts longer than --rollout-max-prompt-len (default: the model's context less
  // --rollout-max-response-len), so that a stray long line neither sizes the KV cache nor runs
  // past the positions the model was trained for. The KV cache is sized by the longest prompt
  // kept plus the response limit: at most the limits, and no more than the data needs. Returns
  // that longest prompt. Throws ConfigError naming the options when the limits leave no room or
  // no prompt is kept.
  int64_t LoadPrompts(const config::Config& c, const model::ModelConfig& model) {
    const int64_t response = c.rollout.rollout_max_response_len;
    const int64_t context = model.max_position_embeddings;  // 0: not stated by the model
    int64_t limit = c.rollout.rollout_max_prompt_len;
    if (context > 0) {
      RL_CHECK(response < context, ConfigError,
               "--rollout-max-response-len {} leaves no room for a prompt in the model's context "
               "of {} positions (max_position_embeddings)",
               response, context);
      RL_CHECK(limit + response <= context, ConfigError,
               "--rollout-max-prompt-len {} + --rollout-max-response-len {} exceed the model's "
               "context of {} positions (max_position_embeddings)",
               limit, response, context);
      if (limit == 0) limit = context - response;
    }
    data::PromptDatasetOptions options;
    options.input_key = c.data.input_key;
    options.label_key = c.data.label_key;
    options.seed = static_cast<uint64_t>(c.run.seed);
    const data::PromptDataset all = data::PromptDataset::LoadJsonl(c.data.prompt_data, options);
    std::vector<data::PromptExample> kept;
    std::vector<int64_t> dropped;  // line numbers
    int64_t longest = 1, longest_dropped = 0;
    for (int64_t i = 0; i < all.size(); ++i) {
      const data::PromptExample& p = all.at(i);
      std::vector<int64_t> ids = Encode(p);
      const int64_t length = static_cast<int64_t>(ids.size());
      if (limit > 0 && length > limit) {
        dropped.push_back(p.line);
        longest_dropped = std::max(longest_dropped, length);
        continue;
      }
      const bool inserted = prompt_ids_.emplace(p.line, std::move(ids)).second;
      RL_CHECK(inserted, Error, "{}: two prompts share line {}", c.data.prompt_data, p.line);
      longest = std::max(longest, length);
      kept.push_back(p);
    }
    RL_CHECK(!kept.empty(), ConfigError,
             "every prompt of {} is longer than --rollout-max-prompt-len {} tokens (the longest "
             "has {}); raise the limit or shorten the prompts",
             c.data.prompt_data, limit, longest_dropped);
    if (!dropped.empty() && comm_.rank() == 0) {
      const size_t shown = std::min<size_t>(dropped.size(), 10);
      spdlog::warn(
          "{} of {} prompts in {} are longer than --rollout-max-prompt-len {} tokens and "
          "are dropped (lines {}{})",
          dropped.size(), all.size(), c.data.prompt_data, limit,
          fmt::join(dropped.begin(), dropped.begin() + shown, ", "),
          dropped.size() > shown ? ", ..." : "");
    }
    dataset_ =
        std::make_unique<data::PromptDataset>(std::move(kept), options.seed, options.shuffle);
    return longest;
  }

  std::vector<int64_t> Encode(const data::PromptExample& p) const {
    if (template_) {
      std::vector<data::ChatMessage> messages = p.messages;
      if (!p.is_chat()) messages = {{"user", p.text}};
      return tokenizer_->Encode(template_->Apply(messages));
    }
    RL_CHECK(!p.is_chat(), ConfigError,
             "prompt on line {} is a chat (a list of messages): pass --apply-chat-template",
             p.line);
    return tokenizer_->Encode(p.text);
  }

  const config::ResolvedConfig& resolved_;
  Communicator& comm_;
  c10::Device device_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  data::RewardFn reward_;
  std::unique_ptr<data::PromptDataset> dataset_;
  std::unique_ptr<data::ChatTemplate> template_;
  std::vector<int64_t> stop_ids_;
  std::unordered_map<int64_t, std::vector<int64_t>> prompt_ids_;  // line -> token ids
  memory::RegionManager& regions_;
  std::unique_ptr<rollout::RolloutEngine> engine_;
  GenerationShares shares_;  // of the last Generate
};

}  // namespace

std::unique_ptr<Rollout> MakeEngineRollout(const config::ResolvedConfig& resolved,
                                           const model::ModelConfig& model,
                                           const ParallelGroups& groups, c10::Device device,
                                           memory::RegionManager& regions) {
  return std::make_unique<EngineRollout>(resolved, model, groups, device, regions);
}

}  // namespace rl
