// The decoder against transformers 5.24 on every fixture in tests/fixtures/ (fp32, CPU), and the
// KV-cache step forward against the full forward.
//
// Tolerance (all comparisons here): max |ours - reference| <= 1e-4 * max(1, max |reference|).
#include "trainer/model/decoder.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>

#include "trainer/model/test_fixtures.h"

namespace rl::model {
namespace {

using testing::FixtureNames;
using testing::LoadFixture;
using testing::ReferenceTensor;

double Tolerance(const at::Tensor& reference) {
  return 1e-4 * std::max(1.0, reference.abs().max().item<double>());
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST_CASE("Logits, log-probs and entropy match transformers on every fixture") {
  const std::vector<std::string> names = FixtureNames();
  REQUIRE(names.size() >= 6);
  for (const std::string& name : names) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    Decoder model(m.config, m.params);
    for (const std::string suffix : {"", "_long"}) {
      INFO("tokens" << suffix);
      const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens" + suffix);
      const at::Tensor ref_logits =
          ReferenceTensor(name, "reference.safetensors", "logits" + suffix);
      const at::Tensor logits = model.Logits(tokens);
      const double diff = MaxAbsDiff(logits, ref_logits);
      fmt::print("{:20s} logits{:5s} max|diff| {:.3g} (tolerance {:.3g})\n", name, suffix, diff,
                 Tolerance(ref_logits));
      CHECK(diff <= Tolerance(ref_logits));

      // Targets: the next token; the last position's target is arbitrary (only its entropy is
      // used).
      const int64_t seq = tokens.size(1);
      const at::Tensor targets = at::cat({tokens.narrow(1, 1, seq - 1), tokens.narrow(1, 0, 1)}, 1);
      const TokenStats stats = model.TokenLogProbs(tokens, targets);
      const at::Tensor ref_lp =
          ReferenceTensor(name, "reference.safetensors", "log_probs" + suffix);
      const at::Tensor ref_entropy =
          ReferenceTensor(name, "reference.safetensors", "entropy" + suffix);
      CHECK(stats.log_probs.scalar_type() == at::kFloat);
      CHECK(MaxAbsDiff(stats.log_probs.narrow(1, 0, seq - 1), ref_lp) <= Tolerance(ref_lp));
      CHECK(MaxAbsDiff(stats.entropy, ref_entropy) <= Tolerance(ref_entropy));
    }
  }
}

TEST_CASE("KV-cache steps give the logits of the full forward") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    Decoder model(m.config, m.params);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens_long");
    const at::Tensor full = model.Logits(tokens);  // [2, 16, V]
    // A larger cache than needed: steps use rows [0, batch) and positions [0, 16).
    KvCache cache = KvCache::Allocate(m.config, 3, 20, at::kFloat, at::kCPU);
    std::vector<at::Tensor> parts;
    const std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 5},  {5, 1},  {6, 3}, {9, 1},
                                                             {10, 4}, {14, 1}, {15, 1}};
    for (const auto& [start, len] : chunks) {
      parts.push_back(model.ForwardStep(tokens.narrow(1, start, len), cache, start));
    }
    const at::Tensor stepped = at::cat(parts, 1);
    const double diff = MaxAbsDiff(stepped, full);
    fmt::print("{:20s} kv-cache steps vs full forward max|diff| {:.3g}\n", name, diff);
    CHECK(diff <= Tolerance(full));
    CHECK_FALSE(stepped.requires_grad());
  }
}

TEST_CASE("PrefillLogits is ForwardStep's last position, and writes the same cache") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    Decoder model(m.config, m.params);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens_long");
    KvCache whole = KvCache::Allocate(m.config, 3, 20, at::kFloat, at::kCPU);
    KvCache last = KvCache::Allocate(m.config, 3, 20, at::kFloat, at::kCPU);
    // A prefill, then a chunk after it (start > 0).
    for (const auto& [start, len] : {std::pair<int64_t, int64_t>{0, 9}, {9, 4}}) {
      const at::Tensor chunk = tokens.narrow(1, start, len);
      const at::Tensor expected = model.ForwardStep(chunk, whole, start).select(1, len - 1);
      const at::Tensor got = model.PrefillLogits(chunk, last, start);
      CHECK(got.sizes() == expected.sizes());
      // CPU GEMMs are batch-invariant (Note [Batch-invariant CPU kernels] in layers.cc): the LM
      // head over one position per row gives that position's bits.
      CHECK(at::equal(got, expected));
      CHECK(at::equal(last.storage(), whole.storage()));
    }
  }
}

