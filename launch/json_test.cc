// The JSON reader accepts exactly RFC 8259, reports each error with its line and column, keeps
// integers exact, and the writer's output reads back to the same value.
#include "launch/json.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace rl::json {
namespace {

bool Contains(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

// Every kind of value, nested, with escapes and non-ASCII text.
constexpr const char* kDocument = R"({
  "name": "model.layers.0.self_attn.q_proj.weight",
  "dtype": "BF16",
  "shape": [4096, 4096],
  "data_offsets": [0, 9007199254740993],
  "scale": -1.25e-3,
  "tiny": 5e-324,
  "flags": [true, false, null],
  "text": "tab\there \"quoted\" back\\slash \u00e9 \ud83d\ude00 caf\u00e9 \u4e2d",
  "raw": "café 中文 😀",
  "empty": {"a": [], "b": {}, "c": ""},
  "deep": [[[[{"x": [1, [2, [3]]]}]]]]
})";

Value SampleValue() {
  Value::Object o;
  o.emplace_back("null", Value());
  o.emplace_back("true", Value::Bool(true));
  o.emplace_back("int", Value::Int(-42));
  o.emplace_back("max", Value::Int(std::numeric_limits<int64_t>::max()));
  o.emplace_back("min", Value::Int(std::numeric_limits<int64_t>::min()));
  o.emplace_back("double", Value::Double(0.1));
  o.emplace_back("whole double", Value::Double(3.0));
  o.emplace_back("negative zero", Value::Double(-0.0));
  o.emplace_back("huge", Value::Double(1.7976931348623157e308));
  o.emplace_back("denormal", Value::Double(4.9406564584124654e-324));
  o.emplace_back("controls", Value::String(std::string("\x01\x1f\b\f\n\r\t\"\\/\x7f", 11)));
  o.emplace_back("nul", Value::String(std::string("a\0b", 3)));
  o.emplace_back("utf8", Value::String("é中😀"));
  o.emplace_back("array", Value::MakeArray({Value::Int(1), Value::MakeArray({}), Value()}));
  o.emplace_back("object", Value::MakeObject({{"k", Value::MakeObject({})}}));
  return Value::MakeObject(std::move(o));
}

TEST_CASE("Dump then Parse gives back the same value, compact and indented") {
  const Value value = SampleValue();
  CHECK(Parse(Dump(value)) == value);
  CHECK(Parse(Dump(value, 0)) == value);
  CHECK(Parse(Dump(value, 2)) == value);
}

TEST_CASE("Parse then Dump then Parse gives back the same value for a file") {
  const Value value = Parse(kDocument);
  CHECK(Parse(Dump(value)) == value);
  CHECK(Parse(Dump(value, 4)) == value);
}

TEST_CASE("Compact and indented output have the documented layout") {
  const Value value = Parse(R"({"a": [1, 2.5, "x"], "b": {}, "c": [], "d": {"e": null}})");
  CHECK(Dump(value) == R"({"a":[1,2.5,"x"],"b":{},"c":[],"d":{"e":null}})");
  CHECK(Dump(value, 2) ==
        "{\n"
        "  \"a\": [\n"
        "    1,\n"
        "    2.5,\n"
        "    \"x\"\n"
        "  ],\n"
        "  \"b\": {},\n"
        "  \"c\": [],\n"
        "  \"d\": {\n"
        "    \"e\": null\n"
        "  }\n"
        "}");
}

TEST_CASE("Object members keep file order through Parse and Dump") {
  const std::string text = R"({"z":1,"a":2,"m":{"y":3,"b":4}})";
  CHECK(Dump(Parse(text)) == text);
}

TEST_CASE("Integers are kept exactly as int64, including beyond 2^53") {
  const Value value = Parse("[9007199254740993, -9223372036854775808, 9223372036854775807, 0, -0]");
  const Value::Array& a = value.AsArray();
  REQUIRE(a.size() == 5);
  for (const Value& v : a) CHECK(v.is_integer());
  CHECK(a[0].AsInt64() == (int64_t{1} << 53) + 1);
  CHECK(a[1].AsInt64() == std::numeric_limits<int64_t>::min());
  CHECK(a[2].AsInt64() == std::numeric_limits<int64_t>::max());
  CHECK(a[4].AsInt64() == 0);
  CHECK(Dump(value) == "[9007199254740993,-9223372036854775808,9223372036854775807,0,0]");
}

TEST_CASE("Numbers with a fraction, an exponent or beyond int64 are doubles") {
  const Value value = Parse("[1.0, 1e3, 2.5E-2, 9223372036854775808, 1e-400, -1e-400]");
  const Value::Array& a = value.AsArray();
  for (const Value& v : a) CHECK((v.is_number() && !v.is_integer()));
  CHECK(a[0].AsDouble() == 1.0);
  CHECK(a[1].AsDouble() == 1000.0);
  CHECK(a[2].AsDouble() == 0.025);
  CHECK(a[3].AsDouble() == 9223372036854775808.0);
  CHECK(a[4].AsDouble() == 0.0);  // underflow reads as zero
  CHECK(std::signbit(a[5].AsDouble()));
}

