#include "launch/json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <unordered_set>

namespace rl::json {
namespace {

// The length (1 to 4) of the well-formed UTF-8 sequence that starts at s[i], or 0 when the bytes
// there are not one (overlong forms, surrogates and code points above U+10FFFF are not).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 == 0xE0) {
    length = 3;
    low = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    length = 3;
  } else if (b0 == 0xED) {
    length = 3;
    high = 0x9F;
  } else if (b0 == 0xF0) {
    length = 4;
    low = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    length = 4;
  } else if (b0 == 0xF4) {
    length = 4;
    high = 0x8F;
  } else {
    return 0;
  }
  if (s.size() - i < length) return 0;
  const unsigned char b1 = byte(i + 1);
  if (b1 < low || b1 > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  return length;
}

void AppendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// Appends `s` as a quoted JSON string. Throws TypeError when `s` is not UTF-8.
void AppendQuoted(std::string_view s, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else if (c < 0x80) {
          out += static_cast<char>(c);
        } else {
          const size_t length = Utf8SequenceLength(s, i);
          if (length == 0) {
            throw TypeError(fmt::format(
                "cannot write a string as JSON: byte 0x{:02X} at offset {} is not valid UTF-8", c,
                i));
          }
          out.append(s.data() + i, length);
          i += length;
          continue;
        }
    }
    ++i;
  }
  out += '"';
}

// A short quoted rendering of `s` for messages.
std::string Preview(std::string_view s) {
  constexpr size_t kMaxBytes = 40;
  std::string out;
  try {
    AppendQuoted(s.substr(0, kMaxBytes), out);
  } catch (const TypeError&) {
    out = "\"(not UTF-8)\"";
  }
  if (s.size() > kMaxBytes) out += "...";
  return out;
}

std::string Describe(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNull:
      return "null";
    case Value::Kind::kBool:
      return v.AsBool() ? "bool true" : "bool false";
    case Value::Kind::kNumber:
      return v.is_integer() ? fmt::format("number {}", v.AsInt64())
                            : fmt::format("number {}", v.AsDouble());
    case Value::Kind::kString:
      return "string " + Preview(v.AsString());
    case Value::Kind::kArray:
      return fmt::format("array of {} elements", v.AsArray().size());
    case Value::Kind::kObject:
      return fmt::format("object with {} members", v.AsObject().size());
  }
  return "?";
}

[[noreturn]] void ThrowWrongKind(std::string_view expected, const Value& found) {
  throw TypeError(fmt::format("expected {}, found {}", expected, Describe(found)));
}