// Right padding: a row's tokens come before its padding, so causal attention keeps the padding
// from them; its logits are those of its last real position, and its cache up to it is the row's
// alone (the engine's prefill of prompts of several lengths, Note [Rollout batching]).
TEST_CASE("PrefillLogits of right-padded rows of several lengths equals each row alone") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    Decoder model(m.config, m.params);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens_long");
    const std::vector<int64_t> lengths = {6, 11};
    at::Tensor padded = tokens.narrow(1, 0, 11).clone();
    padded[0].narrow(0, 6, 5).fill_(0);
    KvCache together = KvCache::Allocate(m.config, 2, 20, at::kFloat, at::kCPU);
    const at::Tensor logits = model.PrefillLogits(padded, together, 0, lengths);
    for (int64_t r = 0; r < 2; ++r) {
      INFO("row " << r);
      const int64_t length = lengths[static_cast<size_t>(r)];
      KvCache alone = KvCache::Allocate(m.config, 1, 20, at::kFloat, at::kCPU);
      const at::Tensor own =
          model.PrefillLogits(tokens.narrow(0, r, 1).narrow(1, 0, length), alone, 0);
      CHECK(MaxAbsDiff(logits.narrow(0, r, 1), own) <= 1e-5);
      for (int64_t l = 0; l < m.config.num_hidden_layers; ++l) {
        const LayerKv& mine = together.layer(l);
        const LayerKv& theirs = alone.layer(l);
        if (mine.key.defined()) {
          CHECK(MaxAbsDiff(mine.key[r].narrow(1, 0, length), theirs.key[0].narrow(1, 0, length)) <=
                1e-5);
          CHECK(MaxAbsDiff(mine.value[r].narrow(1, 0, length),
                           theirs.value[0].narrow(1, 0, length)) <= 1e-5);
        } else {
          CHECK(MaxAbsDiff(mine.latent_pe[r].narrow(0, 0, length),
                           theirs.latent_pe[0].narrow(0, 0, length)) <= 1e-5);
        }
      }
    }
    CHECK_THROWS_WITH(model.PrefillLogits(padded, together, 0, {6, 12}),
                      Catch::Contains("a row length of 12 outside [1, 11]"));
  }
}

TEST_CASE("Decode steps at a device-side position over a larger key block give the full logits") {
  // Note [Decode at a device position]: keys past the position are masked, whatever finite values
  // the cache holds there (here large random ones, written before the steps).
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    Decoder model(m.config, m.params);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens_long");
    const at::Tensor full = model.Logits(tokens);  // [2, 16, V]
    const int64_t seq = tokens.size(1);
    const int64_t key_block = 20;
    KvCache cache = KvCache::Allocate(m.config, 3, key_block, at::kFloat, at::kCPU);
    cache.storage().uniform_(-1000, 1000);
    const RopeTable rope = MakeRopeTable(m.config, 0, key_block, at::kFloat, at::kCPU);
    std::vector<at::Tensor> parts = {model.ForwardStep(tokens.narrow(1, 0, 5), cache, 0)};
    for (int64_t p = 5; p < seq; ++p) {
      const at::Tensor position = at::full({1}, p, at::kLong);
      parts.push_back(
          model.DecodeStep(tokens.narrow(1, p, 1), position, key_block, rope, cache).unsqueeze(1));
    }
    const double diff = MaxAbsDiff(at::cat(parts, 1), full);
    fmt::print("{:20s} device-position steps vs full forward max|diff| {:.3g}\n", name, diff);
    CHECK(diff <= Tolerance(full));
  }
}

