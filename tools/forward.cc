// forward: runs a Hugging Face checkpoint's forward pass on the CPU in fp32 and writes the logits.
//
//   forward --checkpoint DIR --tokens "1,2,3;4,5,6" --output FILE.safetensors
//
// Rows are separated by ';', token ids by ','. Rows of different lengths are right-padded for the
// forward (causal attention: no real position sees the padding), and only real positions are
// written: the output tensor `logits` is [batch, max_len, vocab] fp32 with zeros at padded
// positions. The file's metadata records the checkpoint and the row lengths.
//
// Exit status: 0 on success; 2 for a bad flag (the message names it); 1 when the checkpoint cannot
// be loaded (the CheckpointError message) or the output cannot be written.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "launch/check.h"
#include "trainer/model/decoder.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/model_config.h"
#include "trainer/model/params.h"
#include "trainer/model/safetensors.h"
#include "trainer/model/safetensors_writer.h"

namespace {

constexpr int kExitBadFlag = 2;
constexpr int kExitFailure = 1;

// "1,2,3;4,5" -> {{1,2,3},{4,5}}; throws rl::ConfigError naming --tokens.
std::vector<std::vector<int64_t>> ParseTokens(const std::string& text) {
  std::vector<std::vector<int64_t>> rows;
  size_t row_begin = 0;
  while (row_begin <= text.size()) {
    const size_t row_end = std::min(text.find(';', row_begin), text.size());
    const std::string row = text.substr(row_begin, row_end - row_begin);
    std::vector<int64_t> ids;
    size_t begin = 0;
    while (begin <= row.size()) {
      const size_t end = std::min(row.find(',', begin), row.size());
      std::string item = row.substr(begin, end - begin);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      RL_CHECK(!item.empty() && used == item.size() && id >= 0, rl::ConfigError,
               "--tokens: \"{}\" in row {} is not a non-negative token id (expected rows of "
               "comma-separated ids separated by ';', e.g. \"1,2,3;4,5,6\")",
               item, rows.size() + 1);
      ids.push_back(id);
      begin = end + 1;
    }
    rows.push_back(std::move(ids));
    row_begin = row_end + 1;
  }
  return rows;
}

int Run(const std::string& checkpoint, const std::vector<std::vector<int64_t>>& rows,
        const std::string& output) {
  using namespace rl::model;
  at::NoGradGuard no_grad;
  const ModelConfig config = LoadModelConfig(checkpoint);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t id : rows[r]) {
      RL_CHECK(id < config.vocab_size, rl::ConfigError,
               "--tokens: token id {} in row {} is outside the vocabulary of {} ({} ids)", id,
               r + 1, checkpoint, config.vocab_size);
    }
  }
  TensorMap params = AllocateParams(ListParams(config), at::kFloat, at::kCPU);
  LoadParams(CheckpointReader::Open(checkpoint), config, params);
  const Decoder model(config, params);

  int64_t max_len = 0;
  for (const auto& row : rows) max_len = std::max<int64_t>(max_len, row.size());
  const int64_t batch = static_cast<int64_t>(rows.size());
  const int64_t pad = config.pad_token_id.value_or(0) < config.vocab_size
                          ? config.pad_token_id.value_or(0)
                          : 0;
  at::Tensor tokens = at::full({batch, max_len}, pad, at::kLong);
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < batch; ++b) {
    for (size_t s = 0; s < rows[b].size(); ++s) tokens[b][s] = rows[b][s];
    lengths.push_back(static_cast<int64_t>(rows[b].size()));
  }
  at::Tensor logits = model.Logits(tokens).to(at::kFloat).contiguous();  // [B, L, V]
  for (int64_t b = 0; b < batch; ++b) {
    if (lengths[b] < max_len) logits[b].narrow(0, lengths[b], max_len - lengths[b]).zero_();
  }
  WriteSafetensors(output, {{"logits", logits}},
                   {{"checkpoint", checkpoint},
                    {"model_type", std::string(ModelTypeName(config.model_type))},
                    {"lengths", fmt::format("[{}]", fmt::join(lengths, ","))}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs a checkpoint's forward on the CPU in fp32 and writes the logits "
               "[batch, seq, vocab] as the tensor `logits` of a safetensors file."};
  std::string checkpoint, tokens_text, output;
  app.add_option("--checkpoint", checkpoint,
                 "Hugging Face checkpoint directory (config.json + *.safetensors)")
      ->required();
  app.add_option("--tokens", tokens_text,
                 "token ids: rows separated by ';', ids by ',' (e.g. \"1,2,3;4,5,6\")")
      ->required();
  app.add_option("--output", output, "the safetensors file to write")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "forward: %s\n", e.what());
    return kExitBadFlag;
  }
  try {
    return Run(checkpoint, ParseTokens(tokens_text), output);
  } catch (const rl::ConfigError& e) {
    std::fprintf(stderr, "forward: %s\n", e.what());
    return kExitBadFlag;
  } catch (const rl::Error& e) {
    std::fprintf(stderr, "forward: %s\n", e.what());
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "forward: %s\n", e.what());
    return kExitFailure;
  }
}
