// The safetensors reader: files in other writers' layouts read correctly, returned tensors
// outlive the reader, and every kind of damage is refused with a message that names the file and
// says what is wrong.
#include "trainer/model/safetensors.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/json.h"
#include "launch/sha256.h"
#include "trainer/model/safetensors_testing.h"

namespace rl::model {
namespace {

using testing::DataOf;
using testing::ExpectCheckpointError;
using testing::HeaderOf;
using testing::SixTensors;
using testing::SmallTensors;
using testing::TempDir;
using testing::ValidFileBytes;

// The same data section behind another header.
std::string WithHeader(const std::string& file, const std::string& header) {
  std::string out(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(out.data(), &length, 8);
  return out + header + DataOf(file);
}

// `file` with the first `from` in its header replaced by `to`.
std::string EditHeader(const std::string& file, const std::string& from, const std::string& to) {
  std::string header = HeaderOf(file);
  const size_t at = header.find(from);
  REQUIRE(at != std::string::npos);
  header.replace(at, from.size(), to);
  return WithHeader(file, header);
}

// Writes `bytes` to a file and returns the message SafetensorsFile::Open throws, checking that it
// names the file.
void ExpectCorruptFile(const TempDir& dir, const std::string& bytes,
                       const std::vector<std::string>& pieces) {
  const std::string path = dir / "corrupt.safetensors";
  WriteFileAtomically(path, bytes);
  std::vector<std::string> all = pieces;
  all.push_back(path + ": ");
  ExpectCheckpointError([&] { SafetensorsFile::Open(path); }, all);
}

TEST_CASE("A hand-built file with an unpadded header and misaligned tensors reads correctly") {
  // The layout other writers may produce: a header length that is not a multiple of 8, so that
  // the F32 tensor "w", at file offset 8 + N + 2, is not 4-byte aligned.
  const TempDir dir;
  std::string header =
      R"({"s":{"dtype":"I16","shape":[1],"data_offsets":[0,2]},"w":{"dtype":"F32",)"
      R"("shape":[2],"data_offsets":[2,10]}})";
  while ((8 + header.size() + 2) % 4 != 1) header += ' ';
  const int16_t s = -7;
  const float w[2] = {1.25f, -3.5f};
  std::string data(reinterpret_cast<const char*>(&s), 2);
  data.append(reinterpret_cast<const char*>(w), 8);
  std::string file(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(file.data(), &length, 8);
  WriteFileAtomically(dir / "h.safetensors", file + header + data);

  const SafetensorsFile reader = SafetensorsFile::Open(dir / "h.safetensors");
  CHECK(reader.Get("s").item<int16_t>() == -7);
  const at::Tensor back = reader.Get("w");
  CHECK(back[0].item<float>() == 1.25f);
  CHECK(back[1].item<float>() == -3.5f);
}

TEST_CASE("Tensors stay valid after the reader is destroyed and the file deleted") {
  const TempDir dir;
  WriteSafetensors(dir / "m.safetensors", SmallTensors());
  at::Tensor a;
  {
    const SafetensorsFile file = SafetensorsFile::Open(dir / "m.safetensors");
    a = file.Get("a");
  }
  REQUIRE(::unlink((dir / "m.safetensors").c_str()) == 0);
  CHECK(TensorSha256(a) == TensorSha256(SmallTensors()[0].tensor));
}

TEST_CASE("Writing into a returned tensor never changes the file") {
  const TempDir dir;
  WriteSafetensors(dir / "m.safetensors", SmallTensors());
  const std::string before = ReadWholeFile(dir / "m.safetensors");
  const SafetensorsFile file = SafetensorsFile::Open(dir / "m.safetensors");
  file.Get("a").fill_(42.0);
  CHECK(ReadWholeFile(dir / "m.safetensors") == before);
  CHECK(SafetensorsFile::Open(dir / "m.safetensors").Get("a")[0][0].item<float>() == 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Damaged files: each is refused with a message naming the file and the problem.

TEST_CASE("A missing file is refused") {
  ExpectCheckpointError([] { SafetensorsFile::Open("/nonexistent/model.safetensors"); },
                        {"/nonexistent/model.safetensors: cannot open: No such file"});
}

TEST_CASE("A file shorter than the 8-byte header length is refused") {
  const TempDir dir;
  ExpectCorruptFile(dir, ValidFileBytes(dir).substr(0, 5),
                    {"has 5 bytes, fewer than the 8-byte header length"});
  ExpectCorruptFile(dir, "", {"has 0 bytes"});
}

TEST_CASE("A header length beyond the end of the file is refused without allocating") {
  const TempDir dir;
  const std::string valid = ValidFileBytes(dir);
  ExpectCorruptFile(dir, valid.substr(0, 40), {"header length", "goes beyond the end of the file"});
  for (const uint64_t hostile : {uint64_t{1} << 63, ~uint64_t{0}, uint64_t{valid.size()}}) {
    std::string bytes = valid;
    std::memcpy(bytes.data(), &hostile, 8);
    ExpectCorruptFile(dir, bytes,
                      {"header length " + std::to_string(hostile) + " goes beyond the end"});
  }
}

TEST_CASE("A header longer than the 100 MB limit is refused unread") {
  const TempDir dir;
  const std::string path = dir / "sparse.safetensors";
  const uint64_t length = kMaxSafetensorsHeaderBytes + 1;
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), 8);
  }
  REQUIRE(::truncate(path.c_str(), 8 + length) == 0);  // sparse: no disk blocks
  ExpectCheckpointError([&] { SafetensorsFile::Open(path); },
                        {path, "header length 100000001 exceeds the limit of 100000000 bytes"});
}

TEST_CASE("A header that is not JSON is refused with its line and column") {
  const TempDir dir;
  const std::string valid = ValidFileBytes(dir);
  const size_t at = HeaderOf(valid).find(R"("a":{)");
  ExpectCorruptFile(dir, EditHeader(valid, R"("a":{)", R"("a" {)"),
                    {"the header is not valid JSON: line 1, column " + std::to_string(at + 5) +
                     ": expected ':' after an object key"});
  ExpectCorruptFile(dir, WithHeader(valid, "[]      "),
                    {"the header is a JSON array, not an object"});
}

TEST_CASE("An unknown dtype is refused naming the tensor") {
  const TempDir dir;
  ExpectCorruptFile(dir, EditHeader(ValidFileBytes(dir), R"("F32")", R"("F31")"),
                    {"tensor 'a': unknown dtype \"F31\" (known: BOOL, U8"});
}

TEST_CASE("A negative or non-integer shape is refused naming the tensor") {
  const TempDir dir;
  const std::string valid = ValidFileBytes(dir);
  ExpectCorruptFile(dir, EditHeader(valid, "[2,3]", "[-2,3]"),
                    {"tensor 'a': shape [-2,3] has a negative dimension"});
  ExpectCorruptFile(dir, EditHeader(valid, "[2,3]", "[2,3.0]"),
                    {"tensor 'a': shape [2,3.0] holds 3.0, not an integer"});
  ExpectCorruptFile(dir, EditHeader(valid, "[2,3]", "[2147483648,2147483648,4]"),
                    {"tensor 'a': shape [2147483648,2147483648,4] has more elements than int64"});
}

TEST_CASE("data_offsets that are not two non-negative integers are refused") {
  const TempDir dir;
  const std::string valid = ValidFileBytes(dir);
  for (const std::string bad : {"[0]", "[0,24,24]", "[0.0,24]", R"(["0",24])", "[-1,24]", "{}"}) {
    CAPTURE(bad);
    ExpectCorruptFile(
        dir, EditHeader(valid, "[0,24]", bad),
        {"tensor 'a': data_offsets is " + bad + ", not two non-negative integers [begin, end]"});
  }
}

TEST_CASE("data_offsets that begin after they end are refused") {
  const TempDir dir;
  ExpectCorruptFile(dir, EditHeader(ValidFileBytes(dir), "[0,24]", "[24,0]"),
                    {"tensor 'a': data_offsets [24, 0] begin after they end"});
}

TEST_CASE("data_offsets beyond the data section are refused as a truncated file") {
  const TempDir dir;
  const std::string valid = ValidFileBytes(dir);
  ExpectCorruptFile(
      dir, EditHeader(valid, "[32,36]", "[32,40]"),
      {"tensor 'c': data_offsets [32, 40] end beyond the 36-byte data section", "truncated"});
  ExpectCorruptFile(dir, valid.substr(0, valid.size() - 2),
                    {"tensor 'c': data_offsets [32, 36] end beyond the 34-byte data section"});
}

TEST_CASE("A byte size that does not match the shape and dtype is refused") {
  const TempDir dir;
  ExpectCorruptFile(dir, EditHeader(ValidFileBytes(dir), "[2,3]", "[2,4]"),
                    {"tensor 'a': data_offsets [0, 24] hold 24 bytes, but shape [2, 4] of F32 "
                     "needs 32"});
}

TEST_CASE("Overlapping tensors are refused naming both") {
  const TempDir dir;
  ExpectCorruptFile(dir, EditHeader(ValidFileBytes(dir), "[24,32]", "[20,28]"),
                    {"tensors 'a' (data_offsets [0, 24]) and 'b' (data_offsets [20, 28]) overlap"});
}

TEST_CASE("Data bytes that belong to no tensor are refused") {
  const TempDir dir;
  const std::string valid = ValidFileBytes(dir);
  ExpectCorruptFile(dir, valid + "junk",
                    {"the data section has 40 bytes, but the tensors end at byte 36; 4 trailing"});
  // "b" moved up by 2: bytes [24, 26) belong to no tensor.
  ExpectCorruptFile(dir, EditHeader(valid, "[24,32]", "[26,34]"),
                    {"bytes [24, 26) of the data section belong to no tensor (before tensor 'b')"});
}

TEST_CASE("Malformed metadata and entries are refused") {
  const TempDir dir;
  const std::string valid = ValidFileBytes(dir);
  ExpectCorruptFile(dir, EditHeader(valid, R"({"format":"pt"})", R"({"format":1})"),
                    {"__metadata__ \"format\" is 1, not a string"});
  ExpectCorruptFile(dir, EditHeader(valid, R"("dtype":"F32",)", R"("dtype":"F32","extra":0,)"),
                    {"tensor 'a': unknown field \"extra\""});
  ExpectCorruptFile(dir, EditHeader(valid, R"("dtype":"F32",)", ""),
                    {"tensor 'a': missing field \"dtype\""});
  ExpectCorruptFile(
      dir, EditHeader(valid, R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})", "7"),
      {"tensor 'a': header entry is 7, not an object"});
}

TEST_CASE("Every truncation of a valid file is refused with CheckpointError") {
  const TempDir dir;
  const std::string valid = ValidFileBytes(dir);
  const std::string path = dir / "cut.safetensors";
  for (size_t n = 0; n < valid.size(); ++n) {
    CAPTURE(n);
    WriteFileAtomically(path, valid.substr(0, n));
    CHECK_THROWS_AS(SafetensorsFile::Open(path), CheckpointError);
  }
}

TEST_CASE("Get of an absent name names the file and the tensor") {
  const TempDir dir;
  WriteSafetensors(dir / "m.safetensors", SmallTensors());
  const SafetensorsFile file = SafetensorsFile::Open(dir / "m.safetensors");
  CHECK(file.Find("nope") == nullptr);
  ExpectCheckpointError([&] { file.Get("nope"); },
                        {dir / "m.safetensors", "no tensor named 'nope'"});
}

// ---------------------------------------------------------------------------------------------
// Checkpoint directories.

TEST_CASE("A checkpoint directory with neither or both layouts is refused") {
  const TempDir dir;
  ExpectCheckpointError([&] { CheckpointReader::Open(dir.path()); },
                        {dir.path(), "holds neither model.safetensors.index.json nor"});
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  WriteSafetensors(dir / "model.safetensors", SmallTensors());
  ExpectCheckpointError([&] { CheckpointReader::Open(dir.path()); }, {dir.path(), "holds both"});
}

TEST_CASE("A shard the index names but the directory lacks is refused") {
  const TempDir dir;
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  REQUIRE(::unlink((dir / "model-00002-of-00003.safetensors").c_str()) == 0);
  ExpectCheckpointError(
      [&] { CheckpointReader::Open(dir.path()); },
      {dir / "model.safetensors.index.json", "shard " + (dir / "model-00002-of-00003.safetensors") +
                                                 " (holding tensor 't2') is missing"});
}

TEST_CASE("An index entry whose shard lacks the tensor is refused") {
  const TempDir dir;
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  const std::string index_path = dir / "model.safetensors.index.json";
  json::Value index = json::ParseFile(index_path);
  index.MutableObject()[1].second.MutableObject().emplace_back(
      "ghost", json::Value::String("model-00001-of-00003.safetensors"));
  WriteFileAtomically(index_path, json::Dump(index));
  ExpectCheckpointError([&] { CheckpointReader::Open(dir.path()); },
                        {index_path, "tensor 'ghost' is mapped to",
                         "model-00001-of-00003.safetensors, which has no such tensor"});
}

TEST_CASE("A tensor in two shards is refused naming both") {
  const TempDir dir;
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  // Shard 3 rewritten to hold t0 as well as its own tensors.
  WriteSafetensors(dir / "model-00003-of-00003.safetensors",
                   {{"t4", at::ones({4})}, {"t5", at::ones({4})}, {"t0", at::ones({4})}});
  ExpectCheckpointError([&] { CheckpointReader::Open(dir.path()); },
                        {"tensor 't0' is in two shards", "model-00001-of-00003.safetensors and",
                         "model-00003-of-00003.safetensors"});
}

TEST_CASE("A shard tensor the index does not list is refused") {
  const TempDir dir;
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  WriteSafetensors(dir / "model-00003-of-00003.safetensors",
                   {{"t4", at::ones({4})}, {"t5", at::ones({4})}, {"extra", at::ones({4})}});
  ExpectCheckpointError([&] { CheckpointReader::Open(dir.path()); },
                        {"holds tensor 'extra', which the weight_map does not list"});
}

TEST_CASE("An index naming a path outside the directory, or not JSON, is refused") {
  const TempDir dir;
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  const std::string index_path = dir / "model.safetensors.index.json";
  WriteFileAtomically(index_path, R"({"weight_map": {"t0": "../model-00001-of-00003.safetensors"}})");
  ExpectCheckpointError([&] { CheckpointReader::Open(dir.path()); },
                        {index_path, "is not a file name in"});
  WriteFileAtomically(index_path, "{\"weight_map\": {\n  \"t0\": \"x\",\n}}");
  ExpectCheckpointError([&] { CheckpointReader::Open(dir.path()); },
                        {index_path + ": line 3, column 1: trailing comma before '}'"});
  WriteFileAtomically(index_path, R"({"metadata": {}})");
  ExpectCheckpointError([&] { CheckpointReader::Open(dir.path()); },
                        {index_path, "missing \"weight_map\""});
}

TEST_CASE("Get of a name the checkpoint lacks names the directory") {
  const TempDir dir;
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  const CheckpointReader reader = CheckpointReader::Open(dir.path());
  CHECK(reader.Find("t9") == nullptr);
  ExpectCheckpointError([&] { reader.Get("t9"); }, {dir.path(), "has no tensor named 't9'"});
}

}  // namespace
}  // namespace rl::model
