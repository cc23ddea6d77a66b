// decode_bench --checkpoint DIR | --model-config FILE [--layers N] [--batch 64] [--prompt-len 128]
// [--new-tokens 128] [--temperature 0] [--compare-eager] [--compare-programmatic-launch]
// [--compare-overlap] [--no-cuda-graphs] [--no-programmatic-launch] [--no-overlap] [--profile FILE]
// [--step-time]: generation by our rollout engine, greedy (or sampled at --temperature > 0, top-p
// 1, seed 11) (RolloutEngine::Generate, bf16 on the GPU when there is one, decode by CUDA graphs
// there): tokens/s, and the fraction of the HBM roofline it reaches, counting per decode step the
// bytes that must be read at least once over the step time at --hbm-tb-s (H200: 4.8 TB/s). Prints
// one JSON line with the figures, so that tools/bench/vs_transformers.sh can set them against
// `transformers` generate run in the same call. Every row generates exactly --new-tokens tokens (no
// stop tokens), as `generate` with min_new_tokens does. --compare-eager also times eager decode
// steps in the same process and checks that graphs and eager steps generate bit-identical tokens
// and log-probs (the timed ones, and sampled at temperature 1); the exit status is 1 when they
// differ. --compare-programmatic-launch also times the same Generates with the decode kernels
// launched one after another instead of by programmatic dependent launch (Note [Programmatic
// dependent launch] in trainer/kernels/kernel_util.cuh) and checks that both generate the same
// bits (exit status 1 when not). --compare-overlap also times the same Generates with every decode
// step read on the host before the next is launched (Note [Overlapped decode steps] in
// trainer/rollout/engine.h); without stop tokens no row ends early, so both generate the same bits
// (exit status 1 when not). --stop-fraction F > 0 makes the first F of the vocabulary's ids
// stop tokens, so that rows end at different steps as in a real rollout (each sampled token ends
// its row with probability about F at temperature 1 on a random checkpoint): tokens/s then counts
// the tokens generated, and no roofline is reported (its bytes assume every row runs every step).
// --length-groups G > 1 gives the prompts G lengths (row b's is --prompt-len less
// (b mod G) x --prompt-len / (2 G)), as a real rollout's prompts differ (Note [Rollout batching]);
// no roofline then either.
// `decode_steps`, `row_steps` and `overrun_row_steps` say how the last timed Generate ran
// (RolloutEngine::last_generate_stats).
// `generation_sha256` is the SHA-256 of the last timed Generate's rows (each row's token count,
// tokens and log-probs' bits), so that two builds whose kernels should give the same bits can be
// compared across processes.
// On a GPU it also counts the kernels (and copies and sets) of one eager decode step of the
// batch, in all and per layer (`kernels_per_step`, `kernels_per_layer`), by the Kineto profiler;
// --profile writes a Chrome trace of one more Generate (tools/bench/profile_summary.py FILE).
//
// --step-time also times Generates of the same prompts with one new token, the prefill and its
// token, and reports the mean decode step, (best Generate - best prefill) / (new tokens - 1), in
// `decode_step_ms` (and the mean step's roofline bytes over it, `decode_step_roofline_fraction`):
// with long prompts the prefill is most of a Generate's time.
// --model-config FILE decodes a model of that config.json with random weights (seed 3), e.g.
// configs/models/glm5_744b_a40b_bench.json (GLM-5's widths, its 3 dense layers), whose DSA
// indexer selects keys once a row is longer than index_topk (2048); --layers N keeps its first N
// layers (configs/models/glm47_flash.json --layers 4: GLM-4.7-Flash's widths, a dense layer and 3
// MoE layers).
//
// Roofline bytes per step (StepWeightBytes, StepCacheBytes): the KV cache of every row so far
// (in a DSA model, per layer the index keys of every position and the cached latents of at most
// index_topk of them, Note [DSA decode over the selected keys] in trainer/model/layers.cc), the
// embedding rows of the step's tokens (the whole table when the LM head shares it), and
//  - dense models: every other weight;
//  - MoE models: every weight but the routed experts, plus, in each MoE layer, the weights of the
//    distinct experts that the step's tokens (one per row) were routed to. That count is measured
//    after the timed runs (MeanExpertsPerStep): a Decoder over the engine's weights (the same
//    kernels as the engine's) runs one forward over the timed generations, tokens [batch,
//    prompt_len + new_tokens - 1] (each prompt and its response but the last token), with a
//    routing observer. The decode step that produces response token t (t = 1 .. new_tokens - 1)
//    feeds response token t - 1 at column prompt_len + t - 1, so the columns [prompt_len,
//    prompt_len + new_tokens - 1) are the decode steps; per layer and step the distinct expert
//    ids over the batch are counted, and their mean over layers and steps
//    (`experts_used_per_step` in the JSON line) counts for every step. A full forward routes each
//    position as the step did up to rounding (a near-tie may pick another expert: immaterial to
//    a mean over thousands of choices). The first of the new_tokens steps is the prefill's last
//    position, counted as a decode step as for dense models. With --new-tokens 1 there is no
//    decode step to measure and every expert counts.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "launch/device.h"
#include "launch/json.h"
#include "launch/sha256.h"
#include "tools/bench/profiling.h"
#include "trainer/kernels/cuda_kernels.h"
#include "trainer/model/decoder.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/model_config.h"
#include "trainer/model/params.h"
#include "trainer/model/safetensors.h"
#include "trainer/rollout/engine.h"

