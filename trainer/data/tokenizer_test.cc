// Encoding against Hugging Face tokenizers (testdata/tokenizer_reference.json, produced by
// testdata/make_tokenizer_testdata.py with tokenizers 0.23.3): ids, pre-tokenizer splits and
// decoded text must be identical, byte for byte. Plus loader behaviour and one test per kind of
// malformed file, each checking that the message names the file and the problem.
#include "trainer/data/tokenizer.h"

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

#include "launch/check.h"
#include "launch/json.h"
#include "tests/runfiles.h"

namespace rl::data {
namespace {

std::string TestData(const std::string& name) {
  return rl::testing::RunfilePath("trainer/data/testdata/" + name);
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Loads tiny_qwen2.json after `edit` changed its JSON; returns the CheckpointError message.
template <typename Edit>
std::string LoadErrorAfterEdit(Edit edit) {
  json::Value root = json::ParseFile(TestData("tiny_qwen2.json"));
  edit(root);
  const std::string path = WriteTemp("edited_tokenizer.json", json::Dump(root));
  try {
    BpeTokenizer::FromFile(path);
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    CHECK(message.find(path) != std::string::npos);
    return message;
  }
  FAIL("no CheckpointError");
  return "";
}

json::Value& Model(json::Value& root) {
  for (auto& [key, value] : root.MutableObject()) {
    if (key == "model") return value;
  }
  throw Error("no model");
}

}  // namespace

TEST_CASE("BpeTokenizer matches Hugging Face tokenizers on every reference string", "[tokenizer]") {
  const json::Value reference = json::ParseFile(TestData("tokenizer_reference.json"));
  for (const auto& [file, cases] : reference.at("files").AsObject()) {
    const auto tok = BpeTokenizer::FromFile(TestData(file));
    for (const json::Value& c : cases.AsArray()) {
      const std::string& text = c.at("text").AsString();
      INFO(file << ": " << text);
      std::vector<int64_t> expected_ids;
      for (const json::Value& id : c.at("ids").AsArray()) expected_ids.push_back(id.AsInt64());
      std::vector<std::string> expected_words;
      for (const json::Value& w : c.at("pre_tokens").AsArray()) {
        expected_words.push_back(w.AsString());
      }
      CHECK(tok->PreTokenize(text) == expected_words);
      const std::vector<int64_t> ids = tok->Encode(text);
      CHECK(ids == expected_ids);
      CHECK(tok->Decode(ids) == c.at("decoded").AsString());
      CHECK(tok->Decode(ids, SkipSpecial::kYes) == c.at("decoded_skip_special").AsString());
      CHECK(tok->Decode(ids) == text);  // round trip
    }
  }
}

TEST_CASE("merges as \"a b\" strings and as [a, b] pairs load to the same tokenizer",
          "[tokenizer]") {
  json::Value root = json::ParseFile(TestData("tiny_qwen2.json"));
  json::Value::Array pairs;
  for (const json::Value& m : Model(root).at("merges").AsArray()) {
    const std::string& s = m.AsString();
    const size_t space = s.find(' ');
    pairs.push_back(json::Value::MakeArray(
        {json::Value::String(s.substr(0, space)), json::Value::String(s.substr(space + 1))}));
  }
  Model(root).Set("merges", json::Value::MakeArray(pairs));
  const auto from_pairs = BpeTokenizer::FromJson(root, "pairs");
  const auto from_strings = BpeTokenizer::FromFile(TestData("tiny_qwen2.json"));
  const std::string text = "The quick brown fox; It's 12345 你好 <|im_end|>";
  CHECK(from_pairs->Encode(text) == from_strings->Encode(text));
}

TEST_CASE("special ids, token lookup and undecodable ids", "[tokenizer]") {
  const auto tok = BpeTokenizer::FromFile(TestData("tiny_gpt4.json"));
  CHECK(tok->vocab_size() == 320);
  CHECK(tok->TokenToId("<|im_end|>") == 318);
  CHECK(tok->IdToToken(318) == std::optional<std::string>("<|im_end|>"));
  CHECK(tok->IsSpecial(318));
  CHECK_FALSE(tok->IsSpecial(319));  // <think> is added but not special (as in Qwen3)
  CHECK(tok->eos_id() == 316);       // no tokenizer_config.json: <|endoftext|> by name
  CHECK(tok->stop_ids() == std::vector<int64_t>{316});
  CHECK_FALSE(tok->TokenToId("no such token").has_value());
  CHECK_FALSE(tok->IdToToken(320).has_value());
  // Ids beyond the vocab are skipped; a cut multi-byte character becomes U+FFFD.
  const std::vector<int64_t> ni_hao = tok->Encode("你");
  REQUIRE(ni_hao.size() >= 2);
  CHECK(tok->Decode({ni_hao[0], 999999}) == "\xEF\xBF\xBD");
  // An added token matched inside a word is never split.
  const std::vector<int64_t> ids = tok->Encode("ab<|im_end|>cd");
  CHECK(std::count(ids.begin(), ids.end(), 318) == 1);
}

TEST_CASE("LoadTokenizer reads tokenizer_config.json and generation_config.json", "[tokenizer]") {
  const auto tok = LoadTokenizer(TestData("qwen_dir"));
  CHECK(tok->eos_id() == 318);  // <|im_end|>
  CHECK(tok->pad_id() == std::optional<int64_t>(316));
  CHECK_FALSE(tok->bos_id().has_value());
  CHECK(tok->stop_ids() == std::vector<int64_t>{318, 316});
  CHECK(tok->chat_template().find("<|im_start|>") != std::string::npos);
}

TEST_CASE("LoadTokenizer names the missing tokenizer.json", "[tokenizer]") {
  CHECK_THROWS_WITH(
      LoadTokenizer(TestData("byte_only")),
      Catch::Contains("byte_only/tokenizer.json: not found") && Catch::Contains("tiktoken"));
  CHECK_THROWS_AS(LoadTokenizer(TempPath("no_such_dir")), CheckpointError);
}

TEST_CASE("a truncated tokenizer.json reports the file, line and column", "[tokenizer]") {
  const std::string text = ReadFile(TestData("tiny_qwen2.json"));
  const std::string path = WriteTemp("truncated.json", text.substr(0, text.size() / 2));
  CHECK_THROWS_WITH(BpeTokenizer::FromFile(path), Catch::Contains(path) &&
                                                      Catch::Contains("line ") &&
                                                      Catch::Contains("column "));
  CHECK_THROWS_AS(BpeTokenizer::FromFile(path), CheckpointError);
}

TEST_CASE("malformed tokenizer.json files give specific CheckpointErrors", "[tokenizer]") {
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               auto& obj = r.MutableObject();
               obj.erase(std::remove_if(obj.begin(), obj.end(),
                                        [](const auto& kv) { return kv.first == "model"; }),
                         obj.end());
             }),
             Catch::Contains("no \"model\""));
  CHECK_THAT(LoadErrorAfterEdit(
                 [](json::Value& r) { Model(r).Set("type", json::Value::String("Unigram")); }),
             Catch::Contains("model type \"Unigram\" is not supported"));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               auto& m = Model(r).MutableObject();
               m.erase(std::remove_if(m.begin(), m.end(),
                                      [](const auto& kv) { return kv.first == "merges"; }),
                       m.end());
             }),
             Catch::Contains("model has no \"merges\""));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               Model(r).at("merges");
               json::Value& merges = const_cast<json::Value&>(Model(r).at("merges"));
               merges.MutableArray()[3] = json::Value::String("Ġt zzz");
             }),
             Catch::Contains("merge 3") && Catch::Contains("\"zzz\" is not in the vocab"));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               json::Value& merges = const_cast<json::Value&>(Model(r).at("merges"));
               merges.MutableArray()[5] = json::Value::String("abc");
             }),
             Catch::Contains("merge 5 (\"abc\") is not two tokens"));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               json::Value& vocab = const_cast<json::Value&>(Model(r).at("vocab"));
               vocab.Set("Ġt", json::Value::Int(5));
             }),
             Catch::Contains("duplicate id 5 in vocab"));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               json::Value& vocab = const_cast<json::Value&>(Model(r).at("vocab"));
               vocab.Set("extra", json::Value::Int(1000));
             }),
             Catch::Contains("not contiguous") && Catch::Contains("id 1000"));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               json::Value& vocab = const_cast<json::Value&>(Model(r).at("vocab"));
               vocab.Set("Ġ", json::Value::String("x"));
             }),
             Catch::Contains("\"Ġ\": id is not an integer"));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               auto& obj = r.MutableObject();
               for (auto& [key, value] : obj) {
                 if (key != "pre_tokenizer") continue;
                 json::Value& split = value.MutableObject()[1].second.MutableArray()[0];
                 split.Set("pattern", json::Value::MakeObject(
                                          {{"Regex", json::Value::String("(\\p{L}+|\\s+")}}));
               }
             }),
             Catch::Contains("Split pre-tokenizer: regex \"(\\p{L}+|\\s+\" does not compile: "
                             "missing closing parenthesis at offset 11"));
  CHECK_THAT(
      LoadErrorAfterEdit([](json::Value& r) {
        r.Set("decoder", json::Value::MakeObject({{"type", json::Value::String("WordPiece")}}));
      }),
      Catch::Contains("decoder {\"type\":\"WordPiece\"} is not supported"));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) {
               json::Value& added = const_cast<json::Value&>(r.at("added_tokens"));
               added.MutableArray()[1].Set("id", json::Value::Int(316));
             }),
             Catch::Contains("duplicate id 316 in added_tokens"));
  CHECK_THAT(LoadErrorAfterEdit([](json::Value& r) { r = json::Value::MakeArray({}); }),
             Catch::Contains("expected a JSON object, found array"));
}

