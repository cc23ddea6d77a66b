// The vocabulary-parallel token log-prob and entropy (Note [Vocabulary-parallel log-probs],
// trainer/model/vocab_parallel.h) on CPU ranks against log_softmax over the whole vocabulary, on
// logits every rank draws alike and splits by vocabulary ids: values and the gradient of a loss
// that weighs both outputs, for the rank's own logits. Shards of unequal widths, one rank with no
// vocabulary in the second split. Runs at 2 ranks (vocab_parallel_test) and 4 (_np4).
//
// The embedding and LM head (the rest of the vocabulary-parallel pair) are checked through the
// same log-probs.
//
// Tolerances: the sums over the vocabulary are split by rank (a different order), so fp64 within
// 1e-12 and fp32 within 1e-5 of the largest magnitude.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <vector>

#include "launch/mpi_communicator.h"
#include "tests/mpi_test_env.h"
#include "trainer/model/vocab_parallel.h"

namespace rl::model {
namespace {

constexpr int64_t kVocab = 37;
constexpr int64_t kPositions = 11;
const CommOptions kOptions{std::chrono::seconds(60)};

struct Shard {
  int64_t start = 0;
  int64_t width = 0;
};

// Widths of `ranks` shards over kVocab: even split with the remainder on the last rank, or (when
// `first_empty`) nothing on rank 0 and the rest split evenly over the others.
Shard ShardOf(int rank, int ranks, bool first_empty) {
  const int holders = first_empty ? ranks - 1 : ranks;
  const int index = first_empty ? rank - 1 : rank;
  if (index < 0) return {0, 0};
  const int64_t width = kVocab / holders;
  const int64_t start = index * width;
  return {start, index == holders - 1 ? kVocab - start : width};
}

struct Result {
  at::Tensor log_probs, entropy, grad;  // grad: of this rank's logits
};

// The reference over the whole vocabulary, the gradient narrowed to `shard`.
Result Full(const at::Tensor& logits0, const at::Tensor& targets, const at::Tensor& g_lp,
            const at::Tensor& g_h, Shard shard) {
  const at::Tensor logits = logits0.clone().requires_grad_();
  const at::Tensor log_p = at::log_softmax(logits, -1);
  const at::Tensor lp = log_p.gather(1, targets.unsqueeze(1)).squeeze(1);
  const at::Tensor h = -(log_p.exp() * log_p).sum(-1);
  ((lp * g_lp).sum() + (h * g_h).sum()).backward();
  return {lp.detach(), h.detach(), logits.grad().narrow(1, shard.start, shard.width)};
}

Result Parallel(const at::Tensor& logits0, const at::Tensor& targets, const at::Tensor& g_lp,
                const at::Tensor& g_h, Shard shard, Communicator& group) {
  const at::Tensor logits =
      logits0.narrow(1, shard.start, shard.width).clone().requires_grad_();
  const VocabParallelStats stats = VocabParallelLogProbs(logits, targets, shard.start, group);
  ((stats.log_probs * g_lp).sum() + (stats.entropy * g_h).sum()).backward();
  return {stats.log_probs.detach(), stats.entropy.detach(), logits.grad()};
}

double Scaled(const at::Tensor& got, const at::Tensor& want) {
  if (want.numel() == 0) return 0;
  return (got - want).abs().max().item<double>() /
         std::max(1.0, want.abs().max().item<double>());
}

TEST_CASE("Vocabulary-parallel log-probs, entropy and gradients equal the full log_softmax") {
  MpiCommunicator world(testing::Session(), kOptions);
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const double tolerance = dtype == at::kDouble ? 1e-12 : 1e-5;
    for (const bool first_empty : {false, true}) {
      INFO(c10::toString(dtype) << ", rank " << world.rank() << " of " << world.size()
                                << (first_empty ? ", rank 0 without vocabulary" : ""));
      at::Generator gen = at::detail::createCPUGenerator(7);
      const at::Tensor logits = at::empty({kPositions, kVocab}, dtype).normal_(0, 3, gen);
      // Targets in every shard, the first and last ids included.
      const at::Tensor targets =
          at::cat({at::tensor({int64_t{0}, kVocab - 1}, at::kLong),
                   at::randint(kVocab, {kPositions - 2}, gen, at::kLong)});
      const at::Tensor g_lp = at::empty({kPositions}, dtype).normal_(0, 1, gen);
      const at::Tensor g_h = at::empty({kPositions}, dtype).normal_(0, 1, gen);
      const Shard shard = ShardOf(world.rank(), world.size(), first_empty);
      const Result want = Full(logits, targets, g_lp, g_h, shard);
      const Result got = Parallel(logits, targets, g_lp, g_h, shard, world);
      CHECK(got.log_probs.scalar_type() == dtype);
      CHECK(Scaled(got.log_probs, want.log_probs) <= tolerance);
      CHECK(Scaled(got.entropy, want.entropy) <= tolerance);
      REQUIRE(got.grad.sizes() == want.grad.sizes());
      CHECK(Scaled(got.grad, want.grad) <= tolerance);
    }
  }
}

// The embedding, a per-token function, the LM head and the log-probs, whole against
// vocabulary-parallel: the gradients of this rank's rows of the embedding and of the head (one
// table when tied), with and without sequence parallelism, fp64.
TEST_CASE("Vocabulary-parallel embedding and LM head give the whole model's log-probs and "
          "gradients, tied or not") {
  MpiCommunicator world(testing::Session(), kOptions);
  constexpr int64_t kHidden = 6;
  constexpr int64_t kTokens = 12;  // a multiple of 2 and 4 ranks
  for (const bool tied : {false, true}) {
    for (const bool sequence_parallel : {false, true}) {
      for (const bool first_empty : {false, true}) {
        INFO("rank " << world.rank() << " of " << world.size() << (tied ? ", tied" : "")
                     << (sequence_parallel ? ", sequence parallel" : "")
                     << (first_empty ? ", rank 0 without vocabulary" : ""));
        at::Generator gen = at::detail::createCPUGenerator(9);
        const at::Tensor embed = at::empty({kVocab, kHidden}, at::kDouble).normal_(0, 1, gen);
        const at::Tensor head = at::empty({kVocab, kHidden}, at::kDouble).normal_(0, 1, gen);
        const at::Tensor tokens = at::randint(kVocab, {kTokens}, gen, at::kLong);
        const at::Tensor targets = at::randint(kVocab, {kTokens}, gen, at::kLong);
        const at::Tensor g_lp = at::empty({kTokens}, at::kDouble).normal_(0, 1, gen);
        const at::Tensor g_h = at::empty({kTokens}, at::kDouble).normal_(0, 1, gen);
        const Shard shard = ShardOf(world.rank(), world.size(), first_empty);

        const at::Tensor e_full = embed.clone().requires_grad_();
        const at::Tensor h_full = tied ? e_full : head.clone().requires_grad_();
        const at::Tensor log_p = at::log_softmax(
            at::matmul(at::tanh(at::embedding(e_full, tokens)), h_full.t()), -1);
        const at::Tensor lp = log_p.gather(1, targets.unsqueeze(1)).squeeze(1);
        const at::Tensor entropy = -(log_p.exp() * log_p).sum(-1);
        ((lp * g_lp).sum() + (entropy * g_h).sum()).backward();

        const at::Tensor e = embed.narrow(0, shard.start, shard.width).clone().requires_grad_();
        const at::Tensor h =
            tied ? e : head.narrow(0, shard.start, shard.width).clone().requires_grad_();
        const at::Tensor hidden =
            at::tanh(VocabParallelEmbedding(e, tokens, shard.start, world, sequence_parallel));
        const at::Tensor logits = VocabParallelLmHead(hidden, h, world, sequence_parallel);
        REQUIRE(logits.sizes() == at::IntArrayRef({kTokens, shard.width}));
        const VocabParallelStats stats =
            VocabParallelLogProbs(logits, targets, shard.start, world);
        ((stats.log_probs * g_lp).sum() + (stats.entropy * g_h).sum()).backward();
        CHECK(Scaled(stats.log_probs.detach(), lp.detach()) <= 1e-12);
        CHECK(Scaled(stats.entropy.detach(), entropy.detach()) <= 1e-12);
        if (shard.width > 0) {
          CHECK(Scaled(e.grad(), e_full.grad().narrow(0, shard.start, shard.width)) <= 1e-12);
          if (!tied) {
            CHECK(Scaled(h.grad(), h_full.grad().narrow(0, shard.start, shard.width)) <= 1e-12);
          }
        }
      }
    }
  }
}

TEST_CASE("Vocabulary-parallel log-probs refuse targets of another shape, on every rank alike") {
  MpiCommunicator world(testing::Session(), kOptions);
  const at::Tensor logits = at::zeros({3, 4});
  CHECK_THROWS_WITH(VocabParallelLogProbs(logits, at::zeros({2}, at::kLong), 0, world),
                    Catch::Contains("vocabulary-parallel log-probs over 'world'"));
  world.Barrier();
}

}  // namespace
}  // namespace rl::model
