// Tokenizers: the common interface the trainer uses, a Hugging Face byte-level BPE tokenizer read
// from a checkpoint's tokenizer.json, and a built-in byte tokenizer for the embedded toy task.
//
// Tokenizer (interface): Encode() turns text into ids, matching special ("added") tokens verbatim
// first so they are never split; Decode() turns ids back into text. Neither adds BOS/EOS: Encode
// equals Hugging Face's encode(text, add_special_tokens=False) (the post-processor is not run);
// chat templates (chat_template.h) write the special tokens into the text instead.
// Decode always returns valid UTF-8: ids that end inside a multi-byte character decode to U+FFFD
// (as tokenizers does), and ids with no token (the model's embedding table is often larger than
// the tokenizer's vocabulary) are skipped, also as tokenizers does.
//
// BpeTokenizer supports what byte-level BPE checkpoints (Qwen2/2.5/3, GLM-4.x/5, DeepSeek-V3 style,
// Llama 3, GPT-2) put in tokenizer.json:
//   model        type "BPE" with vocab and merges ("a b" strings or [a, b] pairs), ignore_merges;
//                no dropout, no byte_fallback, no subword prefix/suffix (CheckpointError
//                otherwise).
//   normalizer   null or NFC. NFC is NOT applied (approximation): the text is assumed to be in NFC
//                already, which holds for nearly all text; decomposed accents will tokenize
//                differently from Hugging Face.
//   pre_tokenizer Split with a Regex pattern (run by PCRE2 as written; see pretokenizer.h) and
//                behaviour Isolated, then ByteLevel (add_prefix_space, use_regex); alone or in a
//                Sequence. A regex PCRE2 cannot compile and other types fail with CheckpointError
//                quoting them.
//   added_tokens content/id/special/lstrip/rstrip/single_word/normalized; matched leftmost-longest,
//                normalized=false tokens first (as tokenizers does). single_word treats letters,
//                numbers and '_' as word characters.
//   decoder      ByteLevel (required).
//   post_processor ignored (see above).
// Loading checks every id and merge: not JSON (with line/column), missing or mistyped fields,
// unknown model type, merges naming tokens not in the vocab, duplicate ids, ids that do not cover
// 0..vocab_size-1, a vocab lacking one of the 256 byte tokens. Each failure is a CheckpointError
// that names the file and the offending entry.
//
// Special ids: eos comes from tokenizer_config.json's eos_token; without one, the first of the
// well-known end tokens (<|endoftext|>, <｜end▁of▁sentence｜>, </s>, <|end_of_text|>, <eos>) that
// the vocabulary has; otherwise loading fails. stop_ids() adds generation_config.json's
// eos_token_id list (Qwen3 instruct stops on <|im_end|> and <|endoftext|>).
//
// Thread safety: tokenizers are immutable after construction; all methods are const and safe to
// call concurrently.
#ifndef RL_TRAINER_DATA_TOKENIZER_H_
#define RL_TRAINER_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "launch/json.h"
#include "trainer/data/pretokenizer.h"

namespace rl::data {

enum class SkipSpecial { kNo, kYes };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int64_t> Encode(std::string_view text) const = 0;
  virtual std::string Decode(const std::vector<int64_t>& ids,
                             SkipSpecial skip = SkipSpecial::kNo) const = 0;

  // One past the largest token id.
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eos_id() const = 0;
  virtual std::optional<int64_t> pad_id() const = 0;
  virtual std::optional<int64_t> bos_id() const = 0;
  // eos_id() first, then any further ids that end a response; no duplicates.
  virtual std::vector<int64_t> stop_ids() const = 0;

  // The id of a token as written in the vocabulary (byte-level form, "Ġthe") or an added token.
  virtual std::optional<int64_t> TokenToId(std::string_view token) const = 0;
  virtual std::optional<std::string> IdToToken(int64_t id) const = 0;
  virtual bool IsSpecial(int64_t id) const = 0;

  // The checkpoint's Jinja chat template source, empty when it has none (see chat_template.h).
  virtual const std::string& chat_template() const = 0;
};

// 256 byte tokens (id = byte value) and three specials. Encode() maps "<pad>", "<bos>", "<eos>"
// in the text to their ids and every other byte to itself, so Decode(Encode(s)) == s for valid
// UTF-8 s. vocab_size() is 259.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int64_t kPadId = 256;
  static constexpr int64_t kBosId = 257;
  static constexpr int64_t kEosId = 258;
  static constexpr int64_t kVocabSize = 259;
  static constexpr std::string_view kPadToken = "<pad>";
  static constexpr std::string_view kBosToken = "<bos>";
  static constexpr std::string_view kEosToken = "<eos>";

  std::vector<int64_t> Encode(std::string_view text) const override;
  std::string Decode(const std::vector<int64_t>& ids,
                     SkipSpecial skip = SkipSpecial::kNo) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  int64_t eos_id() const override { return kEosId; }
  std::optional<int64_t> pad_id() const override { return kPadId; }
  std::optional<int64_t> bos_id() const override { return kBosId; }
  std::vector<int64_t> stop_ids() const override { return {kEosId}; }
  std::optional<int64_t> TokenToId(std::string_view token) const override;
  std::optional<std::string> IdToToken(int64_t id) const override;
  bool IsSpecial(int64_t id) const override { return id >= kPadId && id < kVocabSize; }
  const std::string& chat_template() const override { return chat_template_; }

 private:
  std::string chat_template_;  // always empty
};