TEST_CASE("Fused projections on back-to-back weights give the plain decoder's logits") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    // Lay q/k/v and gate/up out back to back, as the engine layout does.
    TensorMap params = m.params;
    int64_t groups = 0;
    const auto place = [&](const std::vector<std::string>& names) {
      std::vector<at::Tensor> parts;
      for (const std::string& n : names) {
        if (params.count(n) == 0) return;
        parts.push_back(params.at(n));
      }
      const at::Tensor joined = at::cat(parts, 0);
      int64_t row = 0;
      for (size_t i = 0; i < names.size(); ++i) {
        params[names[i]] = joined.narrow(0, row, parts[i].size(0));
        row += parts[i].size(0);
      }
      ++groups;
    };
    for (int64_t l = 0; l < m.config.num_hidden_layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      place({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
             p + "self_attn.v_proj.weight"});
      place({p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias",
             p + "self_attn.v_proj.bias"});
      place({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
      place({p + "mlp.shared_experts.gate_proj.weight", p + "mlp.shared_experts.up_proj.weight"});
    }
    const Decoder plain(m.config, m.params);
    const Decoder fused(m.config, params, Kernels::kFused);
    // Every GQA layer's q/k/v, every dense MLP's gate/up and every shared expert's gate/up is
    // fused (biases ride along).
    int64_t expected = 0;
    for (int64_t l = 0; l < m.config.num_hidden_layers; ++l) {
      const std::string shared =
          fmt::format("model.layers.{}.mlp.shared_experts.gate_proj.weight", l);
      if (m.config.attention_kind() == AttentionKind::kGqa) ++expected;
      if (m.config.mlp_layer_types[l] == MlpType::kDense || m.params.count(shared) > 0) ++expected;
    }
    CHECK(fused.fused_projections() == expected);
    CHECK(groups >= expected);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens_long");
    const at::Tensor want = plain.Logits(tokens);
    CHECK(MaxAbsDiff(fused.Logits(tokens), want) <= Tolerance(want));
  }
}

// Note [MLA decode in the latent space]: an inference Decoder's decode steps (host-side and
// device-side positions, the DSA fixture's sparse selection included) attend over the cached
// latents with absorbed up-projections; the logits equal the expanded attention's, fp32. The
// steps start after a 2-token prompt. DSA fixtures (index_topk 4, Note [DSA decode over the
// selected keys]): the host-side steps over 5 to 7 keys mask to the selection, those over 8 or
// more gather it; the device-side steps over the key block of 20 gather it, and the first of them
// see fewer keys than 4, so their selection holds keys they cannot see.
TEST_CASE("MLA decode steps in the latent space give the full forward's logits") {
  int64_t mla_fixtures = 0;
  for (const std::string& name : FixtureNames()) {
    testing::LoadedModel m = LoadFixture(name);
    if (m.config.attention_kind() != AttentionKind::kMla) continue;
    ++mla_fixtures;
    INFO("fixture " << name);
    const Decoder plain(m.config, m.params);
    const Decoder latent(m.config, m.params, Kernels::kFused);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens_long");
    const at::Tensor full = plain.Logits(tokens);  // [2, 16, V]
    const int64_t seq = tokens.size(1);
    const int64_t key_block = 20;
    KvCache host = KvCache::Allocate(m.config, 2, seq, at::kFloat, at::kCPU);
    KvCache device = KvCache::Allocate(m.config, 2, key_block, at::kFloat, at::kCPU);
    const RopeTable rope = MakeRopeTable(m.config, 0, key_block, at::kFloat, at::kCPU);
    const int64_t prompt = 2;
    std::vector<at::Tensor> by_host = {latent.ForwardStep(tokens.narrow(1, 0, prompt), host, 0)};
    std::vector<at::Tensor> by_device = {
        latent.ForwardStep(tokens.narrow(1, 0, prompt), device, 0)};
    for (int64_t p = prompt; p < seq; ++p) {
      by_host.push_back(latent.ForwardStep(tokens.narrow(1, p, 1), host, p));
      by_device.push_back(latent
                              .DecodeStep(tokens.narrow(1, p, 1), at::full({1}, p, at::kLong),
                                          key_block, rope, device)
                              .unsqueeze(1));
    }
    const double host_diff = MaxAbsDiff(at::cat(by_host, 1), full);
    const double device_diff = MaxAbsDiff(at::cat(by_device, 1), full);
    fmt::print("{:20s} latent-space decode vs full forward max|diff| {:.3g} (host positions), "
               "{:.3g} (device positions)\n",
               name, host_diff, device_diff);
    CHECK(host_diff <= 1e-5 * std::max(1.0, full.abs().max().item<double>()));
    CHECK(device_diff <= 1e-5 * std::max(1.0, full.abs().max().item<double>()));
  }
  CHECK(mla_fixtures >= 3);  // deepseek_v3, glm4_moe_lite, glm_moe_dsa
}

