// The sampler against a plain C++ reference (same uniforms), and its greedy, top-k, top-p and
// log-prob contracts (sampler.h). Tolerances: none except the nucleus frequency check (binomial,
// stated there): token choices and log-probs are compared exactly, since the test computes the
// same expressions as the sampler or the choice is a discrete function of well-separated values.
#include "trainer/rollout/sampler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <vector>

#include "launch/check.h"

namespace rl::rollout {
namespace {

at::Tensor RandomLogits(int64_t batch, int64_t vocab, uint64_t seed) {
  at::Generator gen = MakeGenerator(seed);
  return at::randn({batch, vocab}, gen, at::TensorOptions().dtype(at::kFloat)) * 2.0;
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU).to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Plain-loop reference of the sampling rule in sampler.h for one row (no top-k/top-p): the first
// token, in id order, whose cumulative probability exceeds u.
int64_t ReferenceSample(const at::Tensor& row_logits, double temperature, double u) {
  const at::Tensor scaled = (row_logits.to(at::kFloat) / temperature).to(at::kDouble).contiguous();
  const double* x = scaled.data_ptr<double>();
  const int64_t vocab = scaled.numel();
  const double max = *std::max_element(x, x + vocab);
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) total += std::exp(x[i] - max);
  double cumulative = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    cumulative += std::exp(x[i] - max) / total;
    if (cumulative > u) return i;
  }
  return vocab - 1;
}

TEST_CASE("A fixed seed gives fixed tokens: those of the inverse-CDF reference") {
  const at::Tensor logits = RandomLogits(64, 40, 7);
  SamplerConfig config;
  config.temperature = 0.9;
  at::Generator a = MakeGenerator(1234);
  at::Generator b = MakeGenerator(1234);
  const std::vector<int64_t> first = ToVector(Sample(logits, config, a).tokens);
  const std::vector<int64_t> second = ToVector(Sample(logits, config, b).tokens);
  CHECK(first == second);

  at::Generator c = MakeGenerator(1234);
  const at::Tensor uniforms = at::rand({64}, c, at::TensorOptions().dtype(at::kDouble));
  int64_t near_boundary = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const int64_t expected =
        ReferenceSample(logits[i], config.temperature, uniforms[i].item<double>());
    // The reference sums in a different order; only a u within rounding of a CDF boundary could
    // differ, which these 64 draws do not hit (checked: all equal).
    if (expected != first[static_cast<size_t>(i)]) ++near_boundary;
  }
  CHECK(near_boundary == 0);

  at::Generator d = MakeGenerator(1235);
  CHECK(ToVector(Sample(logits, config, d).tokens) != first);
}

TEST_CASE("A top-k of the whole vocabulary or more truncates nothing: the tokens of top-k -1") {
  const at::Tensor logits = RandomLogits(64, 40, 13);
  at::Generator gen = MakeGenerator(77);
  const at::Tensor uniforms = at::rand({64}, gen, at::TensorOptions().dtype(at::kDouble));
  SamplerConfig off;
  const std::vector<int64_t> expected = ToVector(SampleWithUniforms(logits, off, uniforms).tokens);
  for (const int64_t k : {40, 41, 1000}) {
    SamplerConfig whole;
    whole.top_k = k;
    INFO("top_k " << k);
    CHECK(ToVector(SampleWithUniforms(logits, whole, uniforms).tokens) == expected);
  }
}

TEST_CASE("Greedy equals argmax, by flag or by temperature 0; top-k = 1 equals greedy") {
  const at::Tensor logits = RandomLogits(32, 50, 11);
  const std::vector<int64_t> argmax = ToVector(logits.argmax(-1));
  at::Generator gen = MakeGenerator(5);

  SamplerConfig zero;
  zero.temperature = 0;
  CHECK(ToVector(Sample(logits, zero, gen).tokens) == argmax);

  SamplerConfig flag;
  flag.temperature = 0.7;
  flag.greedy = true;
  const SampledTokens greedy = Sample(logits, flag, gen);
  CHECK(ToVector(greedy.tokens) == argmax);
  // Greedy by flag still reports log-probs at the given temperature.
  CHECK(at::equal(
      greedy.log_probs,
      at::log_softmax(logits / 0.7, -1).gather(1, greedy.tokens.unsqueeze(1)).squeeze(1)));

  SamplerConfig top1;
  top1.temperature = 1.3;
  top1.top_k = 1;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    at::Generator g = MakeGenerator(seed);
    CHECK(ToVector(Sample(logits, top1, g).tokens) == argmax);
  }
}

TEST_CASE("Top-k samples only among the k largest logits") {
  const at::Tensor logits = RandomLogits(16, 30, 3);
  SamplerConfig config;
  config.top_k = 3;
  config.temperature = 5.0;  // flat enough that without top-k most draws would fall outside
  const at::Tensor top3 = std::get<1>(logits.topk(3, -1));
  for (uint64_t seed = 0; seed < 20; ++seed) {
    at::Generator gen = MakeGenerator(seed);
    const at::Tensor tokens = Sample(logits, config, gen).tokens;
    CHECK(top3.eq(tokens.unsqueeze(1)).any(1).all().item<bool>());
  }
}

