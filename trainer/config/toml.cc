#include "trainer/config/toml.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "launch/check.h"

namespace rl::config {

std::string_view TomlValue::TypeName() const {
  switch (value.index()) {
    case 0:
      return "boolean";
    case 1:
      return "integer";
    case 2:
      return "float";
    case 3:
      return "string";
    default:
      return "array";
  }
}

namespace {

class LineParser {
 public:
  LineParser(std::string_view line, const std::string& source, int line_number)
      : text_(line), source_(source), line_number_(line_number) {}

  [[noreturn]] void Fail(std::string_view what) const {
    throw ConfigError(fmt::format("{}:{}: {}", source_, line_number_, what));
  }

  void SkipSpaces() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool AtEnd() {
    SkipSpaces();
    return pos_ >= text_.size() || text_[pos_] == '#';
  }
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    SkipSpaces();
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }

  std::string BareKey() {
    SkipSpaces();
    const size_t start = pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') {
        ++pos_;
      } else {
        break;
      }
    }
    if (start == pos_) Fail("expected a key (letters, digits, '_' or '-')");
    if (Peek() == '.') Fail("dotted keys are not supported; use a [section] header");
    return std::string(text_.substr(start, pos_ - start));
  }

  TomlValue Value(int depth) {
    SkipSpaces();
    const char c = Peek();
    if (c == '"') return {BasicString()};
    if (c == '\'') return {LiteralString()};
    if (c == '[') return {Array(depth)};
    if (c == '{') Fail("inline tables are not supported");
    if (text_.substr(pos_, 4) == "true") {
      pos_ += 4;
      return {true};
    }
    if (text_.substr(pos_, 5) == "false") {
      pos_ += 5;
      return {false};
    }
    return Number();
  }

  void ExpectEnd() {
    if (!AtEnd()) Fail(fmt::format("unexpected '{}' after the value", text_.substr(pos_)));
  }

 private:
  std::string BasicString() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) Fail("unterminated string (multi-line strings are not supported)");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) Fail("unterminated escape in string");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          // Exactly four hex digits: strtol alone also takes a sign, spaces and "0x".
          const std::string hex(text_.substr(pos_, 4));
          if (hex.size() != 4 || !std::all_of(hex.begin(), hex.end(), [](char h) {
                return std::isxdigit(static_cast<unsigned char>(h));
              })) {
            Fail("\\u needs 4 hex digits");
          }
          const long code = std::strtol(hex.c_str(), nullptr, 16);
          if (code >= 0xD800 && code <= 0xDFFF) {
            Fail(fmt::format("\\u{} is a UTF-16 surrogate, not a character", hex));
          }
          pos_ += 4;
          if (code < 0x80) {
            out.push_back(static_cast<char>(code));
          } else if (code < 0x800) {
            out.push_back(static_cast<char>(0xC0 | (code >> 6)));
            out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
          } else {
            out.push_back(static_cast<char>(0xE0 | (code >> 12)));
            out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
          }
          break;
        }
        default:
          Fail(fmt::format("unknown escape '\\{}' in string", e));
      }
    }
  }

  std::string LiteralString() {
    ++pos_;
    const size_t end = text_.find('\'', pos_);
    if (end == std::string_view::npos) Fail("unterminated literal string");
    std::string out(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }

  TomlArray Array(int depth) {
    if (depth > 8) Fail("arrays nested too deeply");
    ++pos_;  // [
    TomlArray out;
    while (true) {
      SkipSpaces();
      if (Consume(']')) return out;
      if (pos_ >= text_.size()) Fail("unterminated array (multi-line arrays are not supported)");
      out.push_back(Value(depth + 1));
      SkipSpaces();
      if (Consume(',')) continue;
      if (Consume(']')) return out;
      Fail("expected ',' or ']' in array");
    }
  }

  TomlValue Number() {
    const size_t start = pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.' ||
          c == '_') {
        ++pos_;
      } else {
        break;
      }
    }
    std::string token;
    for (char c : text_.substr(start, pos_ - start)) {
      if (c != '_') token.push_back(c);
    }
    if (token.empty()) Fail("expected a value (string, number, boolean or array)");
    const size_t first = (token[0] == '+' || token[0] == '-') ? 1 : 0;
    if (first >= token.size() || !std::isdigit(static_cast<unsigned char>(token[first]))) {
      Fail(fmt::format("'{}' is not a value (strings need quotes)", token));
    }
    const bool is_float = token.find_first_of(".eE") != std::string::npos &&
                          token.find_first_of("xX") == std::string::npos;
    errno = 0;
    char* end = nullptr;
    if (is_float) {
      const double v = std::strtod(token.c_str(), &end);
      if (end != token.c_str() + token.size() || errno == ERANGE) {
        Fail(fmt::format("'{}' is not a number", token));
      }
      return {v};
    }
    const long long v = std::strtoll(token.c_str(), &end, 10);
    if (end != token.c_str() + token.size()) {
      Fail(fmt::format("'{}' is not a value (strings need quotes)", token));
    }
    if (errno == ERANGE) Fail(fmt::format("integer '{}' is out of range", token));
    return {static_cast<int64_t>(v)};
  }

  std::string_view text_;
  const std::string& source_;
  int line_number_;
  size_t pos_ = 0;
};

}  // namespace

TomlDocument ParseToml(std::string_view text, std::string source) {
  TomlDocument doc;
  doc.source = std::move(source);
  std::string section;
  std::set<std::pair<std::string, std::string>> seen;
  std::set<std::string> sections_seen;
  int line_number = 0;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++line_number;
    begin = end + 1;

    LineParser p(line, doc.source, line_number);
    if (p.AtEnd()) {
      if (end == text.size()) break;
      continue;
    }
    if (p.Consume('[')) {
      if (p.Peek() == '[') p.Fail("arrays of tables are not supported");
      section = p.BareKey();
      if (!p.Consume(']')) p.Fail("expected ']' after the section name");
      p.ExpectEnd();
      if (!sections_seen.insert(section).second) {
        p.Fail(fmt::format("section [{}] appears twice", section));
      }
    } else {
      TomlEntry entry;
      entry.section = section;
      entry.key = p.BareKey();
      entry.line = line_number;
      if (!p.Consume('=')) p.Fail(fmt::format("expected '=' after key '{}'", entry.key));
      entry.value = p.Value(0);
      p.ExpectEnd();
      if (!seen.insert({section, entry.key}).second) {
        p.Fail(fmt::format("key '{}' appears twice in [{}]", entry.key, section));
      }
      doc.entries.push_back(std::move(entry));
    }
    if (end == text.size()) break;
  }
  return doc;
}

TomlDocument ReadTomlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(fmt::format("--config {}: cannot open the file", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return ParseToml(text.str(), path);
}

}  // namespace rl::config
