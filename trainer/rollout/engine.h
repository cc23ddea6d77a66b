// The rollout engine: generates responses with per-token log-probs from a Decoder whose weights
// live in the engine's own storage, in the engine layout that weight sync writes into.
//
// Ownership: the engine owns two storages, each obtained once, at construction, from the
// caller's allocator: "rollout_weights" (weight_sync::EngineLayout::total_bytes) and "kv_cache"
// (KvCache::NumElements(config, max_batch, max_length) elements of the param dtype). The trainer
// backs them with pausable memory regions (docs/colocated-cycle.md); the views the
// Decoder and the caches use stay valid across pause/resume. The Decoder runs directly on the HF
// views of the weight storage (weight_sync::HfViews), so a write through weight_storage() (weight
// sync) or LoadWeights() is seen by the next Generate without telling the engine.
//
// Sleep/WakeUp call the caller's hooks (SetMemoryHooks) and track the state. The engine does not
// decide which regions a hook pauses: docs/colocated-cycle.md steps 9-10 resume the weights, sync
// them, then resume the KV cache, so the trainer's resume hook may bring back only what is still
// paused. After WakeUp the KV cache contents are garbage, which is fine (every Generate prefills);
// the weights are whatever the caller restored or synced.
//
// Note [Rollout batching]
// Continuous batching over the cache rows: rows decode together whatever their prompt lengths,
// each at its own position (Note [Ragged decode] in trainer/model/layers.h), and a row that ends
// gives its place to the next prompt. Generate keeps rows [0, live) of the KV cache live, in
// order; each decode step feeds every live row its last sampled token (one step, one graph
// replay, whatever the rows' lengths) and samples its next. Prompts are admitted in order:
//  - when no row is live, or at least max_batch / kAdmitFraction rows are free (or all the
//    prompts left fit), as many as fit. A prefill is a forward over the whole prompt, so
//    admitting in bunches keeps them few while the batch stays at least 3/4 full;
//  - the admitted prompts are prefilled into the free rows after the live ones, longest first,
//    those within a factor of 2 of the longest in one forward, right-padded to it
//    (Decoder::PrefillLogits with the row lengths: the logits of each row's last prompt position
//    only, into KvCache::Rows of those rows). Padding comes after a row's tokens, so causal
//    attention keeps it from them; its cache entries lie past the row's position, masked until
//    the row's decode steps overwrite them. The first tokens are sampled from those logits.
// When rows finish (stop token or length limit), the live rows are brought to the front: each
// finished row below the new live count is taken by a live row past it, whose cache entries
// (positions so far) move, in one index_select + index_copy_ per cache tensor; the other rows
// stay where they are. So a step in which f rows finish copies at most f rows, not every live
// row. A row's tokens do not depend on its batch-mates (Note [Rollout seeds]), so neither does
// what a prompt generates depend on the order or the moment it was admitted.
//
// Note [Rollout decode steps]
// The decode steps run at device-side positions (Decoder::DecodeStep, one per row) over the first
// KeyLength(position) cache positions of the longest live row: position + 1 rounded up to a block
// of kKeyBlock, so that the step's shapes change only once per block. On a CUDA device, for a
// model whose decode step never waits on the host (Decoder::decode_step_capturable: dense, or MoE
// in bf16 on Hopper, also under expert parallelism with its fixed-capacity dispatch), the steps
// replay CUDA graphs (Note [Decode graphs] in decode_graphs.h) unless set_cuda_graphs(false);
// elsewhere they run eagerly, computing the same. Masked cache positions must be finite, so
// Generate first zeroes every cache row a step may compute on (after WakeUp, or under
// --ci-test's poisoned pages, they hold anything); later they hold only what the model wrote.
//
// Note [Overlapped decode steps]
// A decode step samples its rows' next tokens on the device; the host reads them only to append
// them to the Generations and to see which rows ended. So the host launches step t + 1 before it
// reads step t: step t + 1 feeds every row of step t the token step t sampled for it, straight
// from the device, at the next position, and samples with the uniforms the host draws meanwhile.
// Reading step t then waits for step t alone (an event after its tokens reached pinned memory)
// while step t + 1 runs, so the device does not wait between steps for the host's read, its
// bookkeeping and its next launches. Every transfer of a step is asynchronous (Note [Sampled
// tokens handed on]): its uniforms (and, when the host feeds it, its positions and tokens) go to
// the device from pinned staging, its tokens and log-probs come back into it; two staging slots
// alternate, and a slot is written again only after the step that used it was read.
// At launch the host cannot know whether a row ends at step t by a stop token, so step t + 1
// computes every row of step t, also those at their length limit (unless every row is: then there
// is no step t + 1). When some row did end, the host reads step t + 1 too before going on: the
// ended rows' extra token is dropped (with the uniform their generator drew for it, which no other
// row draws from), the rows that ended at either step are retired and prompts admitted, and the
// next step is launched from the host's tokens. A row that goes on feeds the same tokens at the
// same positions with the same uniforms as without overlap; only its batch-mates in the step after
// a row's end differ (the ended row is one of them). So its tokens are those of Note [Rollout
// seeds], and its log-probs differ by rounding at most (not at all on the CPU, whose kernels are
// batch-invariant). GenerateStats::overrun_row_steps counts the dropped tokens.
// Under tensor or expert parallelism the steps do not overlap yet. Before the host reads what a
// step computed, the group waits for its collectives under its timeout (Note [Enqueued
// all-to-all] in launch/communicator.h), and an expert group agrees on the kind of each forward;
// both wait for the whole stream, so launching step t + 1 returns only once it has run. Waiting
// for step t's event under the timeout instead would let them overlap.
// set_overlapped_steps(false) reads every step before it launches the next.
//
// Note [Sampled tokens handed on]
// What the host and the next decode step take of a step's sampling is written by the sampling
// kernel itself (kernels::SampleRows with kernels::HandOn targets; where the LibTorch ops
// sample, by kernels::HandOnSampled after them): the tokens and log-probs into the slot's host
// memory, which is mapped into the device's address space, the tokens into the next step's input
// (step_[0], the buffer the decode graphs read), and the rows' positions (step_[1]) moved on by
// one, as the host moves rows.position. The sampling reads a sampled step's uniforms from the
// slot's mapped memory as well. So a step fed from the device (the one after it, under overlap)
// needs no transfer at all: at one row on an H100, the four copies this replaced (two back to the
// host, the staging to the device, the tokens into the graphs' buffer) and the gaps around them
// took 21.5 us between the sampling's end and the next graph's first kernel; now 2.2 us pass
// (docs/decode-performance.md, "Between two steps"). The rows past the live ones keep position
// 0. A step fed from the host (after rows end or are admitted, or without overlap) stages its
// tokens and positions in one copy, overwriting what the device had moved on. On the CPU the
// same writes are LibTorch ops.
//
// Note [Rollout seeds]
// Prompt i of a Generate call samples with its own CPU generator seeded with `seed + i`, one
// uniform per generated token, so a row's tokens do not depend on the batch it ran in:
// Generate({prompts[i]}, params with seed + i) reproduces row i of Generate(prompts, params)
// (tokens exactly up to near-ties of u with a CDF boundary; log-probs to float rounding, since
// matmuls of different batch sizes may round differently). A trainer must advance `seed` between
// calls (e.g. by the number of prompts) to get fresh samples.
//
// Note [Engine routing record]
// With Records::experts, the engine keeps beside its KV cache a record [moe layers, max_batch,
// max_length, k] int16 of the experts each MoE layer chose, row for row with the cache; with
// Records::indexer, one [indexer layers, max_batch, max_length, index_topk] int32 of the keys each
// layer with its own DSA indexer selected. Observers on the Decoder write them: the prefill's
// choices for positions [0, prompt length) of the rows it fills, and each decode step's for its
// device-side position (a scatter at position_, so the write is captured in decode graphs like
// the cache writes). Cache compaction moves their rows too. When a row finishes, the choices
// of its fed positions (all but the last token; for the indexer, from index_topk on: before, a
// position sees at most index_topk keys and selects them all) are copied to its Generation, in
// one device-to-host copy per record and step for all the rows that finish in it. Memory: 2 bytes
// per MoE layer x k per cache position, and 4 bytes x index_topk per indexer layer (GLM-5:
// 2048 x 4 B = 8 KiB per layer and position, so indexer replay is for short sequences or
// small batches).
//
// Response rules: a response ends at the first stop token (included, with its log-prob, as the
// reference does) or after min(max_new_tokens, max_length - prompt length) tokens; `truncated` is
// true when it ended by length without a stop token.
//
// Failures: Generate while asleep throws rl::Error("rollout engine is asleep ..."); empty prompts,
// prompts that leave no room under max_length, token ids outside the vocabulary and bad sampling
// values throw rl::Error / rl::ConfigError naming the prompt or the field. An allocator that
// returns the wrong size, dtype or device throws rl::Error naming the tag. LoadWeights throws
// rl::Error listing missing and mismatched tensors.
//
// Thread safety: none; one thread drives an engine.
#ifndef RL_TRAINER_ROLLOUT_ENGINE_H_
#define RL_TRAINER_ROLLOUT_ENGINE_H_

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "launch/communicator.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/memory/region.h"
#include "trainer/model/decoder.h"
#include "trainer/model/model_config.h"
#include "trainer/model/params.h"
#include "trainer/rollout/decode_graphs.h"
#include "weight_sync/engine_layout.h"

