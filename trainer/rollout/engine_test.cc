// The rollout engine on the tiny reference checkpoints (tests/fixtures, fp32, CPU).
//
// Properties: greedy generation reproduces transformers' greedy `generated` tokens; sampled
// rollout log-probs equal a fresh full forward's log_softmax(logits / T) at the response tokens;
// a batch of prompts of different lengths gives what each prompt gives alone (Note [Rollout
// seeds]); overlapped decode steps generate the same bits as steps read one by one; a stop token
// ends a sequence and is included; Generate while asleep throws; the
// engine's routing and indexer records equal what a full forward chooses, and replaying them
// reproduces that forward bit for bit.
//
// Tolerance for log-probs, 1e-5 absolute: the rollout's logits come from KV-cache steps and the
// reference's from one full forward, in fp32; they differ by rounding only (the fixtures' manifest
// records KV-cache vs full-forward max |Δlogits| <= ~1e-6 with logits O(1)), and log_softmax moves
// by at most 2 max|Δlogits| / T, i.e. a few 1e-6 at T = 0.8. A wrong position, temperature or
// token would move them by O(0.1).
#include "trainer/rollout/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "launch/check.h"
#include "tests/runfiles.h"
#include "trainer/model/decoder.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/model_config.h"
#include "trainer/model/params.h"
#include "trainer/model/safetensors.h"

namespace rl::rollout {
namespace {

std::string FixturePath(const std::string& name) {
  return rl::testing::RunfilePath("tests/fixtures/" + name);
}

struct Fixture {
  model::ModelConfig config;
  model::TensorMap params;
};

Fixture LoadFixture(const std::string& name) {
  Fixture f;
  f.config = model::LoadModelConfig(FixturePath(name));
  f.params = model::AllocateParams(model::ListParams(f.config), at::kFloat, at::kCPU);
  model::LoadParams(model::CheckpointReader::Open(FixturePath(name)), f.config, f.params);
  return f;
}

at::Tensor GenerateTensor(const std::string& name, const std::string& tensor) {
  return model::SafetensorsFile::Open(FixturePath(name) + "/generate.safetensors")
      .Get(tensor)
      .clone();
}

std::vector<int64_t> Row(const at::Tensor& t, int64_t row, int64_t begin, int64_t length) {
  const at::Tensor r = t[row].narrow(0, begin, length).to(at::kLong).contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + length);
}

std::unique_ptr<RolloutEngine> MakeEngine(const Fixture& f, int64_t max_batch, int64_t max_length,
                                          Records records = {}) {
  auto engine =
      std::make_unique<RolloutEngine>(f.config, at::kFloat, at::Device(at::kCPU), max_batch,
                                      max_length, PlainAllocator(at::Device(at::kCPU)), records);
  engine->LoadWeights(f.params);
  return engine;
}

// Prompts of lengths 3, 5, 3, 7, 6 cut from the fixture's reference tokens.
std::vector<std::vector<int64_t>> MixedPrompts(const std::string& name) {
  const at::Tensor tokens =
      model::SafetensorsFile::Open(FixturePath(name) + "/reference.safetensors")
          .Get("tokens_long")
          .clone();  // [2, 16]
  return {Row(tokens, 0, 0, 3), Row(tokens, 1, 2, 5), Row(tokens, 1, 0, 3), Row(tokens, 0, 4, 7),
          Row(tokens, 1, 9, 6)};
}

// log_softmax(Logits(prompt + response) / T) at the response tokens, from a fresh Decoder.
std::vector<float> FullForwardLogProbs(const model::Decoder& decoder, const Generation& g,
                                       double temperature) {
  std::vector<int64_t> all = g.prompt;
  all.insert(all.end(), g.response.begin(), g.response.end());
  const int64_t n = static_cast<int64_t>(all.size());
  const int64_t p = static_cast<int64_t>(g.prompt.size());
  const int64_t r = static_cast<int64_t>(g.response.size());
  const at::Tensor tokens = at::tensor(all, at::TensorOptions().dtype(at::kLong)).view({1, n});
  const at::Tensor logits = decoder.Logits(tokens)[0].narrow(0, p - 1, r);  // [r, V]
  const at::Tensor targets = tokens[0].narrow(0, p, r).unsqueeze(1);
  const at::Tensor lp =
      at::log_softmax(logits.to(at::kFloat) / temperature, -1).gather(1, targets).squeeze(1);
  return std::vector<float>(lp.data_ptr<float>(), lp.data_ptr<float>() + r);
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

const std::vector<std::string> kAllFixtures = {
    "qwen3",       "qwen3_moe",   "glm4_moe",          "glm4_moe_lite",
    "deepseek_v3", "glm_moe_dsa", "glm_moe_dsa_shared"};

TEST_CASE("Greedy generation reproduces transformers' greedy tokens") {
  for (const std::string& name : kAllFixtures) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    auto engine = MakeEngine(f, 4, 16);
    const at::Tensor generated = GenerateTensor(name, "generated");  // [2, 10]
    const at::Tensor prompt = GenerateTensor(name, "prompt");        // [2, 4]
    const int64_t p = prompt.size(1);
    const int64_t n = generated.size(1) - p;
    SamplingParams params;
    params.temperature = 0;
    params.max_new_tokens = n;
    const std::vector<Generation> out =
        engine->Generate({Row(prompt, 0, 0, p), Row(prompt, 1, 0, p)}, params);
    REQUIRE(out.size() == 2);
    for (int64_t b = 0; b < 2; ++b) {
      CHECK(out[b].prompt == Row(prompt, b, 0, p));
      CHECK(out[b].response == Row(generated, b, p, n));
      CHECK(out[b].log_probs.size() == static_cast<size_t>(n));
      CHECK(out[b].truncated);
    }
  }
}

TEST_CASE("Sampled rollout log-probs equal a full forward's log_softmax(logits / T)") {
  for (const std::string name : {"qwen3", "glm_moe_dsa"}) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    auto engine = MakeEngine(f, 8, 24);
    const model::Decoder fresh(f.config, f.params);
    SamplingParams params;
    params.temperature = 0.8;
    params.top_k = 40;
    params.top_p = 0.95;
    params.max_new_tokens = 12;
    params.seed = 77;
    const std::vector<Generation> out = engine->Generate(MixedPrompts(name), params);
    double worst = 0;
    for (const Generation& g : out) {
      REQUIRE(g.response.size() == 12);
      worst = std::max(worst, MaxAbsDiff(g.log_probs, FullForwardLogProbs(fresh, g, 0.8)));
    }
    fmt::print("{:12s} rollout vs full-forward log-probs max|diff| {:.3g} (tolerance 1e-5)\n", name,
               worst);
    CHECK(worst <= 1e-5);
  }
}