TEST_CASE("Doubles are written in the shortest form that reads back exactly") {
  CHECK(Dump(Value::Double(0.1)) == "0.1");
  CHECK(Dump(Value::Double(3.0)) == "3.0");
  CHECK(Dump(Value::Double(-0.0)) == "-0.0");
  CHECK(Dump(Value::Double(1e20)) == "1e+20");
  for (double d : {0.1, 1.0 / 3.0, 6.02214076e23, 5e-324, 1.7976931348623157e308, -2.5e-10}) {
    const Value back = Parse(Dump(Value::Double(d)));
    CHECK_FALSE(back.is_integer());
    CHECK(back.AsDouble() == d);
  }
}

TEST_CASE("AsInt64 accepts integral doubles int64 can hold and rejects the rest") {
  CHECK(Parse("1e3").AsInt64() == 1000);
  CHECK(Parse("-2.0").AsInt64() == -2);
  CHECK_THROWS_AS(Parse("1.5").AsInt64(), TypeError);
  CHECK_THROWS_AS(Parse("1e19").AsInt64(), TypeError);
  CHECK_THROWS_AS(Parse("9223372036854775808").AsInt64(), TypeError);
}

TEST_CASE("String escapes, surrogate pairs and raw UTF-8 decode to the same UTF-8 bytes") {
  const Value value = Parse(kDocument);
  CHECK(value.at("text").AsString() ==
        "tab\there \"quoted\" back\\slash \xc3\xa9 \xf0\x9f\x98\x80 caf\xc3\xa9 \xe4\xb8\xad");
  CHECK(value.at("raw").AsString() == "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80");
  CHECK(Parse(R"("\u0000\/\b\f\n\r\t")").AsString() == std::string("\0/\b\f\n\r\t", 7));
  CHECK(Parse(R"("\uD834\uDD1E")").AsString() == "\xf0\x9d\x84\x9e");  // U+1D11E, uppercase hex
}

TEST_CASE("Control characters are written escaped and non-ASCII as raw UTF-8") {
  CHECK(Dump(Value::String(std::string("\x01\n\"\\\x7f\xc3\xa9", 7))) ==
        "\"\\u0001\\n\\\"\\\\\x7f\xc3\xa9\"");
}

struct BadCase {
  std::string text;
  int64_t line;
  int64_t column;
  std::string reason;
};

