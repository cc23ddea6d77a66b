#include "trainer/config/config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <type_traits>

#include "launch/check.h"

namespace rl::config {

std::string FlagName(const char* key) {
  std::string flag = "--";
  for (const char* c = key; *c != '\0'; ++c) flag.push_back(*c == '_' ? '-' : *c);
  return flag;
}

const std::vector<std::pair<std::string, std::string>>& RemovedOptions() {
  static const std::vector<std::pair<std::string, std::string>> removed = {
      {"disable_weights_backuper",
       "--disable-weights-backuper was removed: the weights backuper is always on. To avoid the "
       "pinned host copy of the actor's params, use --rematerialize-param-from-master-weight (the "
       "params are rebuilt from the fp32 master shards on wake-up); without it the pinned backup "
       "is used"},
  };
  return removed;
}

namespace {

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

// ---- TOML values into typed members ---------------------------------------------------------

// Returns "" on success, else what was wrong.
std::string Assign(const TomlValue& v, bool& out) {
  if (const bool* b = std::get_if<bool>(&v.value)) {
    out = *b;
    return "";
  }
  return fmt::format("expected true or false, got a {}", v.TypeName());
}
std::string Assign(const TomlValue& v, int64_t& out) {
  if (const int64_t* i = std::get_if<int64_t>(&v.value)) {
    out = *i;
    return "";
  }
  return fmt::format("expected an integer, got a {}", v.TypeName());
}
std::string Assign(const TomlValue& v, double& out) {
  if (const double* d = std::get_if<double>(&v.value)) {
    out = *d;
    return "";
  }
  if (const int64_t* i = std::get_if<int64_t>(&v.value)) {
    out = static_cast<double>(*i);
    return "";
  }
  return fmt::format("expected a number, got a {}", v.TypeName());
}
std::string Assign(const TomlValue& v, std::string& out) {
  if (const std::string* s = std::get_if<std::string>(&v.value)) {
    out = *s;
    return "";
  }
  return fmt::format("expected a string in quotes, got a {}", v.TypeName());
}
template <class T>
std::string Assign(const TomlValue& v, std::optional<T>& out) {
  T value{};
  std::string error = Assign(v, value);
  if (error.empty()) out = value;
  return error;
}

// ---- Typed members into TOML text -----------------------------------------------------------

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        // TOML allows no other control character unescaped.
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          out += fmt::format("\\u{:04X}", c);
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}
std::string Format(bool v) { return v ? "true" : "false"; }
std::string Format(int64_t v) { return std::to_string(v); }
std::string Format(double v) {
  std::string s = fmt::format("{}", v);  // shortest round-trip representation
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}
std::string Format(const std::string& v) { return Quote(v); }

// ---- CLI11 registration ---------------------------------------------------------------------

CLI::Option* AddFlag(CLI::App& app, const OptionInfo& info, bool& member) {
  const std::string flag = FlagName(info.key);
  return app
      .add_flag_function(
          flag + ",!--no-" + flag.substr(2), [&member](int64_t count) { member = count > 0; },
          info.help)
      ->default_str(member ? "true" : "false");
}
CLI::Option* AddFlag(CLI::App& app, const OptionInfo& info, std::optional<bool>& member) {
  const std::string flag = FlagName(info.key);
  return app
      .add_flag_function(
          flag + ",!--no-" + flag.substr(2), [&member](int64_t count) { member = count > 0; },
          info.help)
      ->default_str(member.has_value() ? (*member ? "true" : "false") : "derived");
}
template <class T>
CLI::Option* AddFlag(CLI::App& app, const OptionInfo& info, T& member) {
  return app.add_option(FlagName(info.key), member, info.help)->capture_default_str();
}
CLI::Option* AddFlag(CLI::App& app, const OptionInfo& info, std::optional<double>& member) {
  return app.add_option_function<double>(
      FlagName(info.key), [&member](const double& v) { member = v; }, info.help);
}

std::string Key(const char* section, const char* key) {
  return fmt::format("{}.{}", section, key);
}

}  // namespace

