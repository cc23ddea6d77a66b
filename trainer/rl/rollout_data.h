// The rollout-data contract: what a rollout hands to training, and its JSON-lines file format
// (--save-debug-rollout-data records it, --load-debug-rollout-data replays it).
//
// Note [Rollout sample layout]
// A Sample is one generated response: `tokens` holds prompt + response ids, and the response is
// the last `response_length` of them (1 <= response_length <= tokens.size()). Every per-token
// quantity of a sample (loss_mask, rollout_log_probs, and in training log-probs, entropy,
// advantages) is response-aligned: element t belongs to response token t, i.e. to
// tokens[tokens.size() - response_length + t], and is predicted by the logits at position
// tokens.size() - response_length + t - 1, as in miles. Samples of one
// prompt (a GRPO group) share `group_index` and sit next to each other in a batch.
//
// File format: UTF-8 text, one JSON object per line, one line per sample, in batch order:
//   {"tokens": [151644, 872, ...], "response_length": 3, "loss_mask": [1, 1, 0],
//    "reward": 0.5, "rollout_log_probs": [-0.25, -1.5, -0.125], "group": 0}
// `rollout_log_probs` and `group` are optional (absent = no engine log-probs / grouping by
// position, consecutive --n-samples-per-prompt samples per prompt). Other keys are rejected, so
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

// One response and what training needs of it. See Note [Rollout sample layout].
struct Sample {
  std::vector<int64_t> tokens;  // [prompt_length + response_length], ids >= 0
  int64_t response_length = 0;  // 1 <= response_length <= tokens.size()
  std::vector<int> loss_mask;   // [response_length], each 0 or 1; 0 = not trained on
  double reward = 0.0;          // raw (not yet group-normalised), finite
  std::optional<std::vector<float>> rollout_log_probs;  // [response_length], from the engine
  std::optional<int64_t> group_index;  // prompt index, >= 0; nullopt = grouped by position

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
// int64 count + float32 each) and the group index (uint8 present flag, then int64), in the host's
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