// Sampling at temperature 1, up to `max_new_tokens`, with the token ids 0, every, 2 every, ...
// below 128 as stop tokens, so that rows end at different steps.
SamplingParams StoppingParams(int64_t max_new_tokens, uint64_t seed, int64_t every) {
  SamplingParams params;
  params.temperature = 1.0;
  params.max_new_tokens = max_new_tokens;
  params.seed = seed;
  for (int64_t t = 0; t < 128; t += every) params.stop_token_ids.push_back(t);
  return params;
}

// Checks each row of `batched` (Generate of `prompts` with `params`) against its prompt generated
// alone with the row's seed (Note [Rollout seeds]): the same prompt, response and truncation.
// Returns the largest difference of their log-probs.
double CheckEachAlone(RolloutEngine& engine, const std::vector<std::vector<int64_t>>& prompts,
                      const SamplingParams& params, const std::vector<Generation>& batched) {
  double worst = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("row " << i);
    SamplingParams alone_params = params;
    alone_params.seed = params.seed + i;
    const std::vector<Generation> alone = engine.Generate({prompts[i]}, alone_params);
    CHECK(batched[i].prompt == prompts[i]);
    CHECK(batched[i].response == alone[0].response);
    CHECK(batched[i].truncated == alone[0].truncated);
    worst = std::max(worst, MaxAbsDiff(batched[i].log_probs, alone[0].log_probs));
  }
  return worst;
}

