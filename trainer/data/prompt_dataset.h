// Prompts for rollouts: a JSONL file read once into memory, served in deterministic shuffled
// epochs from a cursor that a checkpoint can save and restore.
//
// File format (--prompt-data, --input-key, --label-key): one JSON object per line. The prompt is
// under input_key, either a string or a list of chat messages [{"role": ..., "content": ...}];
// the label, under label_key, is a string or a number (kept as its JSON text, e.g. 42 -> "42").
// Lines holding only whitespace are skipped; other keys are ignored. An empty label_key means the
// examples have no labels. Every bad line is a CheckpointError "<path>:<line>: ..." saying what
// is wrong (not JSON, not an object, missing key, wrong type); a file without examples is one too.
//
// Order: with Shuffle::kYes, epoch e visits the examples in a permutation drawn from (seed, e)
// with our own SplitMix64 + Fisher-Yates, so the order is identical on every platform and
// standard library. NextBatch(n) continues from the cursor, wrapping into the next epoch
// mid-batch. ExportState()/ImportState() carry the cursor through a checkpoint; importing a
// state made for a different seed or dataset size is a CheckpointError.
//
// Thread safety: none; one owner (the rollout driver) calls NextBatch.
#ifndef RL_TRAINER_DATA_PROMPT_DATASET_H_
#define RL_TRAINER_DATA_PROMPT_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "launch/json.h"
#include "trainer/data/chat_template.h"

namespace rl::data {

struct PromptExample {
  std::string text;                   // the prompt, when given as a string
  std::vector<ChatMessage> messages;  // the prompt, when given as chat messages (text is empty)
  std::string label;
  int64_t line = 0;  // 1-based line in the source file; 0 for generated examples

  bool is_chat() const { return !messages.empty(); }
};

enum class Shuffle { kNo, kYes };

struct PromptDatasetOptions {
  std::string input_key = "prompt";
  std::string label_key = "label";  // empty: no labels
  uint64_t seed = 0;
  Shuffle shuffle = Shuffle::kYes;
};

// Parses one JSONL line (already known to be non-blank) into an example; throws
// CheckpointError "<source>:<line>: ...".
PromptExample ParsePromptLine(std::string_view line_text, const PromptDatasetOptions& options,
                              const std::string& source, int64_t line);

class PromptDataset {
 public:
  struct Position {
    int64_t epoch = 0;
    int64_t offset = 0;  // examples of `epoch` already served
  };

  // Reads `path`; throws CheckpointError (see the header).
  static PromptDataset LoadJsonl(const std::string& path, const PromptDatasetOptions& options);

  // Throws rl::Error when `examples` is empty.
  PromptDataset(std::vector<PromptExample> examples, uint64_t seed, Shuffle shuffle);

  int64_t size() const { return static_cast<int64_t>(examples_.size()); }
  const PromptExample& at(int64_t index) const { return examples_.at(static_cast<size_t>(index)); }

  // The next `n` examples (n >= 0) in epoch order, wrapping into later epochs as needed.
  std::vector<PromptExample> NextBatch(int64_t n);

  Position position() const { return position_; }
  // Indices of epoch `epoch` in visiting order.
  std::vector<int64_t> EpochOrder(int64_t epoch) const;

  // {"epoch": e, "offset": o, "seed": s, "size": n, "shuffle": bool}
  json::Value ExportState() const;
  // Restores the cursor; throws CheckpointError when the state is malformed or was made with
  // another seed, size or shuffle setting (the order would differ).
  void ImportState(const json::Value& state);

 private:
  std::vector<PromptExample> examples_;
  uint64_t seed_;
  Shuffle shuffle_;
  Position position_;
  int64_t order_epoch_ = -1;  // the epoch `order_` belongs to
  std::vector<int64_t> order_;
};

}  // namespace rl::data

#endif  // RL_TRAINER_DATA_PROMPT_DATASET_H_
