#include "trainer/rl/rollout_data.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/json.h"

namespace rl::rl_algo {
namespace {

constexpr const char* kKnownKeys[] = {"tokens",         "response_length",   "loss_mask",
                                      "reward",         "rollout_log_probs", "group",
                                      "routed_experts", "indexer_topk"};
constexpr const char* kRoutingKeys[] = {"layers", "positions", "first", "k", "id_bytes", "ids"};

// A short description of a JSON value for messages: `-1.5`, `"abc"`, `an array`.
std::string Describe(const json::Value& v) {
  switch (v.kind()) {
    case json::Value::Kind::kArray:
      return "an array";
    case json::Value::Kind::kObject:
      return "an object";
    default: {
      std::string text = json::Dump(v);
      if (text.size() > 40) text = text.substr(0, 37) + "...";
      return text;
    }
  }
}

// A field of one line is wrong; the caller adds "<path>:<line>: ".
class FieldError : public Error {
 public:
  FieldError(std::string_view field, const std::string& what)
      : Error(fmt::format("field \"{}\": {}", field, what)) {}
};

int64_t IntegerOf(const json::Value& v, std::string_view field, const std::string& where) {
  if (v.is_number()) {
    try {
      return v.AsInt64();
    } catch (const json::TypeError&) {
      // Falls through to the message below (1.5, 1e30).
    }
  }
  throw FieldError(field, fmt::format("{}is {}, not an integer", where, Describe(v)));
}

const json::Value::Array& ArrayOf(const json::Value& v, std::string_view field) {
  if (!v.is_array()) throw FieldError(field, fmt::format("is {}, not an array", Describe(v)));
  return v.AsArray();
}

std::string EntryText(size_t i) { return fmt::format("entry {} ", i); }

// Note [Routing record]: {"layers": L, "positions": P, "first": F, "k": K, "id_bytes": B,
// "ids": [...]} in field `kField`.
RoutingRecord ParseRouting(const json::Value& v, std::string_view kField) {
  if (!v.is_object()) throw FieldError(kField, fmt::format("is {}, not an object", Describe(v)));
  for (const auto& [key, unused] : v.AsObject()) {
    bool known = false;
    for (const char* k : kRoutingKeys) known = known || key == k;
    if (!known) {
      throw FieldError(kField, fmt::format("unknown key \"{}\" (expected layers, positions, "
                                           "first, k, id_bytes, ids)",
                                           key));
    }
  }
  const auto integer = [&](const char* key) {
    const json::Value* x = v.Find(key);
    if (x == nullptr) throw FieldError(kField, fmt::format("\"{}\" is missing", key));
    return IntegerOf(*x, kField, fmt::format("\"{}\" ", key));
  };
  RoutingRecord r;
  r.layers = integer("layers");
  r.positions = integer("positions");
  r.first = integer("first");
  r.k = integer("k");
  const int64_t id_bytes = integer("id_bytes");
  if (id_bytes != 1 && id_bytes != 2 && id_bytes != 4) {
    throw FieldError(kField, fmt::format("\"id_bytes\" is {}; it is 1, 2 or 4", id_bytes));
  }
  r.id_bytes = static_cast<int>(id_bytes);
  const json::Value* ids = v.Find("ids");
  if (ids == nullptr) throw FieldError(kField, "\"ids\" is missing");
  const json::Value::Array& values = ArrayOf(*ids, kField);
  const int64_t limit = int64_t{1} << (8 * r.id_bytes);  // at most 2^32
  r.ids.resize(values.size() * static_cast<size_t>(r.id_bytes));
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t id = IntegerOf(values[i], kField, "\"ids\" " + EntryText(i));
    if (id < 0 || id >= limit) {
      throw FieldError(kField, fmt::format("\"ids\" entry {} is {}, outside [0, {}) for {} byte(s)",
                                           i, id, limit, r.id_bytes));
    }
    r.set_id(static_cast<int64_t>(i), id);
  }
  return r;
}

Sample ParseSample(const json::Value& line) {
  if (!line.is_object()) {
    throw Error(
        fmt::format("expected a JSON object (one sample per line), found {}", Describe(line)));
  }
  for (const auto& [key, unused] : line.AsObject()) {
    bool known = false;
    for (const char* k : kKnownKeys) known = known || key == k;
    if (!known) {
      throw FieldError(key,
                       "unknown field (expected tokens, response_length, loss_mask, "
                       "reward, and optionally rollout_log_probs, group, routed_experts, "
                       "indexer_topk)");
    }
  }
  const auto required = [&](const char* key) -> const json::Value& {
    const json::Value* v = line.Find(key);
    if (v == nullptr) throw FieldError(key, "missing");
    return *v;
  };

  Sample sample;
  const json::Value::Array& tokens = ArrayOf(required("tokens"), "tokens");
  sample.tokens.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    sample.tokens.push_back(IntegerOf(tokens[i], "tokens", EntryText(i)));
  }
  sample.response_length = IntegerOf(required("response_length"), "response_length", "");
  const json::Value::Array& mask = ArrayOf(required("loss_mask"), "loss_mask");
  sample.loss_mask.reserve(mask.size());
  for (size_t i = 0; i < mask.size(); ++i) {
    const int64_t m = IntegerOf(mask[i], "loss_mask", EntryText(i));
    if (m != 0 && m != 1) {
      throw FieldError("loss_mask", fmt::format("entry {} is {}; a loss mask holds 0 or 1", i, m));
    }
    sample.loss_mask.push_back(static_cast<int>(m));
  }
  const json::Value& reward = required("reward");
  if (!reward.is_number()) {
    throw FieldError("reward", fmt::format("is {}, not a number", Describe(reward)));
  }
  sample.reward = reward.AsDouble();