// The decimal exponent of the leading nonzero digit of a valid JSON number (1234.5 -> 3,
// 0.0012 -> -3, 5e-400 -> -400), saturating far beyond any double. Tells a number that overflows a
// double from one that underflows it.
int64_t DecimalExponent(std::string_view number) {
  constexpr int64_t kSaturation = int64_t{1} << 40;
  size_t i = number[0] == '-' ? 1 : 0;
  int64_t magnitude = 0;
  bool seen_nonzero = false;
  int64_t digits_before_point = 0;
  for (; i < number.size() && number[i] >= '0' && number[i] <= '9'; ++i) {
    if (!seen_nonzero && number[i] != '0') seen_nonzero = true;
    if (seen_nonzero) ++digits_before_point;
  }
  magnitude = digits_before_point - 1;
  if (i < number.size() && number[i] == '.') {
    int64_t position = 0;
    for (++i; i < number.size() && number[i] >= '0' && number[i] <= '9'; ++i) {
      --position;
      if (!seen_nonzero && number[i] != '0') {
        seen_nonzero = true;
        magnitude = position;
      }
    }
  }
  int64_t exponent = 0;
  if (i < number.size() && (number[i] == 'e' || number[i] == 'E')) {
    ++i;
    const bool negative = i < number.size() && number[i] == '-';
    if (i < number.size() && (number[i] == '-' || number[i] == '+')) ++i;
    for (; i < number.size(); ++i)
      exponent = std::min(exponent * 10 + (number[i] - '0'), kSaturation);
    if (negative) exponent = -exponent;
  }
  return magnitude + exponent;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value ParseDocument() {
    SkipWhitespace();
    Value value = ParseValue(/*depth=*/0);
    SkipWhitespace();
    if (pos_ != text_.size()) Fail("unexpected characters after the JSON value");
    return value;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  unsigned char Peek() const { return static_cast<unsigned char>(text_[pos_]); }

  [[noreturn]] void FailAt(size_t offset, std::string reason) const {
    if (offset >= text_.size()) reason = "unexpected end of input: " + reason;
    offset = std::min(offset, text_.size());
    int64_t line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < offset; ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    throw ParseError(std::move(reason), line, static_cast<int64_t>(offset - line_start) + 1,
                     static_cast<int64_t>(offset));
  }
  [[noreturn]] void Fail(std::string reason) const { FailAt(pos_, std::move(reason)); }

  // "'x'" for printable ASCII, "byte 0xNN" otherwise.
  std::string DescribeCurrent() const {
    const unsigned char c = Peek();
    if (c >= 0x20 && c < 0x7F) return fmt::format("'{}'", static_cast<char>(c));
    return fmt::format("byte 0x{:02X}", c);
  }

  void SkipWhitespace() {
    while (!AtEnd()) {
      const unsigned char c = Peek();
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++pos_;
    }
  }

  Value ParseValue(int depth) {
    if (AtEnd()) Fail("expected a value");
    switch (Peek()) {
      case '{':
        return ParseObject(depth + 1);
      case '[':
        return ParseArray(depth + 1);
      case '"':
        return Value::String(ParseString());
      case 't':
        ExpectLiteral("true");
        return Value::Bool(true);
      case 'f':
        ExpectLiteral("false");
        return Value::Bool(false);
      case 'n':
        ExpectLiteral("null");
        return Value();
      case 'N':
      case 'I':
        Fail("NaN and Infinity are not valid JSON numbers");
      default:
        if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) return ParseNumber();
        Fail(fmt::format("expected a value, found {}", DescribeCurrent()));
    }
  }

  void ExpectLiteral(std::string_view literal) {
    for (size_t i = 0; i < literal.size(); ++i) {
      if (pos_ + i >= text_.size() || text_[pos_ + i] != literal[i]) {
        FailAt(pos_ + i, fmt::format("invalid literal, expected '{}'", literal));
      }
    }
    pos_ += literal.size();
  }

  void CheckDepth(int depth) const {
    if (depth > kMaxDepth) {
      Fail(fmt::format("nesting deeper than {} arrays/objects", kMaxDepth));
    }
  }

  Value ParseArray(int depth) {
    CheckDepth(depth);
    ++pos_;  // '['
    Value::Array elements;
    SkipWhitespace();
    if (!AtEnd() && Peek() == ']') {
      ++pos_;
      return Value::MakeArray(std::move(elements));
    }
    while (true) {
      elements.push_back(ParseValue(depth));
      SkipWhitespace();
      if (AtEnd()) Fail("expected ',' or ']' after an array element");
      if (Peek() == ']') {
        ++pos_;
        return Value::MakeArray(std::move(elements));
      }
      if (Peek() != ',') Fail("expected ',' or ']' after an array element");
      ++pos_;
      SkipWhitespace();
      if (!AtEnd() && Peek() == ']') Fail("trailing comma before ']'");
    }
  }

  Value ParseObject(int depth) {
    CheckDepth(depth);
    ++pos_;  // '{'
    Value::Object members;
    std::unordered_set<std::string> keys;
    SkipWhitespace();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      return Value::MakeObject(std::move(members));
    }
    while (true) {
      if (AtEnd() || Peek() != '"') Fail("expected '\"' to start an object key");
      const size_t key_offset = pos_;
      std::string key = ParseString();
      if (!keys.insert(key).second) {
        FailAt(key_offset, fmt::format("duplicate object key {}", Preview(key)));
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != ':') Fail("expected ':' after an object key");
      ++pos_;
      SkipWhitespace();
      Value value = ParseValue(depth);
      members.emplace_back(std::move(key), std::move(value));
      SkipWhitespace();
      if (AtEnd()) Fail("expected ',' or '}' after an object member");
      if (Peek() == '}') {
        ++pos_;
        return Value::MakeObject(std::move(members));
      }
      if (Peek() != ',') Fail("expected ',' or '}' after an object member");
      ++pos_;
      SkipWhitespace();
      if (!AtEnd() && Peek() == '}') Fail("trailing comma before '}'");
    }
  }

  // Four hex digits at text_[at..at+4) as a number.
  uint32_t ParseHex4(size_t at) const {
    uint32_t value = 0;
    for (size_t i = at; i < at + 4; ++i) {
      if (i >= text_.size()) FailAt(i, "expected four hex digits after \\u");
      const char c = text_[i];
      uint32_t digit = 0;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        FailAt(i, "expected four hex digits after \\u");
      }
      value = value * 16 + digit;
    }
    return value;
  }

  // At a '"'; returns the decoded contents and moves past the closing quote.
  std::string ParseString() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (AtEnd()) Fail("expected '\"' to close a string");
      const unsigned char c = Peek();
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c == '\\') {
        ParseEscape(out);
      } else if (c < 0x20) {
        Fail(fmt::format("control character 0x{:02X} in a string must be escaped", c));
      } else if (c < 0x80) {
        // A run of plain ASCII in one append.
        const size_t start = pos_;
        while (!AtEnd() && Peek() >= 0x20 && Peek() < 0x80 && Peek() != '"' && Peek() != '\\') {
          ++pos_;
        }
        out.append(text_.data() + start, pos_ - start);
      } else {
        const size_t length = Utf8SequenceLength(text_, pos_);
        if (length == 0) Fail(fmt::format("invalid UTF-8 byte 0x{:02X} in a string", c));
        out.append(text_.data() + pos_, length);
        pos_ += length;
      }
    }
  }

  // At a backslash inside a string.
  void ParseEscape(std::string& out) {
    const size_t escape_offset = pos_;
    if (pos_ + 1 >= text_.size()) FailAt(pos_ + 1, "expected an escape character after '\\'");
    const char e = text_[pos_ + 1];
    switch (e) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case '/':
        out += '/';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        uint32_t code_point = ParseHex4(pos_ + 2);
        pos_ += 6;
        if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
          FailAt(escape_offset, fmt::format("unpaired low surrogate \\u{:04X}", code_point));
        }
        if (code_point >= 0xD800 && code_point <= 0xDBFF) {
          if (pos_ + 1 >= text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
            FailAt(escape_offset, fmt::format("unpaired high surrogate \\u{:04X}", code_point));
          }
          const uint32_t low = ParseHex4(pos_ + 2);
          if (low < 0xDC00 || low > 0xDFFF) {
            FailAt(escape_offset, fmt::format("high surrogate \\u{:04X} is followed by \\u{:04X}, "
                                              "not a low surrogate",
                                              code_point, low));
          }
          pos_ += 6;
          code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
        }
        AppendUtf8(code_point, out);
        return;
      }
      default: {
        const auto byte = static_cast<unsigned char>(e);
        FailAt(
            escape_offset,
            byte >= 0x20 && byte < 0x7F
                ? fmt::format("invalid escape '\\{}' in a string", e)
                : fmt::format("invalid escape (backslash then byte 0x{:02X}) in a string", byte));
      }
    }
    pos_ += 2;
  }

  bool AtDigit() const { return !AtEnd() && Peek() >= '0' && Peek() <= '9'; }
  void SkipDigits() {
    while (AtDigit()) ++pos_;
  }

  Value ParseNumber() {
    const size_t start = pos_;
    if (Peek() == '-') {
      ++pos_;
      if (!AtEnd() && (Peek() == 'I' || Peek() == 'N')) {
        Fail("NaN and Infinity are not valid JSON numbers");
      }
    }
    if (!AtDigit()) Fail("expected a digit in a number");
    if (Peek() == '0') {
      ++pos_;
      if (AtDigit()) FailAt(start, "leading zeros are not allowed in numbers");
    } else {
      SkipDigits();
    }
    bool integral = true;
    if (!AtEnd() && Peek() == '.') {
      ++pos_;
      if (!AtDigit()) Fail("expected a digit after the decimal point");
      SkipDigits();
      integral = false;
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      ++pos_;
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) ++pos_;
      if (!AtDigit()) Fail("expected a digit in the exponent");
      SkipDigits();
      integral = false;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      int64_t value = 0;
      const auto [ptr, ec] = std::from_chars(first, last, value);
      if (ec == std::errc() && ptr == last) return Value::Int(value);
      // Beyond int64: kept as a double, like any other number.
    }
    double value = 0;
    const auto [ptr, ec] = std::from_chars(first, last, value);
    if (ec == std::errc::result_out_of_range) {
      // Underflow reads as (signed) zero; overflow has no double.
      if (DecimalExponent(std::string_view(first, last - first)) < 0) {
        return Value::Double(*first == '-' ? -0.0 : 0.0);
      }
      FailAt(start, "number is beyond the range of a double");
    }
    if (ec != std::errc() || ptr != last) FailAt(start, "invalid number");
    return Value::Double(value);
  }

  std::string_view text_;
  size_t pos_ = 0;
};