namespace rl::rollout {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;        // 1 = off
  int64_t top_k = -1;        // -1 = off
  int64_t max_new_tokens = 0;
  std::vector<int64_t> stop_token_ids;
  uint64_t seed = 0;  // Note [Rollout seeds]
};

struct Generation {
  std::vector<int64_t> prompt;
  std::vector<int64_t> response;  // includes the stop token when one ended it
  std::vector<float> log_probs;   // one per response token; Note [Rollout log-probs] (sampler.h)
  bool truncated = false;         // ended by the length limit, not by a stop token
  // Note [Engine routing record]: with Records::experts, the expert ids every MoE layer chose for
  // every position fed to the model (prompt + response but the last token), [moe layers,
  // positions, k] flattened; with Records::indexer, the key positions every layer with its own
  // DSA indexer selected for every fed position from index_topk on, [indexer layers, positions -
  // index_topk, index_topk] flattened. Empty otherwise.
  std::vector<int16_t> routed_experts;
  std::vector<int32_t> indexer_topk;
};

// How the last Generate call ran (Note [Rollout batching]).
struct GenerateStats {
  int64_t prefills = 0;      // prefill forwards (of prompts within a factor of 2 in length)
  int64_t decode_steps = 0;  // decode steps (forwards of one token per live row)
  int64_t row_steps = 0;     // live rows summed over the decode steps
  // Of row_steps, the rows a step computed after they had ended (Note [Overlapped decode steps]).
  int64_t overrun_row_steps = 0;
};

