#include "trainer/data/pretokenizer.h"

#include <array>
#include <cstdint>

#include "trainer/data/unicode.h"

namespace rl::data {
namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum class CharClass : uint8_t { kLetter, kNumber, kNewline, kSpace, kOther };

struct Char {
  size_t pos;   // byte offset in the text
  char32_t cp;  // kReplacementChar for invalid input
  CharClass cls;
};

std::vector<Char> Classify(std::string_view text) {
  std::vector<Char> chars;
  chars.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const DecodedChar d = DecodeUtf8At(text, pos);
    CharClass cls = CharClass::kOther;
    if (d.valid) {
      if (d.code_point == '\r' || d.code_point == '\n') {
        cls = CharClass::kNewline;
      } else if (IsWhitespace(d.code_point)) {
        cls = CharClass::kSpace;
      } else if (IsLetter(d.code_point)) {
        cls = CharClass::kLetter;
      } else if (IsNumber(d.code_point)) {
        cls = CharClass::kNumber;
      }
    }
    chars.push_back({pos, d.valid ? d.code_point : kReplacementChar, cls});
    pos += static_cast<size_t>(d.num_bytes);
  }
  return chars;
}

bool IsSpaceClass(CharClass c) { return c == CharClass::kSpace || c == CharClass::kNewline; }

// Scans one pattern over the classified text; each Match* returns the end index (exclusive) of
// a match starting at `i`, or 0 when that alternative does not match (a match is never empty).
class Scanner {
 public:
  explicit Scanner(const std::vector<Char>& chars) : c_(chars), n_(chars.size()) {}

  CharClass cls(size_t i) const { return c_[i].cls; }

  size_t Extend(size_t j, CharClass want) const {
    while (j < n_ && c_[j].cls == want) ++j;
    return j;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive.
  size_t MatchContraction(size_t i, bool ignore_case) const {
    if (c_[i].cp != '\'' || i + 1 >= n_) return 0;
    const auto fold = [&](size_t k) -> char32_t {
      if (k >= n_) return 0;
      char32_t cp = c_[k].cp;
      if (!ignore_case) return cp;
      if (cp >= 'A' && cp <= 'Z') return cp - 'A' + 'a';
      if (cp == 0x017F) return 's';  // LATIN SMALL LETTER LONG S folds to 's'
      return cp;
    };
    const char32_t a = fold(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    const char32_t b = fold(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
  }

  // " ?X+" for a class X (GPT-2 alternatives).
  size_t MatchOptionalSpaceRun(size_t i, CharClass x) const {
    if (c_[i].cp == ' ' && i + 1 < n_ && c_[i + 1].cls == x) return Extend(i + 1, x);
    if (c_[i].cls == x) return Extend(i, x);
    return 0;
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t MatchPrefixedLetters(size_t i) const {
    if (c_[i].cls == CharClass::kLetter) return Extend(i, CharClass::kLetter);
    const CharClass c0 = c_[i].cls;
    if ((c0 == CharClass::kSpace || c0 == CharClass::kOther) && i + 1 < n_ &&
        c_[i + 1].cls == CharClass::kLetter) {
      return Extend(i + 1, CharClass::kLetter);
    }
    return 0;
  }

  // \p{N}{1,max}
  size_t MatchNumbers(size_t i, size_t max) const {
    size_t j = i;
    while (j < n_ && j - i < max && c_[j].cls == CharClass::kNumber) ++j;
    return j == i ? 0 : j;
  }

  // " ?[^\s\p{L}\p{N}]+[\r\n]*"
  size_t MatchPunctuation(size_t i) const {
    const size_t j = MatchOptionalSpaceRun(i, CharClass::kOther);
    return j == 0 ? 0 : Extend(j, CharClass::kNewline);
  }

  size_t WhitespaceRunEnd(size_t i) const {
    size_t j = i;
    while (j < n_ && IsSpaceClass(c_[j].cls)) ++j;
    return j;
  }

  // \s*[\r\n]+ : the whitespace run up to and including its last CR/LF.
  size_t MatchSpacesToNewline(size_t i) const {
    const size_t end = WhitespaceRunEnd(i);
    for (size_t k = end; k > i; --k) {
      if (c_[k - 1].cls == CharClass::kNewline) return k;
    }
    return 0;
  }

  // \s+(?!\S)|\s+ : the whole run at the end of the text or before more whitespace; otherwise
  // all but its last character (which then goes with the following word), or the single char.
  size_t MatchSpaces(size_t i) const {
    const size_t end = WhitespaceRunEnd(i);
    if (end == i) return 0;
    if (end == n_) return end;
    if (end - i >= 2) return end - 1;
    return end;
  }

 private:
  const std::vector<Char>& c_;
  size_t n_;
};

size_t MatchGpt2(const Scanner& s, size_t i) {
  if (size_t j = s.MatchContraction(i, /*ignore_case=*/false)) return j;
  if (size_t j = s.MatchOptionalSpaceRun(i, CharClass::kLetter)) return j;
  if (size_t j = s.MatchOptionalSpaceRun(i, CharClass::kNumber)) return j;
  if (size_t j = s.MatchOptionalSpaceRun(i, CharClass::kOther)) return j;
  return s.MatchSpaces(i);
}

size_t MatchGpt4(const Scanner& s, size_t i, size_t max_digits) {
  if (size_t j = s.MatchContraction(i, /*ignore_case=*/true)) return j;
  if (size_t j = s.MatchPrefixedLetters(i)) return j;
  if (size_t j = s.MatchNumbers(i, max_digits)) return j;
  if (size_t j = s.MatchPunctuation(i)) return j;
  if (size_t j = s.MatchSpacesToNewline(i)) return j;
  return s.MatchSpaces(i);
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

std::optional<SplitPattern> RecognizeSplitPattern(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  if (regex == kGpt4Regex) return SplitPattern::kGpt4;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  return std::nullopt;
}

std::string_view SplitPatternRegex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return kGpt2Regex;
    case SplitPattern::kGpt4:
      return kGpt4Regex;
    case SplitPattern::kQwen2:
      return kQwen2Regex;
  }
  return {};
}

std::vector<std::string_view> SplitWords(std::string_view text, SplitPattern pattern) {
  const std::vector<Char> chars = Classify(text);
  const Scanner scanner(chars);
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < chars.size()) {
    size_t j = 0;
    switch (pattern) {
      case SplitPattern::kGpt2:
        j = MatchGpt2(scanner, i);
        break;
      case SplitPattern::kGpt4:
        j = MatchGpt4(scanner, i, 3);
        break;
      case SplitPattern::kQwen2:
        j = MatchGpt4(scanner, i, 1);
        break;
    }
    if (j <= i) j = i + 1;  // unreachable: every character class has an alternative
    const size_t begin = chars[i].pos;
    const size_t end = j < chars.size() ? chars[j].pos : text.size();
    words.push_back(text.substr(begin, end - begin));
    i = j;
  }
  return words;
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
