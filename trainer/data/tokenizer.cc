#include "trainer/data/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <queue>
#include <utility>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/utf8.h"

namespace rl::data {
namespace {

using json::Value;

// A short, printable rendering of a token for messages.
std::string Quote(std::string_view s) {
  std::string shown = Utf8Lossy(s.substr(0, 80));
  return fmt::format("\"{}\"{}", shown, s.size() > 80 ? "..." : "");
}

bool OptionalBool(const Value& obj, std::string_view key, bool fallback) {
  const Value* v = obj.Find(key);
  if (v == nullptr || v->is_null()) return fallback;
  return v->AsBool();
}

// A token given as "text" or as {"content": "text", ...}; nullopt for null/absent.
std::optional<std::string> TokenName(const Value* v) {
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (v->is_string()) return v->AsString();
  return v->at("content").AsString();
}

[[noreturn]] void Fail(const std::string& source, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {}", source, what));
}

// tokenizer.json's "model", refused unless it is a byte-level BPE with none of the options this
// tokenizer does not implement.
const Value& CheckedModel(const Value& root, const std::string& source) {
  const Value* model = root.Find("model");
  if (model == nullptr || model->is_null()) {
    Fail(source, "no \"model\": not a tokenizers tokenizer.json");
  }
  if (!model->is_object()) Fail(source, "\"model\" is not an object");
  const Value* type = model->Find("type");
  if (type == nullptr) Fail(source, "model has no \"type\" (expected \"BPE\")");
  if (type->AsString() != "BPE") {
    Fail(source, fmt::format("model type \"{}\" is not supported (only byte-level \"BPE\")",
                             type->AsString()));
  }
  if (OptionalBool(*model, "byte_fallback", false)) {
    Fail(source, "model.byte_fallback = true (SentencePiece-style BPE) is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Value* v = model->Find(key);
    if (v != nullptr && !v->is_null() && !v->AsString().empty()) {
      Fail(source, fmt::format("model.{} = {} is not supported", key, Quote(v->AsString())));
    }
  }
  if (const Value* dropout = model->Find("dropout");
      dropout != nullptr && !dropout->is_null() && dropout->AsDouble() != 0.0) {
    Fail(source, "model.dropout is set: BPE dropout is random, not supported for rollouts");
  }
  return *model;
}

// Only null or NFC normalizers (alone or in a Sequence) are accepted.
void CheckNormalizer(const Value& root, const std::string& source) {
  const Value* norm = root.Find("normalizer");
  if (norm == nullptr || norm->is_null()) return;
  const std::string& kind = norm->at("type").AsString();
  bool ok = kind == "NFC";
  if (kind == "Sequence") {
    ok = true;
    for (const Value& step : norm->at("normalizers").AsArray()) {
      ok = ok && step.at("type").AsString() == "NFC";
    }
  }
  if (!ok) {
    Fail(source,
         fmt::format("normalizer {} is not supported (only null or NFC)", json::Dump(*norm)));
  }
}

void CheckDecoder(const Value& root, const std::string& source) {
  const Value* decoder = root.Find("decoder");
  if (decoder == nullptr || decoder->is_null() || decoder->at("type").AsString() != "ByteLevel") {
    Fail(source, fmt::format("decoder {} is not supported (only ByteLevel)",
                             decoder == nullptr ? std::string("(none)") : json::Dump(*decoder)));
  }
}

// The code point ending just before byte `pos` (pos > 0).
char32_t CodePointBefore(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && pos - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
    --start;
  }
  const DecodedChar d = DecodeUtf8At(text, start);
  return d.valid && start + static_cast<size_t>(d.num_bytes) == pos ? d.code_point
                                                                    : kReplacementChar;
}

}  // namespace

// ---- ByteTokenizer ----

std::vector<int64_t> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text[pos] == '<') {
      const std::string_view rest = text.substr(pos);
      int64_t special = -1;
      size_t length = 0;
      for (const auto& [token, id] : {std::pair{kPadToken, kPadId}, std::pair{kBosToken, kBosId},
                                      std::pair{kEosToken, kEosId}}) {
        if (rest.substr(0, token.size()) == token) {
          special = id;
          length = token.size();
        }
      }
      if (special >= 0) {
        ids.push_back(special);
        pos += length;
        continue;
      }
    }
    ids.push_back(static_cast<unsigned char>(text[pos]));
    ++pos;
  }
  return ids;
}