void AppendNewline(int indent, int depth, std::string& out) {
  out += '\n';
  out.append(static_cast<size_t>(indent) * depth, ' ');
}

void DumpTo(const Value& v, int indent, int depth, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kNull:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.AsBool() ? "true" : "false";
      return;
    case Value::Kind::kNumber: {
      if (v.is_integer()) {
        out += fmt::format("{}", v.AsInt64());
        return;
      }
      std::string number = fmt::format("{}", v.AsDouble());
      if (number.find_first_of(".e") == std::string::npos) number += ".0";
      out += number;
      return;
    }
    case Value::Kind::kString:
      AppendQuoted(v.AsString(), out);
      return;
    case Value::Kind::kArray: {
      const Value::Array& elements = v.AsArray();
      if (elements.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < elements.size(); ++i) {
        if (i > 0) out += ',';
        if (indent >= 0) AppendNewline(indent, depth + 1, out);
        DumpTo(elements[i], indent, depth + 1, out);
      }
      if (indent >= 0) AppendNewline(indent, depth, out);
      out += ']';
      return;
    }
    case Value::Kind::kObject: {
      const Value::Object& members = v.AsObject();
      if (members.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::string_view> keys;
      keys.reserve(members.size());
      for (const auto& [key, unused] : members) keys.push_back(key);
      std::sort(keys.begin(), keys.end());
      const auto repeated = std::adjacent_find(keys.begin(), keys.end());
      if (repeated != keys.end()) {
        throw TypeError(fmt::format("cannot write an object as JSON: key {} appears twice",
                                    Preview(*repeated)));
      }
      out += '{';
      for (size_t i = 0; i < members.size(); ++i) {
        if (i > 0) out += ',';
        if (indent >= 0) AppendNewline(indent, depth + 1, out);
        AppendQuoted(members[i].first, out);
        out += indent >= 0 ? ": " : ":";
        DumpTo(members[i].second, indent, depth + 1, out);
      }
      if (indent >= 0) AppendNewline(indent, depth, out);
      out += '}';
      return;
    }
  }
}

}  // namespace

