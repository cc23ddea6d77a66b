#include "trainer/config/config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
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

// True for the enums of choice options: those with a name table (options.h).
template <class T, class = void>
struct IsChoice : std::false_type {};
template <class T>
struct IsChoice<T, std::void_t<decltype(EnumNames(std::declval<T>()))>> : std::true_type {};

// "a, b, c": the names of Enum's table.
template <class Enum>
std::string ChoiceList() {
  std::string out;
  for (const auto& [value, name] : EnumNames(Enum{})) {
    out += fmt::format("{}{}", out.empty() ? "" : ", ", name);
  }
  return out;
}

// Enum's value called `name`, or "" and `error` saying what is allowed.
template <class Enum>
std::string FromName(std::string_view name, Enum& out) {
  for (const auto& [value, candidate] : EnumNames(Enum{})) {
    if (name == candidate) {
      out = value;
      return "";
    }
  }
  return fmt::format("expected one of {}; got '{}'", ChoiceList<Enum>(), name);
}

// "2,151329" -> {2, 151329}; "" -> {}. Each id is decimal digits that fit in int64.
std::string ParseIdList(std::string_view text, std::vector<int64_t>& out) {
  std::vector<int64_t> ids;
  for (size_t begin = 0; !text.empty();) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string_view item = text.substr(begin, comma - begin);
    int64_t id = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || item[0] == '-' || ec != std::errc() || end != item.data() + item.size()) {
      return fmt::format("expected comma-separated token ids like \"2,151329\"; got '{}'", text);
    }
    ids.push_back(id);
    if (comma == text.size()) break;
    begin = comma + 1;
  }
  out = std::move(ids);
  return "";
}

// ---- TOML values into typed members ---------------------------------------------------------

// Each returns "" on success, else what was wrong. Take sets `out` when `v` holds a V.
template <class V, class T>
std::string Take(const TomlValue& v, T& out, const char* expected) {
  if (const V* value = std::get_if<V>(&v.value)) {
    out = static_cast<T>(*value);
    return "";
  }
  return fmt::format("expected {}, got a {}", expected, v.TypeName());
}
std::string Assign(const TomlValue& v, bool& out) { return Take<bool>(v, out, "true or false"); }
std::string Assign(const TomlValue& v, int64_t& out) { return Take<int64_t>(v, out, "an integer"); }
std::string Assign(const TomlValue& v, double& out) {
  if (std::holds_alternative<int64_t>(v.value)) return Take<int64_t>(v, out, "a number");
  return Take<double>(v, out, "a number");
}
std::string Assign(const TomlValue& v, std::string& out) {
  return Take<std::string>(v, out, "a string in quotes");
}
template <class Enum>
std::enable_if_t<IsChoice<Enum>::value, std::string> Assign(const TomlValue& v, Enum& out) {
  if (const std::string* s = std::get_if<std::string>(&v.value)) return FromName(*s, out);
  return fmt::format("expected one of \"{}\" in quotes, got a {}", ChoiceList<Enum>(),
                     v.TypeName());
}
// An array of integers, or one string of comma-separated ids (the older spelling).
std::string Assign(const TomlValue& v, std::vector<int64_t>& out) {
  if (const std::string* s = std::get_if<std::string>(&v.value)) return ParseIdList(*s, out);
  TomlArray array;
  if (std::string error = Take<TomlArray>(v, array, "an array of integers"); !error.empty()) {
    return error;
  }
  std::vector<int64_t> ids(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    if (std::string error = Take<int64_t>(array[i], ids[i], "integers in the array");
        !error.empty()) {
      return error;
    }
  }
  out = std::move(ids);
  return "";
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
    const char* escaped = c == '"'    ? "\\\""
                          : c == '\\' ? "\\\\"
                          : c == '\n' ? "\\n"
                          : c == '\t' ? "\\t"
                                      : nullptr;
    if (escaped != nullptr) {
      out += escaped;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      out += fmt::format("\\u{:04X}", c);  // TOML allows no other control character raw
    } else {
      out.push_back(c);
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
std::string Format(const std::vector<int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}
template <class Enum>
std::enable_if_t<IsChoice<Enum>::value, std::string> Format(Enum v) {
  return Quote(NameOf(v));
}
// An option's value as TOML text, "(unset)" for an unset optional.
template <class T>
std::string FormatMember(const T& member) {
  if constexpr (IsOptional<T>::value) {
    return member.has_value() ? Format(*member) : "(unset)";
  } else {
    return Format(member);
  }
}

// ---- CLI11 registration ---------------------------------------------------------------------

template <class T>
CLI::Option* AddFlag(CLI::App& app, const OptionInfo& info, T& member) {
  const std::string flag = FlagName(info.key);
  // Choices and id lists go through the parsers the TOML values use; the error names the flag.
  const auto parse_with = [&member, flag](auto parse) {
    return [&member, flag, parse](const std::string& text) {
      const std::string error = parse(text, member);
      if (!error.empty()) throw ConfigError(fmt::format("{}: {}", flag, error));
    };
  };
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>) {
    const std::string value = FormatMember(member);
    return app
        .add_flag_function(
            flag + ",!--no-" + flag.substr(2), [&member](int64_t count) { member = count > 0; },
            info.help)
        ->default_str(value == "(unset)" ? "derived" : value);
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    return app.add_option_function<double>(
        flag, [&member](const double& v) { member = v; }, info.help);
  } else if constexpr (IsChoice<T>::value) {
    return app
        .add_option_function<std::string>(
            flag, parse_with([](std::string_view s, T& out) { return FromName(s, out); }),
            fmt::format("{} One of: {}.", info.help, ChoiceList<T>()))
        ->default_str(NameOf(member));
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return app.add_option_function<std::string>(flag, parse_with(ParseIdList), info.help)
        ->default_str(fmt::format("{}", fmt::join(member, ",")));
  } else {
    return app.add_option(flag, member, info.help)->capture_default_str();
  }
}

bool IsNotRunnableYet(const char* key) {
  return std::any_of(std::begin(kNotRunnableYet), std::end(kNotRunnableYet),
                     [&](const char* k) { return std::string_view(k) == key; });
}

// The one value kRunsOnlyAt (options.h) runs `key` at, or nullptr.
const char* RunsOnlyAt(const char* key) {
  for (const auto& [k, value] : kRunsOnlyAt) {
    if (std::string_view(k) == key) return value;
  }
  return nullptr;
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
    const std::string value = FormatMember(member);
    out += fmt::format("{}{} = {}\n", value == "(unset)" ? "# " : "", info.key, value);
  });
  return out;
}

