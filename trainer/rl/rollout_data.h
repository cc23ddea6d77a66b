// The rollout-data contract: what a rollout hands to training, and its JSON-lines file format
// (--save-debug-rollout-data records it, --load-debug-rollout-data replays it).
//
// Note [Rollout sample layout]
// A Sample is one generated response: `tokens` holds prompt + response ids, and the response is
// the last `response_length` of them, with 1 <= response_length < tokens.size(): at least one
// response token, and at least one prompt token before it (response token 0 is predicted by the
// logits at the position before it, which an empty prompt does not have). Every per-token
// quantity of a sample (loss_mask, rollout_log_probs, and in training log-probs, entropy,
// advantages) is response-aligned: element t belongs to response token t, i.e. to
// tokens[tokens.size() - response_length + t], and is predicted by the logits at position
// tokens.size() - response_length + t - 1 (>= 0), as in miles. Samples of one prompt (a GRPO
// group) share `group_index` and sit next to each other in a batch.
//
// File format: UTF-8 text, one JSON object per line, one line per sample, in batch order:
//   {"tokens": [151644, 872, ...], "response_length": 3, "loss_mask": [1, 1, 0],
//    "reward": 0.5, "rollout_log_probs": [-0.25, -1.5, -0.125], "group": 0}
// `rollout_log_probs`, `group`, `routed_experts` and `indexer_topk` are optional (absent = no
// engine log-probs / grouping by position, consecutive --n-samples-per-prompt samples per prompt /
// no routing records, Note [Routing record]). Other keys are rejected, so
// a misspelt key ("rewards") is an error rather than silently ignored. Blank lines are skipped.
// Numbers are written in the shortest form that reads back to the same double (float log-probs
// are widened to double, which is exact), so Write then Read gives back the same batch, bit for
// bit.
//
// Failures: ReadRolloutData throws rl::CheckpointError naming the file, the 1-based line and the
// field ("rollout.jsonl:7: field \"loss_mask\": has 5 entries, but response_length is 4"); a last
// line cut short (a file truncated while being written) is reported as such. WriteRolloutData
// throws rl::CheckpointError for an invalid sample (naming its index and field) or an I/O error,
// and never leaves a partial file at `path`: it writes `<path>.tmp.<pid>`, fsyncs, renames into
// place and fsyncs the directory.
//
// Thread safety: plain value types and stateless functions.
#ifndef RL_TRAINER_RL_ROLLOUT_DATA_H_
#define RL_TRAINER_RL_ROLLOUT_DATA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rl::rl_algo {

// Note [Routing record]
// What the rollout engine chose for one sample, for training to replay:
// - routed_experts (--use-rollout-routing-replay): for every MoE layer, in model order, and every
//   position the model was fed (all the sample's tokens but the last, which was sampled and never
//   fed), the k expert ids in the engine's order;
// - indexer_topk (--use-rollout-indexer-replay, DSA models): for every layer with its own
//   indexer, in model order, and every fed position p >= k (k = index_topk; a position before k
//   sees at most k keys and selects them all), the k key positions the indexer selected.
// Both are a RoutingRecord: ids laid out [layers, recorded positions, k], where the recorded
// positions are [first, positions) (first = 0 for experts, k for the indexer). Each id takes
// `id_bytes` bytes, little-endian: the fewest of 1, 2 and 4 that hold every possible id (experts:
// 1 for at most 256, 2 for more, as Kimi-K2.5's 384; key positions: 2 up to 65,536 positions).
// In a rollout-data file it is the object {"layers": L, "positions": P, "first": F, "k": K,
// "id_bytes": B, "ids": [L * (P - F) * K integers]}.
struct RoutingRecord {
  int64_t layers = 0;
  int64_t positions = 0;  // fed positions of the sample: tokens.size() - 1
  int64_t first = 0;      // the first recorded position
  int64_t k = 0;
  int id_bytes = 1;
  std::vector<uint8_t> ids;  // [layers * recorded_positions() * k * id_bytes]

