#include "trainer/actor.h"

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <regex>

#include "launch/check.h"
#include "trainer/model/params.h"
#include "trainer/model/safetensors.h"
#include "trainer/rl/advantages.h"

namespace rl {
namespace {

at::ScalarType ParamsDtype(config::ParamsDtype dtype) {
  return dtype == config::ParamsDtype::kFp32 ? at::kFloat : at::kBFloat16;
}

optimizer::AdamOptions AdamOptionsFrom(const config::Config& c) {
  optimizer::AdamOptions o;
  o.schedule.lr = c.optimizer.lr;
  o.schedule.min_lr = c.optimizer.min_lr;
  o.schedule.style = c.optimizer.lr_decay_style;
  o.schedule.warmup_steps = c.optimizer.lr_warmup_iters;
  const int64_t total_steps = c.run.num_rollout * c.rollout.num_steps_per_rollout;
  o.schedule.decay_steps = c.optimizer.lr_decay_iters > 0
                               ? c.optimizer.lr_decay_iters
                               : std::max<int64_t>(1, total_steps - c.optimizer.lr_warmup_iters);
  o.beta1 = c.optimizer.adam_beta1;
  o.beta2 = c.optimizer.adam_beta2;
  o.eps = c.optimizer.adam_eps;
  o.weight_decay = c.optimizer.weight_decay;
  o.clip_grad = c.optimizer.clip_grad;
  return o;
}

PlanOptions PlanOptionsFrom(const config::RolloutOptions& r) {
  PlanOptions o;
  o.global_batch_size = r.global_batch_size;
  o.micro_batch_size = r.micro_batch_size;
  o.balance_data = r.balance_data;
  o.dynamic_batch_size = r.use_dynamic_batch_size;
  o.max_tokens_per_gpu = r.max_tokens_per_gpu;
  return o;
}

// The tokens of a micro-batch, right-padded with 0: [mb, max_len].
struct MicroBatch {
  at::Tensor tokens;
  std::vector<int64_t> lengths;
  std::vector<int64_t> response_lengths;
  int64_t max_response = 0;
};

// Note [Rollout log-probs] (trainer/rollout/sampler.h): the policy trained is the one the engine
// sampled from, logits / rollout temperature (1 for greedy rollouts, as the engine reports).
double LogProbTemperature(const config::Config& c) {
  return c.rollout.rollout_temperature > 0 ? c.rollout.rollout_temperature : 1.0;
}

// The forward positions of a micro-batch (its longest sample less one), padded to a multiple of
// `multiple` (sequence parallelism needs batch x positions to divide by TP).
int64_t ForwardPositions(const rl_algo::RolloutBatch& batch, const std::vector<int64_t>& indices,
                         int64_t multiple) {
  int64_t longest = 0;
  for (int64_t i : indices) longest = std::max<int64_t>(longest, batch.samples.at(i).tokens.size());
  return (longest - 1 + multiple - 1) / multiple * multiple;
}

// The longest response of a micro-batch: the width of its response-aligned tensors.
int64_t LongestResponse(const rl_algo::RolloutBatch& batch, const std::vector<int64_t>& indices) {
  int64_t longest = 0;
  for (int64_t i : indices) longest = std::max(longest, batch.samples.at(i).response_length);
  return longest;
}

// Right-padded to ForwardPositions(..., multiple) + 1 tokens.
MicroBatch Pack(const rl_algo::RolloutBatch& batch, const std::vector<int64_t>& indices,
                c10::Device device, int64_t multiple) {
  MicroBatch mb;
  for (int64_t i : indices) {
    const rl_algo::Sample& s = batch.samples.at(i);
    mb.lengths.push_back(static_cast<int64_t>(s.tokens.size()));
    mb.response_lengths.push_back(s.response_length);
  }
  mb.max_response = LongestResponse(batch, indices);
  const int64_t max_len = ForwardPositions(batch, indices, multiple) + 1;
  at::Tensor tokens = at::zeros({static_cast<int64_t>(indices.size()), max_len}, at::kLong);
  for (size_t row = 0; row < indices.size(); ++row) {
    const rl_algo::Sample& s = batch.samples[indices[row]];
    tokens[row].narrow(0, 0, s.tokens.size()).copy_(at::tensor(s.tokens, at::kLong));
  }
  mb.tokens = tokens.to(device);
  return mb;
}

// Per-position values [mb, max_len - 1] (position p predicts token p + 1) -> response-aligned
// [mb, max_response], zero-padded; keeps autograd.
at::Tensor ResponseAligned(const at::Tensor& per_position, const MicroBatch& mb) {
  std::vector<at::Tensor> rows;
  for (size_t row = 0; row < mb.lengths.size(); ++row) {
    const int64_t length = mb.lengths[row];
    const int64_t response = mb.response_lengths[row];
    at::Tensor r = per_position[row].narrow(0, length - response - 1, response);
    rows.push_back(at::constant_pad_nd(r, {0, mb.max_response - response}, 0));
  }
  return at::stack(rows);
}

// A per-sample vector field, response-aligned and zero-padded: [mb, max_response].
template <class T, class Field>
at::Tensor PackField(const rl_algo::RolloutBatch& batch, const std::vector<int64_t>& indices,
                     int64_t width, Field field, at::ScalarType dtype) {
  at::Tensor out = at::zeros({static_cast<int64_t>(indices.size()), width}, dtype);
  for (size_t row = 0; row < indices.size(); ++row) {
    const std::vector<T>& values = field(batch.samples[indices[row]]);
    std::vector<double> as_double(values.begin(), values.end());
    out[row].narrow(0, 0, values.size()).copy_(at::tensor(as_double, at::kDouble));
  }
  return out;
}

// What the loss of one micro-batch takes from the rollout, response-aligned [mb, max_response]
// and on the device.
struct MicroBatchInputs {
  at::Tensor loss_mask;
  at::Tensor rewards;  // [mb], post-processed
  at::Tensor rollout;  // the engine's log-probs; undefined when a sample has none
};

MicroBatchInputs PackInputs(const rl_algo::RolloutBatch& batch, const std::vector<int64_t>& indices,
                            const at::Tensor& rewards, c10::Device device) {
  const int64_t width = LongestResponse(batch, indices);  // Pack's max_response
  MicroBatchInputs in;
  in.loss_mask =
      PackField<int>(
          batch, indices, width,
          [](const rl_algo::Sample& s) -> const auto& { return s.loss_mask; }, at::kFloat)
          .to(device);
  std::vector<int64_t> local(indices.begin(), indices.end());
  in.rewards = rewards.index({at::tensor(local, at::kLong)}).to(device);
  const bool have_rollout = std::all_of(indices.begin(), indices.end(), [&](int64_t i) {
    return batch.samples[i].rollout_log_probs.has_value();
  });
  if (have_rollout) {
    in.rollout = PackField<float>(
                     batch, indices, width,
                     [](const rl_algo::Sample& s) -> const auto& { return *s.rollout_log_probs; },
                     at::kFloat)
                     .to(device);
  }
  return in;
}

}  // namespace

ParamSplit SplitParams(const std::vector<ParamSpec>& specs, const std::string& freeze_regex,
                       int64_t expert_ranks) {
  ParamSplit split;
  const std::regex freeze(freeze_regex.empty() ? std::string("$^") : freeze_regex);
  // How many of each parameter's checkpoint tensors the regex matches, out of how many: for
  // stacked experts over every EP rank's experts (the whole model's names), so that the choice
  // does not depend on EP and every rank makes the same one.
  std::map<std::string, std::pair<int64_t, int64_t>> matches;
  if (!freeze_regex.empty()) {
    int64_t local_experts = 0;
    for (const ParamSpec& spec : specs) {
      if (spec.role == ParamRole::kRoutedExpert) local_experts = spec.shape.at(0);
    }
    for (int64_t rank = 0; rank < expert_ranks; ++rank) {
      for (const model::HfSlice& slice : model::HfLayout(specs, rank * local_experts)) {
        if (rank > 0 && slice.expert < 0) continue;  // dense tensors once
        auto& [matched, total] = matches[slice.param];
        matched += std::regex_search(slice.hf_name, freeze) ? 1 : 0;
        ++total;
      }
    }
  }
  for (const ParamSpec& spec : specs) {
    const auto [matched, total] = matches[spec.name];
    RL_CHECK(matched == 0 || matched == total, ConfigError,
             "--freeze-params '{}' matches {} of the {} checkpoint tensors stacked in {}; the "
             "routed experts of a layer are frozen or trained together",
             freeze_regex, matched, total, spec.name);
    if (spec.role == ParamRole::kFp32Extra) {
      split.extras.push_back(spec);
    } else if (matched > 0) {
      split.frozen.push_back(spec);
    } else {
      split.trained.push_back(spec);
    }
  }
  return split;
}

std::map<RegionTag, int64_t> Actor::StorageBytes(const config::ResolvedConfig& resolved,
                                                 const model::ModelConfig& model, int dp_size,
                                                 int expert_dp_size) {
  const at::ScalarType dtype = ParamsDtype(resolved.config.model.params_dtype);
  const ParamSplit split =
      SplitParams(model::ListParams(model), resolved.config.model.freeze_params,
                  model.expert_shard.size);
  std::map<RegionTag, int64_t> bytes =
      optimizer::DistributedOptimizer::StorageBytes(split.trained, dp_size, dtype, expert_dp_size);
  int64_t extras = 0;
  for (const ParamSpec& spec : split.extras) {
    extras += AlignedAllocationBytes(
        spec.numel() * c10::elementSize(model::ParamDtype(spec, dtype)));
  }
  bytes[RegionTag::kExtras] = extras;
  return bytes;
}

Actor::Actor(const config::ResolvedConfig& resolved, model::ModelConfig model,
             const ParallelGroups& groups, c10::Device device, const optimizer::Allocator& allocate)
    : resolved_(resolved),
      model_(std::move(model)),
      groups_(groups),
      comm_(groups.dp()),
      device_(device),
      dtype_(ParamsDtype(resolved.config.model.params_dtype)),
      specs_(model::ListParams(model_)),
      loss_options_(rl_algo::LossOptionsFrom(resolved.config)) {
  const config::Config& c = resolved.config;
  ParamSplit split = SplitParams(specs_, c.model.freeze_params, model_.expert_shard.size);
  for (const ParamSpec& spec : split.extras) {
    extras_[spec.name] =
        allocate(RegionTag::kExtras, spec.numel(), model::ParamDtype(spec, dtype_)).view(spec.shape);
  }
  for (const ParamSpec& spec : split.frozen) {
    frozen_[spec.name] = at::zeros(
        spec.shape, at::TensorOptions().dtype(model::ParamDtype(spec, dtype_)).device(device_));
  }
  if (!frozen_.empty()) {
    spdlog::info("--freeze-params '{}': {} of {} parameters frozen", c.model.freeze_params,
                 frozen_.size(), specs_.size());
  }
  int64_t trained_numel = 0;
  for (const ParamSpec& p : split.trained) trained_numel += p.numel();
  spdlog::info("actor: {} trained parameters in {} tensors, {} fp32 extras, {} frozen; params {}",
               trained_numel, split.trained.size(), split.extras.size(), split.frozen.size(),
               config::NameOf(c.model.params_dtype));
  optimizer_ = std::make_unique<optimizer::DistributedOptimizer>(
      split.trained, comm_, dtype_, device_, AdamOptionsFrom(c), allocate, &groups.expert_dp(),
      groups.tp());
  // Megatron runs MoE layers under TP with sequence parallelism only.
  const bool sequence_parallel =
      groups.tp() != nullptr && (c.parallel.sequence_parallel || model_.is_moe());
  decoder_ = std::make_unique<model::Decoder>(model_, AllTensors(), model::Kernels::kLibTorch,
                                              groups.ep(), groups.tp(), sequence_parallel);
  if (groups.tp() != nullptr) {
    tp_grads_ = std::make_unique<model::TensorParallelGrads>(split.trained, sequence_parallel,
                                                             *groups.tp());
    if (sequence_parallel) seq_multiple_ = groups.tp_size();
    spdlog::info("actor: tensor parallel {}{}; {} params' partial gradients summed over TP",
                 groups.tp_size(), sequence_parallel ? " with sequence parallelism" : "",
                 tp_grads_->size());
  }
  RL_CHECK(!resolved_.config.rl.use_routing_replay || !model_.moe_layers().empty(), ConfigError,
           "--use-routing-replay / --use-rollout-routing-replay need a model with MoE layers");
}

model::TensorMap Actor::AllTensors() const {
  model::TensorMap all(optimizer_->params().begin(), optimizer_->params().end());
  all.insert(extras_.begin(), extras_.end());
  all.insert(frozen_.begin(), frozen_.end());
  return all;
}

NamedTensors Actor::SourceTensors() const {
  const model::TensorMap all = AllTensors();
  NamedTensors out;
  for (const ParamSpec& spec : specs_) out.push_back({spec.name, all.at(spec.name)});
  return out;
}

NamedTensors Actor::Extras() const {
  NamedTensors out;
  for (const ParamSpec& spec : specs_) {
    const auto it = extras_.find(spec.name);
    if (it != extras_.end()) out.push_back({spec.name, it->second});
  }
  return out;
}

std::unordered_set<const void*> Actor::ParamBufferIds() const {
  std::unordered_set<const void*> ids;
  for (const auto& [name, t] : optimizer_->params()) ids.insert(backup::Identity(t));
  return ids;
}

void Actor::LoadInitialWeights() {
  const config::ModelOptions& m = resolved_.config.model;
  model::TensorMap all = AllTensors();
  if (m.init == config::InitMode::kRandom) {
    model::InitParamsRandom(model_, all, static_cast<uint64_t>(resolved_.config.run.seed));
  } else {
    model::LoadParams(model::CheckpointReader::Open(m.hf_checkpoint), model_, all);
  }
  optimizer_->InitMastersFromParams();
}

std::vector<TrainingPlan> Actor::PlansForAllRanks(const rl_algo::RolloutBatch& batch) const {
  return MakeTrainingPlans(SampleTokens(batch), PlanOptionsFrom(resolved_.config.rollout),
                           comm_.size());
}

PerMicroBatch Actor::ComputeLogProbs(const rl_algo::RolloutBatch& batch, const TrainingPlan& plan,
                                     const PlanReplay* replay, PlanRouting* record) const {
  c10::NoGradGuard no_grad;
  PerMicroBatch out;
  if (record != nullptr) record->clear();
  for (const auto& step : plan.steps) {
    for (const std::vector<int64_t>& indices : step) {
      const MicroBatch mb = Pack(batch, indices, device_, seq_multiple_);
      const int64_t len = mb.tokens.size(1);
      LayerRouting recorded;
      {
        const RoutingReplayScope routing(
            *decoder_, model_, replay != nullptr ? replay->For(out.size()) : ReplayInputs(),
            record != nullptr ? &recorded : nullptr);
        const model::TokenStats stats = decoder_->TokenLogProbs(
            mb.tokens.narrow(1, 0, len - 1), mb.tokens.narrow(1, 1, len - 1),
            /*with_entropy=*/false, LogProbTemperature(resolved_.config));
        out.push_back(ResponseAligned(stats.log_probs, mb).to(at::kFloat));
      }
      if (record != nullptr) record->push_back(std::move(recorded));
    }
  }
  return out;
}

PlanReplay Actor::RolloutReplay(const rl_algo::RolloutBatch& batch, const TrainingPlan& plan,
                                bool experts, bool indexer) const {
  PlanReplay replay;
  for (const auto& step : plan.steps) {
    for (const std::vector<int64_t>& indices : step) {
      const int64_t positions = ForwardPositions(batch, indices, seq_multiple_);
      if (experts) {
        replay.experts.push_back(PackRolloutRouting(batch, indices, positions, model_, device_));
      }
      if (indexer) {
        replay.indexer.push_back(PackRolloutIndexer(batch, indices, positions, model_, device_));
      }
    }
  }
  return replay;
}

TrainResult Actor::Train(const rl_algo::RolloutBatch& batch, const TrainingPlan& plan,
                         const PerMicroBatch& old_log_probs, const PerMicroBatch& ref_log_probs,
                         const PlanReplay* replay) {
  const config::Config& c = resolved_.config;
  // Rewards: group-normalised over the whole rollout (every rank holds it).
  std::vector<double> raw;
  for (const rl_algo::Sample& s : batch.samples) raw.push_back(s.reward);
  const at::Tensor rewards = rl_algo::PostProcessRewards(
      at::tensor(raw, at::kDouble),
      rl_algo::GroupSizes(batch, c.rollout.n_samples_per_prompt),
      rl_algo::RewardOptionsFrom(c));
  const rl_algo::AdvantageOptions advantage_options = rl_algo::AdvantageOptionsFrom(c);
  const rl_algo::AllReduceSum all_reduce = [this](const at::Tensor& t) {
    // Collectives run on the communicator's device (NCCL needs CUDA tensors).
    at::Tensor sum = t.to(t.options().device(device_), /*non_blocking=*/false, /*copy=*/true);
    comm_.AllReduce(sum, ReduceOp::kSum);
    return sum;
  };
  const bool old_from_rollout = old_log_probs.empty();

  // Every micro-batch's inputs and advantages before the first step: --normalize-advantages
  // whitens over the whole rollout (every micro-batch of every step, on every DP rank), with one
  // all-reduce that every rank makes once, as the reference whitens its rollout data before
  // training. The old and reference log-probs (for the KL) are already there for the whole plan.
  std::vector<MicroBatchInputs> inputs_per_mb;
  std::vector<rl_algo::AdvantageInputs> advantage_inputs;
  for (const auto& step : plan.steps) {
    for (const std::vector<int64_t>& indices : step) {
      const size_t mb_index = inputs_per_mb.size();
      MicroBatchInputs in = PackInputs(batch, indices, rewards, device_);
      RL_CHECK(!old_from_rollout || in.rollout.defined(), Error,
               "--use-rollout-logprobs: the rollout has samples without engine log-probs (replayed "
               "data recorded without them)");
      at::Tensor kl;
      if (advantage_options.kl_coef != 0 && !ref_log_probs.empty()) {
        kl = rl_algo::ApproxKl(
            old_from_rollout ? in.rollout : old_log_probs.at(mb_index).to(device_),
            ref_log_probs.at(mb_index).to(device_), loss_options_.kl_loss_type);
      }
      advantage_inputs.push_back({in.rewards, in.loss_mask, kl});
      inputs_per_mb.push_back(std::move(in));
    }
  }
  PerMicroBatch advantages;  // the loss's dtype; the returns are not used (no critic)
  for (const rl_algo::AdvantagesAndReturns& adv :
       rl_algo::ComputeAdvantagesAndReturns(advantage_inputs, advantage_options, all_reduce)) {
    advantages.push_back(adv.advantages.to(at::kFloat));
  }
  advantage_inputs.clear();

  TrainResult result;
  // Note [Log-prob mismatch]: rollout vs the recomputed old log-probs over every micro-batch, or,
  // when the old-logprob pass was skipped (--use-rollout-logprobs), vs the first step's training
  // forward (the only one on the rollout's weights).
  at::Tensor mismatch;
  at::Tensor routing_counts;  // {replayed, differing} (token, layer) pairs, this rank's
  size_t mb_index = 0;
  for (const auto& step : plan.steps) {
    // Global count of trained tokens in this step (per-token aggregation).
    int64_t local_tokens = 0;
    for (const auto& indices : step) {
      for (int64_t i : indices) {
        for (int m : batch.samples[i].loss_mask) local_tokens += m;
      }
    }
    // Collectives run on the communicator's device (NCCL needs CUDA tensors).
    at::Tensor tokens_in_step =
        at::full({1}, local_tokens, at::TensorOptions().dtype(at::kLong).device(device_));
    comm_.AllReduce(tokens_in_step, ReduceOp::kSum);
    rl_algo::LossScale scale;
    scale.global_batch_size = c.rollout.global_batch_size;
    scale.global_num_tokens = std::max<int64_t>(1, tokens_in_step.item<int64_t>());
    scale.dp_size = comm_.size();

    at::Tensor metric_sums;
    for (const std::vector<int64_t>& indices : step) {
      const MicroBatch mb = Pack(batch, indices, device_, seq_multiple_);
      const MicroBatchInputs& in = inputs_per_mb.at(mb_index);
      const at::Tensor& loss_mask = in.loss_mask;
      const at::Tensor& rollout = in.rollout;
      const at::Tensor old =
          old_from_rollout ? at::Tensor() : old_log_probs.at(mb_index).to(device_);
      const at::Tensor ref =
          ref_log_probs.empty() ? at::Tensor() : ref_log_probs.at(mb_index).to(device_);

      const int64_t len = mb.tokens.size(1);
      model::TokenStats stats;
      {
        const RoutingReplayScope routing(
            *decoder_, model_, replay != nullptr ? replay->For(mb_index) : ReplayInputs(), nullptr);
        const bool replays_experts = replay != nullptr && !replay->experts.empty();
        stats = decoder_->TokenLogProbs(
            mb.tokens.narrow(1, 0, len - 1), mb.tokens.narrow(1, 1, len - 1),
            /*with_entropy=*/loss_options_.entropy_coef != 0, LogProbTemperature(resolved_.config));
        if (replays_experts) {
          const int64_t pairs = static_cast<int64_t>(indices.size()) * (len - 1) *
                                static_cast<int64_t>(replay->experts.at(mb_index).size());
          const at::Tensor differing =
              routing.differing_tokens().defined()
                  ? routing.differing_tokens().to(at::kLong)
                  : at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device_));
          const at::Tensor counts = at::cat({at::full({1}, pairs, differing.options()), differing});
          routing_counts = routing_counts.defined() ? routing_counts + counts : counts;
        }
      }
      rl_algo::PolicyLossInputs inputs;
      inputs.log_probs = ResponseAligned(stats.log_probs, mb).to(at::kFloat);
      inputs.old_log_probs = old;
      inputs.ref_log_probs = ref;
      inputs.rollout_log_probs = rollout;
      if (rollout.defined() && (!old_from_rollout || result.steps == 0)) {
        mismatch = rl_algo::AddMismatchSums(
            mismatch,
            rl_algo::MismatchSums(old_from_rollout ? inputs.log_probs : old, rollout, loss_mask));
      }
      inputs.advantages = advantages.at(mb_index);
      inputs.loss_mask = loss_mask;
      if (loss_options_.entropy_coef != 0) {
        inputs.entropy = ResponseAligned(stats.entropy, mb).to(at::kFloat);
      }
      const rl_algo::PolicyLossOutput out = rl_algo::PolicyLoss(inputs, loss_options_, scale);
      out.loss.backward();
      optimizer_->AccumulateGrads();
      metric_sums = metric_sums.defined() ? metric_sums + out.metric_sums : out.metric_sums;
      for (int64_t l : mb.lengths) result.tokens += l;
      ++mb_index;
    }
    metric_sums = metric_sums.to(device_);
    comm_.AllReduce(metric_sums, ReduceOp::kSum);
    if (tp_grads_ != nullptr) {
      tp_grads_->Sum([this](const std::string& name) { return optimizer_->grad(name); });
    }
    const optimizer::StepStats step_stats = optimizer_->Step();
    const rl_algo::LossMetrics metrics = rl_algo::SummarizeLossMetrics(metric_sums.cpu());
    if (result.steps == 0) result.first_step_metrics = metrics;
    result.metrics = metrics;
    result.grad_norm = step_stats.grad_norm;
    result.lr = step_stats.lr;
    ++result.steps;
  }
  if (routing_counts.defined()) {  // Note [Routing replay modes]: the CI check's counts
    comm_.AllReduce(routing_counts, ReduceOp::kSum);
    const at::Tensor counts = routing_counts.cpu();
    result.routing_replayed = counts[0].item<int64_t>();
    result.routing_differing = counts[1].item<int64_t>();
  }
  // Every rank's mismatch sums, when every rank has them (samples with engine log-probs).
  at::Tensor have = at::full({1}, mismatch.defined() ? 1.0 : 0.0,
                             at::TensorOptions().dtype(at::kDouble).device(device_));
  comm_.AllReduce(have, ReduceOp::kSum);
  if (have.item<double>() == comm_.size()) {
    at::Tensor sums = mismatch.narrow(0, 0, 3).contiguous();
    at::Tensor max = mismatch.narrow(0, 3, 1).contiguous();
    comm_.AllReduce(sums, ReduceOp::kSum);
    comm_.AllReduce(max, ReduceOp::kMax);
    result.mismatch = rl_algo::SummarizeMismatch(at::cat({sums, max}));
  }
  return result;
}