TEST_CASE("A batch of prompts of different lengths equals each prompt alone") {
  for (const std::string name : {"qwen3", "glm_moe_dsa"}) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    // max_batch 2 admits later prompts into freed rows; stop tokens end rows at different steps,
    // which moves live rows into finished rows' places.
    auto engine = MakeEngine(f, 2, 20);
    const SamplingParams params = StoppingParams(10, 1000, 9);
    const std::vector<std::vector<int64_t>> prompts = MixedPrompts(name);
    const std::vector<std::vector<int64_t>> batch_prompts = {
        prompts[0], prompts[1], prompts[2], prompts[3], prompts[4], prompts[0], prompts[2]};
    const std::vector<Generation> batched = engine->Generate(batch_prompts, params);
    const double worst = CheckEachAlone(*engine, batch_prompts, params, batched);
    int64_t stopped = 0;
    for (const Generation& g : batched) stopped += g.truncated ? 0 : 1;
    // Same prompt, different seeds (rows 0 and 5): different samples.
    CHECK(batched[0].response != batched[5].response);
    fmt::print("{:12s} batched vs alone: {} of {} rows stopped early, log-probs max|diff| {:.3g}\n",
               name, stopped, batch_prompts.size(), worst);
    CHECK(stopped >= 2);  // the compaction path ran
    CHECK(worst <= 1e-5);
  }
}

// Generates `prompts` greedily (6 new tokens each) on an engine of `max_batch` rows, and checks
// how it ran (GenerateStats) and that every row equals its prompt generated alone.
void CheckBatching(const Fixture& f, int64_t max_batch,
                   const std::vector<std::vector<int64_t>>& prompts,
                   const GenerateStats& expected) {
  SamplingParams params;
  params.temperature = 0;
  params.max_new_tokens = 6;
  auto engine = MakeEngine(f, max_batch, 16);
  const std::vector<Generation> batched = engine->Generate(prompts, params);
  const GenerateStats& stats = engine->last_generate_stats();
  CHECK(stats.prefills == expected.prefills);
  CHECK(stats.decode_steps == expected.decode_steps);
  CHECK(stats.row_steps == expected.row_steps);
  CHECK(CheckEachAlone(*engine, prompts, params, batched) <= 1e-5);
}

// Note [Rollout batching]: prompts of different lengths decode in one batch (one decode step
// feeds every live row), and a row that ends makes room for the next prompt. The first token of
// each row comes from its prefill, so 6 new tokens take 5 decode steps.
TEST_CASE("Prompts of different lengths decode together, and later prompts take freed rows") {
  const Fixture f = LoadFixture("qwen3");
  const std::vector<std::vector<int64_t>> prompts = {
      {1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11, 12}, {13, 14, 15, 16, 17, 18}};
  // Lengths 3 to 6, within a factor of 2: one prefill, 5 steps of 4 rows.
  CheckBatching(f, 4, prompts, {/*prefills=*/1, /*decode_steps=*/5, /*row_steps=*/4 * 5});
  // Lengths 2 and 5 are more than a factor of 2 apart: two prefills, one decode batch.
  CheckBatching(f, 4, {{1, 2}, {3, 4, 5, 6, 7}}, {2, 5, 2 * 5});
  // Two rows: the last two prompts wait for the first two rows, then share a step.
  CheckBatching(f, 2, prompts, {2, 2 * 5, 4 * 5});
}

TEST_CASE("Rows that finish give their places to rows past them; each equals itself alone") {
  for (const std::string name : {"qwen3", "glm_moe_dsa"}) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    // 8 rows of one prompt (different seeds); stop tokens end them at different steps, so rows
    // past the new batch move into finished rows' places (Note [Rollout batching]), several
    // times.
    auto engine = MakeEngine(f, 8, 20);
    const SamplingParams params = StoppingParams(12, 2000, 7);
    const std::vector<std::vector<int64_t>> prompts(8, MixedPrompts(name)[3]);
    const std::vector<Generation> batched = engine->Generate(prompts, params);
    // A move happened when a row ended while a row after it went on.
    bool moved = false;
    for (size_t i = 0; i < prompts.size(); ++i) {
      for (size_t j = i + 1; j < prompts.size(); ++j) {
        moved |= batched[i].response.size() < batched[j].response.size();
      }
    }
    CHECK(moved);
    CHECK(CheckEachAlone(*engine, prompts, params, batched) <= 1e-5);
  }
}

