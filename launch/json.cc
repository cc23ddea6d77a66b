#include "launch/json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>

#include "launch/utf8.h"

namespace rl::json {
namespace {

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
          const DecodedChar d = DecodeUtf8At(s, i);
          if (!d.valid) {
            throw TypeError(fmt::format(
                "cannot write a string as JSON: byte 0x{:02X} at offset {} is not valid UTF-8", c,
                i));
          }
          out.append(s.data() + i, static_cast<size_t>(d.num_bytes));
          i += static_cast<size_t>(d.num_bytes);
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

// ---- Parse: nlohmann's SAX parser builds the Value; this file adds what RFC 8259 and our callers
// need beyond it (duplicate keys, the depth limit, no byte order mark, no NUL after the value)
// and turns its messages into "line L, column C: reason" at the byte the problem starts at.

[[noreturn]] void FailAt(std::string_view text, size_t offset, std::string reason) {
  if (offset >= text.size()) reason = "unexpected end of input: " + reason;
  offset = std::min(offset, text.size());
  int64_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  throw ParseError(std::move(reason), line, static_cast<int64_t>(offset - line_start) + 1,
                   static_cast<int64_t>(offset));
}

// "'x'" for printable ASCII, "byte 0xNN" otherwise.
std::string DescribeByte(unsigned char c) {
  if (c >= 0x20 && c < 0x7F) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("byte 0x{:02X}", c);
}

// A byte iterator for nlohmann's input adapter that records how far the lexer has read: SAX
// events carry no position, and duplicate keys and the depth limit need one.
class TrackedIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedIterator(const char* p, const char** read_end) : p_(p), read_end_(read_end) {}
  reference operator*() const { return *p_; }
  TrackedIterator& operator++() {
    *read_end_ = ++p_;
    return *this;
  }
  bool operator==(const TrackedIterator& other) const { return p_ == other.p_; }
  bool operator!=(const TrackedIterator& other) const { return p_ != other.p_; }

 private:
  const char* p_;
  const char** read_end_;
};

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}
bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The nlohmann::json SAX interface.
class ValueBuilder {
 public:
  ValueBuilder(std::string_view text, const char* const* read_end)
      : text_(text), read_end_(read_end) {}

