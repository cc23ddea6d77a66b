// decode_bench --checkpoint DIR [--batch 64] [--prompt-len 128] [--new-tokens 128]: greedy
// generation by our rollout engine (RolloutEngine::Generate, bf16 on the GPU when there is one):
// tokens/s, and the fraction of the HBM roofline it reaches, counting per decode step the bytes
// that must be read at least once (every weight, and the KV cache of every live row) over the
// step time at --hbm-tb-s (H200: 4.8 TB/s). Prints one JSON line with the figures, so that
// tools/bench/vs_transformers.sh can set them against `transformers` generate run in the same
// call. Every row generates exactly --new-tokens tokens (no stop tokens), as `generate` with
// min_new_tokens does.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "launch/device.h"
#include "launch/json.h"
#include "trainer/model/decoder.h"
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

  engine.Generate(prompts, greedy);  // warm-up
  Synchronize(device);
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    const std::vector<rl::rollout::Generation> out = engine.Generate(prompts, greedy);
    Synchronize(device);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    for (const auto& g : out) {
      if (static_cast<int64_t>(g.response.size()) != new_tokens) {
        std::fprintf(stderr, "a row generated %zu tokens, not %lld\n", g.response.size(),
                     static_cast<long long>(new_tokens));
        return 1;
      }
    }
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
  std::printf("%s\n", rl::json::Dump(line).c_str());
  return 0;
}
