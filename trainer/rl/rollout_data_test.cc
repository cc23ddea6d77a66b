// The rollout-data file reads back exactly what was written, and every bad line is reported with
// the file, its line number and the field, never a crash.
#include "trainer/rl/rollout_data.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "launch/atomic_file.h"
#include "launch/check.h"

namespace rl::rl_algo {
namespace {

// A fresh directory for one test, under Bazel's TEST_TMPDIR when there is one.
std::string MakeTempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/rollout_data_XXXXXX";
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

// The message ReadRolloutData throws for `text`, or "" when it reads.
std::string ReadError(const std::string& text) {
  const std::string path = MakeTempDir() + "/bad.jsonl";
  WriteText(path, text);
  try {
    ReadRolloutData(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

constexpr const char* kGoodLine =
    R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1], "reward": 1.0})"
    "\n";

Sample MakeSample(std::vector<int64_t> tokens, int64_t response_length, double reward) {
  Sample s;
  s.tokens = std::move(tokens);
  s.response_length = response_length;
  s.loss_mask.assign(static_cast<size_t>(response_length), 1);
  s.reward = reward;
  return s;
}

TEST_CASE("write then read gives back the same batch, bit for bit", "[rollout_data]") {
  RolloutBatch batch;
  Sample a = MakeSample({151644, 872, 0, 9223372036854775807LL}, 3, 0.1);
  a.loss_mask = {1, 0, 1};
  // Values with no short decimal form: the writer must print enough digits.
  a.rollout_log_probs = std::vector<float>{-0.1f, std::nextafter(-1.0f, 0.0f), -1e-38f};
  a.group_index = 0;
  Sample b = MakeSample({1, 2}, 1, -1.0 / 3.0);
  b.rollout_log_probs = std::vector<float>{-std::numeric_limits<float>::denorm_min()};
  b.group_index = 0;
  Sample c = MakeSample({3, 4, 5}, 2, 5e-324);  // smallest double, and no log-probs
  c.group_index = 7;
  Sample d = MakeSample({7, 8}, 1, 1e300);  // no group either
  d.group_index = std::nullopt;
  batch.samples = {a, b, c, d};

  const std::string path = MakeTempDir() + "/rollout.jsonl";
  WriteRolloutData(path, batch);
  const RolloutBatch back = ReadRolloutData(path);
  REQUIRE(back.samples.size() == batch.samples.size());
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    INFO("sample " << i);
    CHECK(back.samples[i] == batch.samples[i]);
  }
  CHECK_FALSE(PathExists(path + ".tmp." + std::to_string(::getpid())));
}

TEST_CASE("an empty batch round-trips to an empty file", "[rollout_data]") {
  const std::string path = MakeTempDir() + "/empty.jsonl";
  WriteRolloutData(path, RolloutBatch{});
  CHECK(ReadRolloutData(path).samples.empty());
}

TEST_CASE("blank lines are skipped and line numbers still count them", "[rollout_data]") {
  const std::string error = ReadError(std::string(kGoodLine) + "\n" + kGoodLine + "[1]\n");
  CHECK_THAT(error, Catch::Contains("bad.jsonl:4: expected a JSON object"));
}

TEST_CASE("each kind of bad line is reported with its line number and field", "[rollout_data]") {
  struct Case {
    const char* line;
    const char* message;
  };
  const Case cases[] = {
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1], "reward": 1.0,})",
       ":2: not valid JSON: column"},
      {R"({"tokens": [5, 6, 7], "loss_mask": [1, 1], "reward": 1.0})",
       ":2: field \"response_length\": missing"},
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1]})",
       ":2: field \"reward\": missing"},
      {R"({"tokens": "5 6 7", "response_length": 2, "loss_mask": [1, 1], "reward": 1.0})",
       ":2: field \"tokens\": is \"5 6 7\", not an array"},
      {R"({"tokens": [5, 6.5, 7], "response_length": 2, "loss_mask": [1, 1], "reward": 1.0})",
       ":2: field \"tokens\": entry 1 is 6.5, not an integer"},
      {R"({"tokens": [5, 6, 7], "response_length": "2", "loss_mask": [1, 1], "reward": 1.0})",
       ":2: field \"response_length\": is \"2\", not an integer"},
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1], "reward": "1"})",
       ":2: field \"reward\": is \"1\", not a number"},
      {R"({"tokens": [5, 6, 7], "response_length": 4, "loss_mask": [1, 1, 1, 1], "reward": 1})",
       ":2: field \"response_length\": is 4, but \"tokens\" has only 3 entries"},
      {R"({"tokens":[5],"response_length":1,"loss_mask":[1],"reward":1})",
       ":2: field \"response_length\": is 1, as many as \"tokens\" has entries; a sample needs at "
       "least one prompt token before its response"},
      {R"({"tokens": [5, 6, 7], "response_length": 0, "loss_mask": [], "reward": 1})",
       ":2: field \"response_length\": is 0; a sample needs at least one response token"},
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1, 1], "reward": 1})",
       ":2: field \"loss_mask\": has 3 entries, but response_length is 2"},
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 2], "reward": 1})",
       ":2: field \"loss_mask\": entry 1 is 2; a loss mask holds 0 or 1"},
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1], "reward": 1,
           "rollout_log_probs": [-0.5]})",
       ":2: field \"rollout_log_probs\": has 1 entries, but response_length is 2"},
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1], "reward": 1,
           "rollout_log_probs": [-0.5, 1e300]})",
       ":2: field \"rollout_log_probs\": entry 1 is 1e+300, beyond the range of a float"},
      {R"({"tokens": [5, -6, 7], "response_length": 2, "loss_mask": [1, 1], "reward": 1})",
       ":2: field \"tokens\": entry 1 is -6; token ids must be >= 0"},
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1], "rewards": 1})",
       ":2: field \"rewards\": unknown field"},
      {R"({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [1, 1], "reward": 1,
           "group": -1})",
       ":2: field \"group\": is -1; group ids must be >= 0"},
      {R"([5, 6, 7])", ":2: expected a JSON object (one sample per line), found an array"},
  };
  for (const Case& c : cases) {
    // Multi-line raw strings above are for reading; a JSONL line has no newline inside.
    std::string line = c.line;
    for (char& ch : line) {
      if (ch == '\n') ch = ' ';
    }
    INFO(line);
    const std::string error = ReadError(std::string(kGoodLine) + line + "\n" + kGoodLine);
    CHECK_THAT(error, Catch::Contains("bad.jsonl" + std::string(c.message)));
  }
}