void Actor::WriteHfCheckpoint(const std::string& dir) const {
  // Under TP every rank of each TP group gathers the whole tensors of its slices first.
  model::ModelConfig config = model_;
  model::TensorMap tensors = AllTensors();
  if (groups_.tp() != nullptr) {
    tensors = GatherTensorParallel(tensors);
    config.tensor_shard = {};
  }
  Communicator& world = groups_.world();
  if (groups_.ep() == nullptr) {
    if (world.rank() == 0) model::SaveHfCheckpoint(dir, config, tensors);
    return;
  }
  // Note [Expert-parallel saves]: rank 0 the dense tensors, the first rank of each EDP group its
  // experts, then rank 0 the index once every part is on disk.
  model::SaveHfCheckpointPart(dir, config, tensors, world.rank() == 0,
                              groups_.expert_dp().rank() == 0);
  world.Barrier();
  if (world.rank() == 0) model::FinishHfCheckpointParts(dir, config, tensors);
}

std::vector<ParamSpec> Actor::TrainedParams(int64_t ep_size,
                                            model::ModelConfig::TensorShard tensor_shard) const {
  model::ModelConfig sharded = model_;
  sharded.expert_shard = {0, ep_size};
  sharded.tensor_shard = tensor_shard;
  return SplitParams(model::ListParams(sharded), resolved_.config.model.freeze_params, ep_size)
      .trained;
}

