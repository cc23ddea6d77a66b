// The pre-tokenization steps of Hugging Face byte-level BPE tokenizers, without a regex engine.
//
// Hugging Face tokenizers split text into "words" with an Oniguruma regex before BPE. std::regex
// has no \p{L}/\p{N}, so this file implements the three regexes that byte-level BPE checkpoints
// use, as hand-written scanners that reproduce Oniguruma's leftmost-first, backtracking result:
//
//   kGpt2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//           (GPT-2; the ByteLevel pre-tokenizer with use_regex = true)
//   kGpt4   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//           (GPT-4 cl100k, Llama 3, GLM-4/4.5/5 Split pre-tokenizers)
//   kQwen2  as kGpt4 with \p{N} instead of \p{N}{1,3} (Qwen2/2.5/3)
//
// Approximations (documented; everything else is exact):
//   * \p{L}, \p{N} and \s come from unicode.h (Python's Unicode version, see there).
//   * (?i:) case folding of the contractions is ASCII plus U+017F (long s, which folds to 's');
//     these are the only characters that fold onto s, t, r, e, v, m, l, d under simple folding.
//   * Invalid UTF-8 (which a Rust &str cannot hold, so tokenizers never sees it) is treated as
//     one "other" (punctuation-like) character per maximal invalid subpart.
//
// Byte level: every byte maps to one printable code point (GPT-2's bytes_to_unicode); BPE runs
// on those. ByteLevelDecode reverses it for one token.
//
// Thread safety: stateless.
#ifndef RL_TRAINER_DATA_PRETOKENIZER_H_
#define RL_TRAINER_DATA_PRETOKENIZER_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rl::data {

enum class SplitPattern { kGpt2, kGpt4, kQwen2 };

// The pattern whose regex text (as written in tokenizer.json) is `regex`, or nullopt.
std::optional<SplitPattern> RecognizeSplitPattern(std::string_view regex);
// The regex text of `pattern`, for messages and tests.
std::string_view SplitPatternRegex(SplitPattern pattern);

// Splits `text` into the consecutive matches of `pattern` ("Isolated" behaviour). The pieces
// concatenate to `text`; none is empty. The views point into `text`.
std::vector<std::string_view> SplitWords(std::string_view text, SplitPattern pattern);

// Each byte of `bytes` as its GPT-2 byte-level code point, UTF-8 encoded.
std::string ByteLevelEncode(std::string_view bytes);

// Maps each code point of a byte-level token back to its byte and appends them to `out`.
// Returns false (and appends nothing) when some character is not a byte-level code point, as
// with added tokens such as "<｜User｜>"; the caller then uses the token's own bytes.
bool ByteLevelDecode(std::string_view token, std::string* out);

}  // namespace rl::data

#endif  // RL_TRAINER_DATA_PRETOKENIZER_H_