TEST_CASE("a non-finite reward is refused (JSON cannot hold one; the writer checks)",
          "[rollout_data]") {
  // JSON has no spelling for inf or NaN; a value that overflows a double is not valid JSON.
  CHECK_THAT(ReadError(R"({"tokens": [5, 6], "response_length": 1, "loss_mask": [1], )"
                       R"("reward": 1e999})"
                       "\n"),
             Catch::Contains("bad.jsonl:1: not valid JSON"));
  RolloutBatch batch;
  batch.samples = {MakeSample({1, 2}, 1, 0.0), MakeSample({1, 2}, 1, std::nan(""))};
  const std::string path = MakeTempDir() + "/nan.jsonl";
  try {
    WriteRolloutData(path, batch);
    FAIL("wrote a NaN reward");
  } catch (const CheckpointError& e) {
    CHECK_THAT(e.what(), Catch::Contains("nan.jsonl: cannot write sample 1 (line 2): field "
                                         "\"reward\": is nan; rewards must be finite"));
  }
  CHECK_FALSE(PathExists(path));
}

TEST_CASE("a truncated last line is reported as truncation, never a crash", "[rollout_data]") {
  const std::string whole = std::string(kGoodLine) + kGoodLine;
  // Every cut inside the second line that leaves it invalid JSON.
  for (size_t cut = std::string(kGoodLine).size() + 1; cut < whole.size() - 1; ++cut) {
    INFO("cut at byte " << cut);
    const std::string error = ReadError(whole.substr(0, cut));
    CHECK_THAT(error, Catch::Contains("bad.jsonl:2: the last line is cut short"));
  }
  // Without its newline but complete, the last line reads.
  CHECK(ReadError(whole.substr(0, whole.size() - 1)).empty());
}

