// SplitRegex (PCRE2) against Hugging Face tokenizers (Oniguruma): the expected pieces in
// testdata/pretokenizer_reference.json come from tokenizers' Split on hard text (CJK, Arabic,
// emoji with modifiers and ZWJ, combining marks, contractions, long digit runs, whitespace runs,
// U+0085 and U+180E) under the GPT-2, GPT-4, o200k and Qwen2 patterns;
// make_pretokenizer_reference.py writes it.
#include "trainer/data/pretokenizer.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "launch/check.h"
#include "launch/json.h"
#include "tests/runfiles.h"

namespace rl::data {
namespace {

using Words = std::vector<std::string>;

Words Split(const SplitRegex& regex, std::string_view text) {
  Words out;
  for (std::string_view w : regex.Split(text)) out.emplace_back(w);
  return out;
}

std::string TestData(const std::string& name) {
  return rl::testing::RunfilePath("trainer/data/testdata/" + name);
}

}  // namespace

TEST_CASE("every pattern splits hard text as Hugging Face tokenizers does", "[pretokenizer]") {
  const json::Value reference = json::ParseFile(TestData("pretokenizer_reference.json"));
  int compared = 0;
  for (const auto& [name, pattern] : reference.at("patterns").AsObject()) {
    const SplitRegex regex(pattern.AsString());
    for (const json::Value& c : reference.at("cases").AsArray()) {
      const std::string& text = c.at("text").AsString();
      Words expected;
      for (const json::Value& w : c.at(name).AsArray()) expected.push_back(w.AsString());
      CAPTURE(name, text);
      CHECK(Split(regex, text) == expected);
      ++compared;
    }
  }
  CHECK(compared == 4 * 26);
}

TEST_CASE("the ByteLevel regex is GPT-2's and splits as documented", "[pretokenizer]") {
  CHECK(Gpt2Regex()->pattern() == kGpt2Pattern);
  CHECK(Split(*Gpt2Regex(), "WE'LL x'Sy") == Words{"WE", "'", "LL", " x", "'", "Sy"});
  CHECK(Split(*Gpt2Regex(), "").empty());
}

TEST_CASE("text between matches is kept as pieces; empty matches give none", "[pretokenizer]") {
  CHECK(Split(SplitRegex(R"(\d+)"), "ab12cd3") == Words{"ab", "12", "cd", "3"});
  CHECK(Split(SplitRegex(R"(x*)"), "axxb") == Words{"a", "xx", "b"});
  CHECK(Split(SplitRegex(R"(\p{Han}+)"), "a中文b") == Words{"a", "中文", "b"});
}

TEST_CASE("invalid UTF-8 matches nothing and is kept between the matches", "[pretokenizer]") {
  const SplitRegex regex(R"(\p{L}+|\s+)");
  CHECK(Split(regex, "ab\xFF\xFE" "cd \xC3") == Words{"ab", "\xFF\xFE", "cd", " ", "\xC3"});
}

TEST_CASE("a pattern PCRE2 cannot compile is refused naming it", "[pretokenizer]") {
  CHECK_THROWS_WITH(SplitRegex("(\\p{L}+"),
                    "regex \"(\\p{L}+\" does not compile: missing closing parenthesis at offset 7");
}

TEST_CASE("a match beyond PCRE2's limits throws instead of running on", "[pretokenizer]") {
  const SplitRegex regex("(a+)+$");
  CHECK_THROWS_WITH(regex.Split(std::string(40, 'a') + "b"),
                    Catch::Contains("regex \"(a+)+$\" failed on a text of 41 bytes: "));
}

TEST_CASE("word characters and whitespace for added tokens", "[pretokenizer]") {
  for (const char32_t cp : {U'a', U'_', U'7', U'\u00E9', U'\u4F60', U'\u0663', U'\u00B2'}) {
    CHECK(IsWordChar(cp));
  }
  for (const char32_t cp : {U' ', U'-', U'\u0301', U'\U0001F600', U'\u3000'}) {
    CHECK_FALSE(IsWordChar(cp));
  }
  CHECK(IsWhitespace(0x00A0));
  CHECK(IsWhitespace(0x3000));
  CHECK(IsWhitespace(0x2003));
  CHECK_FALSE(IsWhitespace(0x200B));  // zero width space is not White_Space
}

TEST_CASE("byte-level map is GPT-2's and reversible", "[pretokenizer]") {
  CHECK(ByteLevelEncode(" ") == "\xC4\xA0");   // U+0120 'Ġ'
  CHECK(ByteLevelEncode("\n") == "\xC4\x8A");  // U+010A 'Ċ'
  CHECK(ByteLevelEncode("a!~") == "a!~");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  REQUIRE(ByteLevelDecode(ByteLevelEncode(all), &back));
  CHECK(back == all);
  std::string untouched = "x";
  CHECK_FALSE(ByteLevelDecode("\xEF\xBD\x9C", &untouched));  // '｜' is not a byte-level char
  CHECK(untouched == "x");
}

}  // namespace rl::data
