#include "trainer/data/rewards.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "launch/check.h"
#include "trainer/data/toy_task.h"

namespace rl::data {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAsciiAlnum(char c) { return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string_view Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\n\v\f");
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(" \t\r\n\v\f");
  return s.substr(begin, end - begin + 1);
}

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  for (size_t pos = 0; (pos = s->find(from, pos)) != std::string::npos; pos += to.size()) {
    s->replace(pos, from.size(), to);
  }
}

// The end (one past the closing brace) of the balanced group opening at s[open] == '{', or npos.
size_t MatchBrace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

std::optional<std::string> LastBoxed(std::string_view s) {
  constexpr std::string_view kBoxed = "\\boxed";
  for (size_t pos = s.rfind(kBoxed); pos != std::string_view::npos;
       pos = pos == 0 ? std::string_view::npos : s.rfind(kBoxed, pos - 1)) {
    size_t open = pos + kBoxed.size();
    while (open < s.size() && s[open] == ' ') ++open;
    if (open >= s.size() || s[open] != '{') continue;
    const size_t end = MatchBrace(s, open);
    if (end != std::string_view::npos) return std::string(s.substr(open + 1, end - open - 2));
  }
  return std::nullopt;
}

// Length of an unsigned number at s[i] (digits with thousands commas, decimals), 0 if none.
size_t UnsignedNumberLength(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size() && IsDigit(s[j])) ++j;
  if (j > i && j - i <= 3) {  // thousands groups: ",ddd" not followed by another digit
    while (j + 3 < s.size() && s[j] == ',' && IsDigit(s[j + 1]) && IsDigit(s[j + 2]) &&
           IsDigit(s[j + 3]) && (j + 4 == s.size() || !IsDigit(s[j + 4]))) {
      j += 4;
    }
  }
  if (j < s.size() && s[j] == '.' && j + 1 < s.size() && IsDigit(s[j + 1])) {
    ++j;
    while (j < s.size() && IsDigit(s[j])) ++j;
  }
  return j - i;
}

std::optional<std::string> LastNumber(std::string_view s) {
  std::optional<std::string> last;
  size_t i = 0;
  while (i < s.size()) {
    const bool starts_here =
        (IsDigit(s[i]) || (s[i] == '.' && i + 1 < s.size() && IsDigit(s[i + 1]))) &&
        (i == 0 || !IsDigit(s[i - 1]));
    if (!starts_here) {
      ++i;
      continue;
    }
    size_t begin = i;
    size_t end = i + UnsignedNumberLength(s, i);
    // A fraction "a/b".
    if (end + 1 < s.size() && s[end] == '/' && IsDigit(s[end + 1])) {
      end += 1 + UnsignedNumberLength(s, end + 1);
    }
    // A sign that is not a binary minus ("5-3" has no negative number).
    if (begin > 0 && (s[begin - 1] == '-' || s[begin - 1] == '+') &&
        (begin == 1 || !(IsAsciiAlnum(s[begin - 2]) || s[begin - 2] == ')'))) {
      --begin;
    }
    last = std::string(s.substr(begin, end - begin));
    i = end;
  }
  return last;
}

// Replaces \frac{a}{b} (and \dfrac, \tfrac) by a/b.
void RewriteFractions(std::string* s) {
  for (const std::string_view command : {"\\dfrac", "\\tfrac", "\\frac"}) {
    size_t pos;
    while ((pos = s->find(command)) != std::string::npos) {
      const size_t open1 = pos + command.size();
      const size_t end1 =
          open1 < s->size() && (*s)[open1] == '{' ? MatchBrace(*s, open1) : std::string::npos;
      const size_t end2 = end1 != std::string::npos && end1 < s->size() && (*s)[end1] == '{'
                              ? MatchBrace(*s, end1)
                              : std::string::npos;
      if (end2 == std::string::npos) break;  // not a well-formed \frac: leave it
      const std::string num = s->substr(open1 + 1, end1 - open1 - 2);
      const std::string den = s->substr(end1 + 1, end2 - end1 - 2);
      s->replace(pos, end2 - pos, num + "/" + den);
    }
  }
}

bool IsThousandsNumber(std::string_view s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  const size_t n = UnsignedNumberLength(s, i);
  return n > 0 && i + n == s.size() && s.find(',') != std::string_view::npos;
}

// A strict decimal: digits with an optional fraction part, or .digits.
std::optional<double> ParseDecimal(std::string_view s) {
  if (s.empty()) return std::nullopt;
  bool digits = false;
  bool dot = false;
  for (const char c : s) {
    if (IsDigit(c)) {
      digits = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return std::strtod(std::string(s).c_str(), nullptr);
}

}  // namespace

std::optional<std::string> ExtractMathAnswer(std::string_view response) {
  if (std::optional<std::string> boxed = LastBoxed(response)) return boxed;
  return LastNumber(response);
}

std::string NormalizeMathAnswer(std::string_view answer) {
  std::string s(Trim(answer));
  ReplaceAll(&s, "\xE2\x88\x92", "-");  // U+2212 MINUS SIGN
  for (const std::string_view noise : {"\\left", "\\right", "\\!", "\\,", "\\;"}) {
    ReplaceAll(&s, noise, "");
  }
  s.erase(std::remove_if(
              s.begin(), s.end(),
              [](char c) { return c == '$' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; }),
          s.end());
  RewriteFractions(&s);
  while (!s.empty() && s.back() == '.') s.pop_back();
  if (IsThousandsNumber(s)) s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  return s;
}

std::optional<double> ParseMathNumber(std::string_view s) {
  double sign = 1.0;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    sign = s[0] == '-' ? -1.0 : 1.0;
    s.remove_prefix(1);
  }
  const size_t slash = s.find('/');
  if (slash == std::string_view::npos) {
    const std::optional<double> v = ParseDecimal(s);
    if (!v) return std::nullopt;
    return sign * *v;
  }
  const std::optional<double> num = ParseDecimal(s.substr(0, slash));
  const std::optional<double> den = ParseDecimal(s.substr(slash + 1));
  if (!num || !den || *den == 0.0) return std::nullopt;
  return sign * *num / *den;
}

double ExactMatchReward(std::string_view response, std::string_view label) {
  return Trim(response) == Trim(label) ? 1.0 : 0.0;
}

double MathReward(std::string_view response, std::string_view label) {
  const std::optional<std::string> answer = ExtractMathAnswer(response);
  if (!answer) return 0.0;
  const std::optional<std::string> boxed_label = LastBoxed(label);
  const std::string want = NormalizeMathAnswer(boxed_label ? *boxed_label : label);
  const std::string got = NormalizeMathAnswer(*answer);
  if (got.empty()) return 0.0;
  const std::optional<double> a = ParseMathNumber(got);
  const std::optional<double> b = ParseMathNumber(want);
  if (a && b) {
    const double scale = std::max({1.0, std::fabs(*a), std::fabs(*b)});
    return std::fabs(*a - *b) <= 1e-9 * scale ? 1.0 : 0.0;
  }
  return got == want ? 1.0 : 0.0;
}

RewardFn MakeRewardFn(RewardType type) {
  switch (type) {
    case RewardType::kExactMatch:
      return ExactMatchReward;
    case RewardType::kMath:
      return MathReward;
    case RewardType::kToy:
      return ToyTaskReward;
  }
  throw Error("MakeRewardFn: not a RewardType");
}

}  // namespace rl::data