TEST_CASE("Top-p keeps the minimal nucleus, renormalised") {
  // Probabilities 0.5, 0.25, 0.15, 0.1 on token ids 2, 0, 3, 1 (sorted order differs from id
  // order).
  const std::vector<double> probs_by_id = {0.25, 0.1, 0.5, 0.15};
  std::vector<float> row;
  for (double p : probs_by_id) row.push_back(static_cast<float>(std::log(p)) + 3.0f);
  const int64_t batch = 4000;
  const at::Tensor logits =
      at::tensor(row, at::TensorOptions().dtype(at::kFloat)).unsqueeze(0).expand({batch, 4});

  struct Case {
    double top_p;
    std::set<int64_t> nucleus;
  };
  // A token is kept while the mass before it is < top_p: 0.45 -> {2}; 0.7 -> {2, 0} (0.75 >= 0.7);
  // 0.8 -> {2, 0, 3}; 1 -> all. top_p values sit >= 0.05 away from the boundaries 0.5/0.75/0.9.
  const std::vector<Case> cases = {
      {0.45, {2}}, {0.7, {2, 0}}, {0.8, {2, 0, 3}}, {1.0, {2, 0, 3, 1}}};
  for (const Case& c : cases) {
    INFO("top_p " << c.top_p);
    SamplerConfig config;
    config.top_p = c.top_p;
    at::Generator gen = MakeGenerator(99);
    const std::vector<int64_t> tokens = ToVector(Sample(logits, config, gen).tokens);
    const std::set<int64_t> seen(tokens.begin(), tokens.end());
    CHECK(seen == c.nucleus);  // every member drawn at least once in 4000, nothing outside
    // Frequencies follow the renormalised nucleus: |freq - p| <= 0.04 (> 5 binomial std devs at
    // n = 4000, std <= 0.0079).
    double mass = 0;
    for (int64_t id : c.nucleus) mass += probs_by_id[static_cast<size_t>(id)];
    for (int64_t id : c.nucleus) {
      const double freq = static_cast<double>(std::count(tokens.begin(), tokens.end(), id)) / batch;
      CHECK(std::abs(freq - probs_by_id[static_cast<size_t>(id)] / mass) <= 0.04);
    }
  }
}

TEST_CASE("Log-probs are log_softmax(logits / T) at the sampled tokens, exactly") {
  const at::Tensor logits = RandomLogits(32, 64, 21);
  for (const double temperature : {0.6, 1.0, 1.7}) {
    SamplerConfig config;
    config.temperature = temperature;
    config.top_k = 10;
    config.top_p = 0.9;
    at::Generator gen = MakeGenerator(8);
    const SampledTokens out = Sample(logits, config, gen);
    const at::Tensor expected =
        at::log_softmax(logits / temperature, -1).gather(1, out.tokens.unsqueeze(1)).squeeze(1);
    CHECK(out.log_probs.scalar_type() == at::kFloat);
    CHECK(at::equal(out.log_probs, expected));
  }
  // Temperature 0: the unscaled distribution (Note [Rollout log-probs]).
  SamplerConfig greedy;
  greedy.temperature = 0;
  at::Generator gen = MakeGenerator(8);
  const SampledTokens out = Sample(logits, greedy, gen);
  CHECK(at::equal(out.log_probs,
                  at::log_softmax(logits, -1).gather(1, out.tokens.unsqueeze(1)).squeeze(1)));
}

TEST_CASE("The hand-on targets take the tokens and log-probs; the positions advance by one") {
  const at::Tensor logits = RandomLogits(6, 64, 23);
  const at::Tensor uniforms =
      at::rand({6}, MakeGenerator(4), at::TensorOptions().dtype(at::kDouble));
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong);
  const at::Tensor step = at::arange(20, longs).view({2, 10});  // rows past 6 untouched
  kernels::HandOn to;
  to.host_tokens = at::full({6}, -1, longs);
  to.host_log_probs = at::zeros({6}, at::TensorOptions().dtype(at::kFloat));
  to.next_tokens = step[0].narrow(0, 0, 6);
  to.positions = step[1].narrow(0, 0, 6);
  const SampledTokens out = SampleWithUniforms(logits, SamplerConfig{}, uniforms, to);
  CHECK(at::equal(to.host_tokens, out.tokens));
  CHECK(at::equal(to.host_log_probs, out.log_probs));
  CHECK(at::equal(step[0].narrow(0, 0, 6), out.tokens));
  CHECK(at::equal(step[1], at::arange(10, 20, longs) + (at::arange(10, longs) < 6).to(at::kLong)));
  CHECK(at::equal(step[0].narrow(0, 6, 4), at::arange(6, 10, longs)));
}

TEST_CASE("Out-of-range sampling settings throw ConfigError") {
  const at::Tensor logits = RandomLogits(2, 8, 1);
  at::Generator gen = MakeGenerator(1);
  SamplerConfig bad;
  bad.temperature = -1;
  CHECK_THROWS_AS(Sample(logits, bad, gen), ConfigError);
  bad = SamplerConfig{};
  bad.top_p = 0;
  CHECK_THROWS_AS(Sample(logits, bad, gen), ConfigError);
  bad = SamplerConfig{};
  bad.top_k = 0;
  CHECK_THROWS_AS(Sample(logits, bad, gen), ConfigError);
}

}  // namespace
}  // namespace rl::rollout
