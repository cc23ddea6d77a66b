// JSONL parsing (string and chat prompts, string and number labels, one test per kind of bad
// line), epoch order (a permutation, deterministic, different per epoch) and cursor resume.
#include "trainer/data/prompt_dataset.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <set>

#include "launch/check.h"

namespace rl::data {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string LoadError(const std::string& text, const PromptDatasetOptions& options = {}) {
  const std::string path = WriteTemp("bad.jsonl", text);
  try {
    PromptDataset::LoadJsonl(path, options);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  FAIL("no CheckpointError");
  return "";
}

PromptDataset Numbered(int n, uint64_t seed, Shuffle shuffle) {
  std::vector<PromptExample> examples(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) examples[static_cast<size_t>(i)].label = std::to_string(i);
  return PromptDataset(std::move(examples), seed, shuffle);
}

}  // namespace

TEST_CASE("JSONL prompts: strings, chats, number labels, blank lines", "[prompt_dataset]") {
  const std::string path =
      WriteTemp("ok.jsonl",
                "{\"q\": \"What is 2+2?\", \"a\": 4, \"extra\": null}\n"
                "\n"
                "{\"q\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                "{\"role\": \"user\", \"content\": \"Name a colour.\"}], \"a\": \"red\"}\n"
                "{\"q\": \"half\", \"a\": 0.5}");  // no final newline
  PromptDatasetOptions options;
  options.input_key = "q";
  options.label_key = "a";
  options.shuffle = Shuffle::kNo;
  PromptDataset data = PromptDataset::LoadJsonl(path, options);
  REQUIRE(data.size() == 3);
  CHECK(data.at(0).text == "What is 2+2?");
  CHECK(data.at(0).label == "4");
  CHECK(data.at(0).line == 1);
  CHECK_FALSE(data.at(0).is_chat());
  REQUIRE(data.at(1).is_chat());
  CHECK(data.at(1).messages.size() == 2);
  CHECK(data.at(1).messages[1].content == "Name a colour.");
  CHECK(data.at(1).label == "red");
  CHECK(data.at(1).line == 3);
  CHECK(data.at(2).label == "0.5");
}

TEST_CASE("bad JSONL lines name the file, the line and the problem", "[prompt_dataset]") {
  const std::string ok = "{\"prompt\": \"x\", \"label\": \"y\"}\n";
  CHECK_THAT(LoadError(ok + "{\"prompt\": \"x\", \n"),
             Catch::Contains("bad.jsonl:2: not JSON: column"));
  CHECK_THAT(LoadError(ok + ok + "[1, 2]\n"),
             Catch::Contains(":3: expected a JSON object, found array"));
  CHECK_THAT(LoadError("{\"label\": \"y\"}\n"),
             Catch::Contains(":1: missing input key \"prompt\""));
  CHECK_THAT(LoadError("{\"prompt\": \"x\"}\n"),
             Catch::Contains(":1: missing label key \"label\""));
  CHECK_THAT(LoadError("{\"prompt\": 3, \"label\": \"y\"}\n"),
             Catch::Contains("\"prompt\" must be a string or a list of messages, found number"));
  CHECK_THAT(LoadError("{\"prompt\": [{\"role\": \"user\"}], \"label\": \"y\"}\n"),
             Catch::Contains("\"prompt\"[0] is not a message"));
  CHECK_THAT(LoadError("{\"prompt\": [], \"label\": \"y\"}\n"),
             Catch::Contains("empty list of messages"));
  CHECK_THAT(LoadError("{\"prompt\": \"x\", \"label\": [1]}\n"),
             Catch::Contains("\"label\" must be a string or a number, found array"));
  CHECK_THAT(LoadError(""), Catch::Contains("no prompts"));
  CHECK_THAT(LoadError("\n  \n"), Catch::Contains("no prompts"));
  CHECK_THROWS_WITH(PromptDataset::LoadJsonl("/nonexistent/p.jsonl", {}),
                    Catch::Contains("/nonexistent/p.jsonl: cannot open"));
}

TEST_CASE("labels are optional with an empty label key", "[prompt_dataset]") {
  PromptDatasetOptions options;
  options.label_key = "";
  const PromptDataset data =
      PromptDataset::LoadJsonl(WriteTemp("nolabel.jsonl", "{\"prompt\": \"x\"}\n"), options);
  CHECK(data.at(0).label.empty());
}

TEST_CASE("each epoch is a seeded permutation; batches wrap epochs", "[prompt_dataset]") {
  PromptDataset a = Numbered(10, 7, Shuffle::kYes);
  const std::vector<int64_t> e0 = a.EpochOrder(0);
  const std::vector<int64_t> e1 = a.EpochOrder(1);
  CHECK(std::set<int64_t>(e0.begin(), e0.end()).size() == 10);
  CHECK(e0 != e1);
  CHECK(Numbered(10, 7, Shuffle::kYes).EpochOrder(0) == e0);  // deterministic
  CHECK(Numbered(10, 8, Shuffle::kYes).EpochOrder(0) != e0);  // seed matters
  CHECK(Numbered(4, 7, Shuffle::kNo).EpochOrder(3) == std::vector<int64_t>{0, 1, 2, 3});

  const std::vector<PromptExample> first = a.NextBatch(7);
  const std::vector<PromptExample> second = a.NextBatch(7);  // 3 from epoch 0, 4 from epoch 1
  CHECK(a.position().epoch == 1);
  CHECK(a.position().offset == 4);
  CHECK(first[0].label == std::to_string(e0[0]));
  CHECK(second[2].label == std::to_string(e0[9]));
  CHECK(second[3].label == std::to_string(e1[0]));
  CHECK(a.NextBatch(0).empty());
}

TEST_CASE("an exported cursor resumes the same sequence", "[prompt_dataset]") {
  PromptDataset a = Numbered(5, 42, Shuffle::kYes);
  a.NextBatch(8);
  const json::Value state = json::Parse(json::Dump(a.ExportState()));
  PromptDataset b = Numbered(5, 42, Shuffle::kYes);
  b.ImportState(state);
  for (int i = 0; i < 3; ++i) {
    const auto x = a.NextBatch(4);
    const auto y = b.NextBatch(4);
    for (size_t k = 0; k < x.size(); ++k) CHECK(x[k].label == y[k].label);
  }
  PromptDataset other_seed = Numbered(5, 43, Shuffle::kYes);
  CHECK_THROWS_WITH(other_seed.ImportState(state), Catch::Contains("saved for seed 42"));
  PromptDataset other_size = Numbered(6, 42, Shuffle::kYes);
  CHECK_THROWS_AS(other_size.ImportState(state), CheckpointError);
  CHECK_THROWS_AS(b.ImportState(json::Parse("{\"epoch\": 1}")), CheckpointError);
}

}  // namespace rl::data