namespace {

using Clock = std::chrono::steady_clock;

void Synchronize(const at::Device& device) {
  if (device.is_cuda()) at::empty({1}, at::TensorOptions().device(device)).cpu();
}

// Weight bytes one decode step of `batch` rows reads at least once: every parameter but the
// routed experts and the embedding table, `experts_read` routed experts of each MoE layer (none
// in a dense model, which has no routed experts), and `batch` rows of the embedding table (all of
// it when the LM head shares it). Every parameter counts `element_bytes` per element, as the
// engine's dtype.
double StepWeightBytes(const rl::model::ModelConfig& config, double element_bytes,
                       double experts_read, int64_t batch) {
  double bytes = 0;
  for (const auto& spec : rl::model::ListParams(config)) {
    double elements = static_cast<double>(spec.numel());
    if (spec.role == rl::ParamRole::kRoutedExpert) {  // stacked [experts, ...]
      elements *= experts_read / static_cast<double>(spec.shape[0]);
    }
    if (spec.name == "model.embed_tokens.weight" && !config.tie_word_embeddings) {
      elements *= static_cast<double>(std::min(batch, spec.shape[0])) /
                  static_cast<double>(spec.shape[0]);
    }
    bytes += elements * element_bytes;
  }
  return bytes;
}

// Cache bytes one decode step of a row at `length` positions reads at least once: every cached
// position's keys and values; in a DSA model every position's index keys (layers with their own
// indexer) and the latents of at most index_topk positions per layer (those selected; the engine
// gathers them from 2 x index_topk keys on, and reads every latent below that).
double StepCacheBytes(const rl::model::ModelConfig& config, double element_bytes, int64_t length) {
  const auto per_position = static_cast<double>(rl::model::KvCache::NumElements(config, 1, 1));
  if (!config.has_indexer()) return per_position * element_bytes * static_cast<double>(length);
  const auto index_keys = static_cast<double>(config.indexer_layers().size() *
                                              static_cast<size_t>(config.index_head_dim));
  const double latents = per_position - index_keys;
  return element_bytes * (index_keys * static_cast<double>(length) +
                          latents * static_cast<double>(std::min(length, config.index_topk)));
}

// The mean over MoE layers and decode steps of the number of distinct routed experts the batch's
// tokens of one step go to (the header comment says how it is measured). `generated` holds the
// generations of `prompts` [batch, prompt_len], each of new_tokens >= 2 tokens.
double MeanExpertsPerStep(const rl::rollout::RolloutEngine& engine, const at::Device& device,
                          const at::Tensor& prompts,
                          const std::vector<rl::rollout::Generation>& generated) {
  const rl::model::ModelConfig& config = engine.config();
  const int64_t batch = prompts.size(0), prompt_len = prompts.size(1);
  const int64_t steps = static_cast<int64_t>(generated.at(0).response.size()) - 1;
  at::Tensor responses = at::empty({batch, steps}, at::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    std::memcpy(responses[b].data_ptr<int64_t>(), generated[b].response.data(),
                steps * sizeof(int64_t));
  }
  const at::Tensor tokens = at::cat({prompts, responses}, 1).to(device);
  rl::model::Decoder decoder(
      config, engine.weights(),
      device.is_cuda() ? rl::model::Kernels::kFused : rl::model::Kernels::kLibTorch);
  const int64_t experts = config.n_routed_experts, k = config.num_experts_per_tok;
  at::Tensor distinct = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device));
  int64_t layers = 0;
  decoder.set_routing_observer([&](int64_t, const at::Tensor& ids) {
    // ids [batch * seq, k] -> the decode steps' columns, one row of batch * k ids per step.
    const at::Tensor step_ids = ids.view({batch, prompt_len + steps, k})
                                    .narrow(1, prompt_len, steps)
                                    .transpose(0, 1)
                                    .reshape({steps, batch * k});
    const at::Tensor used =
        at::zeros({steps, experts}, step_ids.options()).scatter_(1, step_ids, 1);
    distinct += used.sum();
    ++layers;
  });
  at::NoGradGuard no_grad;
  decoder.Hidden(tokens, nullptr, 0);
  return static_cast<double>(distinct.item<int64_t>()) / static_cast<double>(layers * steps);
}

