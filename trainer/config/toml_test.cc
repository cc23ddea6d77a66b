// The recipe reader accepts the TOML subset it documents and refuses the rest with file:line.
#include "trainer/config/toml.h"

#include <catch2/catch.hpp>

#include <string>

#include "launch/check.h"

namespace rl::config {
namespace {

std::string ErrorOf(const std::string& text) {
  try {
    ParseToml(text, "recipe.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("values of every supported type parse, with sections and comments") {
  const TomlDocument doc = ParseToml(
      "# a recipe\n"
      "top = 1\n"
      "[optimizer]  # trailing comment\n"
      "lr = 1e-6\n"
      "steps = 1_000\n"
      "on = true\n"
      "name = \"a \\\"q\\\" \\u00e9\"\n"
      "path = 'C:\\raw'\n"
      "ids = [1, 2, 3]\n"
      "neg = -2.5\n",
      "recipe.toml");
  REQUIRE(doc.entries.size() == 8);
  CHECK(doc.entries[0].section.empty());
  CHECK(std::get<int64_t>(doc.entries[0].value.value) == 1);
  CHECK(doc.entries[1].section == "optimizer");
  CHECK(std::get<double>(doc.entries[1].value.value) == 1e-6);
  CHECK(doc.entries[1].line == 4);
  CHECK(std::get<int64_t>(doc.entries[2].value.value) == 1000);
  CHECK(std::get<bool>(doc.entries[3].value.value));
  CHECK(std::get<std::string>(doc.entries[4].value.value) == "a \"q\" \xc3\xa9");
  CHECK(std::get<std::string>(doc.entries[5].value.value) == "C:\\raw");
  CHECK(std::get<TomlArray>(doc.entries[6].value.value).size() == 3);
  CHECK(std::get<double>(doc.entries[7].value.value) == -2.5);
}

TEST_CASE("malformed lines are refused with file, line and what was expected") {
  CHECK(ErrorOf("[a]\nx 1\n") == "recipe.toml:2: expected '=' after key 'x'");
  CHECK(ErrorOf("x = \"open\n") ==
        "recipe.toml:1: unterminated string (multi-line strings are not supported)");
  CHECK(ErrorOf("x = yes\n") == "recipe.toml:1: 'yes' is not a value (strings need quotes)");
  CHECK(ErrorOf("x = 1 2\n") == "recipe.toml:1: unexpected '2' after the value");
  CHECK(ErrorOf("a.b = 1\n") ==
        "recipe.toml:1: dotted keys are not supported; use a [section] header");
  CHECK(ErrorOf("x = {a = 1}\n") == "recipe.toml:1: inline tables are not supported");
  CHECK(ErrorOf("[a]\nx = 1\nx = 2\n") == "recipe.toml:3: key 'x' appears twice in [a]");
  CHECK(ErrorOf("[a]\n[a]\n") == "recipe.toml:2: section [a] appears twice");
  CHECK(ErrorOf("x = 99999999999999999999\n") ==
        "recipe.toml:1: integer '99999999999999999999' is out of range");
  CHECK(ErrorOf("x = [1, 2\n") == "recipe.toml:1: expected ',' or ']' in array");
}

TEST_CASE("a \\u escape is exactly four hex digits of a character") {
  CHECK(ErrorOf("x = \"\\u12\"\n") == "recipe.toml:1: \\u needs 4 hex digits");
  // strtol would have read these as -0xFFF, 0x1F and 0x12.
  CHECK(ErrorOf("x = \"\\u-FFF\"\n") == "recipe.toml:1: \\u needs 4 hex digits");
  CHECK(ErrorOf("x = \"\\u0x1F\"\n") == "recipe.toml:1: \\u needs 4 hex digits");
  CHECK(ErrorOf("x = \"\\u 012\"\n") == "recipe.toml:1: \\u needs 4 hex digits");
  CHECK(ErrorOf("x = \"\\uD800\"\n") ==
        "recipe.toml:1: \\uD800 is a UTF-16 surrogate, not a character");
  const TomlDocument doc = ParseToml("x = \"\\u00e9\\uFFFF\"\n", "recipe.toml");
  CHECK(std::get<std::string>(doc.entries[0].value.value) == "\xc3\xa9\xef\xbf\xbf");
}

TEST_CASE("every prefix of a valid recipe parses or fails with ConfigError, never crashes") {
  const std::string text = "[rl]\neps_clip = 0.2\nname = \"x\\u0041\"\nids = [1, [2]]\n";
  for (size_t n = 0; n <= text.size(); ++n) {
    try {
      ParseToml(text.substr(0, n), "prefix.toml");
    } catch (const ConfigError&) {
    }
  }
  SUCCEED("no crash");
}

TEST_CASE("a missing file is named") {
  CHECK_THROWS_WITH(ReadTomlFile("/nonexistent/recipe.toml"),
                    "--config /nonexistent/recipe.toml: cannot open the file");
}

}  // namespace
}  // namespace rl::config