  // The bytes per id that hold ids below `limit`.
  static int IdBytesFor(int64_t limit) { return limit <= 256 ? 1 : limit <= 65536 ? 2 : 4; }
  int64_t recorded_positions() const { return positions > first ? positions - first : 0; }
  int64_t num_ids() const { return layers * recorded_positions() * k; }
  int64_t id(int64_t i) const {
    int64_t value = 0;
    for (int b = 0; b < id_bytes; ++b)
      value |= static_cast<int64_t>(ids[i * id_bytes + b]) << (8 * b);
    return value;
  }
  void set_id(int64_t i, int64_t value) {
    for (int b = 0; b < id_bytes; ++b)
      ids[i * id_bytes + b] = static_cast<uint8_t>(value >> (8 * b));
  }
  friend bool operator==(const RoutingRecord& a, const RoutingRecord& b) {
    return a.layers == b.layers && a.positions == b.positions && a.first == b.first && a.k == b.k &&
           a.id_bytes == b.id_bytes && a.ids == b.ids;
  }
};

// One response and what training needs of it. See Note [Rollout sample layout].
struct Sample {
  std::vector<int64_t> tokens;  // [prompt_length + response_length], ids >= 0
  int64_t response_length = 0;  // 1 <= response_length < tokens.size()
  std::vector<int> loss_mask;   // [response_length], each 0 or 1; 0 = not trained on
  double reward = 0.0;          // raw (not yet group-normalised), finite
  std::optional<std::vector<float>> rollout_log_probs;  // [response_length], from the engine
  std::optional<int64_t> group_index;  // prompt index, >= 0; nullopt = grouped by position
  std::optional<RoutingRecord> routed_experts;  // Note [Routing record]
  std::optional<RoutingRecord> indexer_topk;    // Note [Routing record]

  friend bool operator==(const Sample& a, const Sample& b);
  friend bool operator!=(const Sample& a, const Sample& b) { return !(a == b); }
};

struct RolloutBatch {
  std::vector<Sample> samples;
};

// Why `sample` breaks Note [Rollout sample layout], as "field \"x\": <what is wrong>", or "" when
// it is valid. Used by the reader and the writer, so both hold the same rules.
std::string SampleProblem(const Sample& sample);

// Reads a JSON-lines rollout file. Throws rl::CheckpointError (see the header comment).
RolloutBatch ReadRolloutData(const std::string& path);
// The same from the file's text; `source` names it in messages (ReadRolloutData passes the path).
RolloutBatch ParseRolloutData(std::string_view text, const std::string& source);

// Writes `batch` atomically; each sample must be valid (SampleProblem() == ""). Throws
// rl::CheckpointError.
void WriteRolloutData(const std::string& path, const RolloutBatch& batch);

// Note [Sample wire format]
// Samples travel between data-parallel ranks (the rollout exchange) as bytes: a uint64 count, then
// per sample the tokens (int64 count + int64 ids), response_length (int64), the loss mask (int64
// count + int32 each), the reward (float64), the rollout log-probs (uint8 present flag, then
// int64 count + float32 each), the group index (uint8 present flag, then int64) and the two routing
// records (each a uint8 present flag, then layers, positions, first, k, id_bytes as int64 and the
// id bytes), in the host's
// byte order (every rank of a job runs on the same kind of host). DecodeSamples gives back the
// encoded samples exactly (==), and throws rl::Error naming `source` when the bytes are cut short,
// have bytes left over or hold a sample that breaks Note [Rollout sample layout].
std::string EncodeSamples(const std::vector<Sample>& samples);
std::vector<Sample> DecodeSamples(std::string_view bytes, const std::string& source);

// The sizes of the GRPO groups, in batch order, summing to samples.size(). When every sample has
// a group_index, a group is a run of consecutive samples with the same index; an index that
// reappears after another group is an error (groups must be contiguous). When none has one,
// groups are consecutive blocks of `n_samples_per_prompt`, which must divide the batch. A batch
// that mixes the two is an error. Throws rl::Error with a message that says which sample.
std::vector<int64_t> GroupSizes(const RolloutBatch& batch, int64_t n_samples_per_prompt);

}  // namespace rl::rl_algo

#endif  // RL_TRAINER_RL_ROLLOUT_DATA_H_