TEST_CASE("a missing file names the file", "[rollout_data]") {
  CHECK_THROWS_WITH(ReadRolloutData("/nonexistent/rollout.jsonl"),
                    Catch::Contains("/nonexistent/rollout.jsonl: cannot open"));
}

TEST_CASE("groups come from group ids, or from position", "[rollout_data]") {
  RolloutBatch batch;
  for (const int64_t g : {3, 3, 1, 1, 1, 9}) {
    Sample s = MakeSample({1, 2}, 1, 0.0);
    s.group_index = g;
    batch.samples.push_back(s);
  }
  CHECK(GroupSizes(batch, 8) == std::vector<int64_t>{2, 3, 1});

  batch.samples[5].group_index = 3;  // group 3 comes back after group 1
  CHECK_THROWS_WITH(GroupSizes(batch, 2), Catch::Contains("must be consecutive"));
  batch.samples[5].group_index = std::nullopt;
  CHECK_THROWS_WITH(GroupSizes(batch, 2), Catch::Contains("give every sample a \"group\""));

  for (Sample& s : batch.samples) s.group_index = std::nullopt;
  CHECK(GroupSizes(batch, 3) == std::vector<int64_t>{3, 3});
  CHECK_THROWS_WITH(GroupSizes(batch, 4), Catch::Contains("--n-samples-per-prompt"));
}

TEST_CASE("samples encoded for the rollout exchange decode to the same samples",
          "[rollout_data][wire]") {
  Sample a = MakeSample({151644, 872, 0, 9223372036854775807LL}, 3, 0.1);
  a.loss_mask = {1, 0, 1};
  a.rollout_log_probs = std::vector<float>{-0.1f, std::nextafter(-1.0f, 0.0f), -1e-38f};
  a.group_index = 3;
  Sample b = MakeSample({7, 8}, 1, 5e-324);  // no log-probs, no group
  const std::vector<Sample> samples = {a, b};
  const std::vector<Sample> back = DecodeSamples(EncodeSamples(samples), "test");
  REQUIRE(back.size() == 2);
  CHECK(back[0] == a);
  CHECK(back[1] == b);
  CHECK(DecodeSamples(EncodeSamples({}), "test").empty());
}

TEST_CASE("cut or padded sample bytes are an error naming the source, never a crash",
          "[rollout_data][wire]") {
  Sample a = MakeSample({1, 2, 3}, 2, 1.0);
  a.rollout_log_probs = std::vector<float>{-1.0f, -2.0f};
  const std::string bytes = EncodeSamples({a, a});
  // Every proper prefix fails (none is a whole encoding), and so do extra bytes.
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    CHECK_THROWS_WITH(DecodeSamples(bytes.substr(0, n), "rank 1"), Catch::Contains("rank 1"));
  }
  CHECK_THROWS_WITH(DecodeSamples(bytes + "x", "rank 1"), Catch::Contains("left over"));
  // A sample that breaks the layout (response longer than its tokens) is refused.
  Sample bad = a;
  bad.response_length = 9;
  bad.loss_mask.assign(9, 1);
  bad.rollout_log_probs = std::vector<float>(9, -1.0f);
  CHECK_THROWS_WITH(DecodeSamples(EncodeSamples({bad}), "rank 1"),
                    Catch::Contains("rank 1: sample 0"));
  // So is one without a prompt token (its response is all of its tokens).
  Sample no_prompt = a;
  no_prompt.response_length = 3;
  no_prompt.loss_mask.assign(3, 1);
  no_prompt.rollout_log_probs = std::vector<float>(3, -1.0f);
  CHECK_THROWS_WITH(DecodeSamples(EncodeSamples({no_prompt}), "rank 1"),
                    Catch::Contains("at least one prompt token"));
}

// A routing record for `sample` (Note [Routing record]) with ids i * 37 % num_experts.
RoutingRecord MakeRouting(const Sample& sample, int64_t layers, int64_t k, int64_t num_experts) {
  RoutingRecord r;
  r.layers = layers;
  r.positions = static_cast<int64_t>(sample.tokens.size()) - 1;
  r.k = k;
  r.id_bytes = RoutingRecord::IdBytesFor(num_experts);
  r.ids.resize(static_cast<size_t>(r.num_ids() * r.id_bytes));
  for (int64_t i = 0; i < r.num_ids(); ++i) r.set_id(i, i * 37 % num_experts);
  return r;
}

