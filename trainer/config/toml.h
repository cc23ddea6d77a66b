// The reader of launch recipes: TOML 1.0 (parsed by toml++) restricted to what a recipe is,
// `[section]` headers (one level) of `key = value` lines.
//
// Values: booleans, integers (int64), floats, strings (every TOML form) and arrays of those.
// Refused, with the line and the key or section: inline tables (a recipe writes a [section]),
// dotted keys, nested sections, arrays of tables, dates and times; so a recipe never means
// something other than what it says. toml++ itself refuses invalid UTF-8, duplicate keys and
// sections, and anything else that is not TOML.
//
// Errors: ConfigError "FILE:LINE: message". Thread safety: stateless functions.
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