// What the engine records of its forwards (Note [Engine routing record]).
struct Records {
  bool experts = false;  // MoE models
  bool indexer = false;  // DSA models
};

// Returns 1-D uint8 storage of at least `num_bytes` bytes on the engine's device for `tag`
// (kRolloutWeights or kKvCache).
using StorageAllocator = std::function<at::Tensor(memory::RegionTag tag, int64_t num_bytes)>;

// The expert-parallel group an engine decodes with (Note [Expert-parallel decode]).
struct ExpertParallel {
  // The group of config.expert_shard; null, or a group of one, when the model holds every expert.
  Communicator* group = nullptr;
  // The decode steps' dispatch capacity (Note [Fixed-capacity dispatch] in
  // trainer/model/layers.h), as model::DispatchCapacity's factor over max_batch tokens: 0 for the
  // worst case, which never overflows.
  double capacity_factor = 0;
};

// An allocator of plain zero-filled tensors (tests and tools).
StorageAllocator PlainAllocator(at::Device device);

class RolloutEngine {
 public:
  // `records`: what every Generation carries (Note [Engine routing record]); the "kv_cache"
  // storage then also holds the records of every cache row. A record the model has nothing for
  // (experts of a dense model, the indexer of a model without one) is not kept.
  //
  // `expert`: the expert-parallel group, when the model's experts are spread over one. The
  // engines of the group then generate in lockstep (Note [Expert-parallel decode]): Generate is a
  // collective over the group.
  //
  // `tensor_group`: the tensor-parallel group of config.tensor_shard, or null. The engine then
  // holds this rank's slices of the weights (what its actor holds) and a KV cache of its heads,
  // and every forward is a collective over the group (model::Decoder): the ranks of a TP group
  // generate the same rows from the same prompts and seeds, and sample the same tokens from the
  // same gathered logits. Captured decode steps enqueue the TP collectives without waiting
  // (Note [Enqueued all-to-all] in launch/communicator.h).
  RolloutEngine(model::ModelConfig config, at::ScalarType param_dtype, at::Device device,
                int64_t max_batch, int64_t max_length, const StorageAllocator& allocator,
                Records records = {}, ExpertParallel expert = {},
                Communicator* tensor_group = nullptr);

  RolloutEngine(const RolloutEngine&) = delete;
  RolloutEngine& operator=(const RolloutEngine&) = delete;

  const model::ModelConfig& config() const { return config_; }
  int64_t max_batch() const { return max_batch_; }
  int64_t max_length() const { return max_length_; }

  // Weight sync writes into weight_storage() at layout() offsets.
  const weight_sync::EngineLayout& layout() const { return layout_; }
  const at::Tensor& weight_storage() const { return weight_storage_; }
  // HF-named views of weight_storage() (what the Decoder computes with).
  const model::TensorMap& weights() const { return weights_; }

