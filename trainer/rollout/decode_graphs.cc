#include "trainer/rollout/decode_graphs.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "launch/check.h"

namespace rl::rollout {

struct DecodeGraphs::Graph {
  at::cuda::CUDAGraph graph;
  at::Tensor logits;  // [batch, vocab], written by every replay
};

DecodeGraphs::DecodeGraphs(Step step, at::Tensor tokens, std::function<void()> wait)
    : step_(std::move(step)),
      wait_(std::move(wait)),
      tokens_(std::move(tokens)),
      max_batch_(tokens_.dim() == 2 ? tokens_.size(0) : 0),
      device_(tokens_.device()),
      pool_(at::cuda::graph_pool_handle()) {
  RL_CHECK(device_.is_cuda(), Error, "decode graphs need a CUDA device; got {}", device_.str());
  RL_CHECK(tokens_.dim() == 2 && tokens_.size(1) == 1 && max_batch_ >= 1 &&
               tokens_.scalar_type() == at::kLong,
           Error, "decode graphs: the token buffer must be [max_batch >= 1, 1] int64; got {} [{}]",
           c10::toString(tokens_.scalar_type()), fmt::join(tokens_.sizes(), ", "));
}

DecodeGraphs::~DecodeGraphs() = default;

int64_t DecodeGraphs::BatchBucket(int64_t live, int64_t max_batch) {
  int64_t bucket = 1;
  while (bucket < live && bucket < 8) bucket *= 2;
  if (bucket < live) bucket = (live + 7) / 8 * 8;
  return std::min(bucket, max_batch);
}

at::Tensor DecodeGraphs::Run(int64_t live, int64_t key_length) {
  RL_CHECK(live >= 1 && live <= max_batch_, Error,
           "decode graphs: a step of {} rows; 1 to {} can run", live, max_batch_);
  const int64_t batch = BatchBucket(live, max_batch_);
  auto it = graphs_.find({batch, key_length});
  if (it == graphs_.end()) return Capture(batch, key_length).narrow(0, 0, live);
  it->second->graph.replay();
  return it->second->logits.narrow(0, 0, live);
}

at::Tensor DecodeGraphs::Capture(int64_t batch, int64_t key_length) {
  auto graph = std::make_unique<Graph>();
  const at::Tensor tokens = tokens_.narrow(0, 0, batch);
  // The warm-up and the capture run on a side stream (capture cannot use the default stream);
  // device syncs order them after the work queued so far and the caller's work after them.
  c10::cuda::device_synchronize();
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device_.index());
  at::Tensor warm_up_logits;
  {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, device_.index()));
    warm_up_logits = step_(tokens, key_length);  // what the capture records, done once for real
    if (wait_) wait_();
    graph->graph.capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
    try {
      graph->logits = step_(tokens, key_length);
      graph->graph.capture_end();
    } catch (const std::exception& e) {
      std::string reason = e.what();
      try {
        graph->graph.capture_end();  // leave the stream out of capture mode
      } catch (const std::exception&) {
      }
      throw Error(fmt::format(
          "rollout engine: capturing the decode step (batch {}, {} keys) in a CUDA graph failed: "
          "{}; --no-rollout-cuda-graphs runs it eagerly",
          batch, key_length, reason));
    }
  }
  c10::cuda::device_synchronize();
  // Allocated on the side stream, read on the caller's (the sampler, queued after this returns):
  // not reused for the side stream's allocations before the caller's stream is past them.
  warm_up_logits.record_stream(caller);
  graphs_.emplace(std::make_pair(batch, key_length), std::move(graph));
  return warm_up_logits;
}

}  // namespace rl::rollout