  const json::Value* log_probs = line.Find("rollout_log_probs");
  if (log_probs != nullptr && !log_probs->is_null()) {
    const json::Value::Array& values = ArrayOf(*log_probs, "rollout_log_probs");
    std::vector<float> parsed;
    parsed.reserve(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      if (!values[i].is_number()) {
        throw FieldError("rollout_log_probs",
                         fmt::format("entry {} is {}, not a number", i, Describe(values[i])));
      }
      const double value = values[i].AsDouble();
      if (std::abs(value) > std::numeric_limits<float>::max()) {
        throw FieldError("rollout_log_probs",
                         fmt::format("entry {} is {}, beyond the range of a float", i, value));
      }
      parsed.push_back(static_cast<float>(value));
    }
    sample.rollout_log_probs = std::move(parsed);
  }
  const json::Value* group = line.Find("group");
  if (group != nullptr && !group->is_null()) sample.group_index = IntegerOf(*group, "group", "");
  const json::Value* routed = line.Find("routed_experts");
  if (routed != nullptr && !routed->is_null()) {
    sample.routed_experts = ParseRouting(*routed, "routed_experts");
  }
  const json::Value* indexer = line.Find("indexer_topk");
  if (indexer != nullptr && !indexer->is_null()) {
    sample.indexer_topk = ParseRouting(*indexer, "indexer_topk");
  }
  return sample;
}

json::Value RoutingToJson(const RoutingRecord& r) {
  json::Value::Array ids;
  ids.reserve(static_cast<size_t>(r.num_ids()));
  for (int64_t i = 0; i < r.num_ids(); ++i) ids.push_back(json::Value::Int(r.id(i)));
  json::Value::Object routed;
  routed.emplace_back("layers", json::Value::Int(r.layers));
  routed.emplace_back("positions", json::Value::Int(r.positions));
  routed.emplace_back("first", json::Value::Int(r.first));
  routed.emplace_back("k", json::Value::Int(r.k));
  routed.emplace_back("id_bytes", json::Value::Int(r.id_bytes));
  routed.emplace_back("ids", json::Value::MakeArray(std::move(ids)));
  return json::Value::MakeObject(std::move(routed));
}

json::Value SampleToJson(const Sample& sample) {
  json::Value::Array tokens;
  tokens.reserve(sample.tokens.size());
  for (const int64_t t : sample.tokens) tokens.push_back(json::Value::Int(t));
  json::Value::Array mask;
  mask.reserve(sample.loss_mask.size());
  for (const int m : sample.loss_mask) mask.push_back(json::Value::Int(m));
  json::Value::Object object;
  object.emplace_back("tokens", json::Value::MakeArray(std::move(tokens)));
  object.emplace_back("response_length", json::Value::Int(sample.response_length));
  object.emplace_back("loss_mask", json::Value::MakeArray(std::move(mask)));
  object.emplace_back("reward", json::Value::Double(sample.reward));
  if (sample.rollout_log_probs.has_value()) {
    json::Value::Array log_probs;
    log_probs.reserve(sample.rollout_log_probs->size());
    // float -> double is exact, and Dump writes the shortest text that reads back to that double.
    for (const float lp : *sample.rollout_log_probs) {
      log_probs.push_back(json::Value::Double(static_cast<double>(lp)));
    }
    object.emplace_back("rollout_log_probs", json::Value::MakeArray(std::move(log_probs)));
  }
  if (sample.group_index.has_value()) {
    object.emplace_back("group", json::Value::Int(*sample.group_index));
  }
  if (sample.routed_experts.has_value()) {
    object.emplace_back("routed_experts", RoutingToJson(*sample.routed_experts));
  }
  if (sample.indexer_topk.has_value()) {
    object.emplace_back("indexer_topk", RoutingToJson(*sample.indexer_topk));
  }
  return json::Value::MakeObject(std::move(object));
}

}  // namespace

