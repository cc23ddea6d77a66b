// UTF-8 decoding follows Unicode's "maximal subpart" rule; the expected strings are Python's
// bytes.decode("utf-8", "replace"), which follows the same rule as Rust's from_utf8_lossy.
#include "launch/utf8.h"

#include <catch2/catch.hpp>

namespace rl {

TEST_CASE("Utf8Lossy replaces each maximal invalid subpart by one U+FFFD", "[utf8]") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(Utf8Lossy("plain ascii") == "plain ascii");
  CHECK(Utf8Lossy("caf\xC3\xA9") == "caf\xC3\xA9");
  CHECK(Utf8Lossy("\xE4\xBD"
                  "a") == r + "a");                       // truncated 3-byte sequence
  CHECK(Utf8Lossy("\xF0\x90\x80") == r);                  // truncated 4-byte sequence
  CHECK(Utf8Lossy("\xED\xA0\x80") == r + r + r);          // surrogate
  CHECK(Utf8Lossy("\xC0\xAF") == r + r);                  // overlong
  CHECK(Utf8Lossy("\xF4\x90\x80\x80") == r + r + r + r);  // above U+10FFFF
  CHECK(Utf8Lossy("ok\xE2\x82") == "ok" + r);
}

TEST_CASE("DecodeUtf8At and AppendUtf8 agree on every scalar value class", "[utf8]") {
  for (const char32_t cp :
       {0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string s;
    AppendUtf8(cp, &s);
    const DecodedChar d = DecodeUtf8At(s, 0);
    CHECK(d.valid);
    CHECK(d.code_point == cp);
    CHECK(d.num_bytes == static_cast<int>(s.size()));
  }
  CHECK_FALSE(IsValidUtf8("\xFF"));
  CHECK(IsValidUtf8("\xF0\x9F\x98\x80"));
}

}  // namespace rl
