#include "launch/utf8.h"

namespace rl {

DecodedChar DecodeUtf8At(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) -> int {
    return pos + i < text.size() ? static_cast<unsigned char>(text[pos + i]) : -1;
  };
  const int b0 = byte(0);
  if (b0 < 0x80) return {static_cast<char32_t>(b0), 1, true};
  int width = 0;
  int lo = 0x80;
  int hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    width = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    width = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    width = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {kReplacementChar, 1, false};
  }
  char32_t cp = static_cast<char32_t>(b0 & (0xFF >> (width + 1)));
  for (int i = 1; i < width; ++i) {
    const int b = byte(i);
    const int min = i == 1 ? lo : 0x80;
    const int max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return {kReplacementChar, i, false};
    cp = (cp << 6) | static_cast<char32_t>(b & 0x3F);
  }
  return {cp, width, true};
}

bool IsValidUtf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const DecodedChar c = DecodeUtf8At(text, pos);
    if (!c.valid) return false;
    pos += static_cast<size_t>(c.num_bytes);
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const DecodedChar c = DecodeUtf8At(bytes, pos);
    if (c.valid) {
      out.append(bytes.substr(pos, static_cast<size_t>(c.num_bytes)));
    } else {
      AppendUtf8(kReplacementChar, &out);
    }
    pos += static_cast<size_t>(c.num_bytes);
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace rl