bool operator==(const Sample& a, const Sample& b) {
  return a.tokens == b.tokens && a.response_length == b.response_length &&
         a.loss_mask == b.loss_mask && a.reward == b.reward &&
         a.rollout_log_probs == b.rollout_log_probs && a.group_index == b.group_index &&
         a.routed_experts == b.routed_experts && a.indexer_topk == b.indexer_topk;
}

namespace {

// Why `r` does not fit a sample of `num_tokens` tokens, or "".
std::string RoutingProblem(const RoutingRecord& r, int64_t num_tokens) {
  if (r.layers < 1 || r.k < 1 || r.first < 0 ||
      (r.id_bytes != 1 && r.id_bytes != 2 && r.id_bytes != 4)) {
    return fmt::format(
        "{} layers, k {}, first {}, {} id bytes; layers and k must be >= 1, first "
        ">= 0 and id bytes 1, 2 or 4",
        r.layers, r.k, r.first, r.id_bytes);
  }
  if (r.positions != num_tokens - 1) {
    return fmt::format("has {} positions, but the sample feeds {} tokens (all but the last)",
                       r.positions, num_tokens - 1);
  }
  int64_t count = 0, bytes = 0;  // a corrupt file may hold sizes whose product overflows
  if (__builtin_mul_overflow(r.layers, r.recorded_positions(), &count) ||
      __builtin_mul_overflow(count, r.k, &count) ||
      __builtin_mul_overflow(count, static_cast<int64_t>(r.id_bytes), &bytes) ||
      static_cast<int64_t>(r.ids.size()) != bytes) {
    return fmt::format("holds {} ids, but {} layers x {} recorded positions x k {} need {}",
                       static_cast<int64_t>(r.ids.size()) / r.id_bytes, r.layers,
                       r.recorded_positions(), r.k, count);
  }
  return "";
}

}  // namespace

std::string SampleProblem(const Sample& sample) {
  const int64_t num_tokens = static_cast<int64_t>(sample.tokens.size());
  for (size_t i = 0; i < sample.tokens.size(); ++i) {
    if (sample.tokens[i] < 0) {
      return fmt::format("field \"tokens\": entry {} is {}; token ids must be >= 0", i,
                         sample.tokens[i]);
    }
  }
  if (sample.response_length < 1) {
    return fmt::format(
        "field \"response_length\": is {}; a sample needs at least one response "
        "token",
        sample.response_length);
  }
  if (sample.response_length > num_tokens) {
    return fmt::format("field \"response_length\": is {}, but \"tokens\" has only {} entries",
                       sample.response_length, num_tokens);
  }
  if (sample.response_length == num_tokens) {
    return fmt::format(
        "field \"response_length\": is {}, as many as \"tokens\" has entries; a sample needs at "
        "least one prompt token before its response (response token 0 is predicted from the "
        "position before it)",
        sample.response_length);
  }
  if (static_cast<int64_t>(sample.loss_mask.size()) != sample.response_length) {
    return fmt::format("field \"loss_mask\": has {} entries, but response_length is {}",
                       sample.loss_mask.size(), sample.response_length);
  }
  for (size_t i = 0; i < sample.loss_mask.size(); ++i) {
    if (sample.loss_mask[i] != 0 && sample.loss_mask[i] != 1) {
      return fmt::format("field \"loss_mask\": entry {} is {}; a loss mask holds 0 or 1", i,
                         sample.loss_mask[i]);
    }
  }
  if (!std::isfinite(sample.reward)) {
    return fmt::format("field \"reward\": is {}; rewards must be finite", sample.reward);
  }
  if (sample.rollout_log_probs.has_value()) {
    const std::vector<float>& lp = *sample.rollout_log_probs;
    if (static_cast<int64_t>(lp.size()) != sample.response_length) {
      return fmt::format("field \"rollout_log_probs\": has {} entries, but response_length is {}",
                         lp.size(), sample.response_length);
    }
    for (size_t i = 0; i < lp.size(); ++i) {
      if (!std::isfinite(lp[i])) {
        return fmt::format("field \"rollout_log_probs\": entry {} is {}; log-probs must be finite",
                           i, lp[i]);
      }
    }
  }
  if (sample.group_index.has_value() && *sample.group_index < 0) {
    return fmt::format("field \"group\": is {}; group ids must be >= 0", *sample.group_index);
  }
  for (const auto& [field, record] : {std::make_pair("routed_experts", &sample.routed_experts),
                                      std::make_pair("indexer_topk", &sample.indexer_topk)}) {
    if (record->has_value()) {
      const std::string problem = RoutingProblem(**record, num_tokens);
      if (!problem.empty()) return fmt::format("field \"{}\": {}", field, problem);
    }
  }
  return "";
}