TEST_CASE("Each malformed document throws ParseError naming the line, column and the problem") {
  const std::vector<BadCase> cases = {
      {"", 1, 1, "unexpected end of input: expected a value"},
      {"   \n  ", 2, 3, "unexpected end of input: expected a value"},
      {"{\"a\": 1,\n \"b\": 2\n \"c\": 3}", 3, 2, "expected ',' or '}' after an object member"},
      {"[1 2]", 1, 4, "expected ',' or ']' after an array element"},
      {"{\"a\" 1}", 1, 6, "expected ':' after an object key"},
      {"{1: 2}", 1, 2, "expected '\"' to start an object key"},
      {"['a']", 1, 2, "expected a value, found '''"},
      {"[1,]", 1, 4, "trailing comma before ']'"},
      {"{\"a\":1,}", 1, 8, "trailing comma before '}'"},
      {"{\"a\":1,\n\"a\":2}", 2, 1, "duplicate object key \"a\""},
      {"{\"a\":1,\"\\u0061\":2}", 1, 8, "duplicate object key \"a\""},
      {"[1] x", 1, 5, "unexpected characters after the JSON value"},
      {"{} {}", 1, 4, "unexpected characters after the JSON value"},
      {"[NaN]", 1, 2, "NaN and Infinity are not valid JSON numbers"},
      {"[Infinity]", 1, 2, "NaN and Infinity are not valid JSON numbers"},
      {"[-Infinity]", 1, 3, "NaN and Infinity are not valid JSON numbers"},
      {"[01]", 1, 2, "leading zeros are not allowed in numbers"},
      {"[-012]", 1, 2, "leading zeros are not allowed in numbers"},
      {"[1.]", 1, 4, "expected a digit after the decimal point"},
      {"[1e+]", 1, 5, "expected a digit in the exponent"},
      {"[-]", 1, 3, "expected a digit in a number"},
      {"[.5]", 1, 2, "expected a value, found '.'"},
      {"[+1]", 1, 2, "expected a value, found '+'"},
      {"[1e400]", 1, 2, "number is beyond the range of a double"},
      {"[tru]", 1, 5, "invalid literal, expected 'true'"},
      {"[nul", 1, 5, "unexpected end of input: invalid literal, expected 'null'"},
      {"\"a\x01z\"", 1, 3, "control character 0x01 in a string must be escaped"},
      {"\"line\nbreak\"", 1, 6, "control character 0x0A in a string must be escaped"},
      {"\"\\x\"", 1, 2, "invalid escape '\\x' in a string"},
      {"\"\\u12G4\"", 1, 6, "expected four hex digits after \\u"},
      {"\"\\uD800\"", 1, 2, "unpaired high surrogate \\uD800"},
      {"\"\\uDC00\"", 1, 2, "unpaired low surrogate \\uDC00"},
      {"\"\\uD800\\u0041\"", 1, 2,
       "high surrogate \\uD800 is followed by \\u0041, not a low surrogate"},
      {"\"\xff\"", 1, 2, "invalid UTF-8 byte 0xFF in a string"},
      {"\"\xc0\x80\"", 1, 2, "invalid UTF-8 byte 0xC0 in a string"},          // overlong NUL
      {"\"\xed\xa0\x80\"", 1, 2, "invalid UTF-8 byte 0xED in a string"},      // encoded surrogate
      {"\"\xf4\x90\x80\x80\"", 1, 2, "invalid UTF-8 byte 0xF4 in a string"},  // beyond U+10FFFF
      {"\xef\xbb\xbf{}", 1, 1, "expected a value, found byte 0xEF"},          // byte order mark
      {"{\"a\": 1 // comment\n}", 1, 9, "expected ',' or '}' after an object member"},
      {"[\"abc", 1, 6, "unexpected end of input: expected '\"' to close a string"},
      {"{\"a\":", 1, 6, "unexpected end of input: expected a value"},
      // nlohmann reads a NUL byte as the end of the input; JSON has no NUL outside strings.
      {std::string("[1]\0", 4), 1, 4, "unexpected characters after the JSON value"},
      {std::string("[1,\0]", 5), 1, 4, "expected a value, found byte 0x00"},
      {"[1 tru]", 1, 4, "expected ',' or ']' after an array element"},
      // nlohmann quotes the input in its messages; the input's words are not its message's.
      {"\"ill-formed UTF-8", 1, 18, "unexpected end of input: expected '\"' to close a string"},
      {"[\"; expected ']'\x01", 1, 17, "control character 0x01 in a string must be escaped"},
  };
  for (const BadCase& c : cases) {
    CAPTURE(c.text);
    try {
      Parse(c.text);
      FAIL("no throw");
    } catch (const ParseError& e) {
      CHECK(e.line() == c.line);
      CHECK(e.column() == c.column);
      CHECK(e.reason() == c.reason);
      CHECK(std::string(e.what()) == "line " + std::to_string(c.line) + ", column " +
                                         std::to_string(c.column) + ": " + c.reason);
    }
  }
}

TEST_CASE("ParseError::offset is the byte offset of the line and column it reports") {
  try {
    Parse("{\n  \"a\": 1\n  \"b\": 2}");
    FAIL("no throw");
  } catch (const ParseError& e) {
    CHECK(e.line() == 3);
    CHECK(e.column() == 3);
    CHECK(e.offset() == 13);
  }
}

TEST_CASE("Nesting is accepted up to kMaxDepth levels and rejected beyond") {
  const auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  CHECK_NOTHROW(Parse(nested(kMaxDepth)));
  try {
    Parse(nested(kMaxDepth + 1));
    FAIL("no throw");
  } catch (const ParseError& e) {
    CHECK(e.column() == kMaxDepth + 1);
    CHECK(e.reason() == "nesting deeper than 512 arrays/objects");
  }
  std::string objects;
  for (int i = 0; i <= kMaxDepth; ++i) objects += "{\"a\":";
  CHECK_THROWS_AS(Parse(objects), ParseError);
}

TEST_CASE("Hostile nesting a million levels deep throws instead of overflowing the stack") {
  CHECK_THROWS_AS(Parse(std::string(1'000'000, '[')), ParseError);
  CHECK_THROWS_AS(Parse(std::string(1'000'000, '[') + std::string(1'000'000, ']')), ParseError);
}

TEST_CASE("Every proper prefix of a valid document throws ParseError") {
  const std::string text = kDocument;
  REQUIRE_NOTHROW(Parse(text));
  for (size_t n = 0; n < text.size(); ++n) {
    CAPTURE(n);
    // A copy of exactly n bytes, so that reading past it is caught by sanitizers.
    const std::vector<char> prefix(text.begin(), text.begin() + n);
    CHECK_THROWS_AS(Parse(std::string_view(prefix.data(), prefix.size())), ParseError);
  }
}

