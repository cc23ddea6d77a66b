// The one UTF-8 decoder, validator and encoder of the repository (JSON writer, tokenizer).
//
// Decoding is strict (no overlong forms, no surrogates, nothing above U+10FFFF) and reports invalid
// input as "maximal subparts", the way Unicode recommends and Rust's String::from_utf8_lossy (used
// by Hugging Face tokenizers) does, so Utf8Lossy() gives the same text as tokenizers' decode.
//
// Failures: none; invalid input is reported in DecodedChar, never thrown.
// Thread safety: stateless functions.
#ifndef RL_LAUNCH_UTF8_H_
#define RL_LAUNCH_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace rl {

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

}  // namespace rl

#endif  // RL_LAUNCH_UTF8_H_