std::string ByteTokenizer::Decode(const std::vector<int64_t>& ids, SkipSpecial skip) const {
  std::string bytes;
  bytes.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id >= 0 && id < 256) {
      bytes.push_back(static_cast<char>(id));
    } else if (IsSpecial(id) && skip == SkipSpecial::kNo) {
      bytes.append(*IdToToken(id));
    }
  }
  return Utf8Lossy(bytes);
}

std::optional<int64_t> ByteTokenizer::TokenToId(std::string_view token) const {
  if (token == kPadToken) return kPadId;
  if (token == kBosToken) return kBosId;
  if (token == kEosToken) return kEosId;
  if (token.size() == 1) return static_cast<unsigned char>(token[0]);
  return std::nullopt;
}

std::optional<std::string> ByteTokenizer::IdToToken(int64_t id) const {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  if (id == kPadId) return std::string(kPadToken);
  if (id == kBosId) return std::string(kBosToken);
  if (id == kEosId) return std::string(kEosToken);
  return std::nullopt;
}

// ---- Config files ----

TokenizerConfig ParseTokenizerConfig(const Value& root, const std::string& source) {
  TokenizerConfig config;
  try {
    RL_CHECK(root.is_object(), CheckpointError, "{}: expected a JSON object, found {}", source,
             json::KindName(root.kind()));
    config.eos_token = TokenName(root.Find("eos_token"));
    config.pad_token = TokenName(root.Find("pad_token"));
    config.bos_token = TokenName(root.Find("bos_token"));
    if (const Value* t = root.Find("chat_template"); t != nullptr && !t->is_null()) {
      if (t->is_string()) {
        config.chat_template = t->AsString();
      } else {
        // A list of named templates; the "default" one is the chat template.
        for (const Value& named : t->AsArray()) {
          if (named.at("name").AsString() == "default") {
            config.chat_template = named.at("template").AsString();
          }
        }
      }
    }
  } catch (const json::TypeError& e) {
    throw CheckpointError(fmt::format("{}: {}", source, e.what()));
  }
  return config;
}

TokenizerConfig ReadTokenizerConfig(const std::string& dir) {
  TokenizerConfig config;
  const std::string config_path = JoinPath(dir, "tokenizer_config.json");
  if (PathExists(config_path)) {
    config = ParseTokenizerConfig(json::ParseFile(config_path), config_path);
  }
  const std::string jinja_path = JoinPath(dir, "chat_template.jinja");
  if (PathExists(jinja_path)) config.chat_template = ReadWholeFile(jinja_path);

  const std::string generation_path = JoinPath(dir, "generation_config.json");
  if (PathExists(generation_path)) {
    const Value root = json::ParseFile(generation_path);
    try {
      if (const Value* eos = root.Find("eos_token_id"); eos != nullptr && !eos->is_null()) {
        if (eos->is_array()) {
          for (const Value& id : eos->AsArray()) config.extra_stop_ids.push_back(id.AsInt64());
        } else {
          config.extra_stop_ids.push_back(eos->AsInt64());
        }
      }
    } catch (const json::TypeError& e) {
      throw CheckpointError(fmt::format("{}: eos_token_id: {}", generation_path, e.what()));
    }
  }
  return config;
}

// ---- BpeTokenizer: loading ----

std::unique_ptr<BpeTokenizer> BpeTokenizer::FromFile(const std::string& path,
                                                     const TokenizerConfig& config) {
  return FromJson(json::ParseFile(path), path, config);
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::FromJson(const Value& root, const std::string& source,
                                                     const TokenizerConfig& config) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  try {
    if (!root.is_object()) {
      Fail(source, fmt::format("expected a JSON object, found {}", json::KindName(root.kind())));
    }
    const Value& model = CheckedModel(root, source);
    tok->ignore_merges_ = OptionalBool(model, "ignore_merges", false);
    std::unordered_map<int64_t, std::string> by_id = tok->ReadVocab(model, source);
    tok->ReadAddedTokens(root, source, &by_id);
    tok->IndexTokens(by_id, source);
    tok->ReadMerges(model, source);
    CheckNormalizer(root, source);
    tok->ReadPreTokenizer(root, source);
    CheckDecoder(root, source);
  } catch (const json::TypeError& e) {
    Fail(source, e.what());
  }
  tok->ReadSpecialIds(config, source);
  return tok;
}

