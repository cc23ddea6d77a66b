// UTF-8 decoding and the few Unicode properties the tokenizer's pre-tokenizer needs.
//
// What this is: a strict UTF-8 decoder (no overlong forms, no surrogates, nothing above
// U+10FFFF) that reports invalid input as "maximal subparts" the way Unicode (and Rust's
// String::from_utf8_lossy, which Hugging Face tokenizers uses) recommends, a lossy converter
// built on it, and the categories \p{L} (letters), \p{N} (numbers) and \s (White_Space) used by
// the GPT-2/GPT-4/Qwen2 split regexes.
//
// Approximation: the L and N tables (unicode_tables.inc) are generated from Python's unicodedata
// by gen_unicode_tables.py, so they follow that Unicode version (see the file's header); code
// points assigned in later versions are classed as "other" (punctuation/symbol) here while
// Oniguruma (used by tokenizers) may know them. White_Space is the fixed 25-code-point list,
// which has not changed since Unicode 6.
//
// Thread safety: stateless functions over constant tables.
#ifndef RL_TRAINER_DATA_UNICODE_H_
#define RL_TRAINER_DATA_UNICODE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace rl::data {

inline constexpr char32_t kReplacementChar = 0xFFFD;

struct DecodedChar {
  char32_t code_point = kReplacementChar;  // kReplacementChar when !valid
  int num_bytes = 1;                       // >= 1; for invalid input the maximal invalid subpart
  bool valid = false;
};

// Decodes the character starting at text[pos] (pos < text.size()).
DecodedChar DecodeUtf8At(std::string_view text, size_t pos);

bool IsValidUtf8(std::string_view text);

// Valid UTF-8, with each maximal invalid subpart replaced by U+FFFD (as from_utf8_lossy does).
std::string Utf8Lossy(std::string_view bytes);

// Appends the UTF-8 form of `cp` (must be a Unicode scalar value).
void AppendUtf8(char32_t cp, std::string* out);

bool IsLetter(char32_t cp);      // general category L*  (\p{L})
bool IsNumber(char32_t cp);      // general category N*  (\p{N})
bool IsWhitespace(char32_t cp);  // White_Space          (\s in Oniguruma and Rust regex)

}  // namespace rl::data

#endif  // RL_TRAINER_DATA_UNICODE_H_