// Note [Ragged decode]: rows at different positions in one DecodeStep (each with its own cache
// slot, RoPE angles and visible keys) give the logits each row gives decoded alone, with the
// LibTorch ops and with an inference decoder's (MLA in the latent space), on every fixture.
TEST_CASE("Rows at different positions in one decode step give their logits alone") {
  for (const std::string& name : FixtureNames()) {
    testing::LoadedModel m = LoadFixture(name);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens_long");
    const int64_t seq = tokens.size(1);
    const int64_t key_block = seq + 4;
    const std::vector<int64_t> prompt = {5, 9};  // row r's prompt length
    const RopeTable rope = MakeRopeTable(m.config, 0, key_block, at::kFloat, at::kCPU);
    for (const Kernels kernels : {Kernels::kLibTorch, Kernels::kFused}) {
      INFO("fixture " << name << ", kernels " << static_cast<int>(kernels));
      const Decoder model(m.config, m.params, kernels);
      KvCache together = KvCache::Allocate(m.config, 2, key_block, at::kFloat, at::kCPU);
      std::vector<KvCache> alone;
      for (int64_t r = 0; r < 2; ++r) {
        const at::Tensor row_prompt = tokens.narrow(0, r, 1).narrow(1, 0, prompt[r]);
        KvCache rows = together.Rows(r, 1);
        model.ForwardStep(row_prompt, rows, 0);
        alone.push_back(KvCache::Allocate(m.config, 1, key_block, at::kFloat, at::kCPU));
        model.ForwardStep(row_prompt, alone.back(), 0);
      }
      double worst = 0;
      for (int64_t i = 0; prompt[1] + i < seq; ++i) {
        const std::vector<int64_t> positions = {prompt[0] + i, prompt[1] + i};
        const at::Tensor step =
            at::stack({tokens[0][positions[0]], tokens[1][positions[1]]}).view({2, 1});
        const at::Tensor logits =
            model.DecodeStep(step, at::tensor(positions, at::kLong), key_block, rope, together);
        for (int64_t r = 0; r < 2; ++r) {
          const at::Tensor own = model.DecodeStep(
              step.narrow(0, r, 1), at::full({1}, positions[static_cast<size_t>(r)], at::kLong),
              key_block, rope, alone[static_cast<size_t>(r)]);
          worst = std::max(worst, MaxAbsDiff(logits.narrow(0, r, 1), own));
        }
      }
      fmt::print("{:20s} ragged decode step vs each row alone ({}) max|diff| {:.3g}\n", name,
                 kernels == Kernels::kFused ? "inference" : "LibTorch ops", worst);
      CHECK(worst <= 1e-5);
    }
  }
}

// Decoder::set_latent_mla_decode(false): the decode steps of an inference Decoder attend over
// expanded keys and values, the same ops as a training Decoder's steps (the CPU has none of the
// fused kernels), so the logits are bit-identical.
TEST_CASE("MLA decode steps with the latent space turned off equal a training decoder's") {
  for (const std::string& name : FixtureNames()) {
    testing::LoadedModel m = LoadFixture(name);
    if (m.config.attention_kind() != AttentionKind::kMla) continue;
    INFO("fixture " << name);
    const Decoder plain(m.config, m.params);
    Decoder expanded(m.config, m.params, Kernels::kFused);
    expanded.set_latent_mla_decode(false);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens_long");
    const int64_t seq = tokens.size(1);
    KvCache plain_cache = KvCache::Allocate(m.config, 2, seq, at::kFloat, at::kCPU);
    KvCache expanded_cache = KvCache::Allocate(m.config, 2, seq, at::kFloat, at::kCPU);
    plain.ForwardStep(tokens.narrow(1, 0, 5), plain_cache, 0);
    expanded.ForwardStep(tokens.narrow(1, 0, 5), expanded_cache, 0);
    for (int64_t p = 5; p < seq; ++p) {
      const at::Tensor step = tokens.narrow(1, p, 1);
      CHECK(at::equal(expanded.ForwardStep(step, expanded_cache, p),
                      plain.ForwardStep(step, plain_cache, p)));
    }
  }
}