model::TensorMap Actor::GatherTensorParallel(const model::TensorMap& local) const {
  Communicator& group = *groups_.tp();
  // Each TP rank's slice of every param (Note [Tensor shard]).
  std::vector<std::unordered_map<std::string, ParamSpec>> by_rank(group.size());
  for (int r = 0; r < group.size(); ++r) {
    model::ModelConfig config = model_;
    config.tensor_shard = {r, group.size()};
    for (ParamSpec& spec : model::ListParams(config)) by_rank[r].emplace(spec.name, spec);
  }
  model::TensorMap whole;
  for (const ParamSpec& spec : specs_) {
    const at::Tensor& mine = local.at(spec.name);
    if (spec.tp_dim < 0) {
      whole.emplace(spec.name, mine);
      continue;
    }
    // An all-gather of equal blocks: each slice padded along tp_dim to the longest (the
    // vocabulary's last slice holds the remainder), then the ranks' slices put back in place,
    // once each (key/value heads shared by several ranks come from the lowest of them).
    const auto dim = static_cast<size_t>(spec.tp_dim);
    int64_t longest = 0;
    for (const auto& specs : by_rank) longest = std::max(longest, specs.at(spec.name).shape[dim]);
    std::vector<int64_t> block_shape = spec.shape;
    block_shape[dim] = longest;
    at::Tensor block = at::zeros(block_shape, mine.options());
    block.narrow(spec.tp_dim, 0, spec.shape[dim]).copy_(mine);
    at::Tensor blocks = at::empty({group.size() * block.numel()}, mine.options());
    group.AllGather(block.view({-1}), blocks);
    std::vector<int64_t> whole_shape = spec.shape;
    whole_shape[dim] = spec.tp_extent;
    at::Tensor out = at::empty(whole_shape, mine.options());
    for (int r = 0; r < group.size(); ++r) {
      const ParamSpec& s = by_rank[r].at(spec.name);
      if (s.tp_duplicate) continue;
      const at::Tensor theirs = blocks.narrow(0, r * block.numel(), block.numel())
                                    .view(block_shape)
                                    .narrow(spec.tp_dim, 0, s.shape[dim]);
      out.narrow(spec.tp_dim, s.tp_start, s.shape[dim]).copy_(theirs);
    }
    whole.emplace(spec.name, out);
  }
  return whole;
}

void Actor::SaveHf(const std::string& dir) const {
  WriteHfCheckpoint(dir);
  if (groups_.world().rank() == 0) {
    spdlog::info("saved the actor as a Hugging Face checkpoint in {}", dir);
  }
  groups_.world().Barrier();
}

}  // namespace rl
