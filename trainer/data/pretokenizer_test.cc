// The hand-written scanners against the regexes they replace; expected splits were produced with
// Python's `regex` module (which has \p{L}) on the same strings. tokenizer_test.cc checks the full
// pre-tokenizer against Hugging Face tokenizers on more text.
#include "trainer/data/pretokenizer.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace rl::data {
namespace {

std::vector<std::string> Split(std::string_view text, SplitPattern pattern) {
  std::vector<std::string> out;
  for (std::string_view w : SplitWords(text, pattern)) out.emplace_back(w);
  return out;
}

using Words = std::vector<std::string>;

}  // namespace

TEST_CASE("the known regexes are recognised and nothing else", "[pretokenizer]") {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kGpt4, SplitPattern::kQwen2}) {
    CHECK(RecognizeSplitPattern(SplitPatternRegex(p)) == p);
  }
  CHECK_FALSE(RecognizeSplitPattern("\\p{L}+").has_value());
}

TEST_CASE("GPT-4 and GPT-2 splits equal the regex matches", "[pretokenizer]") {
  CHECK(Split("Hello  world\n\n", SplitPattern::kGpt4) == Words{"Hello", " ", " world", "\n\n"});
  CHECK(Split("Hello  world\n\n", SplitPattern::kGpt2) == Words{"Hello", " ", " world", "\n\n"});
  CHECK(Split("WE'LL x'Sy", SplitPattern::kGpt4) == Words{"WE", "'LL", " x", "'S", "y"});
  CHECK(Split("WE'LL x'Sy", SplitPattern::kGpt2) == Words{"WE", "'", "LL", " x", "'", "Sy"});
  CHECK(Split("12345 abc", SplitPattern::kGpt4) == Words{"123", "45", " abc"});
  CHECK(Split("12345 abc", SplitPattern::kQwen2) == Words{"1", "2", "3", "4", "5", " abc"});
  CHECK(Split("12345 abc", SplitPattern::kGpt2) == Words{"12345", " abc"});
  CHECK(Split(" \t\n x", SplitPattern::kGpt4) == Words{" \t\n", " x"});
  CHECK(Split("!?\n\nok", SplitPattern::kGpt4) == Words{"!?\n\n", "ok"});
  CHECK(Split("!?\n\nok", SplitPattern::kGpt2) == Words{"!?", "\n", "\n", "ok"});
  CHECK(Split("", SplitPattern::kGpt4).empty());
}

TEST_CASE("invalid UTF-8 is kept, one piece per invalid subpart", "[pretokenizer]") {
  const std::string text =
      "ab\xFF\xFE"
      "cd";
  std::string joined;
  for (std::string_view w : SplitWords(text, SplitPattern::kGpt4)) joined += w;
  CHECK(joined == text);
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
