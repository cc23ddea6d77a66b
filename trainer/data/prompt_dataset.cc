#include "trainer/data/prompt_dataset.h"

#include <fmt/format.h>

#include <fstream>
#include <numeric>
#include <utility>

#include "launch/check.h"

namespace rl::data {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection sampling).
uint64_t UniformBelow(uint64_t bound, uint64_t* state) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = SplitMix64(state);
  } while (x >= limit);
  return x % bound;
}

bool IsBlank(std::string_view s) {
  return s.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

}  // namespace

PromptExample ParsePromptLine(std::string_view line_text, const PromptDatasetOptions& options,
                              const std::string& source, int64_t line) {
  const auto fail = [&](const std::string& what) {
    throw CheckpointError(fmt::format("{}:{}: {}", source, line, what));
  };
  json::Value value;
  try {
    value = json::Parse(line_text);
  } catch (const json::ParseError& e) {
    fail(fmt::format("not JSON: column {}: {}", e.column(), e.reason()));
  }
  if (!value.is_object()) {
    fail(fmt::format("expected a JSON object, found {}", json::KindName(value.kind())));
  }
  PromptExample example;
  example.line = line;

  const json::Value* prompt = value.Find(options.input_key);
  if (prompt == nullptr) fail(fmt::format("missing input key \"{}\"", options.input_key));
  if (prompt->is_string()) {
    example.text = prompt->AsString();
  } else if (prompt->is_array()) {
    const json::Value::Array& list = prompt->AsArray();
    if (list.empty()) fail(fmt::format("\"{}\" is an empty list of messages", options.input_key));
    for (size_t i = 0; i < list.size(); ++i) {
      const json::Value* role = list[i].Find("role");
      const json::Value* content = list[i].Find("content");
      if (!list[i].is_object() || role == nullptr || content == nullptr || !role->is_string() ||
          !content->is_string()) {
        fail(fmt::format("\"{}\"[{}] is not a message {{\"role\": string, \"content\": string}}",
                         options.input_key, i));
      }
      example.messages.push_back({role->AsString(), content->AsString()});
    }
  } else {
    fail(fmt::format("\"{}\" must be a string or a list of messages, found {}", options.input_key,
                     json::KindName(prompt->kind())));
  }

  if (!options.label_key.empty()) {
    const json::Value* label = value.Find(options.label_key);
    if (label == nullptr) fail(fmt::format("missing label key \"{}\"", options.label_key));
    if (label->is_string()) {
      example.label = label->AsString();
    } else if (label->is_number()) {
      example.label = json::Dump(*label);
    } else {
      fail(fmt::format("\"{}\" must be a string or a number, found {}", options.label_key,
                       json::KindName(label->kind())));
    }
  }
  return example;
}

PromptDataset PromptDataset::LoadJsonl(const std::string& path,
                                       const PromptDatasetOptions& options) {
  std::ifstream in(path, std::ios::binary);
  RL_CHECK(in, CheckpointError, "{}: cannot open prompt data for reading", path);
  std::vector<PromptExample> examples;
  std::string line_text;
  int64_t line = 0;
  while (std::getline(in, line_text)) {
    ++line;
    if (IsBlank(line_text)) continue;
    examples.push_back(ParsePromptLine(line_text, options, path, line));
  }
  RL_CHECK(!in.bad(), CheckpointError, "{}: read failed after line {}", path, line);
  RL_CHECK(!examples.empty(), CheckpointError, "{}: no prompts (the file is empty or blank)", path);
  return PromptDataset(std::move(examples), options.seed, options.shuffle);
}

PromptDataset::PromptDataset(std::vector<PromptExample> examples, uint64_t seed, Shuffle shuffle)
    : examples_(std::move(examples)), seed_(seed), shuffle_(shuffle) {
  RL_CHECK(!examples_.empty(), Error, "PromptDataset: no examples");
}

std::vector<int64_t> PromptDataset::EpochOrder(int64_t epoch) const {
  std::vector<int64_t> order(examples_.size());
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_ == Shuffle::kNo) return order;
  uint64_t state = seed_ ^ (0xD1B54A32D192ED03ULL * static_cast<uint64_t>(epoch + 1));
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(UniformBelow(i, &state));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

std::vector<PromptExample> PromptDataset::NextBatch(int64_t n) {
  RL_CHECK(n >= 0, Error, "PromptDataset::NextBatch: negative count {}", n);
  std::vector<PromptExample> batch;
  batch.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    if (position_.offset == size()) {
      ++position_.epoch;
      position_.offset = 0;
    }
    if (order_epoch_ != position_.epoch) {
      order_ = EpochOrder(position_.epoch);
      order_epoch_ = position_.epoch;
    }
    batch.push_back(examples_[static_cast<size_t>(order_[static_cast<size_t>(position_.offset)])]);
    ++position_.offset;
  }
  return batch;
}

json::Value PromptDataset::ExportState() const {
  return json::Value::MakeObject({
      {"epoch", json::Value::Int(position_.epoch)},
      {"offset", json::Value::Int(position_.offset)},
      // The seed is written as a string: JSON integers here are int64 and seeds use all 64 bits.
      {"seed", json::Value::String(std::to_string(seed_))},
      {"size", json::Value::Int(size())},
      {"shuffle", json::Value::Bool(shuffle_ == Shuffle::kYes)},
  });
}

void PromptDataset::ImportState(const json::Value& state) {
  Position p;
  std::string seed;
  int64_t n = 0;
  bool shuffle = false;
  try {
    p.epoch = state.at("epoch").AsInt64();
    p.offset = state.at("offset").AsInt64();
    seed = state.at("seed").AsString();
    n = state.at("size").AsInt64();
    shuffle = state.at("shuffle").AsBool();
  } catch (const json::TypeError& e) {
    throw CheckpointError(fmt::format("prompt dataset state: {}", e.what()));
  }
  RL_CHECK(seed == std::to_string(seed_) && n == size() && shuffle == (shuffle_ == Shuffle::kYes),
           CheckpointError,
           "prompt dataset state was saved for seed {}, {} prompts, shuffle {} but this run has "
           "seed {}, {} prompts, shuffle {}: resume with the same --prompt-data and seed",
           seed, n, shuffle, seed_, size(), shuffle_ == Shuffle::kYes);
  RL_CHECK(p.epoch >= 0 && p.offset >= 0 && p.offset <= n, CheckpointError,
           "prompt dataset state: epoch {} offset {} is out of range for {} prompts", p.epoch,
           p.offset, n);
  position_ = p;
}

}  // namespace rl::data