// Note [Overlapped decode steps]: launching each step before the host reads the one ahead feeds
// every row the same tokens at the same positions with the same uniforms; rows that end are
// computed one step more and dropped. On the CPU (batch-invariant kernels) every bit agrees.
TEST_CASE("Overlapped decode steps generate what steps read one by one generate") {
  for (const std::string name : {"qwen3", "qwen3_moe", "glm_moe_dsa"}) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    // 3 rows for 8 prompts: rows end by stop tokens and by length, and prompts are admitted into
    // the freed rows, at steps that overlap moves.
    auto engine = MakeEngine(f, 3, 20, Records{/*experts=*/true, /*indexer=*/true});
    REQUIRE(engine->overlapped_steps());  // the default
    const SamplingParams params = StoppingParams(9, 300, 10);
    std::vector<std::vector<int64_t>> prompts = MixedPrompts(name);
    prompts.push_back(prompts[1]);
    prompts.push_back(prompts[3]);
    prompts.push_back(prompts[0]);
    const std::vector<Generation> overlapped = engine->Generate(prompts, params);
    const GenerateStats with = engine->last_generate_stats();
    engine->set_overlapped_steps(false);
    const std::vector<Generation> one_by_one = engine->Generate(prompts, params);
    const GenerateStats without = engine->last_generate_stats();
    int64_t stopped = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("prompt " << i);
      CHECK(overlapped[i].response == one_by_one[i].response);
      CHECK(overlapped[i].log_probs == one_by_one[i].log_probs);
      CHECK(overlapped[i].truncated == one_by_one[i].truncated);
      CHECK(overlapped[i].routed_experts == one_by_one[i].routed_experts);
      CHECK(overlapped[i].indexer_topk == one_by_one[i].indexer_topk);
      stopped += overlapped[i].truncated ? 0 : 1;
    }
    CHECK(stopped >= 2);  // rows ended by stop tokens, which the host learns a step late
    CHECK(with.overrun_row_steps > 0);
    CHECK(without.overrun_row_steps == 0);
    // Each row is fed as many tokens either way; the overlapped steps also fed ended rows.
    CHECK(with.row_steps - with.overrun_row_steps == without.row_steps);
  }
}

TEST_CASE("A stop token ends the sequence and is included with its log-prob") {
  for (const std::string name : {"qwen3", "glm_moe_dsa"}) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    auto engine = MakeEngine(f, 4, 16);
    const at::Tensor generated = GenerateTensor(name, "generated");  // [2, 10]
    const std::vector<int64_t> prompt = Row(generated, 0, 0, 4);
    const std::vector<int64_t> greedy = Row(generated, 0, 4, 6);
    SamplingParams params;
    params.temperature = 0;
    params.max_new_tokens = 6;
    const Generation full = engine->Generate({prompt}, params)[0];
    params.stop_token_ids = {greedy[2]};
    const Generation stopped = engine->Generate({prompt}, params)[0];
    const size_t end = static_cast<size_t>(std::find(greedy.begin(), greedy.end(), greedy[2]) -
                                           greedy.begin() + 1);
    CHECK(stopped.response == std::vector<int64_t>(greedy.begin(), greedy.begin() + end));
    CHECK(!stopped.truncated);
    CHECK(stopped.log_probs ==
          std::vector<float>(full.log_probs.begin(), full.log_probs.begin() + end));
  }
}

TEST_CASE("Sleep and WakeUp call the hooks; Generate while asleep throws") {
  const Fixture f = LoadFixture("qwen3");
  auto engine = MakeEngine(f, 2, 12);
  int pauses = 0;
  int resumes = 0;
  engine->SetMemoryHooks([&] { ++pauses; }, [&] { ++resumes; });
  SamplingParams params;
  params.max_new_tokens = 2;
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}};
  engine->Sleep();
  CHECK(engine->asleep());
  CHECK(pauses == 1);
  CHECK_THROWS_WITH(engine->Generate(prompts, params), Catch::Contains("rollout engine is asleep"));
  CHECK_THROWS_AS(engine->Generate(prompts, params), Error);
  CHECK_THROWS_AS(engine->Sleep(), Error);
  engine->WakeUp();
  CHECK(resumes == 1);
  CHECK_FALSE(engine->asleep());
  CHECK(engine->Generate(prompts, params).size() == 1);
  CHECK_THROWS_AS(engine->WakeUp(), Error);
}

