// Fuzz target: the tokenizer.json loader (trainer/data/tokenizer.h), and the tokenizer it builds.
//
// Input: the text of tokenizer.json, optionally followed by a NUL byte and the text of
// tokenizer_config.json (JSON text holds no raw NUL, so the split is unambiguous). Loading
// refuses bad files with CheckpointError (json::ParseError for text that is not JSON). A
// tokenizer that loads is then used as the trainer uses it: a fixed string (ASCII, multi-byte
// UTF-8, special tokens, odd whitespace) and the config's chat template are encoded and decoded,
// and must give ids inside the vocabulary and valid UTF-8, without throwing (except for a Split
// regex beyond PCRE2's match limits, see pretokenizer.h).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "launch/check.h"
#include "launch/json.h"
#include "trainer/data/tokenizer.h"
#include "launch/utf8.h"

namespace {

using rl::data::BpeTokenizer;
using rl::data::SkipSpecial;

constexpr std::string_view kFixedText =
    "Hello, world! It's 2024: 12345 tokens.\n<|endoftext|><|im_start|>user\n"
    "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80\t \xC2\xA0x  \r\n<eos> </s>";

void CheckIds(const BpeTokenizer& tok, const std::vector<int64_t>& ids, std::string_view what) {
  for (const int64_t id : ids) {
    RL_FUZZ_EXPECT(id >= 0 && id < tok.vocab_size(), "{}: id {} outside the vocab (size {})", what,
                   id, tok.vocab_size());
  }
}

void Exercise(const BpeTokenizer& tok, std::string_view text, std::string_view what) {
  std::vector<int64_t> ids;
  try {
    ids = tok.Encode(text);
  } catch (const rl::CheckpointError& e) {
    // The one failure pretokenizer.h allows: a Split regex that backtracks beyond PCRE2's limits.
    RL_FUZZ_EXPECT(std::string_view(e.what()).find("failed on a text of") != std::string::npos,
                   "{}: Encode threw {}", what, e.what());
    return;
  }
  CheckIds(tok, ids, what);
  for (const SkipSpecial skip : {SkipSpecial::kNo, SkipSpecial::kYes}) {
    const std::string decoded = tok.Decode(ids, skip);
    RL_FUZZ_EXPECT(rl::IsValidUtf8(decoded), "{}: Decode gave invalid UTF-8", what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  std::unique_ptr<BpeTokenizer> tok;
  rl::data::TokenizerConfig config;
  try {
    if (nul != std::string_view::npos) {
      config = rl::data::ParseTokenizerConfig(rl::json::Parse(input.substr(nul + 1)),
                                              "tokenizer_config.json");
    }
    tok = BpeTokenizer::FromJson(rl::json::Parse(input.substr(0, nul)), "tokenizer.json", config);
  } catch (const rl::Error&) {
    return 0;
  }
  CheckIds(*tok, tok->stop_ids(), "stop ids");
  if (tok->pad_id()) CheckIds(*tok, {*tok->pad_id()}, "pad id");
  if (tok->bos_id()) CheckIds(*tok, {*tok->bos_id()}, "bos id");
  Exercise(*tok, kFixedText, "the fixed text");
  Exercise(*tok, tok->chat_template(), "the chat template");
  // Ids the model may sample but the tokenizer lacks are skipped, not an error.
  tok->Decode({-1, tok->vocab_size(), INT64_MAX, tok->eos_id()});
  return 0;
}