ParseError::ParseError(std::string reason, int64_t line, int64_t column, int64_t offset)
    : Error(fmt::format("line {}, column {}: {}", line, column, reason)),
      reason_(std::move(reason)),
      line_(line),
      column_(column),
      offset_(offset) {}

Value::Value() = default;
Value::Value(Storage storage) : storage_(std::move(storage)) {}

Value Value::Bool(bool b) { return Value(Storage(b)); }
Value Value::Int(int64_t v) { return Value(Storage(v)); }
Value Value::Double(double v) {
  if (!std::isfinite(v)) {
    throw TypeError(fmt::format("JSON cannot hold the number {}", v));
  }
  return Value(Storage(v));
}
Value Value::String(std::string s) { return Value(Storage(std::move(s))); }
Value Value::MakeArray(Array a) { return Value(Storage(std::move(a))); }
Value Value::MakeObject(Object o) { return Value(Storage(std::move(o))); }

Value::Kind Value::kind() const {
  switch (storage_.index()) {
    case 0:
      return Kind::kNull;
    case 1:
      return Kind::kBool;
    case 2:
    case 3:
      return Kind::kNumber;
    case 4:
      return Kind::kString;
    case 5:
      return Kind::kArray;
    default:
      return Kind::kObject;
  }
}

bool Value::is_integer() const { return std::holds_alternative<int64_t>(storage_); }