TEST_CASE("Weights live in one engine-layout storage that the Decoder reads") {
  const Fixture f = LoadFixture("qwen3");
  auto engine = MakeEngine(f, 2, 12);
  CHECK(engine->weight_storage().scalar_type() == at::kByte);
  CHECK(engine->weight_storage().numel() >= engine->layout().total_bytes);
  const at::Tensor& q = engine->weights().at("model.layers.0.self_attn.q_proj.weight");
  CHECK(at::equal(q, f.params.at("model.layers.0.self_attn.q_proj.weight")));
  CHECK(q.data_ptr() >= engine->weight_storage().data_ptr());
  engine->set_weight_version(3);
  CHECK(engine->weight_version() == 3);

  // The fused q/k/v and gate/up rows are back to back in that storage, so an inference Decoder
  // over the engine's weights (as the engine builds one on a GPU) computes each group as one GEMM.
  const model::Decoder fused(f.config, engine->weights(), model::Kernels::kFused);
  CHECK(fused.fused_projections() == 2 * f.config.num_hidden_layers);
  // So are a shared expert's gate/up rows (DeepSeek-V3: MLA has no q/k/v group; a dense first
  // layer, then MoE layers with a shared expert).
  const Fixture d = LoadFixture("deepseek_v3");
  auto moe_engine = MakeEngine(d, 2, 12);
  int64_t gate_ups = 0;
  for (int64_t l = 0; l < d.config.num_hidden_layers; ++l) {
    const std::string shared =
        fmt::format("model.layers.{}.mlp.shared_experts.gate_proj.weight", l);
    if (d.config.mlp_layer_types[l] == model::MlpType::kDense || d.params.count(shared) > 0) {
      ++gate_ups;
    }
  }
  CHECK(gate_ups > 1);
  CHECK(
      model::Decoder(d.config, moe_engine->weights(), model::Kernels::kFused).fused_projections() ==
      gate_ups);

  model::TensorMap incomplete = f.params;
  incomplete.erase("model.norm.weight");
  CHECK_THROWS_WITH(engine->LoadWeights(incomplete), Catch::Contains("model.norm.weight"));
}

TEST_CASE("Decode steps attend over key blocks; decode graphs pad the batch to few buckets") {
  // Note [Rollout decode steps]: position p reads keys [0, KeyLength(p)), p + 1 rounded up to a
  // block, never past max_length.
  RolloutEngine engine(LoadFixture("qwen3").config, at::kFloat, at::kCPU, 2, 100,
                       PlainAllocator(at::kCPU));
  CHECK(engine.KeyLength(0) == RolloutEngine::kKeyBlock);
  CHECK(engine.KeyLength(RolloutEngine::kKeyBlock - 1) == RolloutEngine::kKeyBlock);
  CHECK(engine.KeyLength(RolloutEngine::kKeyBlock) == 100);
  CHECK(engine.KeyLength(99) == 100);
  CHECK_FALSE(engine.uses_cuda_graphs());  // on the CPU the steps run eagerly
  // Note [Decode graphs]: 1, 2, 4, 8, then multiples of 8, capped at max_batch.
  const std::vector<std::pair<int64_t, int64_t>> buckets = {
      {1, 1}, {2, 2}, {3, 4}, {5, 8}, {8, 8}, {9, 16}, {17, 24}, {64, 64}, {65, 72}};
  for (const auto& [live, bucket] : buckets) {
    INFO("live " << live);
    CHECK(DecodeGraphs::BatchBucket(live, 1000) == bucket);
  }
  CHECK(DecodeGraphs::BatchBucket(61, 62) == 62);
}