TEST_CASE("A decoder with fused inference kernels refuses params that require grad") {
  testing::LoadedModel m = LoadFixture("qwen3");
  m.params.at("model.norm.weight").requires_grad_(true);
  CHECK_THROWS_WITH(Decoder(m.config, m.params, Kernels::kFused),
                    Catch::Contains("model.norm.weight requires grad"));
}

TEST_CASE("Greedy generation with the KV cache reproduces transformers' generate") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name);
    Decoder model(m.config, m.params);
    const at::Tensor prompt = ReferenceTensor(name, "generate.safetensors", "prompt");
    const at::Tensor generated = ReferenceTensor(name, "generate.safetensors", "generated");
    const at::Tensor ref_logits = ReferenceTensor(name, "generate.safetensors", "generated_logits");
    const int64_t new_tokens = generated.size(1) - prompt.size(1);
    KvCache cache =
        KvCache::Allocate(m.config, prompt.size(0), generated.size(1), at::kFloat, at::kCPU);
    at::Tensor sequence = prompt;
    at::Tensor step_input = prompt;
    int64_t position = 0;
    std::vector<at::Tensor> step_logits;
    for (int64_t i = 0; i < new_tokens; ++i) {
      at::Tensor logits = model.ForwardStep(step_input, cache, position);
      position += step_input.size(1);
      at::Tensor last = logits.select(1, logits.size(1) - 1);  // [B, V]
      step_logits.push_back(last.unsqueeze(1));
      step_input = last.argmax(-1, /*keepdim=*/true);
      sequence = at::cat({sequence, step_input}, 1);
    }
    CHECK(at::equal(sequence, generated));
    const at::Tensor ours = at::cat(step_logits, 1);
    CHECK(MaxAbsDiff(ours, ref_logits) <= Tolerance(ref_logits));
  }
}

TEST_CASE("A bf16 model computes in bf16 with an fp32 router bias, close to fp32") {
  for (const std::string& name : FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = LoadFixture(name, at::kBFloat16);
    Decoder model(m.config, m.params);
    CHECK(model.dtype() == at::kBFloat16);
    const at::Tensor tokens = ReferenceTensor(name, "reference.safetensors", "tokens");
    const at::Tensor ref = ReferenceTensor(name, "reference.safetensors", "logits");
    const at::Tensor logits = model.Logits(tokens);
    CHECK(logits.scalar_type() == at::kBFloat16);
    // bf16 has 8 mantissa bits; a near-tie in routing may flip, so only a loose check.
    CHECK(MaxAbsDiff(logits, ref) <= 0.25 * std::max(1.0, ref.abs().max().item<double>()));
    const TokenStats stats = model.TokenLogProbs(tokens, tokens);
    CHECK(stats.log_probs.scalar_type() == at::kFloat);
  }
}

TEST_CASE("The decoder rejects parameters that do not match the config") {
  testing::LoadedModel m = LoadFixture("glm4_moe");
  TensorMap params = m.params;
  params.erase("model.layers.1.mlp.experts.down_proj");
  params["model.layers.0.self_attn.q_proj.weight"] = at::zeros({3, 3});
  params["model.layers.9.unknown.weight"] = at::zeros({1});
  try {
    Decoder model(m.config, params);
    FAIL("expected rl::Error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("missing 1: model.layers.1.mlp.experts.down_proj"));
    CHECK_THAT(msg, Catch::Contains("unexpected 1: model.layers.9.unknown.weight"));
    CHECK_THAT(msg, Catch::Contains("model.layers.0.self_attn.q_proj.weight (shape [3, 3]"));
  }
}

TEST_CASE("ForwardStep refuses positions beyond the cache") {
  testing::LoadedModel m = LoadFixture("qwen3");
  Decoder model(m.config, m.params);
  KvCache cache = KvCache::Allocate(m.config, 1, 4, at::kFloat, at::kCPU);
  const at::Tensor tokens = at::zeros({1, 3}, at::kLong);
  CHECK_NOTHROW(model.ForwardStep(tokens, cache, 0));
  CHECK_THROWS_AS(model.ForwardStep(tokens, cache, 2), Error);
  CHECK_THROWS_AS(model.ForwardStep(at::zeros({2, 1}, at::kLong), cache, 3), Error);
}

}  // namespace
}  // namespace rl::model
