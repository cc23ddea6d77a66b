#include "trainer/config/toml.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "launch/check.h"
#include "launch/utf8.h"

// Only the parser: toml++'s formatters are unused and slow to compile.
#define TOML_ENABLE_FORMATTERS 0
// toml++'s internal asserts are off in optimized builds (NDEBUG), where a table header without a
// key ("[#", found by fuzz/toml_fuzz.cc) is reported as a parse error; a build without NDEBUG (the
// fuzz build) would abort on the assert in parse_key instead. Off everywhere, so the fuzzer runs
// what the trainer runs.
#define TOML_ASSERT(expr) static_cast<void>(0)
#include <toml++/toml.h>

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

// Turns toml++'s tree into entries, refusing what a recipe must not contain: a recipe is flat
// [section] key = value lines, so a value never means something other than what it says.
class Flattener {
 public:
  explicit Flattener(TomlDocument& doc) : doc_(doc) {}

  [[noreturn]] void Fail(const toml::source_region& where, std::string_view what) const {
    throw ConfigError(fmt::format("{}:{}: {}", doc_.source, where.begin.line, what));
  }

  // The members of the root table (section "") or of one [section].
  void AddTable(const toml::table& table, const std::string& section) {
    for (const auto& [key, node] : table) {
      const std::string name(key.str());
      const toml::table* sub = node.as_table();
      // toml++ gives a table made by a dotted key (a.b = 1) the key's own source region.
      if (sub != nullptr && !sub->is_inline() && sub->source().begin == key.source().begin) {
        Fail(key.source(), "dotted keys are not supported; use a [section] header");
      }
      if (sub != nullptr && !sub->is_inline()) {
        if (!section.empty()) {
          Fail(sub->source(), fmt::format("[{}.{}]: sections do not nest; use [{}] and [{}]",
                                          section, name, section, name));
        }
        AddTable(*sub, name);
        continue;
      }
      if (node.is_array_of_tables() && section.empty() && !node.as_array()->empty() &&
          !node.as_array()->front().as_table()->is_inline()) {
        Fail(key.source(), fmt::format("[[{}]]: arrays of tables are not supported", name));
      }
      doc_.entries.push_back(
          {section, name, Convert(node, name), static_cast<int>(key.source().begin.line)});
      columns_.push_back(key.source().begin.column);
    }
  }

  // File order, as the checks of ApplyToml report them.
  void SortEntries() {
    std::vector<size_t> order(doc_.entries.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::pair(doc_.entries[a].line, columns_[a]) <
             std::pair(doc_.entries[b].line, columns_[b]);
    });
    std::vector<TomlEntry> sorted;
    sorted.reserve(order.size());
    for (const size_t i : order) sorted.push_back(std::move(doc_.entries[i]));
    doc_.entries = std::move(sorted);
  }

 private:
  TomlValue Convert(const toml::node& node, const std::string& key) const {
    switch (node.type()) {
      case toml::node_type::boolean:
        return {node.as_boolean()->get()};
      case toml::node_type::integer:
        return {node.as_integer()->get()};
      case toml::node_type::floating_point:
        return {node.as_floating_point()->get()};
      case toml::node_type::string:
        return {node.as_string()->get()};
      case toml::node_type::array: {
        TomlArray out;
        for (const toml::node& element : *node.as_array()) out.push_back(Convert(element, key));
        return {std::move(out)};
      }
      case toml::node_type::table:
        Fail(node.source(), fmt::format("key '{}': inline tables are not supported", key));
      default:
        Fail(node.source(), fmt::format("key '{}': dates and times are not supported", key));
    }
  }

  TomlDocument& doc_;
  std::vector<uint32_t> columns_;  // of each entry's key, to sort by
};

}  // namespace

TomlDocument ParseToml(std::string_view text, std::string source) {
  TomlDocument doc;
  doc.source = std::move(source);
  toml::table root;
  try {
    root = toml::parse(text, doc.source);
  } catch (const toml::parse_error& e) {
    // toml++ names what it expected; quoting the line names the key.
    const size_t line = e.source().begin.line;
    size_t begin = 0;
    for (size_t n = 1; n < line && begin != std::string_view::npos; ++n) {
      begin = text.find('\n', begin);
      if (begin != std::string_view::npos) ++begin;
    }
    std::string_view quoted = begin == std::string_view::npos ? "" : text.substr(begin);
    std::string shown = Utf8Lossy(quoted.substr(0, std::min(quoted.find('\n'), size_t{80})));
    for (char& c : shown) {
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    }
    std::string_view what = e.description();
    if (what.substr(0, 19) == "Error while parsing") what.remove_prefix(20);
    throw ConfigError(fmt::format("{}:{}: {}{} (in \"{}\")", doc.source, line, what,
                                  what.find("could not determine value type") != what.npos
                                      ? "; strings need quotes"
                                      : "",
                                  shown));
  }
  Flattener flattener(doc);
  flattener.AddTable(root, "");
  flattener.SortEntries();
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