  // Copies every parameter of the model from `params` (HF names, any dtype/device; converted).
  void LoadWeights(const model::TensorMap& params);

  // Decode with CUDA graphs where the device and the model allow it (Note [Rollout decode
  // steps]); on by default. Graphs captured so far are dropped when turned off.
  void set_cuda_graphs(bool on);
  // True when the next decode steps replay CUDA graphs.
  bool uses_cuda_graphs() const { return graphs_ != nullptr; }
  // MLA models: decode steps in the latent space (on by default) or over expanded keys and values
  // (model::Decoder::set_latent_mla_decode); graphs captured so far are dropped.
  void set_latent_mla_decode(bool on);
  // Decode steps with programmatic dependent launch (on by default; model::Decoder::
  // set_programmatic_launch); graphs captured so far are dropped.
  void set_programmatic_launch(bool on);

  // Each decode step launched before the host reads the step ahead (Note [Overlapped decode
  // steps]); on by default.
  void set_overlapped_steps(bool on) { overlapped_steps_ = on; }
  bool overlapped_steps() const { return overlapped_steps_; }

  // Cache positions a decode step at `position` attends over (Note [Rollout decode steps]).
  static constexpr int64_t kKeyBlock = 64;
  int64_t KeyLength(int64_t position) const;

  // The model layers each record holds, in order (a routing record's layers).
  const std::vector<int64_t>& moe_layers() const { return experts_.layers; }
  const std::vector<int64_t>& indexer_layers() const { return indexer_.layers; }
  bool records_routing() const { return experts_.data.defined(); }
  // Indexer records exist once sequences can be longer than index_topk (max_length > index_topk).
  bool records_indexer() const { return indexer_.data.defined(); }
  // The bytes of the "kv_cache" storage: the KV cache and the records.
  static int64_t KvStorageBytes(const model::ModelConfig& config, at::ScalarType param_dtype,
                                int64_t max_batch, int64_t max_length, Records records);

  int64_t weight_version() const { return weight_version_; }
  void set_weight_version(int64_t version) { weight_version_ = version; }

  // One Generation per prompt, in prompt order (Notes [Rollout batching], [Rollout seeds]).
  std::vector<Generation> Generate(const std::vector<std::vector<int64_t>>& prompts,
                                   const SamplingParams& params);

  const GenerateStats& last_generate_stats() const { return stats_; }

  // Hooks called by Sleep (pause) and WakeUp (resume); default no-ops.
  void SetMemoryHooks(std::function<void()> pause, std::function<void()> resume);
  // Throws rl::Error when already asleep / already awake.
  void Sleep();
  void WakeUp();
  bool asleep() const { return asleep_; }

