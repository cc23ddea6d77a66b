// The pre-tokenization steps of Hugging Face byte-level BPE tokenizers.
//
// Split: tokenizers splits text into "words" with the regex of tokenizer.json (Oniguruma) before
// BPE. SplitRegex runs that pattern verbatim with PCRE2 in UTF mode with Unicode properties
// (\p{L}, \s, \w, \d and (?i) case folding are Unicode's), JIT-compiled where PCRE2 can. Pieces
// are the matches and the text between them, as tokenizers' Split with behavior Isolated does;
// empty matches give no piece. The patterns of GPT-2, GPT-4/Llama-3/GLM (cl100k-style), o200k and
// Qwen2 give tokenizers' splits (pretokenizer_test.cc checks them on hard text). Where PCRE2 and
// Oniguruma differ: \h is horizontal space in PCRE2 and a hex digit in Oniguruma, and each
// library has its own Unicode version (PCRE2 10.42: Unicode 14), which matters only for
// characters assigned since. Invalid UTF-8 (which a Rust &str cannot hold, so tokenizers never
// sees it) matches nothing: it stays in the pieces between matches.
//
// Byte level: every byte maps to one printable code point (GPT-2's bytes_to_unicode); BPE runs
// on those. ByteLevelDecode reverses it for one token.
//
// Failures: a pattern PCRE2 cannot compile throws CheckpointError naming it; so does a match that
// exceeds PCRE2's limits (a pattern that backtracks without bound).
// Thread safety: a SplitRegex is immutable and may be used from several threads; the functions
// are stateless.
#ifndef RL_TRAINER_DATA_PRETOKENIZER_H_
#define RL_TRAINER_DATA_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;  // pcre2.h's pcre2_code, kept out of this header

namespace rl::data {

// The regex of the ByteLevel pre-tokenizer with use_regex = true (GPT-2's).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class SplitRegex {
 public:
  explicit SplitRegex(std::string_view pattern);

  const std::string& pattern() const { return pattern_; }

  // The matches of the pattern in `text` and the text between them, in order. The pieces
  // concatenate to `text`; none is empty. The views point into `text`.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  std::string pattern_;
  std::shared_ptr<pcre2_real_code_8> code_;
};

// The ByteLevel pre-tokenizer's regex, compiled once.
std::shared_ptr<const SplitRegex> Gpt2Regex();

// For added tokens' single_word, lstrip and rstrip: PCRE2's \w (a letter, a number or '_'), and
// White_Space (Rust's char::is_whitespace, which tokenizers uses).
bool IsWordChar(char32_t cp);
bool IsWhitespace(char32_t cp);

// Each byte of `bytes` as its GPT-2 byte-level code point, UTF-8 encoded.
std::string ByteLevelEncode(std::string_view bytes);

// Maps each code point of a byte-level token back to its byte and appends them to `out`.
// Returns false (and appends nothing) when some character is not a byte-level code point, as
// with added tokens such as "<｜User｜>"; the caller then uses the token's own bytes.
bool ByteLevelDecode(std::string_view token, std::string* out);

}  // namespace rl::data

#endif  // RL_TRAINER_DATA_PRETOKENIZER_H_
