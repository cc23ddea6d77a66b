#include "trainer/training_plan.h"

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <utility>

#include "launch/check.h"

namespace rl {
namespace {

using MicroBatches = std::vector<std::vector<int64_t>>;  // micro-batch -> sample index

// Orders sample indices by (tokens, index): shortest first, equal lengths by index.
struct ShorterFirst {
  const std::vector<int64_t>& sample_tokens;
  bool operator()(int64_t a, int64_t b) const {
    return std::make_pair(sample_tokens[a], a) < std::make_pair(sample_tokens[b], b);
  }
};

// One rank's share of a step while the partition is being built.
struct Share {
  int64_t tokens = 0;
  int64_t first_sample = 0;      // smallest sample index in it (for deterministic order)
  std::vector<int64_t> samples;  // sample indices
};

// Heaviest first; among equal sums, the share with the smaller first sample.
bool Heavier(const Share& a, const Share& b) {
  if (a.tokens != b.tokens) return a.tokens > b.tokens;
  return a.first_sample < b.first_sample;
}

// dp shares of equal count covering some of a step's samples, sorted by Heavier.
struct PartialPartition {
  std::vector<Share> shares;
  int64_t id = 0;  // creation order: the tie-break between partitions of equal spread

  int64_t spread() const { return shares.front().tokens - shares.back().tokens; }
};

// Merges `b` into `a`: a's i-th heaviest share takes b's i-th lightest.
void Merge(PartialPartition& a, PartialPartition&& b) {
  const size_t k = a.shares.size();
  for (size_t i = 0; i < k; ++i) {
    Share& into = a.shares[i];
    Share& from = b.shares[k - 1 - i];
    into.tokens += from.tokens;
    into.first_sample = std::min(into.first_sample, from.first_sample);
    into.samples.insert(into.samples.end(), from.samples.begin(), from.samples.end());
  }
  std::sort(a.shares.begin(), a.shares.end(), Heavier);
}

// Largest token sum minus smallest.
int64_t Spread(const std::vector<std::vector<int64_t>>& shares,
               const std::vector<int64_t>& sample_tokens) {
  int64_t max_sum = 0;
  int64_t min_sum = 0;
  for (size_t r = 0; r < shares.size(); ++r) {
    int64_t sum = 0;
    for (int64_t i : shares[r]) sum += sample_tokens[i];
    max_sum = r == 0 ? sum : std::max(max_sum, sum);
    min_sum = r == 0 ? sum : std::min(min_sum, sum);
  }
  return max_sum - min_sum;
}

// The samples [begin, begin + count) dealt strided: sample i to rank i % dp.
std::vector<std::vector<int64_t>> StridedShares(int64_t begin, int64_t count, int dp_size) {
  std::vector<std::vector<int64_t>> shares(dp_size);
  for (int64_t i = begin; i < begin + count; ++i) shares[i % dp_size].push_back(i);
  return shares;
}

// The samples [begin, begin + count) in dp equal-count shares of close token sums: Karmarkar-Karp
// with the equal-size constraint (Note [Training plan]). `count` is a multiple of dp_size.
std::vector<std::vector<int64_t>> KarmarkarKarpShares(int64_t begin, int64_t count, int dp_size,
                                                      const std::vector<int64_t>& sample_tokens) {
  std::vector<int64_t> by_length(count);
  for (int64_t j = 0; j < count; ++j) by_length[j] = begin + j;
  std::sort(by_length.begin(), by_length.end(), ShorterFirst{sample_tokens});
  // A max-heap: largest spread on top; among equal spreads, the partition made first.
  const auto below = [](const PartialPartition& a, const PartialPartition& b) {
    if (a.spread() != b.spread()) return a.spread() < b.spread();
    return a.id > b.id;
  };
  const auto pop = [&](std::vector<PartialPartition>& heap) {
    std::pop_heap(heap.begin(), heap.end(), below);
    PartialPartition top = std::move(heap.back());
    heap.pop_back();
    return top;
  };
  std::vector<PartialPartition> heap;
  int64_t next_id = 0;
  for (int64_t chunk = 0; chunk < count; chunk += dp_size) {
    PartialPartition p;
    p.id = next_id++;
    for (int r = 0; r < dp_size; ++r) {
      const int64_t i = by_length[chunk + r];
      p.shares.push_back(Share{sample_tokens[i], i, {i}});
    }
    std::sort(p.shares.begin(), p.shares.end(), Heavier);
    heap.push_back(std::move(p));
    std::push_heap(heap.begin(), heap.end(), below);
  }
  while (heap.size() > 1) {
    PartialPartition a = pop(heap);
    Merge(a, pop(heap));
    a.id = next_id++;
    heap.push_back(std::move(a));
    std::push_heap(heap.begin(), heap.end(), below);
  }
  std::vector<Share> result = std::move(heap.front().shares);
  std::sort(result.begin(), result.end(),
            [](const Share& a, const Share& b) { return a.first_sample < b.first_sample; });
  std::vector<std::vector<int64_t>> shares;
  for (Share& share : result) {
    std::sort(share.samples.begin(), share.samples.end());
    shares.push_back(std::move(share.samples));
  }
  return shares;
}

// While the spread of `shares` falls, swaps one sample of the heaviest share (the first of equal
// ones) with one of the lightest: the pair whose difference x of tokens is closest to half the
// spread d (ties: the smallest indices), if 0 < x < d. At most `max_swaps` swaps.
void RefineBySwaps(std::vector<std::vector<int64_t>>& shares, int64_t max_swaps,
                   const std::vector<int64_t>& sample_tokens) {
  const auto sum_of = [&](const std::vector<int64_t>& share) {
    int64_t sum = 0;
    for (int64_t i : share) sum += sample_tokens[i];
    return sum;
  };
  for (int64_t swap = 0; swap < max_swaps; ++swap) {
    std::vector<int64_t> sums;
    for (const std::vector<int64_t>& share : shares) sums.push_back(sum_of(share));
    const size_t heavy = std::max_element(sums.begin(), sums.end()) - sums.begin();
    const size_t light = std::min_element(sums.begin(), sums.end()) - sums.begin();
    const int64_t spread = sums[heavy] - sums[light];
    if (spread == 0) return;
    std::vector<int64_t> light_by_length = shares[light];
    std::sort(light_by_length.begin(), light_by_length.end(), ShorterFirst{sample_tokens});
    // The first sample (smallest index) of the light share with `length` tokens or more.
    const auto first_from = [&](int64_t length) {
      return std::partition_point(light_by_length.begin(), light_by_length.end(),
                                  [&](int64_t b) { return sample_tokens[b] < length; });
    };
    // Swapping a for b moves x = tokens[a] - tokens[b]; the pair's new spread is |d - 2x|, below
    // d exactly when 0 < x < d. For each a, the best b has 2 tokens[b] nearest 2 tokens[a] - d.
    int64_t best_miss = 0;
    int64_t best_a = -1;
    int64_t best_b = -1;
    for (int64_t a : shares[heavy]) {
      const int64_t target = 2 * sample_tokens[a] - spread;
      const auto above =
          std::partition_point(light_by_length.begin(), light_by_length.end(),
                               [&](int64_t b) { return 2 * sample_tokens[b] < target; });
      std::vector<int64_t> candidates;
      if (above != light_by_length.end()) candidates.push_back(*above);
      if (above != light_by_length.begin()) {
        candidates.push_back(*first_from(sample_tokens[*(above - 1)]));
      }
      for (int64_t b : candidates) {
        const int64_t miss = std::abs(spread - 2 * (sample_tokens[a] - sample_tokens[b]));
        if (miss >= spread) continue;  // x is not in (0, d)
        if (best_a < 0 || std::tie(miss, a, b) < std::tie(best_miss, best_a, best_b)) {
          best_miss = miss;
          best_a = a;
          best_b = b;
        }
      }
    }
    if (best_a < 0) return;
    std::vector<std::vector<int64_t>> swapped = shares;
    std::replace(swapped[heavy].begin(), swapped[heavy].end(), best_a, best_b);
    std::replace(swapped[light].begin(), swapped[light].end(), best_b, best_a);
    if (Spread(swapped, sample_tokens) >= spread) return;  // another share holds the max or min
    std::sort(swapped[heavy].begin(), swapped[heavy].end());
    std::sort(swapped[light].begin(), swapped[light].end());
    shares = std::move(swapped);
  }
}

// Karmarkar-Karp, or the strided deal when its spread is strictly smaller, refined by swaps.
std::vector<std::vector<int64_t>> BalancedShares(int64_t begin, int64_t count, int dp_size,
                                                 const std::vector<int64_t>& sample_tokens) {
  std::vector<std::vector<int64_t>> shares =
      KarmarkarKarpShares(begin, count, dp_size, sample_tokens);
  std::vector<std::vector<int64_t>> strided = StridedShares(begin, count, dp_size);
  if (Spread(strided, sample_tokens) < Spread(shares, sample_tokens)) shares = std::move(strided);
  RefineBySwaps(shares, count, sample_tokens);
  return shares;
}

MicroBatches FixedMicroBatches(const std::vector<int64_t>& share, int64_t micro_batch_size) {
  MicroBatches micro_batches;
  for (size_t begin = 0; begin < share.size(); begin += micro_batch_size) {
    const size_t end = std::min(share.size(), begin + static_cast<size_t>(micro_batch_size));
    micro_batches.emplace_back(share.begin() + begin, share.begin() + end);
  }
  return micro_batches;
}

// Micro-batch samples are in ascending length order while dynamic micro-batches are built, so the
// last one is the longest.
int64_t PaddedTokens(const std::vector<int64_t>& by_length,
                     const std::vector<int64_t>& sample_tokens) {
  return static_cast<int64_t>(by_length.size()) * sample_tokens[by_length.back()];
}

// The share sorted by (tokens, index), packed greedily under `max_tokens` padded tokens.
MicroBatches PackByTokens(std::vector<int64_t> share, int64_t max_tokens,
                          const std::vector<int64_t>& sample_tokens) {
  std::sort(share.begin(), share.end(), ShorterFirst{sample_tokens});
  MicroBatches micro_batches;
  for (int64_t i : share) {
    // Adding i (the longest so far) makes (count + 1) x tokens[i] padded tokens; compared by
    // division so that it cannot overflow.
    const bool fits =
        !micro_batches.empty() &&
        sample_tokens[i] <= max_tokens / static_cast<int64_t>(micro_batches.back().size() + 1);
    if (fits) {
      micro_batches.back().push_back(i);
    } else {
      micro_batches.push_back({i});
    }
  }
  return micro_batches;
}

// Cuts the micro-batch of most padded tokens (of those with two samples or more) in halves until
// there are `count`; needs at least `count` samples in all.
void SplitToCount(MicroBatches& micro_batches, size_t count,
                  const std::vector<int64_t>& sample_tokens) {
  while (micro_batches.size() < count) {
    size_t widest = micro_batches.size();
    for (size_t j = 0; j < micro_batches.size(); ++j) {
      if (micro_batches[j].size() < 2) continue;
      if (widest == micro_batches.size() ||
          PaddedTokens(micro_batches[j], sample_tokens) >
              PaddedTokens(micro_batches[widest], sample_tokens)) {
        widest = j;
      }
    }
    RL_CHECK(widest < micro_batches.size(), Error,
             "training plan: cannot split {} micro-batches into {} (every one holds a single "
             "sample); ranks must have equal sample counts per step",
             micro_batches.size(), count);
    std::vector<int64_t>& whole = micro_batches[widest];
    const auto middle = whole.begin() + static_cast<std::ptrdiff_t>(whole.size() / 2);
    std::vector<int64_t> shorter(whole.begin(), middle);
    whole.erase(whole.begin(), middle);
    micro_batches.insert(micro_batches.begin() + static_cast<std::ptrdiff_t>(widest),
                         std::move(shorter));
  }
}

void CheckOptions(const std::vector<int64_t>& sample_tokens, const PlanOptions& options,
                  int dp_size) {
  const int64_t num_samples = static_cast<int64_t>(sample_tokens.size());
  const int64_t gbs = options.global_batch_size;
  RL_CHECK(dp_size >= 1, Error, "training plan: the data-parallel size must be at least 1; got {}",
           dp_size);
  RL_CHECK(gbs >= 1, ConfigError, "--global-batch-size must be at least 1; got {}", gbs);
  RL_CHECK(gbs % dp_size == 0, ConfigError,
           "--global-batch-size {} is not a multiple of the {} data-parallel ranks", gbs, dp_size);
  RL_CHECK(num_samples % gbs == 0, Error,
           "the rollout has {} samples, not a multiple of --global-batch-size {}", num_samples,
           gbs);
  if (options.dynamic_batch_size) {
    RL_CHECK(options.max_tokens_per_gpu >= 1, ConfigError,
             "--use-dynamic-batch-size needs --max-tokens-per-gpu >= 1; got {}",
             options.max_tokens_per_gpu);
  } else {
    RL_CHECK(options.micro_batch_size >= 1, ConfigError,
             "--micro-batch-size must be at least 1; got {}", options.micro_batch_size);
  }
  for (int64_t i = 0; i < num_samples; ++i) {
    RL_CHECK(sample_tokens[i] >= 1, Error, "training plan: sample {} has {} tokens (at least 1)", i,
             sample_tokens[i]);
  }
}

}  // namespace

std::vector<TrainingPlan> MakeTrainingPlans(const std::vector<int64_t>& sample_tokens,
                                            const PlanOptions& options, int dp_size) {
  CheckOptions(sample_tokens, options, dp_size);
  const int64_t num_samples = static_cast<int64_t>(sample_tokens.size());
  const int64_t gbs = options.global_batch_size;
  std::vector<TrainingPlan> plans(dp_size);
  for (int64_t begin = 0; begin < num_samples; begin += gbs) {
    const std::vector<std::vector<int64_t>> shares =
        options.balance_data ? BalancedShares(begin, gbs, dp_size, sample_tokens)
                             : StridedShares(begin, gbs, dp_size);
    std::vector<MicroBatches> per_rank;
    for (const std::vector<int64_t>& share : shares) {
      per_rank.push_back(options.dynamic_batch_size
                             ? PackByTokens(share, options.max_tokens_per_gpu, sample_tokens)
                             : FixedMicroBatches(share, options.micro_batch_size));
    }
    if (options.dynamic_batch_size) {
      size_t count = 0;
      for (const MicroBatches& m : per_rank) count = std::max(count, m.size());
      for (MicroBatches& m : per_rank) {
        SplitToCount(m, count, sample_tokens);
        for (std::vector<int64_t>& micro_batch : m) {
          std::sort(micro_batch.begin(), micro_batch.end());
        }
      }
    }
    for (int r = 0; r < dp_size; ++r) plans[r].steps.push_back(std::move(per_rank[r]));
  }
  return plans;
}

std::vector<int64_t> SampleTokens(const rl_algo::RolloutBatch& batch) {
  std::vector<int64_t> tokens;
  tokens.reserve(batch.samples.size());
  for (const rl_algo::Sample& s : batch.samples) {
    tokens.push_back(static_cast<int64_t>(s.tokens.size()));
  }
  return tokens;
}

int64_t PlanTokens(const TrainingPlan& plan, const std::vector<int64_t>& sample_tokens) {
  int64_t tokens = 0;
  for (const auto& step : plan.steps) {
    for (const std::vector<int64_t>& micro_batch : step) {
      for (int64_t i : micro_batch) tokens += sample_tokens.at(i);
    }
  }
  return tokens;
}

}  // namespace rl
