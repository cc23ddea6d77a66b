// CUDA graphs of the rollout engine's decode step.
//
// Note [Decode graphs]
// An eager decode step issues some 30 LibTorch ops per layer from the host; at batch 64 on an H200
// the host, not the GPU, sets the pace (about 15 ms per step for a 28-layer model whose weights
// take 0.3 ms to read). A CUDA graph replays the whole step with one launch. A graph fixes every
// shape and address it was captured with, so:
//  - the step must take its position from the device (Decoder::DecodeStep, Note [Decode at a
//    device position] in layers.h) and read and write only memory whose address is fixed while
//    the graphs live: the weights and the KV cache (the engine's storages, which pause and resume
//    at the same addresses), the engine's position tensor and RoPE table, and its token buffer,
//    given here (the engine writes each step's tokens there before Run);
//  - one graph per (batch bucket, key length): the live rows are padded to the next bucket (1, 2,
//    4, 8, then multiples of 8 up to max_batch); the padding rows compute on whatever tokens the
//    buffer holds, at position 0 (the engine stages that for them), in cache rows nobody reads. The
//    engine rounds key lengths up to blocks, so a handful of graphs serves a whole generation. Each
//    is captured the first time it is needed and kept for the life of the engine. That first time,
//    the step runs eagerly on the capture stream (a warm-up, so that lazy initialisation such as
//    cuBLAS workspaces happens outside the capture), the capture records it without running it, and
//    Run returns the warm-up's logits: the step runs exactly once per Run, so a step with
//    collectives (an expert-parallel decode step, Note [Fixed-capacity dispatch] in
//    trainer/model/layers.h) makes the same collectives on every rank of its group, whether a rank
//    captures or replays.
//  - all graphs share one memory pool. That is safe because every Run's logits are consumed
//    before the next Run replays anything (the engine samples from them on the stream before it
//    launches the next step): a graph may reuse memory another graph used for temporaries or for
//    its output.
// Replaying a graph computes exactly what the eager step computes for the same (batch, key
// length) (tools/bench/decode_bench --compare-eager checks that on the GPU).
//
// Failures: a step that synchronises with the host cannot be captured; Run throws rl::Error
// naming the shape and the CUDA error (the engine only captures steps that
// Decoder::decode_step_capturable() admits).
// Thread safety: none; the engine's thread drives it.
#ifndef RL_TRAINER_ROLLOUT_DECODE_GRAPHS_H_
#define RL_TRAINER_ROLLOUT_DECODE_GRAPHS_H_

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

namespace rl::rollout {

class DecodeGraphs {
 public:
  // step(tokens [batch, 1] int64 on the device, key_length) -> logits [batch, vocab].
  using Step = std::function<at::Tensor(const at::Tensor& tokens, int64_t key_length)>;

  // `tokens` [max_batch, 1] int64 on a CUDA device: every graph reads its step's tokens from its
  // first rows. `wait`, when given, is called after the warm-up step, before the device is
  // synchronised: a step that enqueues collectives waits for them there under their timeout (Note
  // [Enqueued all-to-all] in launch/communicator.h).
  DecodeGraphs(Step step, at::Tensor tokens, std::function<void()> wait = nullptr);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // The step for the tokens in rows [0, live) of the token buffer (1 <= live <= max_batch), by
  // replaying the graph of (BatchBucket(live), key_length), captured first when new. Returns
  // logits [live, vocab], valid until the next Run.
  at::Tensor Run(int64_t live, int64_t key_length);

  // 1, 2, 4, 8, then the next multiple of 8; never above max_batch.
  static int64_t BatchBucket(int64_t live, int64_t max_batch);

  int64_t num_graphs() const { return static_cast<int64_t>(graphs_.size()); }

 private:
  struct Graph;
  // Runs the step once for real (the warm-up), captures it, and returns the warm-up's logits.
  at::Tensor Capture(int64_t batch, int64_t key_length);

  Step step_;
  std::function<void()> wait_;
  at::Tensor tokens_;  // [max_batch, 1] int64: the captured steps read their tokens here
  int64_t max_batch_;
  at::Device device_;
  c10::MempoolId_t pool_;  // the graph memory pool they share
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> graphs_;
};

}  // namespace rl::rollout

#endif  // RL_TRAINER_ROLLOUT_DECODE_GRAPHS_H_
