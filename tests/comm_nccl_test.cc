// The NCCL backend's AllToAll and Split on GPU ranks, one GPU per rank, with the exact data of
// tests/all_to_all_rows.h. Skips loudly when this host has fewer CUDA devices than ranks (NCCL
// refuses two ranks on one device). On one GPU (mpirun -np 1) it still runs the split and
// all-to-all paths: non-blocking ncclCommSplit, a group of send/receive to itself, empty rows,
// and the enqueue-only all-to-all captured in a CUDA graph, alone and inside a MoE block; the
// enqueue-only all-reduce and all-gather; the vocabulary-parallel log-probs by the fused kernels.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "launch/check.h"
#include "launch/communicator.h"
#include "launch/mpi_session.h"
#include "tests/all_to_all_rows.h"
#include "tests/mpi_test_env.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/model/layers.h"
#include "trainer/model/model_config.h"
#include "trainer/model/vocab_parallel.h"

namespace rl {
namespace {

using testing::ExchangeAndCheck;
using testing::NoRows;
using testing::RowsSent;

// Every rank decides alike on one host: skip unless each local rank has a device of its own.
bool HaveGpuPerRankOrWarn(const MpiSession& session) {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count >= session.local_size();
  cudaGetLastError();
  if (!ok) {
    WARN("SKIPPED: " << count << " CUDA devices for " << session.local_size()
                     << " local ranks; the NCCL communicator tests did not run");
    SUCCEED();
  }
  return ok;
}

c10::Device DeviceOf(const MpiSession& session) {
  return {c10::kCUDA, static_cast<c10::DeviceIndex>(session.local_rank())};
}

// The NCCL world of this session, or null (with the warning) when the host lacks GPUs.
std::unique_ptr<Communicator> GpuWorldOrSkip(const MpiSession& session) {
  if (!HaveGpuPerRankOrWarn(session)) return nullptr;
  return CreateCommunicator(session, DeviceOf(session), CommOptions{std::chrono::seconds(60)});
}

// Runs the enqueue-only `step` eagerly (NCCL connects outside a capture) and check(0), captures
// it in a CUDA graph on a side stream, changes its inputs by perturb(offset), replays it and
// check(offset): a replay computes the step on the replay's inputs.
template <typename Step, typename Check, typename Perturb>
void CheckGraphReplay(Communicator& world, c10::Device device, Step step, Check check,
                      Perturb perturb, double offset) {
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, device.index()));
    step();
    world.WaitEnqueued();
    check(0.0);
    graph.capture_begin();
    step();
    graph.capture_end();
  }
  perturb(offset);
  graph.replay();
  world.WaitEnqueued();
  check(offset);
  world.Barrier();
}

TEST_CASE("nccl all_to_all and split move exactly each source's rows") {
  const MpiSession& session = testing::Session();
  if (!HaveGpuPerRankOrWarn(session)) return;
  const c10::Device device = DeviceOf(session);
  const std::unique_ptr<Communicator> world =
      CreateCommunicator(session, device, CommOptions{std::chrono::seconds(60)});
  REQUIRE(world->backend() == "nccl");
  const int rank = world->rank();
  for (at::ScalarType type : {at::kFloat, at::kBFloat16, at::kLong}) {
    ExchangeAndCheck(*world, type, RowsSent, device);
    ExchangeAndCheck(*world, type, NoRows, device);
  }

  const std::unique_ptr<Communicator> ep = world->Split(rank / 2, rank, "ep");
  const int pair_size = std::min(2, world->size() - rank / 2 * 2);
  CHECK(ep->name() == "ep");
  CHECK(ep->size() == pair_size);
  CHECK(ep->rank() == rank % 2);
  at::Tensor t = at::full({4}, rank + 1, at::TensorOptions().dtype(at::kFloat).device(device));
  ep->AllReduce(t, ReduceOp::kSum);
  const int first = rank / 2 * 2;
  const double pair_sum = pair_size == 2 ? 2 * first + 3 : first + 1;
  CHECK(at::equal(t.cpu(), at::full({4}, pair_sum)));
  ExchangeAndCheck(*ep, at::kBFloat16, RowsSent, device);

  const std::unique_ptr<Communicator> reversed =
      world->Split(0, world->size() - 1 - rank, "reversed");
  CHECK(reversed->rank() == world->size() - 1 - rank);
  ExchangeAndCheck(*reversed, at::kFloat, RowsSent, device);

  // Argument errors name the group and leave it usable.
  std::string message;
  try {
    ep->AllToAll(at::zeros({1, 3}, t.options()), {1}, at::zeros({1, 3}, t.options()), {1, 0, 0});
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("nccl all_to_all over 'ep'") != std::string::npos);
  CHECK_THROWS_AS(world->Split(rank == 0 ? -1 : 0, 0, "bad"), Error);
  ep->Barrier();
  world->Barrier();
}