// What tokenizer_config.json (and generation_config.json) add to tokenizer.json.
struct TokenizerConfig {
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> bos_token;
  std::string chat_template;
  std::vector<int64_t> extra_stop_ids;
};

// The tokenizer_config.json part of ReadTokenizerConfig, from an already parsed document: eos, pad
// and bos tokens and the chat template. `source` names it in messages; throws CheckpointError.
TokenizerConfig ParseTokenizerConfig(const json::Value& root, const std::string& source);

// Reads `dir`/tokenizer_config.json, `dir`/chat_template.jinja (preferred over the config's
// chat_template, as transformers does) and `dir`/generation_config.json; each may be absent.
// Throws CheckpointError naming the file for a present but malformed one.
TokenizerConfig ReadTokenizerConfig(const std::string& dir);

class BpeTokenizer final : public Tokenizer {
 public:
  // Parses tokenizer.json at `path`; throws CheckpointError naming `path` (see the header).
  static std::unique_ptr<BpeTokenizer> FromFile(const std::string& path,
                                                const TokenizerConfig& config = {});
  // The same from an already parsed document; `source` names it in messages.
  static std::unique_ptr<BpeTokenizer> FromJson(const json::Value& root, const std::string& source,
                                                const TokenizerConfig& config = {});

  std::vector<int64_t> Encode(std::string_view text) const override;
  std::string Decode(const std::vector<int64_t>& ids,
                     SkipSpecial skip = SkipSpecial::kNo) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int64_t eos_id() const override { return eos_id_; }
  std::optional<int64_t> pad_id() const override { return pad_id_; }
  std::optional<int64_t> bos_id() const override { return bos_id_; }
  std::vector<int64_t> stop_ids() const override { return stop_ids_; }
  std::optional<int64_t> TokenToId(std::string_view token) const override;
  std::optional<std::string> IdToToken(int64_t id) const override;
  bool IsSpecial(int64_t id) const override;
  const std::string& chat_template() const override { return chat_template_; }

  // The pre-tokenizer alone on text without added tokens: the byte-level words BPE sees (what
  // tokenizers' pre_tokenizer.pre_tokenize_str returns). For tests and debugging.
  std::vector<std::string> PreTokenize(std::string_view text) const;

 private:
  struct PreTokenizerStep {
    enum class Kind { kSplit, kByteLevel };
    Kind kind = Kind::kSplit;
    std::shared_ptr<const SplitRegex> regex;  // kSplit; kByteLevel with use_regex: Gpt2Regex()
    bool add_prefix_space = false;            // kByteLevel
    bool use_regex = false;                   // kByteLevel
  };
  struct AddedToken {
    int64_t id = 0;
    std::string content;
    bool special = false;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = false;
  };
  struct Merge {
    int32_t rank = 0;
    int64_t merged_id = 0;
  };
  // A piece of the input: either an added token or text still to be tokenized.
  struct Segment {
    std::string_view text;
    int64_t added_id = -1;
  };

  BpeTokenizer() = default;
  void SplitOnAddedTokens(std::string_view text, bool normalized_pass,
                          std::vector<Segment>* out) const;
  void EncodeWord(std::string_view byte_level_word, std::vector<int64_t>* ids) const;
  // The steps of FromJson, in its order, one part of tokenizer.json each. They throw
  // CheckpointError naming `source`, or json::TypeError, which FromJson reports the same way.
  std::unordered_map<int64_t, std::string> ReadVocab(const json::Value& model,
                                                     const std::string& source);
  void ReadAddedTokens(const json::Value& root, const std::string& source,
                       std::unordered_map<int64_t, std::string>* by_id);
  // Ids must be exactly 0..n-1 and the vocab must hold the 256 byte-level tokens; builds the
  // id and added-token indexes.
  void IndexTokens(const std::unordered_map<int64_t, std::string>& by_id,
                   const std::string& source);
  void ReadMerges(const json::Value& model, const std::string& source);
  void ReadPreTokenizer(const json::Value& root, const std::string& source);
  // eos (from the config, else the first known name in the vocab), pad, bos, the stop ids and
  // the chat template.
  void ReadSpecialIds(const TokenizerConfig& config, const std::string& source);

  std::unordered_map<std::string, int64_t> token_to_id_;    // vocab and added tokens
  std::vector<std::string> id_to_token_;                    // added tokens override the vocab
  std::vector<uint8_t> is_special_;                         // by id
  std::unordered_map<uint64_t, Merge> merges_;              // (left_id << 32 | right_id) -> merge
  std::vector<AddedToken> added_tokens_;                    // longest first
  std::vector<std::vector<uint32_t>> added_by_first_byte_;  // [256] -> indices, longest first
  std::vector<PreTokenizerStep> steps_;
  bool ignore_merges_ = false;
  int64_t eos_id_ = -1;
  std::optional<int64_t> pad_id_;
  std::optional<int64_t> bos_id_;
  std::vector<int64_t> stop_ids_;
  std::string chat_template_;
};

// The tokenizer of a Hugging Face checkpoint directory: `checkpoint_dir`/tokenizer.json plus
// ReadTokenizerConfig(checkpoint_dir). Throws CheckpointError naming the missing or bad file (a
// checkpoint without tokenizer.json, e.g. Kimi's tiktoken.model, is reported as unsupported).
std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& checkpoint_dir);

}  // namespace rl::data

#endif  // RL_TRAINER_DATA_TOKENIZER_H_