TEST_CASE("tokenizer_config.json naming an unknown eos token fails", "[tokenizer]") {
  TokenizerConfig config;
  config.eos_token = "<|nope|>";
  CHECK_THROWS_WITH(BpeTokenizer::FromFile(TestData("tiny_gpt2.json"), config),
                    Catch::Contains("eos_token \"<|nope|>\" is not a token of the vocab"));
}

TEST_CASE("ByteTokenizer round-trips bytes and maps its specials", "[tokenizer]") {
  const ByteTokenizer tok;
  CHECK(tok.vocab_size() == 259);
  const std::string text = "a\xC3\xA9<eos>z<pad>";
  const std::vector<int64_t> ids = tok.Encode(text);
  CHECK(ids ==
        std::vector<int64_t>{'a', 0xC3, 0xA9, ByteTokenizer::kEosId, 'z', ByteTokenizer::kPadId});
  CHECK(tok.Decode(ids) == text);
  CHECK(tok.Decode(ids, SkipSpecial::kYes) == "a\xC3\xA9z");
  CHECK(tok.Decode({0xC3}) == "\xEF\xBF\xBD");  // lone lead byte -> U+FFFD
  CHECK(tok.Decode({999, -1, 'x'}) == "x");
  CHECK(tok.TokenToId("<bos>") == ByteTokenizer::kBosId);
  CHECK(tok.IdToToken('q') == std::optional<std::string>("q"));
  CHECK(tok.Encode("<eo") == std::vector<int64_t>{'<', 'e', 'o'});
}

}  // namespace rl::data
