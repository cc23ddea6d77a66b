#include "trainer/data/pretokenizer.h"

#include <fmt/format.h>

#include <array>
#include <cstdint>

#include "launch/check.h"
#include "launch/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace rl::data {
namespace {

std::shared_ptr<pcre2_code> Compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                                   &offset, nullptr);
  if (code == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error, message.data(), message.size());
    throw CheckpointError(fmt::format("regex \"{}\" does not compile: {} at offset {}",
                                      Utf8Lossy(pattern), reinterpret_cast<char*>(message.data()),
                                      offset));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // when it fails, pcre2_match interprets
  return std::shared_ptr<pcre2_code>(code, pcre2_code_free);
}

struct MatchDataFree {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataFree>;

// Matches `code` in `text` from byte `start`; false when there is no match. On a match,
// [ovector[0], ovector[1]) is its extent.
bool Match(const pcre2_code* code, std::string_view text, size_t start, uint32_t options,
           pcre2_match_data* data, std::string_view pattern) {
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = pcre2_match(code, subject, text.size(), start, options, data, nullptr);
  // The JIT's stack is small; the interpreter keeps its backtracking on the heap.
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code, subject, text.size(), start, options | PCRE2_NO_JIT, data, nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(rc, message.data(), message.size());
    throw CheckpointError(fmt::format("regex \"{}\" failed on a text of {} bytes: {}",
                                      Utf8Lossy(pattern), text.size(),
                                      reinterpret_cast<char*>(message.data())));
  }
  return true;
}

// True when `cp` matches `code`, a pattern anchored at both ends.
bool IsInClass(const pcre2_code* code, char32_t cp) {
  std::string encoded;
  AppendUtf8(cp, &encoded);
  MatchData data(pcre2_match_data_create_from_pattern(code, nullptr));
  return Match(code, encoded, 0, 0, data.get(), "");
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.
struct ByteMap {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 512> from_cp{};  // every mapped code point is < 0x144

  ByteMap() {
    from_cp.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? static_cast<char32_t>(b) : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& GetByteMap() {
  static const ByteMap map;
  return map;
}

}  // namespace

SplitRegex::SplitRegex(std::string_view pattern) : pattern_(pattern), code_(Compile(pattern)) {}

std::vector<std::string_view> SplitRegex::Split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  MatchData data(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
  size_t done = 0;  // text before this is in `pieces`
  size_t from = 0;  // where the next search starts
  while (from < text.size() && Match(code_.get(), text, from, 0, data.get(), pattern_)) {
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start > done) pieces.push_back(text.substr(done, start - done));
    done = start;
    if (end > start) {
      pieces.push_back(text.substr(start, end - start));
      done = from = end;
    } else {  // an empty match: search again from the next character
      from = start + static_cast<size_t>(start < text.size() ? DecodeUtf8At(text, start).num_bytes
                                                             : 1);
    }
  }
  if (done < text.size()) pieces.push_back(text.substr(done));
  return pieces;
}

std::shared_ptr<const SplitRegex> Gpt2Regex() {
  static const auto regex = std::make_shared<const SplitRegex>(kGpt2Pattern);
  return regex;
}

bool IsWordChar(char32_t cp) {
  static const std::shared_ptr<pcre2_code> word = Compile(R"(\A\w\z)");
  return IsInClass(word.get(), cp);
}

bool IsWhitespace(char32_t cp) {
  // White_Space, as Rust's char::is_whitespace (used by tokenizers for lstrip/rstrip); PCRE2's \s
  // also holds U+180E.
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string ByteLevelEncode(std::string_view bytes) {
  const ByteMap& map = GetByteMap();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char ch : bytes) AppendUtf8(map.to_cp[static_cast<unsigned char>(ch)], &out);
  return out;
}

bool ByteLevelDecode(std::string_view token, std::string* out) {
  const ByteMap& map = GetByteMap();
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    const DecodedChar d = DecodeUtf8At(token, pos);
    if (!d.valid || d.code_point >= map.from_cp.size() || map.from_cp[d.code_point] < 0) {
      return false;
    }
    bytes.push_back(static_cast<char>(map.from_cp[d.code_point]));
    pos += static_cast<size_t>(d.num_bytes);
  }
  out->append(bytes);
  return true;
}

}  // namespace rl::data