// Note [Enqueued all-to-all]: rank r's row i of block j is r * 1000 + j * 10 + i (+ the replay's
// offset), so block j received here must be rank j's rows for this rank.
TEST_CASE("nccl EnqueueAllToAll replays from a CUDA graph and WaitEnqueued waits for it") {
  const MpiSession& session = testing::Session();
  const std::unique_ptr<Communicator> world = GpuWorldOrSkip(session);
  if (world == nullptr) return;
  const c10::Device device = DeviceOf(session);
  const int rank = world->rank();
  const int size = world->size();
  constexpr int64_t kRows = 3;  // per block
  const at::TensorOptions floats = at::TensorOptions().dtype(at::kFloat).device(device);
  const auto rows_of = [&](int source, int block, double offset) {
    return (at::arange(kRows, floats) + source * 1000 + block * 10 + offset).unsqueeze(1).expand(
        {kRows, 4});
  };
  const at::Tensor send = at::empty({size * kRows, 4}, floats);
  for (int j = 0; j < size; ++j) send.narrow(0, j * kRows, kRows).copy_(rows_of(rank, j, 0));
  const at::Tensor recv = at::zeros_like(send);
  CheckGraphReplay(
      *world, device, [&] { world->EnqueueAllToAll(send, recv); },
      [&](double offset) {
        for (int j = 0; j < size; ++j) {
          INFO("block from rank " << j << ", offset " << offset);
          CHECK(at::equal(recv.narrow(0, j * kRows, kRows).cpu(), rows_of(j, rank, offset).cpu()));
        }
      },
      [&](double offset) {
        send.add_(offset);
        recv.zero_();
      },
      7);
}

// Note [Enqueued all-to-all], EnqueueOnlyScope: the all-reduce and all-gather of the
// tensor-parallel decode step, captured in a graph while only enqueued, replay to the sums and
// concatenations of the replay's inputs (rank r contributes r + 1 + offset).
TEST_CASE("nccl all_reduce and all_gather in enqueue-only mode replay from a CUDA graph") {
  const MpiSession& session = testing::Session();
  const std::unique_ptr<Communicator> world = GpuWorldOrSkip(session);
  if (world == nullptr) return;
  const c10::Device device = DeviceOf(session);
  const int size = world->size();
  const at::TensorOptions floats = at::TensorOptions().dtype(at::kFloat).device(device);
  const at::Tensor input = at::full({5}, world->rank() + 1.0, floats);
  const at::Tensor summed = at::empty({5}, floats);
  const at::Tensor gathered = at::empty({size * 5}, floats);
  CheckGraphReplay(
      *world, device,
      [&] {
        const EnqueueOnlyScope enqueue(world.get());
        summed.copy_(input);
        world->AllReduce(summed, ReduceOp::kSum);
        world->AllGather(input, gathered);
      },
      [&](double offset) {
        const double total = size * (size + 1) / 2.0 + size * offset;
        CHECK(at::equal(summed.cpu(), at::full({5}, total, at::kFloat)));
        for (int r = 0; r < size; ++r) {
          INFO("block of rank " << r << ", offset " << offset);
          CHECK(at::equal(gathered.narrow(0, r * 5, 5).cpu(), at::full({5}, r + 1.0 + offset)));
        }
      },
      [&](double offset) {
        input.add_(offset);
        summed.zero_();
        gathered.zero_();
      },
      3);
}