TEST_CASE("Bad prompts and settings are refused with a message") {
  const Fixture f = LoadFixture("qwen3");
  auto engine = MakeEngine(f, 2, 8);
  SamplingParams params;
  params.max_new_tokens = 4;
  CHECK_THROWS_AS(engine->Generate(std::vector<std::vector<int64_t>>(1), params), Error);
  CHECK_THROWS_AS(engine->Generate({{1, 2, 3, 4, 5, 6, 7, 8}}, params), Error);
  CHECK_THROWS_AS(engine->Generate({{1, 128}}, params), Error);
  params.max_new_tokens = 0;
  CHECK_THROWS_AS(engine->Generate({{1, 2}}, params), ConfigError);
  // A long prompt is cut by max_length: 8 - 6 = 2 tokens, truncated.
  params.max_new_tokens = 4;
  const Generation g = engine->Generate({{1, 2, 3, 4, 5, 6}}, params)[0];
  CHECK(g.response.size() == 2);
  CHECK(g.truncated);
}

TEST_CASE("A bf16 engine (the production dtype) generates, with fp32 router extras") {
  for (const std::string name : {"qwen3", "glm_moe_dsa"}) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    RolloutEngine engine(f.config, at::kBFloat16, at::Device(at::kCPU), 2, 16,
                         PlainAllocator(at::Device(at::kCPU)));
    engine.LoadWeights(f.params);  // converts fp32 -> bf16 (extras stay fp32)
    for (const auto& [n, view] : engine.weights()) {
      INFO(n);
      CHECK(view.scalar_type() ==
            (n.find("e_score_correction_bias") != std::string::npos ? at::kFloat : at::kBFloat16));
    }
    SamplingParams params;
    params.max_new_tokens = 6;
    params.seed = 3;
    const std::vector<Generation> out = engine.Generate(MixedPrompts(name), params);
    for (const Generation& g : out) {
      CHECK(g.response.size() == 6);
      for (float lp : g.log_probs) CHECK((std::isfinite(lp) && lp <= 0));
    }
  }
}

TEST_CASE("The engine's routing record equals the routing of a full forward, and replays it") {
  for (const std::string name : {"qwen3_moe", "deepseek_v3", "glm_moe_dsa"}) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    // max_batch 3 admits prompts as rows free up, and stop tokens end rows early: the record is
    // read at different steps and moves with the cache.
    auto engine = MakeEngine(f, 3, 24, Records{/*experts=*/true, /*indexer=*/false});
    REQUIRE(engine->records_routing());
    SamplingParams params;
    params.max_new_tokens = 12;
    params.seed = 5;
    for (int64_t t = 0; t < 128; t += 11) params.stop_token_ids.push_back(t);
    const std::vector<Generation> out = engine->Generate(MixedPrompts(name), params);
    model::Decoder decoder(f.config, f.params);
    const int64_t layers = static_cast<int64_t>(engine->moe_layers().size());
    const int64_t k = f.config.num_experts_per_tok;
    int64_t stopped = 0, compared = 0;
    for (const Generation& g : out) {
      stopped += g.truncated ? 0 : 1;
      std::vector<int64_t> fed = g.prompt;
      fed.insert(fed.end(), g.response.begin(), g.response.end() - 1);
      const int64_t n = static_cast<int64_t>(fed.size());
      REQUIRE(static_cast<int64_t>(g.routed_experts.size()) == layers * n * k);
      const at::Tensor record = at::tensor(g.routed_experts, at::TensorOptions().dtype(at::kShort))
                                    .to(at::kLong)
                                    .view({layers, n, k});
      // What a full forward over the fed tokens chooses, layer by layer.
      std::vector<at::Tensor> chosen(static_cast<size_t>(f.config.num_hidden_layers));
      decoder.set_routing_observer(
          [&](int64_t l, const at::Tensor& ids) { chosen[static_cast<size_t>(l)] = ids; });
      decoder.set_routing_source({});
      const at::Tensor tokens = at::tensor(fed, at::TensorOptions().dtype(at::kLong)).view({1, n});
      const at::Tensor natural = decoder.Logits(tokens);
      for (int64_t m = 0; m < layers; ++m) {
        INFO("MoE layer " << m);
        CHECK(at::equal(chosen[static_cast<size_t>(engine->moe_layers()[m])], record[m]));
        ++compared;
      }
      // Replaying the record reproduces the full forward bit for bit.
      decoder.set_routing_source([&](int64_t l) {
        const auto it = std::find(engine->moe_layers().begin(), engine->moe_layers().end(), l);
        return it == engine->moe_layers().end()
                   ? at::Tensor()
                   : record[it - engine->moe_layers().begin()].contiguous();
      });
      CHECK(at::equal(decoder.Logits(tokens), natural));
    }
    fmt::print("{:12s} routing record vs full forward: {} rows ({} stopped early), {} layers\n",
               name, out.size(), stopped, layers);
    CHECK(stopped >= 1);
    CHECK(compared == static_cast<int64_t>(out.size()) * layers);
  }
}

