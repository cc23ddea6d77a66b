// The tensor-parallel mappings (Note [Tensor-parallel mappings], trainer/model/tensor_parallel.h)
// on CPU ranks, through the dense SwiGLU MLP with gate/up column-parallel and down row-parallel,
// against the whole MLP on one rank: the output, the input gradient and each rank's slice of the
// weight gradients, with and without sequence parallelism, fp64 and fp32. Every rank draws the
// whole weights, input and output gradient from one seed. Runs at 2 ranks (tensor_parallel_test)
// and 4 (_np4).
//
// Tolerances: the row-parallel layer sums its inner dimension by rank (another order), so fp64
// within 1e-12 and fp32 within 1e-5 of the largest magnitude.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>

#include "launch/mpi_communicator.h"
#include "tests/mpi_test_env.h"
#include "trainer/model/layers.h"
#include "trainer/model/tensor_parallel.h"

namespace rl::model {
namespace {

constexpr int64_t kHidden = 24;
constexpr int64_t kInter = 32;  // 16 per rank at 2 ranks, 8 at 4
constexpr int64_t kTokens = 12;  // 6 per rank at 2 ranks, 3 at 4
const CommOptions kOptions{std::chrono::seconds(60)};

struct Tensors {
  at::Tensor out, x, gate, up, down;  // the output, then the gradients
};

double Scaled(const at::Tensor& got, const at::Tensor& want) {
  REQUIRE(got.sizes() == want.sizes());
  return (got - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
}

TEST_CASE("The tensor-parallel MLP equals the whole MLP, with and without sequence parallelism") {
  MpiCommunicator world(testing::Session(), kOptions);
  const int64_t rank = world.rank();
  const int64_t inter = kInter / world.size();
  const int64_t tokens = kTokens / world.size();
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const double tolerance = dtype == at::kDouble ? 1e-12 : 1e-5;
    at::Generator gen = at::detail::createCPUGenerator(3);
    const auto normal = [&](std::vector<int64_t> shape, double std) {
      return at::empty(shape, dtype).normal_(0, std, gen);
    };
    const at::Tensor gate = normal({kInter, kHidden}, 0.2);
    const at::Tensor up = normal({kInter, kHidden}, 0.2);
    const at::Tensor down = normal({kHidden, kInter}, 0.2);
    const at::Tensor x0 = normal({kTokens, kHidden}, 1.0);
    const at::Tensor out_grad = normal({kTokens, kHidden}, 1.0);

    // The whole MLP on one rank.
    Tensors whole;
    {
      MlpWeights w{gate.clone().requires_grad_(), up.clone().requires_grad_(),
                   down.clone().requires_grad_(), {}};
      const at::Tensor x = x0.clone().requires_grad_();
      whole.out = DenseMlp(w, x);
      whole.out.backward(out_grad);
      whole.out = whole.out.detach();
      whole = {whole.out, x.grad(), w.gate_proj.grad(), w.up_proj.grad(), w.down_proj.grad()};
    }
    for (const bool sequence_parallel : {false, true}) {
      INFO(c10::toString(dtype) << ", rank " << rank << " of " << world.size()
                                << (sequence_parallel ? ", sequence parallel" : ""));
      const at::Tensor g = gate.narrow(0, rank * inter, inter).clone().requires_grad_();
      const at::Tensor u = up.narrow(0, rank * inter, inter).clone().requires_grad_();
      const at::Tensor d = down.narrow(1, rank * inter, inter).clone().requires_grad_();
      const at::Tensor x =
          (sequence_parallel ? x0.narrow(0, rank * tokens, tokens) : x0).clone().requires_grad_();
      const at::Tensor out = TensorParallelMlp(g, u, d, x, world, sequence_parallel);
      out.backward(sequence_parallel ? out_grad.narrow(0, rank * tokens, tokens) : out_grad);
      const auto mine = [&](const at::Tensor& t) {
        return sequence_parallel ? t.narrow(0, rank * tokens, tokens) : t;
      };
      CHECK(Scaled(out.detach(), mine(whole.out)) <= tolerance);
      CHECK(Scaled(x.grad(), mine(whole.x)) <= tolerance);
      CHECK(Scaled(g.grad(), whole.gate.narrow(0, rank * inter, inter)) <= tolerance);
      CHECK(Scaled(u.grad(), whole.up.narrow(0, rank * inter, inter)) <= tolerance);
      CHECK(Scaled(d.grad(), whole.down.narrow(1, rank * inter, inter)) <= tolerance);
    }
  }
}

TEST_CASE("Sequence parallelism refuses token rows that do not split over the group") {
  MpiCommunicator world(testing::Session(), kOptions);
  const at::Tensor x = at::zeros({2 * world.size() + 1, 4});
  CHECK_THROWS_WITH(ScatterToSequenceParallel(x, world),
                    Catch::Contains("do not split over"));
  world.Barrier();
}

}  // namespace
}  // namespace rl::model
