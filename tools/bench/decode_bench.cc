// decode_bench --checkpoint DIR [--batch 64] [--prompt-len 128] [--new-tokens 128]
// [--compare-eager] [--no-cuda-graphs]: greedy generation by our rollout engine
// (RolloutEngine::Generate, bf16 on the GPU when there is one, decode by CUDA graphs there):
// tokens/s, and the fraction of the HBM roofline it reaches, counting per decode step the bytes
// that must be read at least once (every weight, and the KV cache of every live row) over the
// step time at --hbm-tb-s (H200: 4.8 TB/s). Prints one JSON line with the figures, so that
// tools/bench/vs_transformers.sh can set them against `transformers` generate run in the same
// call. Every row generates exactly --new-tokens tokens (no stop tokens), as `generate` with
// min_new_tokens does. --compare-eager also times eager decode steps in the same process and
// checks that graphs and eager steps generate bit-identical tokens and log-probs (greedy and
// sampled); the exit status is 1 when they differ.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "launch/device.h"
#include "launch/json.h"
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decode benchmark: our rollout engine, greedy, tokens/s and HBM roofline."};
  std::string checkpoint;
  int64_t batch = 64, prompt_len = 128, new_tokens = 128;
  int rounds = 3;
  double hbm_tb_s = 4.8;
  app.add_option("--checkpoint", checkpoint, "Hugging Face checkpoint directory")->required();
  app.add_option("--batch", batch, "prompts per Generate call");
  app.add_option("--prompt-len", prompt_len, "tokens per prompt");
  app.add_option("--new-tokens", new_tokens, "tokens generated per prompt");
  app.add_option("--rounds", rounds, "timed Generate calls; the best counts");
  app.add_option("--hbm-tb-s", hbm_tb_s, "HBM bandwidth for the roofline, TB/s");
  bool compare_eager = false, cuda_graphs = true;
  app.add_flag("--compare-eager", compare_eager,
               "also time eager decode steps and check that they give bit-identical generations");
  app.add_flag("--cuda-graphs,!--no-cuda-graphs", cuda_graphs, "decode by CUDA graphs (default)");
  CLI11_PARSE(app, argc, argv);

  const at::Device device = rl::BindDevice(0, rl::DevicePreference::kCudaIfAvailable);
  const at::ScalarType dtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;
  const rl::model::ModelConfig config = rl::model::LoadModelConfig(checkpoint);
  rl::model::TensorMap host = rl::model::AllocateParams(rl::model::ListParams(config), dtype,
                                                        at::kCPU);
  rl::model::LoadParams(rl::model::CheckpointReader::Open(checkpoint), config, host);

  const int64_t max_length = prompt_len + new_tokens;
  rl::rollout::RolloutEngine engine(config, dtype, device, batch, max_length,
                                    rl::rollout::PlainAllocator(device));
  engine.LoadWeights(host);
  engine.set_cuda_graphs(cuda_graphs);
  host.clear();

  const at::Tensor ids = at::randint(config.vocab_size, {batch, prompt_len},
                                     at::make_generator<at::CPUGeneratorImpl>(7), at::kLong);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = ids[b].data_ptr<int64_t>();
    prompts.emplace_back(row, row + prompt_len);
  }
  rl::rollout::SamplingParams greedy;
  greedy.temperature = 0.0;
  greedy.max_new_tokens = new_tokens;

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
  const double best = time_generate(greedy, generated);
  for (const auto& g : generated) {
    if (static_cast<int64_t>(g.response.size()) != new_tokens) {
      std::fprintf(stderr, "a row generated %zu tokens, not %lld\n", g.response.size(),
                   static_cast<long long>(new_tokens));
      return 1;
    }
  }
  const bool graphs = engine.uses_cuda_graphs();

  // --compare-eager: the same generations with eager decode steps, timed the same way; the
  // tokens and the bits of every log-prob must match (Note [Decode graphs]), greedy and sampled.
  double eager_seconds = 0;
  int64_t graph_pool_bytes = 0;
  bool identical = true;
  if (compare_eager) {
    rl::rollout::SamplingParams sampled = greedy;
    sampled.temperature = 1.0;
    sampled.seed = 11;
    std::vector<rl::rollout::Generation> graph_sampled, eager_greedy, eager_sampled;
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
    eager_seconds = time_generate(greedy, eager_greedy);
    time_generate(sampled, eager_sampled);
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
    identical = same(generated, eager_greedy) && same(graph_sampled, eager_sampled);
    std::printf("graphs %s, eager %.1f ms, graphs %.1f ms per Generate (%.2fx); greedy and "
                "sampled generations %s; graph memory pool %.1f MiB\n",
                graphs ? "on" : "unavailable", 1e3 * eager_seconds, 1e3 * best,
                eager_seconds / best, identical ? "bit-identical" : "DIFFER",
                static_cast<double>(graph_pool_bytes) / (1 << 20));
  }

  // Roofline: each decode step reads every weight once and the KV cache of every row so far.
  const double element_bytes = static_cast<double>(c10::elementSize(dtype));
  double weight_bytes = 0;
  for (const auto& s : rl::model::ListParams(config)) {
    weight_bytes += static_cast<double>(s.numel()) * element_bytes;
  }
  const double kv_bytes_per_token =
      static_cast<double>(rl::model::KvCache::NumElements(config, 1, 1)) * element_bytes;
  double bytes = 0;
  for (int64_t t = 0; t < new_tokens; ++t) {
    bytes += weight_bytes + kv_bytes_per_token * static_cast<double>(batch * (prompt_len + t));
  }
  const double tokens_per_s = static_cast<double>(batch * new_tokens) / best;
  const double roofline = bytes / best / (hbm_tb_s * 1e12);

  rl::json::Value line = rl::json::Value::MakeObject({});
  line.Set("bench", rl::json::Value::String("decode"));
  line.Set("device", rl::json::Value::String(device.str()));
  line.Set("batch", rl::json::Value::Int(batch));
  line.Set("prompt_len", rl::json::Value::Int(prompt_len));
  line.Set("new_tokens", rl::json::Value::Int(new_tokens));
  line.Set("seconds", rl::json::Value::Double(best));
  line.Set("tokens_per_s", rl::json::Value::Double(tokens_per_s));
  line.Set("weight_bytes", rl::json::Value::Double(weight_bytes));
  line.Set("roofline_fraction", rl::json::Value::Double(roofline));
  line.Set("cuda_graphs", rl::json::Value::Bool(graphs));
  if (compare_eager) {
    line.Set("eager_seconds", rl::json::Value::Double(eager_seconds));
    line.Set("eager_identical", rl::json::Value::Bool(identical));
    line.Set("graph_pool_bytes", rl::json::Value::Int(graph_pool_bytes));
  }
  std::printf("%s\n", rl::json::Dump(line).c_str());
  return identical ? 0 : 1;
}
