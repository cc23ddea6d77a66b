// A reader for the subset of TOML that launch recipes use.
//
// Supported: `# comments`, `[section]` headers (one level), `key = value` with values that are
// basic "strings" (with \" \\ \n \t \uXXXX escapes), 'literal strings', integers (with optional
// `_` separators), floats (with exponent), booleans, and one-line arrays of those. Everything
// else (inline tables, dotted keys, multi-line strings, dates) is refused with the line and what
// was expected, so a recipe never means something other than what it says.
//
// Errors: ConfigError "FILE:LINE: message". Duplicate keys in a section are errors.
#ifndef RL_TRAINER_CONFIG_TOML_H_
#define RL_TRAINER_CONFIG_TOML_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace rl::config {

struct TomlValue;
using TomlArray = std::vector<TomlValue>;

struct TomlValue {
  std::variant<bool, int64_t, double, std::string, TomlArray> value;
  // "boolean", "integer", "float", "string", "array": for error messages.
  std::string_view TypeName() const;
};

struct TomlEntry {
  std::string section;  // "" before the first [section]
  std::string key;
  TomlValue value;
  int line = 0;
};

struct TomlDocument {
  std::string source;  // file name for messages
  std::vector<TomlEntry> entries;
};

// `source` names the text in error messages.
TomlDocument ParseToml(std::string_view text, std::string source);
// Reads and parses a file; a missing or unreadable file is a ConfigError naming it.
TomlDocument ReadTomlFile(const std::string& path);

}  // namespace rl::config

#endif  // RL_TRAINER_CONFIG_TOML_H_