std::vector<std::string> NotRunnable(const Config& config) {
  const Config default_config;
  std::map<std::string, std::string> defaults;
  VisitOptions(default_config, [&](const OptionInfo& info, const auto& member) {
    defaults[info.key] = FormatMember(member);
  });
  // kRunsOnlyAt describes the cycle of an actor and a rollout engine; without one of them the
  // options have nothing to act on.
  const bool cycle = !config.colocate.debug_train_only && !config.colocate.debug_rollout_only;
  std::vector<std::string> problems;
  VisitOptions(config, [&](const OptionInfo& info, const auto& member) {
    const std::string value = FormatMember(member);
    if (IsNotRunnableYet(info.key) && value != defaults[info.key]) {
      problems.push_back(
          fmt::format("{} {}: only {} runs yet", FlagName(info.key), value, defaults[info.key]));
    }
    // An unset optional is derived by validation from --colocate, and so are the offload options
    // without --colocate: only --colocate is reported then, which fixes them.
    const char* only = RunsOnlyAt(info.key);
    const bool follows_colocate =
        std::string_view(info.key) != "colocate" && !config.colocate.colocate;
    if (cycle && only != nullptr && !follows_colocate && value != "(unset)" && value != only) {
      problems.push_back(fmt::format(
          "{} {}: only {} runs yet (the actor and the rollout engine share each device and take "
          "turns)",
          FlagName(info.key), value, only));
    }
  });
  return problems;
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
    if (IsNotRunnableYet(info.key)) {
      option->description(option->get_description() +
                          " [Validates and plans, but only the default runs yet.]");
    }
    if (const char* only = RunsOnlyAt(info.key)) {
      option->description(option->get_description() +
                          fmt::format(" [Validates and plans, but only {} runs yet.]", only));
    }
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