// Note [Fixed-capacity dispatch] on a GPU: a bf16 MoE block whose experts are spread over the
// world (one rank at -np 1: the exchange is a send to itself) is captured in a CUDA graph; its
// replay computes the eager step's bits, and the exact exchange's results to bf16 rounding.
TEST_CASE("A MoE block with a fixed-capacity dispatch replays from a CUDA graph bit for bit") {
  const MpiSession& session = testing::Session();
  const std::unique_ptr<Communicator> world = GpuWorldOrSkip(session);
  if (world == nullptr) return;
  const c10::Device device = DeviceOf(session);
  model::ModelConfig c;
  c.model_type = model::ModelType::kQwen3Moe;
  c.hidden_size = 64;
  c.router = model::RouterKind::kSoftmax;
  c.n_routed_experts = 8 * world->size();
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = true;
  const int64_t local = 8;
  const at::TensorOptions bf16 = at::TensorOptions().dtype(at::kBFloat16).device(device);
  at::manual_seed(11);  // the same whole model on every rank
  model::MoeWeights w;
  w.router = at::randn({c.n_routed_experts, 64}, bf16) * 0.3;
  w.gate_up = (at::randn({c.n_routed_experts, 64, 64}, bf16) * 0.2)
                  .narrow(0, world->rank() * local, local)
                  .contiguous();
  w.down = (at::randn({c.n_routed_experts, 64, 32}, bf16) * 0.2)
               .narrow(0, world->rank() * local, local)
               .contiguous();
  w.expert_group = world.get();
  REQUIRE(model::MoeBlockSyncFree(w));
  at::manual_seed(100 + world->rank());
  const at::Tensor x = at::randn({16, 64}, bf16);
  at::NoGradGuard no_grad;
  const model::ExpertDispatch dispatch{model::DispatchCapacity(c, 16, world->size(), 0),
                                       at::zeros({1}, bf16.dtype(at::kInt))};
  const at::Tensor eager = model::MoeBlock(w, c, x, nullptr, {}, &dispatch);
  world->WaitEnqueued();
  at::cuda::CUDAGraph graph;
  at::Tensor captured;
  {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, device.index()));
    model::MoeBlock(w, c, x, nullptr, {}, &dispatch);  // warm-up on the capture stream
    world->WaitEnqueued();
    graph.capture_begin();
    captured = model::MoeBlock(w, c, x, nullptr, {}, &dispatch);
    graph.capture_end();
  }
  graph.replay();
  world->WaitEnqueued();
  CHECK(at::equal(captured, eager));
  CHECK(dispatch.overflow.item<int>() == 0);
  const at::Tensor exact = model::MoeBlock(w, c, x);  // the exact exchange (or none at -np 1)
  const double difference = (exact.to(at::kFloat) - eager.to(at::kFloat)).abs().max().item<double>();
  INFO("max |fixed - exact| " << difference);
  CHECK(difference <= 1e-2);
  world->Barrier();
}

// Note [Vocabulary-parallel log-probs] on CUDA: each shard's statistics and the logits' gradient
// come from our fused kernels (on one GPU the shard is the whole vocabulary). Values and
// gradients equal log_softmax over the whole vocabulary in fp32, for fp32 and bf16 logits; the
// backward kernel adds no one-hot term for a target another rank holds (-1).
TEST_CASE("vocabulary-parallel log-probs by the fused kernels equal log_softmax") {
  const MpiSession& session = testing::Session();
  const std::unique_ptr<Communicator> world = GpuWorldOrSkip(session);
  if (world == nullptr) return;
  const c10::Device device = DeviceOf(session);
  if (world->size() != 1) return;  // the shards of several GPUs: not lent
  at::manual_seed(5);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    const at::Tensor base = (at::randn({6, 1000}) * 3).to(dtype).to(device);
    const at::Tensor targets = at::randint(0, 1000, {6}, at::TensorOptions().dtype(at::kLong))
                                   .to(device);
    const at::Tensor weights = at::randn({6}).to(device);
    at::Tensor ours = base.clone().requires_grad_();
    const model::VocabParallelStats got = model::VocabParallelLogProbs(ours, targets, 0, *world);
    (got.log_probs * weights + got.entropy).sum().backward();
    at::Tensor ref = base.clone().requires_grad_();
    const at::Tensor log_p = at::log_softmax(ref.to(at::kFloat), 1);
    const at::Tensor want_lp = log_p.gather(1, targets.unsqueeze(1)).squeeze(1);
    const at::Tensor want_h = -(log_p.exp() * log_p).sum(1);
    (want_lp * weights + want_h).sum().backward();
    CHECK((got.log_probs - want_lp).abs().max().item<double>() <= 1e-5);
    CHECK((got.entropy - want_h).abs().max().item<double>() <= 1e-5);
    const double grad_tolerance = dtype == at::kFloat ? 1e-6 : 1e-2;  // bf16 gradients
    CHECK((ours.grad().to(at::kFloat) - ref.grad().to(at::kFloat)).abs().max().item<double>() <=
          grad_tolerance);
    // A target held by another rank: -p only, no one-hot term.
    const at::Tensor lse = at::logsumexp(base.to(at::kFloat), 1);
    const at::Tensor ones = at::ones({6}, weights.options());
    const at::Tensor grad = kernels::TokenLogProbsRowsGrad(
        base.contiguous(), at::full({6}, -1, targets.options()), lse, at::Tensor(), ones,
        at::Tensor());
    CHECK((grad.to(at::kFloat) + (base.to(at::kFloat) - lse.unsqueeze(1)).exp())
              .abs()
              .max()
              .item<double>() <= (dtype == at::kFloat ? 1e-6 : 1e-2));
  }
}

}  // namespace
}  // namespace rl