TEST_CASE("routing records round-trip through the file and the exchange, 1- and 2-byte ids",
          "[rollout_data][routing]") {
  Sample a = MakeSample({5, 6, 7, 8}, 2, 1.0);
  a.routed_experts = MakeRouting(a, 3, 2, 128);  // 1 byte per id
  Sample b = MakeSample({5, 6, 7, 8, 9}, 3, 0.0);
  b.routed_experts = MakeRouting(b, 2, 8, 384);  // 2 bytes: ids up to 383
  CHECK(a.routed_experts->id_bytes == 1);
  CHECK(b.routed_experts->id_bytes == 2);
  CHECK(b.routed_experts->id(7) == 7 * 37 % 384);
  // An indexer record: key positions from `first` on, 2 bytes each.
  b.indexer_topk = MakeRouting(b, 1, 2, 70000);
  b.indexer_topk->first = 2;
  b.indexer_topk->ids.resize(static_cast<size_t>(b.indexer_topk->num_ids() * 4));
  CHECK(b.indexer_topk->id_bytes == 4);
  for (int64_t i = 0; i < b.indexer_topk->num_ids(); ++i) b.indexer_topk->set_id(i, 65536 + i);
  CHECK(b.indexer_topk->id(1) == 65537);
  const std::string path = MakeTempDir() + "/routing.jsonl";
  WriteRolloutData(path, RolloutBatch{{a, b}});
  const RolloutBatch back = ReadRolloutData(path);
  REQUIRE(back.samples.size() == 2);
  CHECK(back.samples[0] == a);
  CHECK(back.samples[1] == b);
  const std::vector<Sample> wire = DecodeSamples(EncodeSamples({a, b}), "test");
  REQUIRE(wire.size() == 2);
  CHECK(wire[0] == a);
  CHECK(wire[1] == b);
}

TEST_CASE("a routing record that does not fit its sample is refused, naming the field",
          "[rollout_data][routing]") {
  const std::string base = R"({"tokens": [5, 6, 7], "response_length": 1, "loss_mask": [1], )"
                           R"("reward": 1.0, "routed_experts": )";
  CHECK(
      ReadError(
          base +
          R"({"layers": 1, "positions": 2, "first": 0, "k": 2, "id_bytes": 1, "ids": [0, 1, 2, 3]}})"
          "\n") == "");
  CHECK_THAT(
      ReadError(
          base +
          R"({"layers": 1, "positions": 3, "first": 0, "k": 2, "id_bytes": 1, "ids": [0, 1, 2, 3, 4, 5]}})"
          "\n"),
      Catch::Contains("has 3 positions, but the sample feeds 2 tokens"));
  CHECK_THAT(
      ReadError(
          base +
          R"({"layers": 1, "positions": 2, "first": 0, "k": 2, "id_bytes": 1, "ids": [0, 1, 2]}})"
          "\n"),
      Catch::Contains("holds 3 ids, but 1 layers x 2 recorded positions x k 2 need 4"));
  CHECK_THAT(
      ReadError(
          base +
          R"({"layers": 1, "positions": 2, "first": 0, "k": 2, "id_bytes": 1, "ids": [0, 1, 2, 256]}})"
          "\n"),
      Catch::Contains("entry 3 is 256, outside [0, 256)"));
  CHECK_THAT(
      ReadError(base +
                R"({"layers": 1, "positions": 2, "first": 0, "k": 2, "id_bytes": 3, "ids": []}})"
                "\n"),
      Catch::Contains("\"id_bytes\" is 3; it is 1, 2 or 4"));
  CHECK_THAT(
      ReadError(
          base +
          R"({"layers": 4611686018427387904, "positions": 2, "first": 0, "k": 4, "id_bytes": 1, "ids": []}})"
          "\n"),
      Catch::Contains("routed_experts"));
  CHECK_THAT(ReadError(base + R"({"layer": 1}})"
                              "\n"),
             Catch::Contains("unknown key \"layer\""));
}

}  // namespace
}  // namespace rl::rl_algo