TEST_CASE("The engine's indexer record equals a full forward's DSA selection, and replays it") {
  for (const std::string name : {"glm_moe_dsa", "glm_moe_dsa_shared"}) {
    INFO("fixture " << name);
    const Fixture f = LoadFixture(name);
    const int64_t k = f.config.index_topk;
    auto engine = MakeEngine(f, 3, 24, Records{/*experts=*/false, /*indexer=*/true});
    REQUIRE(engine->records_indexer());
    SamplingParams params;
    params.max_new_tokens = 12;
    params.seed = 9;
    for (int64_t t = 0; t < 128; t += 11) params.stop_token_ids.push_back(t);
    const std::vector<Generation> out = engine->Generate(MixedPrompts(name), params);
    model::Decoder decoder(f.config, f.params);
    const int64_t layers = static_cast<int64_t>(engine->indexer_layers().size());
    int64_t compared = 0;
    for (const Generation& g : out) {
      std::vector<int64_t> fed = g.prompt;
      fed.insert(fed.end(), g.response.begin(), g.response.end() - 1);
      const int64_t n = static_cast<int64_t>(fed.size());
      const int64_t recorded = std::max<int64_t>(0, n - k);
      REQUIRE(static_cast<int64_t>(g.indexer_topk.size()) == layers * recorded * k);
      if (recorded == 0) continue;
      const at::Tensor record = at::tensor(g.indexer_topk, at::TensorOptions().dtype(at::kInt))
                                    .to(at::kLong)
                                    .view({layers, recorded, k});
      std::vector<at::Tensor> selected(static_cast<size_t>(f.config.num_hidden_layers));
      decoder.set_indexer_observer(
          [&](int64_t l, const at::Tensor& topk) { selected[static_cast<size_t>(l)] = topk; });
      decoder.set_indexer_source({});
      const at::Tensor tokens = at::tensor(fed, at::TensorOptions().dtype(at::kLong)).view({1, n});
      const at::Tensor natural = decoder.Logits(tokens);
      // The same key sets (the order within a selection is free) from position k on.
      for (int64_t i = 0; i < layers; ++i) {
        INFO("indexer layer " << i);
        const at::Tensor full =
            selected[static_cast<size_t>(engine->indexer_layers()[i])][0].narrow(0, k, recorded);
        CHECK(at::equal(std::get<0>(full.sort(-1)), std::get<0>(record[i].sort(-1))));
        ++compared;
      }
      // Replaying the record (keys 0..k-1 before position k) reproduces the forward bit for bit.
      decoder.set_indexer_source([&](int64_t l) -> std::optional<at::Tensor> {
        const auto& ls = engine->indexer_layers();
        const int64_t i = std::find(ls.begin(), ls.end(), l) - ls.begin();
        at::Tensor replay = at::arange(k, at::kLong).repeat({1, n, 1});
        replay[0].narrow(0, k, recorded).copy_(record[i]);
        return replay;
      });
      CHECK(at::equal(decoder.Logits(tokens), natural));
      decoder.set_indexer_source({});
    }
    fmt::print("{:18s} indexer record vs full forward: {} layer selections compared\n", name,
               compared);
    CHECK(compared > 0);
  }
}

}  // namespace
}  // namespace rl::rollout