 private:
  // One Generate call's prompts and live rows (Note [Rollout batching]).
  struct Rows;
  // Admit a prompt while at least max_batch / kAdmitFraction rows are free (or the last prompts
  // fit, or no row is live).
  static constexpr int64_t kAdmitFraction = 4;
  // Prefills the next `count` prompts into the free cache rows after the live ones (one forward
  // for lengths within a factor of 2) and samples their first tokens.
  void Admit(Rows& rows, int64_t count);
  // Host memory through which a step's inputs go to the device and its sampled tokens come back;
  // two alternate (Note [Overlapped decode steps]). On a GPU `step` is pinned and the rest mapped
  // into the device's address space, where the sampling reads the uniforms and writes the tokens
  // and log-probs (Note [Sampled tokens handed on]); on the CPU each `device` is its `host`.
  struct HostSlot {
    at::Tensor step;               // [2, max_batch] int64: tokens and positions, staged for step_
    kernels::MappedHost uniforms;  // [max_batch] fp64: the rows' draws
    kernels::MappedHost tokens;    // [max_batch] int64: the sampled tokens
    kernels::MappedHost log_probs;  // [max_batch] fp32: their log-probs
    std::optional<c10::Event> copied;  // on a GPU: recorded after the hand-on
  };
  // A decode step launched on the device and not yet read on the host.
  struct StepInFlight {
    int64_t rows = 0;  // it computes live rows [0, rows)
    HostSlot* slot = nullptr;
  };
  // The staging for the next step (or prefill).
  HostSlot& NextSlot();
  // Decode steps of every live row, each at its own position (Note [Ragged decode] in
  // trainer/model/layers.h), overlapped (Note [Overlapped decode steps]), until some rows end;
  // retires them.
  void DecodeUntilRowsEnd(Rows& rows);
  // Launches one decode step of the live rows at their positions and advances the positions. It
  // feeds the tokens and positions the step ahead left on the device (Note [Sampled tokens handed
  // on]) when `from_device`, else the host's rows.token and rows.position.
  StepInFlight LaunchDecode(Rows& rows, bool from_device);
  // Draws a uniform for each of the live rows [first_row, first_row + logits.size(0)), samples
  // their tokens from `logits`, and starts handing tokens and log-probs back into `slot`; a
  // decode step's (`decode`) also become the next step's input at the next positions.
  void SampleToHost(Rows& rows, const at::Tensor& logits, int64_t first_row, HostSlot& slot,
                    bool decode);
  // Waits for what the step handed back into `slot`, appends the sampled tokens of live rows
  // [first_row, first_row + n) but `dropped` (ascending) to their Generations, and adds the rows
  // that end with them to `finished`.
  void TakeSampled(Rows& rows, HostSlot& slot, int64_t first_row, int64_t n,
                   const std::vector<int64_t>& dropped, std::vector<int64_t>& finished);
  // Hands the finished rows' records to their Generations and fills their cache rows with live
  // rows from past the new batch size.
  void Retire(Rows& rows, const std::vector<int64_t>& finished);
  // One decode step of rows [0, live) on their tokens step_[0][0, live) at their positions
  // position_[0, live): their logits [live, vocab].
  at::Tensor DecodeLogits(int64_t live, int64_t key_length);
  // One record kept row for row with the KV cache (Note [Engine routing record]).
  struct ChoiceRecord {
    at::Tensor data;               // [layers, max_batch, max_length, k], or undefined
    std::vector<int64_t> layers;   // the model layers recorded
    std::vector<int64_t> ordinal;  // model layer -> record layer, or -1
    int64_t first = 0;             // the first position a Generation receives
  };
  // Writes a forward's choice of model layer `layer` ([rows * len, k] or [rows, len, k]).
  void Record(ChoiceRecord& record, int64_t layer, const at::Tensor& ids);
  // What an engine of an expert group runs next (Note [Expert-parallel decode]); a larger kind
  // goes first.
  enum class StepKind { kNone = 0, kDecode = 1, kPrefill = 2 };
  // Note [Expert-parallel decode]: called before each forward with its kind, and with kNone once
  // this engine's Generate has nothing left; returns when the group agrees on `mine`, after
  // serving the group's other forwards by idle steps. Throws rl::Error on every engine of the
  // group when a decode step overflowed the dispatch capacity.
  void JoinGroupStep(StepKind mine);
  // The dispatch of the decode steps: null without expert parallelism.
  const model::ExpertDispatch* decode_dispatch() const {
    return expert_group_ != nullptr ? &dispatch_ : nullptr;
  }

  model::ModelConfig config_;
  at::ScalarType dtype_;
  at::Device device_;
  int64_t max_batch_;
  int64_t max_length_;
  weight_sync::EngineLayout layout_;
  at::Tensor weight_storage_;  // [total_bytes] uint8
  model::TensorMap weights_;   // HF-named views of weight_storage_
  at::Tensor kv_storage_;      // [NumElements] of dtype_, a view of the "kv_cache" bytes
  Communicator* expert_group_;  // null without expert parallelism
  Communicator* tensor_group_;  // null without tensor parallelism
  double capacity_factor_;      // ExpertParallel::capacity_factor, for messages
  model::ExpertDispatch dispatch_;  // the decode steps' (capacity 0 without expert parallelism)
  std::unique_ptr<model::Decoder> decoder_;
  std::unique_ptr<model::KvCache> cache_;  // rows [0, live) hold the live rows of a Generate
  model::RopeTable rope_;                  // every cache position [0, max_length)
  at::Tensor step_;       // [2, max_batch] int64 on the device: a decode step's tokens, positions
  at::Tensor token_;      // step_[0]: each row's token in the decode step
  at::Tensor position_;   // step_[1]: each row's position in the decode step
  std::array<HostSlot, 2> slots_;  // Note [Overlapped decode steps]
  int64_t next_slot_ = 0;
  bool overlapped_steps_ = true;
  ChoiceRecord experts_;                   // int16 expert ids of the MoE layers
  ChoiceRecord indexer_;        // int32 key positions of the layers with their own DSA indexer
  int64_t prefill_length_ = 0;  // > 0 while a prefill of that many positions runs
  int64_t prefill_row_ = 0;     // its first cache row
  GenerateStats stats_;
  std::unique_ptr<DecodeGraphs> graphs_;   // null: eager decode steps
  int64_t weight_version_ = 0;
  bool asleep_ = false;
  std::function<void()> pause_hook_;
  std::function<void()> resume_hook_;
};

}  // namespace rl::rollout

#endif  // RL_TRAINER_ROLLOUT_ENGINE_H_