  bool null() { return Put(Value()); }
  bool boolean(bool b) { return Put(Value::Bool(b)); }
  bool number_integer(int64_t v) { return Put(Value::Int(v)); }
  bool number_unsigned(uint64_t v) {
    // Beyond int64: kept as a double, like any other number.
    return Put(v <= static_cast<uint64_t>(INT64_MAX) ? Value::Int(static_cast<int64_t>(v))
                                                      : Value::Double(static_cast<double>(v)));
  }
  bool number_float(double v, const std::string& /*text*/) { return Put(Value::Double(v)); }
  bool string(std::string& s) { return Put(Value::String(std::move(s))); }
  bool binary(nlohmann::json::binary_t& /*bytes*/) { return false; }  // not in JSON text
  bool start_object(size_t /*unknown*/) { return Open(Value::MakeObject({})); }
  bool start_array(size_t /*unknown*/) { return Open(Value::MakeArray({})); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(std::string& k) {
    Frame& top = stack_.back();
    if (!top.keys.insert(k).second) {
      FailAt(text_, KeyOffset(), fmt::format("duplicate object key {}", Preview(k)));
    }
    top.key = std::move(k);
    return true;
  }

  // `position` counts the bytes the lexer read (one more when it read the end of the input);
  // `token` is what it read of the current token, with control characters written <U+00XX>.
  bool parse_error(size_t position, const std::string& token,
                   const nlohmann::detail::exception& e);

  Value TakeRoot() { return std::move(root_); }

 private:
  struct Frame {
    Value value;
    std::string key;                       // objects: the member being read
    std::unordered_set<std::string> keys;  // objects: every key so far
  };

  size_t ReadOffset() const { return static_cast<size_t>(*read_end_ - text_.data()); }

  // The opening quote of the key the lexer just read: the last '"' before its closing quote that
  // is not escaped (preceded by an even number of backslashes).
  size_t KeyOffset() const {
    size_t i = ReadOffset() - 1;
    while (i > 0) {
      --i;
      if (text_[i] != '"') continue;
      size_t backslashes = 0;
      while (backslashes < i && text_[i - 1 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) break;
    }
    return i;
  }

  bool Open(Value v) {
    if (stack_.size() >= static_cast<size_t>(kMaxDepth)) {
      FailAt(text_, ReadOffset() - 1,
             fmt::format("nesting deeper than {} arrays/objects", kMaxDepth));
    }
    stack_.push_back({std::move(v), {}, {}});
    return true;
  }

  bool Close() {
    Value v = std::move(stack_.back().value);
    stack_.pop_back();
    return Put(std::move(v));
  }

  bool Put(Value v) {
    if (stack_.empty()) {
      root_ = std::move(v);
    } else if (Frame& top = stack_.back(); top.value.is_array()) {
      top.value.MutableArray().push_back(std::move(v));
    } else {
      top.value.MutableObject().emplace_back(std::move(top.key), std::move(v));
    }
    return true;
  }

  std::string_view text_;
  const char* const* read_end_;
  std::vector<Frame> stack_;
  Value root_;
};

bool ValueBuilder::parse_error(size_t position, const std::string& token,
                               const nlohmann::detail::exception& e) {
  constexpr size_t npos = std::string_view::npos;
  const std::string_view what = e.what();
  const size_t size = text_.size();
  const size_t read = std::min(position, size);                 // bytes read
  const size_t last = position == 0 ? 0 : std::min(position - 1, size);  // where it stopped
  const unsigned char c = last < size ? static_cast<unsigned char>(text_[last]) : 0;
  // Strings and numbers are read from their first byte into `token`; only its last byte can be a
  // control character (which ends the token).
  size_t raw = token.size();
  if (raw >= 8 && read > 0 && static_cast<unsigned char>(text_[read - 1]) < 0x20 &&
      token.compare(raw - 8, 5, "<U+00") == 0) {
    raw -= 7;
  }
  const size_t token_start = read >= raw ? read - raw : 0;
  if (e.id == 406) FailAt(text_, token_start, "number is beyond the range of a double");

  // A lexer error quotes the input ("; last read: '<token>'"), which must not be read as the
  // message: split it off.
  const std::string last_read = "; last read: '" + token + "'";
  const size_t quoted = what.rfind(last_read);
  const std::string_view message = what.substr(0, quoted);
  const std::string_view suffix =
      quoted == std::string_view::npos ? what : what.substr(quoted + last_read.size());
  // What the grammar expected decides the message when the token found is wrong as a whole.
  std::string expected;
  if (EndsWith(suffix, "; expected ':'")) {
    expected = "expected ':' after an object key";
  } else if (EndsWith(suffix, "; expected ']'")) {
    expected = "expected ',' or ']' after an array element";
  } else if (EndsWith(suffix, "; expected '}'")) {
    expected = "expected ',' or '}' after an object member";
  } else if (EndsWith(suffix, "; expected end of input")) {
    expected = "unexpected characters after the JSON value";
  }
  const bool key_expected = EndsWith(suffix, "; expected string literal");
  const std::string_view detail =
      message.substr(std::min(message.find(" - "), message.size() - 3) + 3);

  if (StartsWith(detail, "unexpected ")) {  // a well-formed token in the wrong place
    const std::string_view found = detail.substr(11);
    size_t start = last;  // one-byte tokens and the end of the input
    if (StartsWith(found, "string literal") || StartsWith(found, "number literal")) {
      start = token_start;
    } else if (StartsWith(found, "true literal") || StartsWith(found, "null literal")) {
      start = read - 4;
    } else if (StartsWith(found, "false literal")) {
      start = read - 5;
    }
    // A number right after a lone 0 can only be the rest of a number with leading zeros.
    if (StartsWith(found, "number literal") && start > 0 && start < size && text_[start] != '-' &&
        text_[start - 1] == '0') {
      FailAt(text_, start >= 2 && text_[start - 2] == '-' ? start - 2 : start - 1,
             "leading zeros are not allowed in numbers");
    }
    if (start < size && (text_[start] == ']' || text_[start] == '}')) {
      size_t before = start;
      while (before > 0 && std::string_view(" \t\n\r").find(text_[before - 1]) != npos) --before;
      if (before > 0 && text_[before - 1] == ',') {
        FailAt(text_, start, fmt::format("trailing comma before '{}'", text_[start]));
      }
    }
    if (key_expected) FailAt(text_, start, "expected '\"' to start an object key");
    if (!expected.empty()) FailAt(text_, start, expected);
    FailAt(text_, start,
           start < size ? "expected a value, found " + DescribeByte(text_[start])
                        : std::string("expected a value"));
  }

  // The lexer could not read a token.
  const auto has = [&](std::string_view s) { return detail.find(s) != std::string_view::npos; };
  if (StartsWith(detail, "invalid string")) {
    if (!expected.empty()) FailAt(text_, token_start, expected);
    if (has("ill-formed UTF-8")) {
      // nlohmann stops at the first byte that cannot continue the sequence; name its lead byte.
      size_t lead = last;
      for (size_t k = 1; k <= 3 && k <= last; ++k) {
        const auto b = static_cast<unsigned char>(text_[last - k]);
        const DecodedChar d = DecodeUtf8At(text_, last - k);
        if (b >= 0xC2 && b <= 0xF4 && !d.valid && d.num_bytes == static_cast<int>(k)) {
          lead = last - k;
          break;
        }
      }
      FailAt(text_, lead,
             fmt::format("invalid UTF-8 byte 0x{:02X} in a string",
                         lead < size ? static_cast<unsigned char>(text_[lead]) : 0));
    }
    if (has("control character")) {
      FailAt(text_, last, fmt::format("control character 0x{:02X} in a string must be escaped", c));
    }
    if (has("missing closing quote")) FailAt(text_, last, "expected '\"' to close a string");
    if (has("forbidden character after backslash")) {
      if (last >= size) FailAt(text_, last, "expected an escape character after '\\'");
      FailAt(text_, last - 1,
             c >= 0x20 && c < 0x7F
                 ? fmt::format("invalid escape '\\{}' in a string", static_cast<char>(c))
                 : fmt::format("invalid escape (backslash then byte 0x{:02X}) in a string", c));
    }
    if (has("must be followed by 4 hex digits")) {
      FailAt(text_, last, "expected four hex digits after \\u");
    }
    // Surrogates: the lexer read \uXXXX (and maybe a second \uXXXX) before it could tell.
    const auto hex_at = [&](size_t escape) {
      std::string hex(escape + 2 <= size ? text_.substr(escape + 2, 4) : "");
      for (char& h : hex) h = static_cast<char>(std::toupper(static_cast<unsigned char>(h)));
      return hex;
    };
    const auto is_high_escape = [&](size_t at) {
      return at + 6 <= size && text_.substr(at, 2) == "\\u" &&
             std::toupper(static_cast<unsigned char>(text_[at + 2])) == 'D' &&
             std::string_view("89abAB").find(text_[at + 3]) != npos;
    };
    if (has("must follow U+D800") && last >= 5) {
      FailAt(text_, last - 5, "unpaired low surrogate \\u" + hex_at(last - 5));
    }
    if (last >= 11 && text_.substr(last - 5, 2) == "\\u" && is_high_escape(last - 11)) {
      FailAt(text_, last - 11,
             fmt::format("high surrogate \\u{} is followed by \\u{}, not a low surrogate",
                         hex_at(last - 11), hex_at(last - 5)));
    }
    const size_t escape = last >= 6 && is_high_escape(last - 6) ? last - 6 : last - 7;
    FailAt(text_, escape, "unpaired high surrogate \\u" + hex_at(escape));
  }
  if (StartsWith(detail, "invalid number")) {
    if (!expected.empty()) FailAt(text_, token_start, expected);
    if (c == 'I' || c == 'N') FailAt(text_, last, "NaN and Infinity are not valid JSON numbers");
    if (has("after '-'")) FailAt(text_, last, "expected a digit in a number");
    if (has("after '.'")) FailAt(text_, last, "expected a digit after the decimal point");
    FailAt(text_, last, "expected a digit in the exponent");
  }
  // "invalid literal": true/false/null broken off at `last`, or a byte no value starts with.
  for (size_t k = 1; k <= 4 && k <= last; ++k) {
    for (const std::string_view literal : {"true", "false", "null"}) {
      if (k < literal.size() && text_.substr(last - k, k) == literal.substr(0, k)) {
        if (!expected.empty() || key_expected) {
          FailAt(text_, last - k, key_expected ? "expected '\"' to start an object key" : expected);
        }
        FailAt(text_, last, fmt::format("invalid literal, expected '{}'", literal));
      }
    }
  }
  if (key_expected) FailAt(text_, last, "expected '\"' to start an object key");
  if (!expected.empty()) FailAt(text_, last, expected);
  if (c == 'I' || c == 'N') FailAt(text_, last, "NaN and Infinity are not valid JSON numbers");
  FailAt(text_, last, "expected a value, found " + DescribeByte(c));
}

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

Value Parse(std::string_view text) {
  // nlohmann skips a byte order mark, which RFC 8259 does not allow.
  if (!text.empty() && static_cast<unsigned char>(text[0]) == 0xEF) {
    FailAt(text, 0, "expected a value, found byte 0xEF");
  }
  const char* read_end = text.data();
  ValueBuilder builder(text, &read_end);
  nlohmann::json::sax_parse(TrackedIterator(text.data(), &read_end),
                            TrackedIterator(text.data() + text.size(), &read_end), &builder);
  // nlohmann reads a NUL byte as the end of the input; in valid JSON there is none anywhere.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    FailAt(text, nul, "unexpected characters after the JSON value");
  }
  return builder.TakeRoot();
}

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