std::unordered_map<int64_t, std::string> BpeTokenizer::ReadVocab(const Value& model,
                                                                 const std::string& source) {
  const Value* vocab = model.Find("vocab");
  if (vocab == nullptr) Fail(source, "model has no \"vocab\"");
  if (!vocab->is_object()) Fail(source, "model.vocab is not an object of token -> id");
  std::unordered_map<int64_t, std::string> by_id;
  by_id.reserve(vocab->AsObject().size());
  for (const auto& [token, id_value] : vocab->AsObject()) {
    if (!id_value.is_integer()) {
      Fail(source, fmt::format("vocab token {}: id is not an integer", Quote(token)));
    }
    const int64_t id = id_value.AsInt64();
    if (id < 0) Fail(source, fmt::format("vocab token {} has negative id {}", Quote(token), id));
    const auto [it, inserted] = by_id.emplace(id, token);
    if (!inserted) {
      Fail(source,
           fmt::format("duplicate id {} in vocab: {} and {}", id, Quote(it->second), Quote(token)));
    }
    token_to_id_.emplace(token, id);
  }
  return by_id;
}

void BpeTokenizer::ReadAddedTokens(const Value& root, const std::string& source,
                                   std::unordered_map<int64_t, std::string>* by_id) {
  const Value* added = root.Find("added_tokens");
  if (added == nullptr || added->is_null()) return;
  std::unordered_map<int64_t, std::string> added_by_id;
  for (const Value& entry : added->AsArray()) {
    AddedToken t;
    t.id = entry.at("id").AsInt64();
    t.content = entry.at("content").AsString();
    t.special = OptionalBool(entry, "special", false);
    t.single_word = OptionalBool(entry, "single_word", false);
    t.lstrip = OptionalBool(entry, "lstrip", false);
    t.rstrip = OptionalBool(entry, "rstrip", false);
    t.normalized = OptionalBool(entry, "normalized", !t.special);
    if (t.content.empty()) Fail(source, fmt::format("added token {} has empty content", t.id));
    if (t.id < 0) {
      Fail(source, fmt::format("added token {} has negative id {}", Quote(t.content), t.id));
    }
    if (!added_by_id.emplace(t.id, t.content).second) {
      Fail(source, fmt::format("duplicate id {} in added_tokens: {} and {}", t.id,
                               Quote(added_by_id[t.id]), Quote(t.content)));
    }
    if (const auto it = by_id->find(t.id); it != by_id->end() && it->second != t.content) {
      Fail(source, fmt::format("added token {} has id {}, which the vocab gives to {}",
                               Quote(t.content), t.id, Quote(it->second)));
    }
    by_id->emplace(t.id, t.content);
    token_to_id_[t.content] = t.id;  // an added token overrides the vocab, as in HF
    added_tokens_.push_back(std::move(t));
  }
}