void ApplyToml(const TomlDocument& doc, Config& config, const std::vector<std::string>& keep) {
  using Setter = std::function<std::string(const TomlValue&)>;
  std::map<std::string, Setter> setters;             // "section.key" -> setter
  std::map<std::string, std::string> section_of_key;  // "key" -> "section" (for hints)
  VisitOptions(config, [&](const OptionInfo& info, auto& member) {
    setters[Key(info.section, info.key)] = [&member](const TomlValue& v) {
      return Assign(v, member);
    };
    section_of_key[info.key] = info.section;
  });

  std::vector<std::string> errors;
  for (const TomlEntry& entry : doc.entries) {
    const std::string where = fmt::format("{}:{}", doc.source, entry.line);
    const auto removed = std::find_if(RemovedOptions().begin(), RemovedOptions().end(),
                                      [&](const auto& r) { return r.first == entry.key; });
    if (removed != RemovedOptions().end()) {
      errors.push_back(fmt::format("{}: {}", where, removed->second));
      continue;
    }
    if (entry.section.empty()) {
      const auto hint = section_of_key.find(entry.key);
      errors.push_back(fmt::format(
          "{}: key '{}' is outside any [section]{}", where, entry.key,
          hint != section_of_key.end() ? fmt::format("; put it under [{}]", hint->second) : ""));
      continue;
    }
    const std::string full_key = Key(entry.section.c_str(), entry.key.c_str());
    const auto setter = setters.find(full_key);
    if (setter == setters.end()) {
      const auto hint = section_of_key.find(entry.key);
      errors.push_back(fmt::format(
          "{}: unknown key '{}' in [{}]{}", where, entry.key, entry.section,
          hint != section_of_key.end() ? fmt::format(" (it belongs in [{}])", hint->second)
                                       : ""));
      continue;
    }
    if (std::find(keep.begin(), keep.end(), full_key) != keep.end()) continue;
    const std::string error = setter->second(entry.value);
    if (!error.empty()) {
      errors.push_back(fmt::format("{}: [{}] {}: {}", where, entry.section, entry.key, error));
    }
  }
  if (!errors.empty()) {
    std::string message = fmt::format("{} problem(s) in {}:", errors.size(), doc.source);
    for (const std::string& e : errors) message += "\n  " + e;
    throw ConfigError(message);
  }
}

std::string DumpToml(const Config& config) {
  std::string out;
  std::string section;
  VisitOptions(config, [&](const OptionInfo& info, const auto& member) {
    if (section != info.section) {
      section = info.section;
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    using T = std::decay_t<decltype(member)>;
    if constexpr (IsOptional<T>::value) {
      if (member.has_value()) {
        out += fmt::format("{} = {}\n", info.key, Format(*member));
      } else {
        out += fmt::format("# {} = (unset)\n", info.key);
      }
    } else {
      out += fmt::format("{} = {}\n", info.key, Format(member));
    }
  });
  return out;
}

std::optional<CommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                            std::ostream& out) {
  CommandLine result;
  CLI::App app{
      "Distributed RL trainer for LLMs: a colocated actor and rollout engine per GPU.\n"
      "Options come from their defaults, then --config FILE (TOML, [section] key = value), then "
      "these flags."};
  app.option_defaults()->always_capture_default();
  app.add_option("--config", result.config_file, "TOML recipe (see configs/).");
  bool validate_only = false;
  bool plan = false;
  app.add_flag("--validate-only", validate_only,
               "Print the resolved config and exit 0, or every error and exit 2.");
  app.add_flag("--plan", plan,
               "Print the per-rank memory plan of the recipe at full scale and exit.");
  std::vector<CLI::Option*> removed_flags;
  for (const auto& [key, message] : RemovedOptions()) {
    removed_flags.push_back(app.add_flag(FlagName(key.c_str()), "(removed)")->group(""));
  }

  std::map<std::string, CLI::Option*> flags;  // "section.key" -> option
  VisitOptions(result.config, [&](const OptionInfo& info, auto& member) {
    CLI::Option* option = AddFlag(app, info, member);
    option->group(info.section);
    flags[Key(info.section, info.key)] = option;
  });

  try {
    // CLI11 wants argv order reversed when given a vector.
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw ConfigError(fmt::format("{} (see --help)", e.what()));
  }
  for (size_t i = 0; i < removed_flags.size(); ++i) {
    if (removed_flags[i]->count() > 0) throw ConfigError(RemovedOptions()[i].second);
  }
  RL_CHECK(!(validate_only && plan), ConfigError,
           "--validate-only and --plan exclude each other; pass one");
  result.mode = validate_only ? Mode::kValidateOnly : plan ? Mode::kPlan : Mode::kRun;

  if (!result.config_file.empty()) {
    std::vector<std::string> given;
    for (const auto& [key, option] : flags) {
      if (option->count() > 0) given.push_back(key);
    }
    ApplyToml(ReadTomlFile(result.config_file), result.config, given);
  }
  return result;
}

}  // namespace rl::config