TEST_CASE("Every single-byte corruption of a valid document parses or throws ParseError") {
  const std::string text = kDocument;
  for (size_t i = 0; i < text.size(); ++i) {
    for (const char replacement : {'\0', '"', '\\', '{', ']', ',', 'x', '\xff', '\x80'}) {
      std::string corrupt = text;
      corrupt[i] = replacement;
      CAPTURE(i, static_cast<int>(replacement));
      try {
        Parse(corrupt);
      } catch (const ParseError&) {
      }
    }
  }
}

TEST_CASE("Accessors of the wrong kind throw TypeError naming what was expected and found") {
  const Value value = Parse(R"({"n": 3, "s": "abc", "a": [1, 2], "o": {}})");
  try {
    value.at("n").AsString();
    FAIL("no throw");
  } catch (const TypeError& e) {
    CHECK(std::string(e.what()) == "expected a string, found number 3");
  }
  try {
    value.at("s").AsInt64();
    FAIL("no throw");
  } catch (const TypeError& e) {
    CHECK(std::string(e.what()) == "expected an integer, found string \"abc\"");
  }
  try {
    value.at("a").AsObject();
    FAIL("no throw");
  } catch (const TypeError& e) {
    CHECK(std::string(e.what()) == "expected an object, found array of 2 elements");
  }
  CHECK_THROWS_AS(value.AsArray(), TypeError);
  CHECK_THROWS_AS(value.AsBool(), TypeError);
  CHECK_THROWS_AS(value.AsDouble(), TypeError);
  CHECK_THROWS_AS(Value().MutableArray(), TypeError);
  CHECK_THROWS_AS(Value::Int(1).Set("k", Value()), TypeError);
}

TEST_CASE("Find returns nullptr for a missing key and at() throws naming it") {
  const Value value = Parse(R"({"dtype": "F32"})");
  CHECK(value.Find("dtype")->AsString() == "F32");
  CHECK(value.Find("shape") == nullptr);
  CHECK(Value::Int(1).Find("dtype") == nullptr);
  try {
    value.at("shape");
    FAIL("no throw");
  } catch (const TypeError& e) {
    CHECK(std::string(e.what()) == "missing key \"shape\"");
  }
}

TEST_CASE("Set replaces a member in place or appends a new one") {
  Value value = Value::MakeObject({{"a", Value::Int(1)}, {"b", Value::Int(2)}});
  value.Set("a", Value::String("x"));
  value.Set("c", Value::Bool(false));
  CHECK(Dump(value) == R"({"a":"x","b":2,"c":false})");
  value.MutableObject().pop_back();
  CHECK(value.Find("c") == nullptr);
}

TEST_CASE("Values JSON cannot carry are refused when made or written") {
  CHECK_THROWS_AS(Value::Double(std::numeric_limits<double>::quiet_NaN()), TypeError);
  CHECK_THROWS_AS(Value::Double(-std::numeric_limits<double>::infinity()), TypeError);
  CHECK_THROWS_AS(Dump(Value::String("a\xff")), TypeError);
  CHECK_THROWS_AS(Dump(Value::MakeObject({{"k\xc3", Value()}})), TypeError);
  try {
    Dump(Value::MakeObject({{"k", Value()}, {"j", Value()}, {"k", Value::Int(1)}}));
    FAIL("no throw");
  } catch (const TypeError& e) {
    CHECK(Contains(e.what(), "key \"k\" appears twice"));
  }
}

TEST_CASE("Int and Double of the same value are different values") {
  CHECK(Value::Int(1) != Value::Double(1.0));
  CHECK(Value::Int(1) == Value::Int(1));
  CHECK(Parse("[1]") != Parse("[1.0]"));
}

class TempFile {
 public:
  explicit TempFile(const std::string& contents)
      : path_("/tmp/rl_json_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) +
              ".json") {
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST_CASE("ParseFile reads a file") {
  const TempFile file(kDocument);
  CHECK(ParseFile(file.path()) == Parse(kDocument));
}

TEST_CASE("ParseFile throws CheckpointError naming the file, line and column of invalid JSON") {
  const TempFile file("{\n  \"a\": 1\n  \"b\": 2\n}\n");
  try {
    ParseFile(file.path());
    FAIL("no throw");
  } catch (const CheckpointError& e) {
    CHECK(std::string(e.what()) ==
          file.path() + ": line 3, column 3: expected ',' or '}' after an object member");
  }
}

TEST_CASE("ParseFile throws CheckpointError naming a missing file or a directory") {
  try {
    ParseFile("/nonexistent/config.json");
    FAIL("no throw");
  } catch (const CheckpointError& e) {
    CHECK(std::string(e.what()) ==
          "/nonexistent/config.json: cannot open: No such file or directory");
  }
  try {
    ParseFile("/tmp");
    FAIL("no throw");
  } catch (const CheckpointError& e) {
    CHECK(Contains(e.what(), "/tmp: cannot read"));
  }
}

}  // namespace
}  // namespace rl::json
