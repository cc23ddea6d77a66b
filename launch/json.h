// A strict JSON reader (RFC 8259; nlohmann-json's parser underneath, included by json.cc only)
// and writer for the trainer's file formats: safetensors headers, checkpoint indexes, config and
// tokenizer files, dataset manifests.
//
// Values: a Value owns its whole tree (arrays and objects hold their children by value). Objects
// keep their members in file order, which Dump() preserves, so a file read and written back keeps
// its layout. Numbers written without a fraction or exponent that fit in int64 are kept exactly as
// int64 (safetensors byte offsets need all 64 bits); every other number is a double.
//
// Strictness: Parse() accepts exactly RFC 8259 JSON and nothing else: no comments, no trailing
// commas, no NaN/Infinity, no leading zeros, no duplicate object keys, no unescaped control
// characters, no invalid UTF-8 (strings are validated; \uXXXX escapes, surrogate pairs included,
// are decoded to UTF-8), no byte order mark, nothing after the value but whitespace. Nesting is
// limited to kMaxDepth arrays/objects so that hostile input cannot overflow the stack; the parser
// never reads outside the given text.
//
// Failures: Parse() throws ParseError ("line 3, column 14: expected ',' or '}' after an object
// member"; lines and columns count from 1, columns in bytes). ParseFile() throws
// rl::CheckpointError naming the file. Accessors asked for the wrong kind throw TypeError saying
// what was expected and what was found. Dump() throws TypeError for a value JSON cannot carry (a
// string that is not UTF-8, an object with a repeated key), so that Parse(Dump(v)) == v for every
// value it writes.
//
// Thread safety: a Value is a plain value type; concurrent const access is safe, mutation needs
// external synchronisation. The free functions are stateless.
#ifndef RL_LAUNCH_JSON_H_
#define RL_LAUNCH_JSON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "launch/check.h"

namespace rl::json {

// Deeper documents are rejected by Parse(); 512 nested arrays/objects are accepted, 513 are not.
inline constexpr int kMaxDepth = 512;

// A value is not of the kind the caller asked for, a key is missing, or Dump() met a value JSON
// cannot represent.
class TypeError : public Error {
 public:
  using Error::Error;
};

// The text is not valid JSON. what() is "line L, column C: <reason>".
class ParseError : public Error {
 public:
  ParseError(std::string reason, int64_t line, int64_t column, int64_t offset);

  int64_t line() const { return line_; }                 // 1-based
  int64_t column() const { return column_; }             // 1-based, in bytes
  int64_t offset() const { return offset_; }             // 0-based byte offset into the text
  const std::string& reason() const { return reason_; }  // the message without the position

 private:
  std::string reason_;
  int64_t line_;
  int64_t column_;
  int64_t offset_;
};

class Value {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;  // file order kept

  Value();  // null

  static Value Bool(bool b);
  static Value Int(int64_t v);
  // Throws TypeError for NaN or an infinity: JSON has no way to write them.
  static Value Double(double v);
  // `s` should be UTF-8; Dump() checks it.
  static Value String(std::string s);
  static Value MakeArray(Array a);
  // Keys should be unique; Dump() checks it.
  static Value MakeObject(Object o);

  Kind kind() const;
  bool is_null() const { return kind() == Kind::kNull; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_number() const { return kind() == Kind::kNumber; }
  bool is_integer() const;  // a number stored as int64 (written without fraction or exponent)
  bool is_string() const { return kind() == Kind::kString; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_object() const { return kind() == Kind::kObject; }

  // Each throws TypeError ("expected a string, found number 3") for the wrong kind.
  bool AsBool() const;
  // An int64 number, or a double with an integral value that int64 holds exactly (1e3 -> 1000);
  // 1.5 or 1e30 throw TypeError.
  int64_t AsInt64() const;
  double AsDouble() const;  // any number; int64 values beyond 2^53 are rounded
  const std::string& AsString() const;
  const Array& AsArray() const;
  const Object& AsObject() const;

  // The member named `key`, or nullptr when there is none or this is not an object. Linear in the
  // number of members.
  const Value* Find(std::string_view key) const;
  // Like Find(), but throws TypeError ("missing key \"dtype\"") instead of returning nullptr.
  const Value& at(std::string_view key) const;

  // Throw TypeError when this is not an array / object.
  Array& MutableArray();
  Object& MutableObject();
  // Replaces the member named `key`, or appends it; returns the stored value.
  Value& Set(std::string key, Value v);

  // Same kind and same contents; objects compare member by member in order. An int64 number and a
  // double are never equal (Int(1) != Double(1.0)), so equality also checks the stored kind.
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

 private:
  using Storage = std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object>;
  explicit Value(Storage storage);

  Storage storage_;
};

// "null", "bool", "number", "string", "array", "object".
std::string_view KindName(Value::Kind kind);

// Parses one JSON document; throws ParseError.
Value Parse(std::string_view text);

// Reads and parses a file; throws rl::CheckpointError "<path>: line 3, column 14: ..." for invalid
// JSON, and "<path>: cannot open: ..." for a missing or unreadable file.
Value ParseFile(const std::string& path);

// indent < 0: compact, no whitespace. indent >= 0: one member or element per line, indented by
// `indent` spaces per level, with ": " after keys. Integers are written exactly; doubles in the
// shortest form that reads back to the same double, with ".0" added when that form looks like an
// integer, so the kind survives a round trip. Non-ASCII UTF-8 is written as is; control characters
// are escaped. Throws TypeError for invalid UTF-8 or a repeated object key.
std::string Dump(const Value& v, int indent = -1);

}  // namespace rl::json

#endif  // RL_LAUNCH_JSON_H_