RolloutBatch ReadRolloutData(const std::string& path) {
  return ParseRolloutData(ReadWholeFile(path), path);
}

RolloutBatch ParseRolloutData(std::string_view text, const std::string& source) {
  RolloutBatch batch;
  size_t begin = 0;
  int64_t line_number = 0;
  while (begin < text.size()) {
    ++line_number;
    size_t end = text.find('\n', begin);
    const bool has_newline = end != std::string_view::npos;
    if (!has_newline) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank line

    const auto fail = [&](const std::string& what) {
      return CheckpointError(fmt::format("{}:{}: {}", source, line_number, what));
    };
    json::Value value;
    try {
      value = json::Parse(line);
    } catch (const json::ParseError& e) {
      if (!has_newline) {
        throw fail(
            fmt::format("the last line is cut short (no newline at the end, and it is not "
                        "valid JSON: column {}: {}); the file looks truncated, so record "
                        "it again",
                        e.column(), e.reason()));
      }
      throw fail(fmt::format("not valid JSON: column {}: {}", e.column(), e.reason()));
    }
    Sample sample;
    try {
      sample = ParseSample(value);
    } catch (const Error& e) {
      throw fail(e.what());
    }
    const std::string problem = SampleProblem(sample);
    if (!problem.empty()) throw fail(problem);
    batch.samples.push_back(std::move(sample));
  }
  return batch;
}

void WriteRolloutData(const std::string& path, const RolloutBatch& batch) {
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    const std::string problem = SampleProblem(batch.samples[i]);
    if (!problem.empty()) {
      throw CheckpointError(
          fmt::format("{}: cannot write sample {} (line {}): {}", path, i, i + 1, problem));
    }
  }
  AtomicFileWriter writer(path);
  std::string chunk;
  for (const Sample& sample : batch.samples) {
    chunk += json::Dump(SampleToJson(sample));
    chunk += '\n';
    if (chunk.size() >= (size_t{1} << 20)) {
      writer.Write(chunk);
      chunk.clear();
    }
  }
  writer.Write(chunk);
  writer.Commit();
}