// The device activities of one eager decode step of `batch` rows at position `position`, by a
// Decoder over the engine's weights (the engine's kernels), after a warm-up step.
int64_t KernelsPerDecodeStep(const rl::rollout::RolloutEngine& engine, const at::Device& device,
                             int64_t batch, int64_t position) {
  const rl::model::ModelConfig& config = engine.config();
  const rl::model::Decoder decoder(config, engine.weights(), rl::model::Kernels::kFused);
  rl::model::KvCache cache =
      rl::model::KvCache::Allocate(config, batch, position + 1, decoder.dtype(), device);
  cache.storage().zero_();
  const rl::model::RopeTable rope =
      rl::model::MakeRopeTable(config, 0, position + 1, decoder.dtype(), device);
  const at::Tensor tokens = at::zeros({batch, 1}, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor at_position =
      at::full({1}, position, at::TensorOptions().dtype(at::kLong).device(device));
  at::NoGradGuard no_grad;
  const auto step = [&] { decoder.DecodeStep(tokens, at_position, position + 1, rope, cache); };
  step();
  return rl::bench::CountDeviceActivities(step);
}

}  // namespace

// The benchmark; main reports what it throws (a missing checkpoint, a bad config) as one line.
int Run(int argc, char** argv) {
  CLI::App app{"Decode benchmark: our rollout engine, tokens/s and HBM roofline."};
  std::string checkpoint;
  int64_t batch = 64, prompt_len = 128, new_tokens = 128;
  int rounds = 3;
  double hbm_tb_s = 4.8;
  std::string model_config;
  auto* from_checkpoint =
      app.add_option("--checkpoint", checkpoint, "Hugging Face checkpoint directory");
  app.add_option("--model-config", model_config,
                 "config.json of a model to decode with random weights (seed 3) instead")
      ->excludes(from_checkpoint);
  int64_t layers = 0;
  app.add_option("--layers", layers,
                 "with --model-config: keep only the first N layers (num_hidden_layers = N)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "prompts per Generate call");
  app.add_option("--prompt-len", prompt_len, "tokens per prompt");
  app.add_option("--new-tokens", new_tokens, "tokens generated per prompt");
  app.add_option("--rounds", rounds, "timed Generate calls; the best counts");
  double temperature = 0, stop_fraction = 0;
  app.add_option("--temperature", temperature,
                 "0: greedy (default); above 0: sampled at this temperature, top-p 1")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--stop-fraction", stop_fraction,
                 "stop on the first fraction of the vocabulary's ids (0: no stop tokens)")
      ->check(CLI::Range(0.0, 1.0));
  int64_t length_groups = 1;
  app.add_option("--length-groups", length_groups,
                 "prompt lengths: row b's is --prompt-len - (b % G) * --prompt-len / (2 G)")
      ->check(CLI::PositiveNumber);
  app.add_option("--hbm-tb-s", hbm_tb_s, "HBM bandwidth for the roofline, TB/s");
  bool compare_eager = false, compare_launch = false, compare_overlap = false, cuda_graphs = true,
       programmatic_launch = true, overlap = true;
  app.add_flag("--compare-eager", compare_eager,
               "also time eager decode steps and check that they give bit-identical generations");
  app.add_flag("--compare-programmatic-launch", compare_launch,
               "also time decode kernels launched one after another and check that they give "
               "bit-identical generations");
  app.add_flag("--compare-overlap", compare_overlap,
               "also time decode steps each read before the next is launched and check that they "
               "give bit-identical generations (no stop tokens)");
  app.add_flag("--cuda-graphs,!--no-cuda-graphs", cuda_graphs, "decode by CUDA graphs (default)");
  app.add_flag("--overlap,!--no-overlap", overlap,
               "launch each decode step before reading the one ahead (default)");
  app.add_flag("--programmatic-launch,!--no-programmatic-launch", programmatic_launch,
               "decode kernels by programmatic dependent launch (default)");
  bool shared_weight_linear = true;
  app.add_flag("--shared-weight-linear,!--no-shared-weight-linear", shared_weight_linear,
               "projections of 1 or 2 rows with their weights in shared memory where they fit "
               "(default; the same bits as in registers)");
  std::string profile;
  app.add_option("--profile", profile, "also write a Chrome trace of one Generate here");
  bool step_time = false;
  app.add_flag("--step-time", step_time,
               "also time Generates of one new token (the prefill) and report the decode steps' "
               "mean time, (Generate - prefill) / (new tokens - 1)");
  CLI11_PARSE(app, argc, argv);
  if (checkpoint.empty() && model_config.empty()) {
    std::fprintf(stderr, "decode_bench: give --checkpoint DIR or --model-config FILE\n");
    return 2;
  }
  if (layers > 0 && model_config.empty()) {
    std::fprintf(stderr, "decode_bench: --layers needs --model-config\n");
    return 2;
  }
  if (compare_overlap && (!overlap || stop_fraction > 0)) {
    std::fprintf(stderr,
                 "decode_bench: --compare-overlap compares against --overlap (the default) "
                 "without stop tokens; drop --no-overlap and --stop-fraction\n");
    return 2;
  }
  if (compare_launch && !programmatic_launch) {
    std::fprintf(stderr,
                 "decode_bench: --compare-programmatic-launch compares against "
                 "--programmatic-launch (the default); drop --no-programmatic-launch\n");
    return 2;
  }

  const rl::kernels::SharedWeightLinear weights_in_shared(shared_weight_linear);
  const at::Device device = rl::BindDevice(0, rl::DevicePreference::kCudaIfAvailable);
  const at::ScalarType dtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;
  rl::json::Value architecture;
  if (!model_config.empty()) {
    architecture = rl::json::ParseFile(model_config);
    if (layers > 0) architecture.Set("num_hidden_layers", rl::json::Value::Int(layers));
  }
  const rl::model::ModelConfig config =
      checkpoint.empty() ? rl::model::ParseModelConfig(architecture, model_config)
                         : rl::model::LoadModelConfig(checkpoint);
  rl::model::TensorMap host =
      rl::model::AllocateParams(rl::model::ListParams(config), dtype, at::kCPU);
  if (checkpoint.empty()) {
    rl::model::InitParamsRandom(config, host, 3);
  } else {
    rl::model::LoadParams(rl::model::CheckpointReader::Open(checkpoint), config, host);
  }

  const int64_t max_length = prompt_len + new_tokens;
  rl::rollout::RolloutEngine engine(config, dtype, device, batch, max_length,
                                    rl::rollout::PlainAllocator(device));
  engine.LoadWeights(host);
  engine.set_cuda_graphs(cuda_graphs);
  engine.set_programmatic_launch(programmatic_launch);
  engine.set_overlapped_steps(overlap);
  host.clear();

  const at::Tensor ids = at::randint(config.vocab_size, {batch, prompt_len},
                                     at::make_generator<at::CPUGeneratorImpl>(7), at::kLong);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = ids[b].data_ptr<int64_t>();
    prompts.emplace_back(row,
                         row + prompt_len - (b % length_groups) * prompt_len / (2 * length_groups));
  }
  const bool uniform = stop_fraction == 0 && length_groups == 1;  // every row runs every step
  rl::rollout::SamplingParams timed;
  timed.temperature = temperature;
  timed.seed = 11;
  timed.max_new_tokens = new_tokens;
  const auto stop_ids =
      static_cast<int64_t>(std::llround(stop_fraction * static_cast<double>(config.vocab_size)));
  for (int64_t id = 0; id < stop_ids; ++id) timed.stop_token_ids.push_back(id);

  // Best of `rounds` timed Generate calls after a warm-up one; `out` gets the last generations.
  const auto time_generate = [&](const rl::rollout::SamplingParams& params,
                                 std::vector<rl::rollout::Generation>& out) {
    engine.Generate(prompts, params);  // warm-up (and, with graphs, their capture)
    Synchronize(device);
    double best_seconds = 1e30;
    for (int r = 0; r < rounds; ++r) {
      const auto start = Clock::now();
      out = engine.Generate(prompts, params);
      Synchronize(device);
      best_seconds =
          std::min(best_seconds, std::chrono::duration<double>(Clock::now() - start).count());
    }
    return best_seconds;
  };
  std::vector<rl::rollout::Generation> generated;
  const double best = time_generate(timed, generated);
  const rl::rollout::GenerateStats stats = engine.last_generate_stats();
  double step_seconds = 0;
  if (step_time && new_tokens >= 2) {
    rl::rollout::SamplingParams prefill_only = timed;
    prefill_only.max_new_tokens = 1;
    std::vector<rl::rollout::Generation> first_tokens;
    step_seconds =
        (best - time_generate(prefill_only, first_tokens)) / static_cast<double>(new_tokens - 1);
  }
  int64_t tokens_generated = 0;
  for (const auto& g : generated) {
    tokens_generated += static_cast<int64_t>(g.response.size());
    if (stop_ids == 0 && static_cast<int64_t>(g.response.size()) != new_tokens) {
      std::fprintf(stderr, "a row generated %zu tokens, not %lld\n", g.response.size(),
                   static_cast<long long>(new_tokens));
      return 1;
    }
  }
  const std::string generation_sha256 = [&] {
    rl::Sha256 sha;
    for (const auto& g : generated) {
      const auto count = static_cast<int64_t>(g.response.size());
      sha.Update(&count, sizeof(count));
      sha.Update(g.response.data(), g.response.size() * sizeof(int64_t));
      sha.Update(g.log_probs.data(), g.log_probs.size() * sizeof(float));
    }
    return sha.HexDigest();
  }();
  const bool graphs = engine.uses_cuda_graphs();
  const auto same = [](const std::vector<rl::rollout::Generation>& a,
                       const std::vector<rl::rollout::Generation>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].response != b[i].response || a[i].log_probs.size() != b[i].log_probs.size() ||
          std::memcmp(a[i].log_probs.data(), b[i].log_probs.data(),
                      a[i].log_probs.size() * sizeof(float)) != 0) {
        return false;
      }
    }
    return a.size() == b.size();
  };

  // A comparison of the default against the same Generates with one setting off (`set(false)`,
  // restored after), timed the same way: the bits must match.
  struct Comparison {
    double seconds = 0;  // the best Generate with the setting off
    bool same = true;
  };
  const auto compare_without = [&](const char* what, const char* off,
                                   const std::function<void(bool)>& set) {
    set(false);
    std::vector<rl::rollout::Generation> other;
    Comparison c;
    c.seconds = time_generate(timed, other);
    c.same = same(generated, other);
    set(true);
    std::printf(
        "%s: %.2f ms per Generate, %s %.2f ms (%.3fx, %.1f us a decode step); generations %s\n",
        what, 1e3 * best, off, 1e3 * c.seconds, c.seconds / best,
        1e6 * (c.seconds - best) / static_cast<double>(std::max<int64_t>(1, new_tokens - 1)),
        c.same ? "bit-identical" : "DIFFER");
    return c;
  };
  // --compare-programmatic-launch: the kernels launched one after another.
  Comparison sequential;
  if (compare_launch) {
    sequential = compare_without("programmatic launch", "launched one after another",
                                 [&](bool on) { engine.set_programmatic_launch(on); });
  }
  // --compare-overlap: each step read before the next is launched.
  Comparison one_by_one;
  if (compare_overlap) {
    one_by_one = compare_without("overlapped steps", "each step read before the next",
                                 [&](bool on) { engine.set_overlapped_steps(on); });
  }

  // --compare-eager: the same generations with eager decode steps, timed the same way; the
  // tokens and the bits of every log-prob must match (Note [Decode graphs]), for the timed
  // generations and sampled ones.
  double eager_seconds = 0;
  int64_t graph_pool_bytes = 0;
  bool identical = true;
  if (compare_eager) {
    rl::rollout::SamplingParams sampled = timed;
    sampled.temperature = 1.0;
    sampled.seed = 11;
    std::vector<rl::rollout::Generation> graph_sampled, eager_timed, eager_sampled;
    time_generate(sampled, graph_sampled);
    // The graphs' memory pool: device memory the caching allocator holds with the graphs alive
    // and not after they are dropped (both after releasing the cache's free blocks).
    const auto reserved = [&] {
      c10::cuda::CUDACachingAllocator::emptyCache();
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
      return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
          .current;
    };
    const int64_t with_graphs = graphs ? reserved() : 0;
    engine.set_cuda_graphs(false);
    if (graphs) graph_pool_bytes = with_graphs - reserved();
    eager_seconds = time_generate(timed, eager_timed);
    time_generate(sampled, eager_sampled);
    identical = same(generated, eager_timed) && same(graph_sampled, eager_sampled);
    std::printf(
        "graphs %s, eager %.1f ms, graphs %.1f ms per Generate (%.2fx); timed and "
        "sampled generations %s; graph memory pool %.1f MiB\n",
        graphs ? "on" : "unavailable", 1e3 * eager_seconds, 1e3 * best, eager_seconds / best,
        identical ? "bit-identical" : "DIFFER", static_cast<double>(graph_pool_bytes) / (1 << 20));
  }

  int64_t kernels_per_step = 0;
  if (device.is_cuda()) {
    kernels_per_step = KernelsPerDecodeStep(engine, device, batch, prompt_len);
    if (!profile.empty()) {
      rl::bench::ProfileToFile([&] { engine.Generate(prompts, timed); }, profile);
    }
  }

  // Roofline (header comment): per decode step the weights it reads and the KV cache so far.
  const double element_bytes = static_cast<double>(c10::elementSize(dtype));
  // A model with a router but no MoE layer among those kept (GLM-5's first 3, dense) counts as
  // dense: there is no routing to measure.
  const bool moe = !config.moe_layers().empty();
  double experts_per_step = 0;
  if (moe && uniform) {
    experts_per_step = new_tokens >= 2 ? MeanExpertsPerStep(engine, device, ids, generated)
                                       : static_cast<double>(config.n_routed_experts);
  }
  const double weight_bytes = StepWeightBytes(
      config, element_bytes, static_cast<double>(config.n_routed_experts), batch);
  const double step_weight_bytes = StepWeightBytes(config, element_bytes, experts_per_step, batch);
  double bytes = 0;
  for (int64_t t = 0; t < new_tokens; ++t) {
    bytes += step_weight_bytes +
             static_cast<double>(batch) * StepCacheBytes(config, element_bytes, prompt_len + t);
  }
  const double tokens_per_s = static_cast<double>(tokens_generated) / best;
  const double roofline = bytes / best / (hbm_tb_s * 1e12);

  rl::json::Value line = rl::json::Value::MakeObject({});
  line.Set("bench", rl::json::Value::String("decode"));
  line.Set("device", rl::json::Value::String(device.str()));
  line.Set("batch", rl::json::Value::Int(batch));
  line.Set("prompt_len", rl::json::Value::Int(prompt_len));
  line.Set("new_tokens", rl::json::Value::Int(new_tokens));
  line.Set("temperature", rl::json::Value::Double(temperature));
  if (stop_ids > 0) line.Set("stop_fraction", rl::json::Value::Double(stop_fraction));
  if (length_groups > 1) line.Set("length_groups", rl::json::Value::Int(length_groups));
  if (!uniform) line.Set("tokens_generated", rl::json::Value::Int(tokens_generated));
  line.Set("seconds", rl::json::Value::Double(best));
  if (step_seconds > 0) line.Set("decode_step_ms", rl::json::Value::Double(1e3 * step_seconds));
  line.Set("tokens_per_s", rl::json::Value::Double(tokens_per_s));
  line.Set("generation_sha256", rl::json::Value::String(generation_sha256));
  line.Set("weight_bytes", rl::json::Value::Double(weight_bytes));
  if (moe && uniform) {
    line.Set("experts_used_per_step", rl::json::Value::Double(experts_per_step));
    line.Set("step_weight_bytes", rl::json::Value::Double(step_weight_bytes));
  }
  if (uniform) line.Set("roofline_fraction", rl::json::Value::Double(roofline));
  if (uniform && step_seconds > 0) {  // the mean step's bytes over the mean step's time
    line.Set("decode_step_roofline_fraction",
             rl::json::Value::Double(bytes / static_cast<double>(new_tokens) / step_seconds /
                                     (hbm_tb_s * 1e12)));
  }
  line.Set("cuda_graphs", rl::json::Value::Bool(graphs));
  line.Set("decode_steps", rl::json::Value::Int(stats.decode_steps));
  line.Set("row_steps", rl::json::Value::Int(stats.row_steps));
  line.Set("overrun_row_steps", rl::json::Value::Int(stats.overrun_row_steps));
  if (kernels_per_step > 0) {
    line.Set("kernels_per_step", rl::json::Value::Int(kernels_per_step));
    line.Set("kernels_per_layer",
             rl::json::Value::Double(static_cast<double>(kernels_per_step) /
                                     static_cast<double>(config.num_hidden_layers)));
  }
  if (compare_eager) {
    line.Set("eager_seconds", rl::json::Value::Double(eager_seconds));
    line.Set("eager_identical", rl::json::Value::Bool(identical));
    line.Set("graph_pool_bytes", rl::json::Value::Int(graph_pool_bytes));
  }
  if (compare_launch) {
    line.Set("sequential_launch_seconds", rl::json::Value::Double(sequential.seconds));
    line.Set("programmatic_launch_identical", rl::json::Value::Bool(sequential.same));
  }
  if (compare_overlap) {
    line.Set("one_by_one_seconds", rl::json::Value::Double(one_by_one.seconds));
    line.Set("overlap_identical", rl::json::Value::Bool(one_by_one.same));
  }
  std::printf("%s\n", rl::json::Dump(line).c_str());
  return identical && sequential.same && one_by_one.same ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 1;
  }
}
