// Training plans: the strided deal of --no-balance-data written out by hand, the coverage and
// equal-count properties over random and adversarial lengths, the balance of Karmarkar-Karp against
// the strided deal and its bound, and the budget and equal-count properties of dynamic
// micro-batches (Note [Training plan]).
#include "trainer/training_plan.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "launch/check.h"

namespace rl {
namespace {

using Lengths = std::vector<int64_t>;

PlanOptions Fixed(int64_t global_batch_size, int64_t micro_batch_size, bool balance) {
  PlanOptions o;
  o.global_batch_size = global_batch_size;
  o.micro_batch_size = micro_batch_size;
  o.balance_data = balance;
  return o;
}

PlanOptions Dynamic(int64_t global_batch_size, int64_t max_tokens, bool balance) {
  PlanOptions o;
  o.global_batch_size = global_batch_size;
  o.balance_data = balance;
  o.dynamic_batch_size = true;
  o.max_tokens_per_gpu = max_tokens;
  return o;
}

// The samples of one rank's step, in plan order.
std::vector<int64_t> StepSamples(const TrainingPlan& plan, size_t step) {
  std::vector<int64_t> samples;
  for (const auto& micro_batch : plan.steps.at(step)) {
    samples.insert(samples.end(), micro_batch.begin(), micro_batch.end());
  }
  return samples;
}

int64_t Tokens(const std::vector<int64_t>& samples, const Lengths& lengths) {
  int64_t sum = 0;
  for (int64_t i : samples) sum += lengths[i];
  return sum;
}

// Largest minus smallest token sum of the ranks in `step`.
int64_t StepSpread(const std::vector<TrainingPlan>& plans, size_t step, const Lengths& lengths) {
  std::vector<int64_t> sums;
  for (const TrainingPlan& plan : plans) sums.push_back(Tokens(StepSamples(plan, step), lengths));
  return *std::max_element(sums.begin(), sums.end()) - *std::min_element(sums.begin(), sums.end());
}

// Note [Training plan]'s bound for Karmarkar-Karp on step `step`: the largest spread of the
// consecutive chunks of dp samples of the step, sorted by length.
int64_t ChunkBound(const Lengths& lengths, int64_t global_batch_size, size_t step, int dp_size) {
  Lengths sorted(lengths.begin() + step * global_batch_size,
                 lengths.begin() + (step + 1) * global_batch_size);
  std::sort(sorted.begin(), sorted.end());
  int64_t bound = 0;
  for (size_t c = 0; c < sorted.size(); c += dp_size) {
    bound = std::max(bound, sorted[c + dp_size - 1] - sorted[c]);
  }
  return bound;
}

// Length lists of 24 samples (divisible by every gbs used below) that are hard on one split or
// the other, plus random ones.
std::vector<Lengths> LengthLists() {
  std::vector<Lengths> lists;
  Lengths ascending(24);
  for (int64_t i = 0; i < 24; ++i) ascending[i] = 1 + 37 * i;
  lists.push_back(ascending);
  lists.push_back(Lengths(ascending.rbegin(), ascending.rend()));
  Lengths one_huge(24, 3);
  one_huge[5] = 100000;
  lists.push_back(one_huge);
  lists.push_back(Lengths(24, 512));  // all equal: every tie is broken by index
  Lengths ones_then_thousands(24, 1);
  std::fill(ones_then_thousands.begin() + 18, ones_then_thousands.end(), 1000);
  lists.push_back(ones_then_thousands);
  Lengths alternating(24);
  for (int64_t i = 0; i < 24; ++i) alternating[i] = i % 2 == 0 ? 4000 : 10;
  lists.push_back(alternating);
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 20; ++trial) {
    // Log-uniform-ish: many short responses and a few long ones, as in RL rollouts.
    std::uniform_int_distribution<int> exponent(0, 13);
    Lengths random(24);
    for (int64_t& l : random) {
      const int64_t top = int64_t{1} << exponent(rng);
      l = std::uniform_int_distribution<int64_t>(1, top)(rng);
    }
    lists.push_back(random);
  }
  return lists;
}

TEST_CASE("--no-balance-data: sample i of a step goes to rank i % dp, in order (today's deal)") {
  // 12 samples, gbs 6, 2 ranks, micro-batches of 2: step 0 is samples 0..5, step 1 is 6..11.
  const Lengths lengths = {5, 9, 2, 7, 7, 1, 3, 8, 6, 4, 2, 9};
  const std::vector<TrainingPlan> plans = MakeTrainingPlans(lengths, Fixed(6, 2, false), 2);
  REQUIRE(plans.size() == 2);
  using Steps = std::vector<std::vector<std::vector<int64_t>>>;
  CHECK(plans[0].steps == Steps{{{0, 2}, {4}}, {{6, 8}, {10}}});
  CHECK(plans[1].steps == Steps{{{1, 3}, {5}}, {{7, 9}, {11}}});
}

TEST_CASE("every sample appears exactly once, every rank has gbs / dp samples per step, sorted") {
  for (const Lengths& lengths : LengthLists()) {
    for (int dp : {1, 2, 3, 4}) {
      for (const int64_t gbs : {int64_t{12}, int64_t{24}}) {
        for (const bool balance : {false, true}) {
          for (const bool dynamic : {false, true}) {
            INFO("dp " << dp << " gbs " << gbs << " balance " << balance << " dynamic " << dynamic
                       << " first length " << lengths[0]);
            const PlanOptions options =
                dynamic ? Dynamic(gbs, 2048, balance) : Fixed(gbs, 2, balance);
            const std::vector<TrainingPlan> plans = MakeTrainingPlans(lengths, options, dp);
            REQUIRE(plans.size() == static_cast<size_t>(dp));
            std::vector<int> seen(lengths.size(), 0);
            for (const TrainingPlan& plan : plans) {
              REQUIRE(plan.steps.size() == lengths.size() / gbs);
              for (size_t s = 0; s < plan.steps.size(); ++s) {
                const std::vector<int64_t> samples = StepSamples(plan, s);
                CHECK(static_cast<int64_t>(samples.size()) == gbs / dp);
                for (int64_t i : samples) {
                  CHECK(i / gbs == static_cast<int64_t>(s));  // step s covers [s gbs, (s+1) gbs)
                  ++seen.at(i);
                }
                if (!dynamic) CHECK(std::is_sorted(samples.begin(), samples.end()));
              }
            }
            CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
          }
        }
      }
    }
  }
}

TEST_CASE("--balance-data: spread no worse than the strided deal, within Karmarkar-Karp's bound") {
  for (const Lengths& lengths : LengthLists()) {
    for (int dp : {1, 2, 3, 4}) {
      for (const int64_t gbs : {int64_t{12}, int64_t{24}}) {
        INFO("dp " << dp << " gbs " << gbs << " first length " << lengths[0]);
        const auto balanced = MakeTrainingPlans(lengths, Fixed(gbs, 1, true), dp);
        const auto strided = MakeTrainingPlans(lengths, Fixed(gbs, 1, false), dp);
        for (size_t s = 0; s < lengths.size() / gbs; ++s) {
          CHECK(StepSpread(balanced, s, lengths) <= StepSpread(strided, s, lengths));
          CHECK(StepSpread(balanced, s, lengths) <= ChunkBound(lengths, gbs, s, dp));
        }
      }
    }
  }
}

TEST_CASE("--balance-data over 2 ranks: no swap of two samples lowers the spread") {
  for (const Lengths& lengths : LengthLists()) {
    for (const int64_t gbs : {int64_t{12}, int64_t{24}}) {
      const auto plans = MakeTrainingPlans(lengths, Fixed(gbs, 1, true), 2);
      for (size_t s = 0; s < lengths.size() / gbs; ++s) {
        const std::vector<int64_t> first = StepSamples(plans[0], s);
        const std::vector<int64_t> second = StepSamples(plans[1], s);
        const int64_t difference = Tokens(first, lengths) - Tokens(second, lengths);
        for (int64_t a : first) {
          for (int64_t b : second) {
            // Swapping a and b moves tokens[a] - tokens[b] from the first rank to the second.
            const int64_t swapped = difference - 2 * (lengths[a] - lengths[b]);
            CHECK(std::abs(swapped) >= std::abs(difference));
          }
        }
      }
    }
  }
}

TEST_CASE("--balance-data: known optima, where the strided deal misses them") {
  // {10, 9, ..., 3} over 2 ranks, 4 samples each: 52 tokens, so 26 / 26 is optimal; the strided
  // deal gives 10 + 8 + 6 + 4 = 28 against 24.
  const Lengths lengths = {10, 9, 8, 7, 6, 5, 4, 3};
  const auto balanced = MakeTrainingPlans(lengths, Fixed(8, 4, true), 2);
  CHECK(Tokens(StepSamples(balanced[0], 0), lengths) == 26);
  CHECK(Tokens(StepSamples(balanced[1], 0), lengths) == 26);
  CHECK(StepSpread(MakeTrainingPlans(lengths, Fixed(8, 4, false), 2), 0, lengths) == 4);

  // Ascending 1..12 over 3 ranks: 78 tokens, 26 each.
  Lengths ascending(12);
  for (int64_t i = 0; i < 12; ++i) ascending[i] = i + 1;
  CHECK(StepSpread(MakeTrainingPlans(ascending, Fixed(12, 4, true), 3), 0, ascending) == 0);
  CHECK(StepSpread(MakeTrainingPlans(ascending, Fixed(12, 4, false), 3), 0, ascending) == 8);

  // [1 x 6, 1000 x 2] over 2 ranks: each rank must get one 1000 (1003 / 1003).
  const Lengths ones_thousands = {1, 1, 1, 1, 1, 1, 1000, 1000};
  CHECK(StepSpread(MakeTrainingPlans(ones_thousands, Fixed(8, 4, true), 2), 0, ones_thousands) ==
        0);

  // One huge sample and 7 small ones over 2 ranks: the best is 1003 against 4.
  const Lengths one_huge = {1, 1, 1000, 1, 1, 1, 1, 1};
  CHECK(StepSpread(MakeTrainingPlans(one_huge, Fixed(8, 4, true), 2), 0, one_huge) == 999);
}

TEST_CASE("--balance-data: each rank's samples in ascending index order, ranks by first sample") {
  const Lengths lengths = {10, 9, 8, 7, 6, 5, 4, 3};
  const auto plans = MakeTrainingPlans(lengths, Fixed(8, 4, true), 2);
  // Worked by hand from Note [Training plan], in lengths: the chunks {3,4} {5,6} {7,8} {9,10}
  // (spread 1 each) merge in creation order to {4,5}/{3,6} and {8,9}/{7,10}, then those to
  // {3,6,8,9}/{4,5,7,10}. The set holding sample 0 (length 10) goes to rank 0.
  using Steps = std::vector<std::vector<std::vector<int64_t>>>;
  CHECK(plans[0].steps == Steps{{{0, 3, 5, 6}}});
  CHECK(plans[1].steps == Steps{{{1, 2, 4, 7}}});
}

TEST_CASE("dynamic micro-batches: within budget unless alone, none empty, equal counts") {
  for (const Lengths& lengths : LengthLists()) {
    for (int dp : {1, 2, 3, 4}) {
      for (const int64_t budget : {int64_t{1}, int64_t{600}, int64_t{4096}, int64_t{1} << 40}) {
        for (const bool balance : {false, true}) {
          INFO("dp " << dp << " budget " << budget << " balance " << balance << " first length "
                     << lengths[0]);
          const auto plans = MakeTrainingPlans(lengths, Dynamic(12, budget, balance), dp);
          for (size_t s = 0; s < plans[0].steps.size(); ++s) {
            for (const TrainingPlan& plan : plans) {
              CHECK(plan.steps[s].size() == plans[0].steps[s].size());
              for (const auto& micro_batch : plan.steps[s]) {
                REQUIRE_FALSE(micro_batch.empty());
                int64_t longest = 0;
                for (int64_t i : micro_batch) longest = std::max(longest, lengths[i]);
                const int64_t padded = static_cast<int64_t>(micro_batch.size()) * longest;
                CHECK((padded <= budget || micro_batch.size() == 1));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("dynamic micro-batches: a rank with fewer is split until it has as many as the others") {
  // Step of 8 over 2 ranks, --no-balance-data: rank 0 gets samples 0, 2, 4, 6 (100 tokens each:
  // one per micro-batch under a budget of 150), rank 1 gets 1, 3, 5, 7 (10 tokens: all four fit
  // in one micro-batch of 40 padded tokens). Rank 1 is split to 4 micro-batches as well: its one
  // micro-batch in halves {1, 3} {5, 7}, then the first of the widest (equal: 20 tokens) halves.
  const Lengths lengths = {100, 10, 100, 10, 100, 10, 100, 10};
  const auto plans = MakeTrainingPlans(lengths, Dynamic(8, 150, false), 2);
  using Steps = std::vector<std::vector<std::vector<int64_t>>>;
  CHECK(plans[0].steps == Steps{{{0}, {2}, {4}, {6}}});
  CHECK(plans[1].steps == Steps{{{1}, {3}, {5}, {7}}});
}

TEST_CASE("dynamic micro-batches: a sample longer than the budget trains alone") {
  // Packed by length: 5, 5, 5 fit in 15 padded tokens; 50 is over the budget and goes alone.
  const Lengths lengths = {5, 50, 5, 5};
  const auto plans = MakeTrainingPlans(lengths, Dynamic(4, 16, false), 1);
  using Steps = std::vector<std::vector<std::vector<int64_t>>>;
  CHECK(plans[0].steps == Steps{{{0, 2, 3}, {1}}});
}

TEST_CASE("PlanTokens sums the unpadded tokens of the plan's samples") {
  const Lengths lengths = {5, 9, 2, 7};
  const auto plans = MakeTrainingPlans(lengths, Fixed(4, 1, false), 2);
  CHECK(PlanTokens(plans[0], lengths) == 5 + 2);
  CHECK(PlanTokens(plans[1], lengths) == 9 + 7);
}

TEST_CASE("geometry errors name the options") {
  const Lengths lengths(12, 4);
  try {
    MakeTrainingPlans(lengths, Fixed(6, 1, true), 4);
    FAIL("gbs 6 over 4 ranks was accepted");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) ==
          "--global-batch-size 6 is not a multiple of the 4 data-parallel ranks");
  }
  try {
    MakeTrainingPlans(lengths, Fixed(8, 1, true), 2);
    FAIL("12 samples with gbs 8 were accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "the rollout has 12 samples, not a multiple of --global-batch-size 8");
  }
  try {
    MakeTrainingPlans(lengths, Dynamic(12, 0, true), 2);
    FAIL("dynamic micro-batches without a budget were accepted");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) ==
          "--use-dynamic-batch-size needs --max-tokens-per-gpu >= 1; got 0");
  }
}

}  // namespace
}  // namespace rl