namespace {

// Appends and reads plain values in the host's byte order (Note [Sample wire format]).
class ByteWriter {
 public:
  template <class T>
  void Put(T value) {
    const char* p = reinterpret_cast<const char*>(&value);
    out_.append(p, sizeof(T));
  }
  template <class T, class U = T>
  void PutArray(const std::vector<U>& values) {
    Put<int64_t>(static_cast<int64_t>(values.size()));
    for (const U& v : values) Put<T>(static_cast<T>(v));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  ByteReader(std::string_view bytes, const std::string& source) : bytes_(bytes), source_(source) {}
  template <class T>
  T Get(std::string_view what) {
    RL_CHECK(bytes_.size() - offset_ >= sizeof(T), Error,
             "{}: the sample bytes end inside {} (at byte {} of {})", source_, what, offset_,
             bytes_.size());
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  template <class T, class U = T>
  std::vector<U> GetArray(std::string_view what) {
    const int64_t n = Get<int64_t>(what);
    RL_CHECK(n >= 0 && static_cast<uint64_t>(n) <= (bytes_.size() - offset_) / sizeof(T), Error,
             "{}: {} claims {} entries, more than the {} bytes left", source_, what, n,
             bytes_.size() - offset_);
    std::vector<U> values;
    values.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values.push_back(static_cast<U>(Get<T>(what)));
    return values;
  }
  bool done() const { return offset_ == bytes_.size(); }
  size_t offset() const { return offset_; }

 private:
  std::string_view bytes_;
  const std::string& source_;
  size_t offset_ = 0;
};

}  // namespace

std::string EncodeSamples(const std::vector<Sample>& samples) {
  ByteWriter w;
  w.Put<uint64_t>(samples.size());
  for (const Sample& s : samples) {
    w.PutArray<int64_t>(s.tokens);
    w.Put<int64_t>(s.response_length);
    w.PutArray<int32_t>(s.loss_mask);
    w.Put<double>(s.reward);
    w.Put<uint8_t>(s.rollout_log_probs.has_value() ? 1 : 0);
    if (s.rollout_log_probs) w.PutArray<float>(*s.rollout_log_probs);
    w.Put<uint8_t>(s.group_index.has_value() ? 1 : 0);
    if (s.group_index) w.Put<int64_t>(*s.group_index);
    for (const std::optional<RoutingRecord>* record : {&s.routed_experts, &s.indexer_topk}) {
      w.Put<uint8_t>(record->has_value() ? 1 : 0);
      if (!record->has_value()) continue;
      const RoutingRecord& r = **record;
      w.Put<int64_t>(r.layers);
      w.Put<int64_t>(r.positions);
      w.Put<int64_t>(r.first);
      w.Put<int64_t>(r.k);
      w.Put<int64_t>(r.id_bytes);
      w.PutArray<uint8_t>(r.ids);
    }
  }
  return w.Take();
}

std::vector<Sample> DecodeSamples(std::string_view bytes, const std::string& source) {
  ByteReader r(bytes, source);
  const uint64_t count = r.Get<uint64_t>("the sample count");
  std::vector<Sample> samples;
  for (uint64_t i = 0; i < count; ++i) {
    Sample s;
    s.tokens = r.GetArray<int64_t>("tokens");
    s.response_length = r.Get<int64_t>("response_length");
    s.loss_mask = r.GetArray<int32_t, int>("loss_mask");
    s.reward = r.Get<double>("reward");
    if (r.Get<uint8_t>("rollout_log_probs") != 0) {
      s.rollout_log_probs = r.GetArray<float>("rollout_log_probs");
    }
    if (r.Get<uint8_t>("group") != 0) s.group_index = r.Get<int64_t>("group");
    for (std::optional<RoutingRecord>* record : {&s.routed_experts, &s.indexer_topk}) {
      if (r.Get<uint8_t>("a routing record") == 0) continue;
      RoutingRecord routing;
      routing.layers = r.Get<int64_t>("a routing record");
      routing.positions = r.Get<int64_t>("a routing record");
      routing.first = r.Get<int64_t>("a routing record");
      routing.k = r.Get<int64_t>("a routing record");
      routing.id_bytes = static_cast<int>(r.Get<int64_t>("a routing record"));
      routing.ids = r.GetArray<uint8_t>("a routing record");
      *record = std::move(routing);
    }
    const std::string problem = SampleProblem(s);
    RL_CHECK(problem.empty(), Error, "{}: sample {}: {}", source, i, problem);
    samples.push_back(std::move(s));
  }
  RL_CHECK(r.done(), Error, "{}: {} bytes left over after {} samples", source,
           bytes.size() - r.offset(), count);
  return samples;
}

std::vector<int64_t> GroupSizes(const RolloutBatch& batch, int64_t n_samples_per_prompt) {
  const std::vector<Sample>& samples = batch.samples;
  const int64_t num_samples = static_cast<int64_t>(samples.size());
  int64_t num_with_group = 0;
  for (const Sample& s : samples) num_with_group += s.group_index.has_value() ? 1 : 0;

  std::vector<int64_t> sizes;
  if (num_with_group == 0) {
    RL_CHECK(n_samples_per_prompt >= 1 && num_samples % n_samples_per_prompt == 0, Error,
             "grouping {} samples without group ids needs --n-samples-per-prompt to divide them; "
             "it is {}",
             num_samples, n_samples_per_prompt);
    sizes.assign(static_cast<size_t>(num_samples / n_samples_per_prompt), n_samples_per_prompt);
    return sizes;
  }
  for (int64_t i = 0; i < num_samples; ++i) {
    RL_CHECK(samples[i].group_index.has_value(), Error,
             "sample {} has no group id, but other samples of the batch have one; give every "
             "sample a \"group\" or none",
             i);
  }
  std::unordered_set<int64_t> seen;  // group ids already started
  for (int64_t i = 0; i < num_samples; ++i) {
    const int64_t group = *samples[i].group_index;
    if (i > 0 && group == *samples[i - 1].group_index) {
      ++sizes.back();
      continue;
    }
    RL_CHECK(seen.insert(group).second, Error,
             "sample {} belongs to group {}, which ended earlier in the batch; the samples of one "
             "prompt must be consecutive",
             i, group);
    sizes.push_back(1);
  }
  return sizes;
}

}  // namespace rl::rl_algo