void BpeTokenizer::IndexTokens(const std::unordered_map<int64_t, std::string>& by_id,
                               const std::string& source) {
  const int64_t n = static_cast<int64_t>(by_id.size());
  if (n == 0) Fail(source, "empty vocab");
  id_to_token_.resize(static_cast<size_t>(n));
  is_special_.assign(static_cast<size_t>(n), 0);
  for (const auto& [id, token] : by_id) {
    if (id >= n) {
      int64_t missing = 0;
      while (by_id.count(missing) != 0) ++missing;
      Fail(source, fmt::format("token ids are not contiguous: {} tokens, but {} has id {} and id "
                               "{} is unused",
                               n, Quote(token), id, missing));
    }
    id_to_token_[static_cast<size_t>(id)] = token;
  }
  for (const AddedToken& t : added_tokens_) {
    is_special_[static_cast<size_t>(t.id)] = t.special ? 1 : 0;
  }
  std::stable_sort(
      added_tokens_.begin(), added_tokens_.end(),
      [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  added_by_first_byte_.assign(256, {});
  for (size_t i = 0; i < added_tokens_.size(); ++i) {
    const auto first = static_cast<unsigned char>(added_tokens_[i].content[0]);
    added_by_first_byte_[first].push_back(static_cast<uint32_t>(i));
  }
  for (int b = 0; b < 256; ++b) {
    const std::string byte_token = ByteLevelEncode(std::string(1, static_cast<char>(b)));
    if (token_to_id_.count(byte_token) == 0) {
      Fail(source, fmt::format("vocab lacks the byte-level token {} for byte 0x{:02X}: not a "
                               "byte-level BPE vocabulary",
                               Quote(byte_token), b));
    }
  }
}

void BpeTokenizer::ReadMerges(const Value& model, const std::string& source) {
  const Value* merges = model.Find("merges");
  if (merges == nullptr) Fail(source, "model has no \"merges\"");
  if (!merges->is_array()) Fail(source, "model.merges is not an array");
  const Value::Array& merge_list = merges->AsArray();
  merges_.reserve(merge_list.size());
  for (size_t rank = 0; rank < merge_list.size(); ++rank) {
    const Value& m = merge_list[rank];
    std::string left;
    std::string right;
    if (m.is_string()) {
      const std::string& s = m.AsString();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        Fail(source,
             fmt::format("merge {} ({}) is not two tokens separated by one space", rank, Quote(s)));
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.AsArray().size() == 2) {
      left = m.AsArray()[0].AsString();
      right = m.AsArray()[1].AsString();
    } else {
      Fail(source, fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", rank));
    }
    const auto id_of = [&](const std::string& token) {
      const auto it = token_to_id_.find(token);
      if (it == token_to_id_.end()) {
        Fail(source, fmt::format("merge {} ({} + {}): {} is not in the vocab", rank, Quote(left),
                                 Quote(right), Quote(token)));
      }
      return it->second;
    };
    const int64_t left_id = id_of(left);
    const int64_t right_id = id_of(right);
    const int64_t merged_id = id_of(left + right);
    const uint64_t key = (static_cast<uint64_t>(left_id) << 32) | static_cast<uint64_t>(right_id);
    // A repeated merge keeps its first (best) rank, as tokenizers does.
    merges_.emplace(key, Merge{static_cast<int32_t>(rank), merged_id});
  }
}

void BpeTokenizer::ReadPreTokenizer(const Value& root, const std::string& source) {
  const Value* pre = root.Find("pre_tokenizer");
  if (pre == nullptr || pre->is_null()) {
    Fail(source, "no pre_tokenizer: a byte-level BPE tokenizer needs a ByteLevel pre-tokenizer");
  }
  std::vector<const Value*> steps;
  if (pre->at("type").AsString() == "Sequence") {
    for (const Value& step : pre->at("pretokenizers").AsArray()) steps.push_back(&step);
  } else {
    steps.push_back(pre);
  }
  for (const Value* step : steps) {
    const std::string& kind = step->at("type").AsString();
    PreTokenizerStep s;
    if (!steps_.empty() && steps_.back().kind == PreTokenizerStep::Kind::kByteLevel) {
      Fail(source, fmt::format("pre_tokenizer step {} after ByteLevel is not supported", kind));
    }
    if (kind == "Split") {
      const Value& pattern = step->at("pattern");
      const Value* regex = pattern.Find("Regex");
      if (regex == nullptr) {
        Fail(source, fmt::format("Split pre-tokenizer with pattern {} is not supported (only "
                                 "Regex)",
                                 json::Dump(pattern)));
      }
      try {
        s.regex = std::make_shared<const SplitRegex>(regex->AsString());
      } catch (const CheckpointError& e) {
        Fail(source, fmt::format("Split pre-tokenizer: {}", e.what()));
      }
      const Value* behavior = step->Find("behavior");
      if (behavior != nullptr && behavior->AsString() != "Isolated") {
        Fail(source, fmt::format("Split pre-tokenizer behavior \"{}\" is not supported (only "
                                 "Isolated)",
                                 behavior->AsString()));
      }
      if (OptionalBool(*step, "invert", false)) {
        Fail(source, "Split pre-tokenizer with invert = true is not supported");
      }
      s.kind = PreTokenizerStep::Kind::kSplit;
    } else if (kind == "ByteLevel") {
      s.kind = PreTokenizerStep::Kind::kByteLevel;
      s.add_prefix_space = OptionalBool(*step, "add_prefix_space", true);
      s.use_regex = OptionalBool(*step, "use_regex", true);
      if (s.use_regex) s.regex = Gpt2Regex();
    } else {
      Fail(source, fmt::format("pre_tokenizer type \"{}\" is not supported (only Split and "
                               "ByteLevel)",
                               kind));
    }
    steps_.push_back(s);
  }
  if (steps_.empty() || steps_.back().kind != PreTokenizerStep::Kind::kByteLevel) {
    Fail(source, "pre_tokenizer has no ByteLevel step: not a byte-level BPE tokenizer");
  }
}

void BpeTokenizer::ReadSpecialIds(const TokenizerConfig& config, const std::string& source) {
  const auto special_id = [&](const std::optional<std::string>& name, const char* what) {
    std::optional<int64_t> id;
    if (name) {
      id = TokenToId(*name);
      if (!id) {
        Fail(source, fmt::format("tokenizer_config.json's {} {} is not a token of the vocab", what,
                                 Quote(*name)));
      }
    }
    return id;
  };
  if (std::optional<int64_t> eos = special_id(config.eos_token, "eos_token")) {
    eos_id_ = *eos;
  } else {
    for (const char* name :
         {"<|endoftext|>", "<｜end▁of▁sentence｜>", "</s>", "<|end_of_text|>", "<eos>"}) {
      if (std::optional<int64_t> id = TokenToId(name)) {
        eos_id_ = *id;
        break;
      }
    }
    if (eos_id_ < 0) {
      Fail(source,
           "no eos token: tokenizer_config.json has no eos_token and the vocab has none of "
           "<|endoftext|>, <｜end▁of▁sentence｜>, </s>, <|end_of_text|>, <eos>");
    }
  }
  pad_id_ = special_id(config.pad_token, "pad_token");
  bos_id_ = special_id(config.bos_token, "bos_token");
  stop_ids_.push_back(eos_id_);
  for (const int64_t id : config.extra_stop_ids) {
    if (id < 0 || id >= vocab_size()) {
      Fail(source, fmt::format("generation_config.json's eos_token_id {} is outside the vocab "
                               "(size {})",
                               id, vocab_size()));
    }
    if (std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) {
      stop_ids_.push_back(id);
    }
  }
  chat_template_ = config.chat_template;
}

// ---- BpeTokenizer: encoding ----

void BpeTokenizer::SplitOnAddedTokens(std::string_view text, bool normalized_pass,
                                      std::vector<Segment>* out) const {
  size_t plain_start = 0;  // start of the text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* match = nullptr;
    // Candidates starting with this byte, longest first: leftmost-longest.
    for (const uint32_t index : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& t = added_tokens_[index];
      if (t.normalized != normalized_pass) continue;
      if (text.compare(pos, t.content.size(), t.content) != 0) continue;
      if (t.single_word) {
        const size_t end = pos + t.content.size();
        const bool left_ok = pos == 0 || !IsWordChar(CodePointBefore(text, pos));
        const bool right_ok = end == text.size() || !IsWordChar(DecodeUtf8At(text, end).code_point);
        if (!left_ok || !right_ok) continue;
      }
      match = &t;
      break;
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + match->content.size();
    if (match->lstrip) {
      while (begin > plain_start && IsWhitespace(CodePointBefore(text, begin))) {
        const char32_t cp = CodePointBefore(text, begin);
        begin -= cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      }
    }
    if (match->rstrip) {
      while (end < text.size()) {
        const DecodedChar d = DecodeUtf8At(text, end);
        if (!d.valid || !IsWhitespace(d.code_point)) break;
        end += static_cast<size_t>(d.num_bytes);
      }
    }
    if (begin > plain_start) out->push_back({text.substr(plain_start, begin - plain_start), -1});
    out->push_back({text.substr(begin, end - begin), match->id});
    plain_start = end;
    pos = end;
  }
  if (plain_start < text.size()) out->push_back({text.substr(plain_start), -1});
}

std::vector<std::string> BpeTokenizer::PreTokenize(std::string_view text) const {
  std::vector<std::string> pieces{std::string(text)};
  for (const PreTokenizerStep& step : steps_) {
    std::vector<std::string> next;
    for (std::string& piece : pieces) {
      if (step.kind == PreTokenizerStep::Kind::kSplit) {
        for (std::string_view w : step.regex->Split(piece)) next.emplace_back(w);
        continue;
      }
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, " ");
      if (step.use_regex) {
        for (std::string_view w : step.regex->Split(piece)) {
          next.push_back(ByteLevelEncode(w));
        }
      } else {
        next.push_back(ByteLevelEncode(piece));
      }
    }
    pieces = std::move(next);
  }
  pieces.erase(
      std::remove_if(pieces.begin(), pieces.end(), [](const std::string& p) { return p.empty(); }),
      pieces.end());
  return pieces;
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int64_t>* ids) const {
  if (ignore_merges_) {
    if (const auto it = token_to_id_.find(std::string(word)); it != token_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // Symbols form a doubly linked list; merges are applied best rank first, leftmost first on a
  // tie, exactly as tokenizers' BPE::merge_word does.
  struct Symbol {
    int64_t id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < word.size();) {
    const DecodedChar d = DecodeUtf8At(word, pos);
    const std::string ch(word.substr(pos, static_cast<size_t>(d.num_bytes)));
    // Every byte-level character is in the vocab (checked at load).
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({token_to_id_.at(ch), index - 1, index + 1, true});
    pos += static_cast<size_t>(d.num_bytes);
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int left;
    int64_t left_id;
    int64_t right_id;
    int64_t merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push = [&](int left) {
    if (left < 0) return;
    const int right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const int64_t a = symbols[static_cast<size_t>(left)].id;
    const int64_t b = symbols[static_cast<size_t>(right)].id;
    const auto it = merges_.find((static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b));
    if (it != merges_.end()) queue.push({it->second.rank, left, a, b, it->second.merged_id});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) push(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(c.left)];
    if (!left.alive || left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    if (right.id != c.right_id) continue;
    left.id = c.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
    push(left.prev);
    push(c.left);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids->push_back(s.id);
  }
}

std::vector<int64_t> BpeTokenizer::Encode(std::string_view text) const {
  // Pass 1: added tokens matched on the raw text; pass 2: the "normalized" added tokens on what
  // is left (our normalizer is the identity, see the header).
  std::vector<Segment> first;
  SplitOnAddedTokens(text, /*normalized_pass=*/false, &first);
  std::vector<Segment> segments;
  for (const Segment& s : first) {
    if (s.added_id >= 0) {
      segments.push_back(s);
    } else {
      SplitOnAddedTokens(s.text, /*normalized_pass=*/true, &segments);
    }
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (const Segment& s : segments) {
    if (s.added_id >= 0) {
      ids.push_back(s.added_id);
      continue;
    }
    for (const std::string& word : PreTokenize(s.text)) EncodeWord(word, &ids);
  }
  return ids;
}

std::string BpeTokenizer::Decode(const std::vector<int64_t>& ids, SkipSpecial skip) const {
  std::string bytes;
  for (const int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;  // as tokenizers does
    if (skip == SkipSpecial::kYes && is_special_[static_cast<size_t>(id)]) continue;
    const std::string& token = id_to_token_[static_cast<size_t>(id)];
    if (!ByteLevelDecode(token, &bytes)) bytes.append(token);
  }
  return Utf8Lossy(bytes);
}

std::optional<int64_t> BpeTokenizer::TokenToId(std::string_view token) const {
  const auto it = token_to_id_.find(std::string(token));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> BpeTokenizer::IdToToken(int64_t id) const {
  if (id < 0 || id >= vocab_size()) return std::nullopt;
  return id_to_token_[static_cast<size_t>(id)];
}

bool BpeTokenizer::IsSpecial(int64_t id) const {
  return id >= 0 && id < vocab_size() && is_special_[static_cast<size_t>(id)] != 0;
}

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& checkpoint_dir) {
  const std::string path = JoinPath(checkpoint_dir, "tokenizer.json");
  if (!PathExists(path)) {
    const bool tiktoken = PathExists(JoinPath(checkpoint_dir, "tiktoken.model"));
    throw CheckpointError(fmt::format(
        "{}: not found{}", path,
        tiktoken ? " (the checkpoint has tiktoken.model, e.g. Kimi; tiktoken tokenizers are not "
                   "supported: convert it to tokenizer.json or use pre-tokenized prompts)"
                 : ": the checkpoint directory must hold a Hugging Face tokenizer.json"));
  }
  const TokenizerConfig config = ReadTokenizerConfig(checkpoint_dir);
  return BpeTokenizer::FromFile(path, config);
}

}  // namespace rl::data
