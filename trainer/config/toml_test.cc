// The recipe reader (toml++ underneath) refuses what recipes must not contain, and every error
// names the file and line.
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

TEST_CASE("malformed lines are refused with file, line, toml++'s reason and the line itself") {
  CHECK(ErrorOf("[a]\nx 1\n") ==
        "recipe.toml:2: key-value pair: expected '=', saw '1' (in \"x 1\")");
  CHECK(ErrorOf("x = yes\n") ==
        "recipe.toml:1: value: could not determine value type; strings need quotes "
        "(in \"x = yes\")");
  CHECK(ErrorOf("x = 1 2\n") ==
        "recipe.toml:1: key-value pair: expected a comment or whitespace, saw '2' "
        "(in \"x = 1 2\")");
  CHECK(ErrorOf("[a]\nx = 1\nx = 2\n") ==
        "recipe.toml:3: key-value pair: cannot redefine existing integer 'x' (in \"x = 2\")");
  CHECK(ErrorOf("[a]\n[a]\n") ==
        "recipe.toml:2: table header: cannot redefine existing table 'a' (in \"[a]\")");
  CHECK(ErrorOf("x = 99999999999999999999\n") ==
        "recipe.toml:1: decimal integer: '99999999999999999999' is not representable in 64 bits "
        "(in \"x = 99999999999999999999\")");
  CHECK(ErrorOf("x = [1, 2\n") ==
        "recipe.toml:1: array: encountered end-of-file (in \"x = [1, 2\")");
  CHECK(ErrorOf("x = \"open\n").rfind("recipe.toml:1: string: ", 0) == 0);
  // toml++ 3.3 reached undefined behaviour on these (see toml.cc).
  CHECK(ErrorOf("[a]\nb \xc2\xa7= 1\n") ==
        "recipe.toml:2: key-value pair: expected '=', saw '\xc2\xa7' (in \"b \xc2\xa7= 1\")");
  CHECK(ErrorOf("c = 1 \xc3\xa9\n").rfind("recipe.toml:1: ", 0) == 0);
  CHECK(ErrorOf("[#\n") ==
        "recipe.toml:1: key: expected bare key starting character or string delimiter, saw '#' "
        "(in \"[#\")");
  CHECK(ErrorOf("x = \"\xff\"\n") ==
        "recipe.toml:1: Encountered invalid utf-8 sequence (in \"x = \"\xef\xbf\xbd\"\")");
}

TEST_CASE("what a recipe must not contain is refused naming the key or section") {
  CHECK(ErrorOf("a.b = 1\n") ==
        "recipe.toml:1: dotted keys are not supported; use a [section] header");
  CHECK(ErrorOf("[a]\nb.c = 1\n") ==
        "recipe.toml:2: dotted keys are not supported; use a [section] header");
  CHECK(ErrorOf("x = {a = 1}\n") == "recipe.toml:1: key 'x': inline tables are not supported");
  CHECK(ErrorOf("[a]\nx = [{b = 1}]\n") ==
        "recipe.toml:2: key 'x': inline tables are not supported");
  CHECK(ErrorOf("[a]\nd = 1979-05-27\n") ==
        "recipe.toml:2: key 'd': dates and times are not supported");
  CHECK(ErrorOf("[a]\nt = 07:32:00\n") ==
        "recipe.toml:2: key 't': dates and times are not supported");
  CHECK(ErrorOf("[a]\nx = [1979-05-27T07:32:00Z]\n") ==
        "recipe.toml:2: key 'x': dates and times are not supported");
  CHECK(ErrorOf("[[a]]\nx = 1\n") == "recipe.toml:1: [[a]]: arrays of tables are not supported");
  CHECK(ErrorOf("[a.b]\nx = 1\n") ==
        "recipe.toml:1: [a.b]: sections do not nest; use [a] and [b]");
}

TEST_CASE("entries come in file order whatever the order of keys") {
  const TomlDocument doc =
      ParseToml("[b]\nz = 1\ny = [1,\n  2]\n[a]\nx = \"\"\"multi\nline\"\"\"\n", "recipe.toml");
  REQUIRE(doc.entries.size() == 3);
  CHECK(doc.entries[0].key == "z");
  CHECK(doc.entries[1].key == "y");
  CHECK(doc.entries[1].line == 3);
  CHECK(doc.entries[2].section == "a");
  CHECK(std::get<std::string>(doc.entries[2].value.value) == "multi\nline");
}

TEST_CASE("a \\u escape is exactly four hex digits of a character") {
  const auto refused = [](const std::string& escape, const std::string& reason) {
    return ErrorOf("x = \"" + escape + "\"\n") == "recipe.toml:1: unicode scalar sequence: " +
                                                     reason + " (in \"x = \"" + escape + "\"\")";
  };
  CHECK(refused("\\u12", "expected hex digit, saw '\"'"));
  // strtol would read these as -0xFFF, 0x1F and 0x12.
  CHECK(refused("\\u-FFF", "expected hex digit, saw '-'"));
  CHECK(refused("\\u0x1F", "expected hex digit, saw 'x'"));
  CHECK(refused("\\u 012", "expected hex digit, saw ' '"));
  CHECK(refused("\\uD800", "unicode surrogates (U+D800 - U+DFFF) are explicitly prohibited"));
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