bool Value::AsBool() const {
  if (const bool* b = std::get_if<bool>(&storage_)) return *b;
  ThrowWrongKind("a bool", *this);
}

int64_t Value::AsInt64() const {
  if (const int64_t* i = std::get_if<int64_t>(&storage_)) return *i;
  if (const double* d = std::get_if<double>(&storage_)) {
    // [-2^63, 2^63) holds every integral double that int64 can represent.
    constexpr double kTwoTo63 = 9223372036854775808.0;
    if (std::trunc(*d) == *d && *d >= -kTwoTo63 && *d < kTwoTo63) {
      return static_cast<int64_t>(*d);
    }
  }
  ThrowWrongKind("an integer", *this);
}

double Value::AsDouble() const {
  if (const double* d = std::get_if<double>(&storage_)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(&storage_)) return static_cast<double>(*i);
  ThrowWrongKind("a number", *this);
}

const std::string& Value::AsString() const {
  if (const std::string* s = std::get_if<std::string>(&storage_)) return *s;
  ThrowWrongKind("a string", *this);
}

const Value::Array& Value::AsArray() const {
  if (const Array* a = std::get_if<Array>(&storage_)) return *a;
  ThrowWrongKind("an array", *this);
}

const Value::Object& Value::AsObject() const {
  if (const Object* o = std::get_if<Object>(&storage_)) return *o;
  ThrowWrongKind("an object", *this);
}

const Value* Value::Find(std::string_view key) const {
  const Object* o = std::get_if<Object>(&storage_);
  if (o == nullptr) return nullptr;
  for (const auto& [name, value] : *o) {
    if (name == key) return &value;
  }
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  if (!is_object()) ThrowWrongKind(fmt::format("an object with key {}", Preview(key)), *this);
  const Value* v = Find(key);
  if (v == nullptr) throw TypeError(fmt::format("missing key {}", Preview(key)));
  return *v;
}

Value::Array& Value::MutableArray() {
  if (Array* a = std::get_if<Array>(&storage_)) return *a;
  ThrowWrongKind("an array", *this);
}

Value::Object& Value::MutableObject() {
  if (Object* o = std::get_if<Object>(&storage_)) return *o;
  ThrowWrongKind("an object", *this);
}

Value& Value::Set(std::string key, Value v) {
  Object& members = MutableObject();
  for (auto& [name, value] : members) {
    if (name == key) {
      value = std::move(v);
      return value;
    }
  }
  members.emplace_back(std::move(key), std::move(v));
  return members.back().second;
}

bool operator==(const Value& a, const Value& b) { return a.storage_ == b.storage_; }

std::string_view KindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kNull:
      return "null";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kNumber:
      return "number";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kArray:
      return "array";
    case Value::Kind::kObject:
      return "object";
  }
  return "?";
}

Value Parse(std::string_view text) { return Parser(text).ParseDocument(); }

Value ParseFile(const std::string& path) {
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    throw CheckpointError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::string text;
  char buffer[1 << 16];
  while (true) {
    const size_t n = std::fread(buffer, 1, sizeof(buffer), file.get());
    text.append(buffer, n);
    if (n < sizeof(buffer)) break;
  }
  if (std::ferror(file.get())) {
    throw CheckpointError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  }
  try {
    return Parse(text);
  } catch (const ParseError& e) {
    throw CheckpointError(fmt::format("{}: {}", path, e.what()));
  }
}

std::string Dump(const Value& v, int indent) {
  std::string out;
  DumpTo(v, indent, /*depth=*/0, out);
  return out;
}

}  // namespace rl::json
