// The safetensors writer: files read back exactly what was written, in the reference layout
// (Note [Safetensors layout]); bad tensor lists are refused without leaving a file; checkpoint
// directories are sharded as `transformers` shards them.
#include "trainer/model/safetensors_writer.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/json.h"
#include "launch/sha256.h"
#include "trainer/model/safetensors.h"
#include "trainer/model/safetensors_testing.h"

namespace rl::model {
namespace {

using testing::DataOf;
using testing::ExpectCheckpointError;
using testing::HeaderLength;
using testing::HeaderOf;
using testing::SixTensors;
using testing::SmallTensors;
using testing::TempDir;
using testing::ValidFileBytes;

// ---------------------------------------------------------------------------------------------
// Round trips and layout.

TEST_CASE("Tensors of every dtype read back with identical bytes, dtype and shape") {
  const TempDir dir;
  const NamedTensors tensors = {
      {"bf16", at::randn({3, 5}).to(at::kBFloat16)},
      {"f16", at::randn({7}).to(at::kHalf)},
      {"f32", at::randn({2, 3, 4})},
      {"f64", at::randn({3}, at::kDouble)},
      {"i64", at::arange(-3, 4, at::kLong)},
      {"i32", at::arange(5, at::kInt)},
      {"i16", at::arange(5, at::kShort)},
      {"i8", at::arange(-2, 3, at::kChar)},
      {"u8", at::arange(250, 256, at::kByte)},
      {"bool", at::tensor({1, 0, 1}, at::kInt).to(at::kBool)},
      {"f8_e4m3", at::randn({4}).to(at::kFloat8_e4m3fn)},
      {"f8_e5m2", at::randn({4}).to(at::kFloat8_e5m2)},
  };
  WriteSafetensors(dir / "m.safetensors", tensors);
  const SafetensorsFile file = SafetensorsFile::Open(dir / "m.safetensors");
  REQUIRE(file.tensors().size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, original] = tensors[i];
    CAPTURE(name);
    CHECK(file.tensors()[i].name == name);  // header order is write order
    const at::Tensor back = file.Get(name);
    CHECK(back.scalar_type() == original.scalar_type());
    CHECK(back.sizes() == original.sizes());
    CHECK(TensorSha256(back) == TensorSha256(original));
  }
}

TEST_CASE("Metadata reads back as written") {
  const TempDir dir;
  WriteSafetensors(dir / "m.safetensors", SmallTensors(), {{"format", "pt"}, {"step", "1200"}});
  const SafetensorsFile file = SafetensorsFile::Open(dir / "m.safetensors");
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"step", "1200"}});
  WriteSafetensors(dir / "n.safetensors", SmallTensors());
  CHECK(SafetensorsFile::Open(dir / "n.safetensors").metadata().empty());
}

TEST_CASE("The writer produces the reference layout: padded header, offsets in order, raw bytes") {
  const TempDir dir;
  const std::string bytes = ValidFileBytes(dir);
  const std::string header = HeaderOf(bytes);
  CHECK(HeaderLength(bytes) % 8 == 0);
  const std::string expected = R"({"__metadata__":{"format":"pt"},)"
                               R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                               R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
                               R"("c":{"dtype":"F16","shape":[2],"data_offsets":[32,36]}})";
  CHECK(header.substr(0, expected.size()) == expected);
  CHECK(header.substr(expected.size()) == std::string(header.size() - expected.size(), ' '));
  std::string data;
  for (const auto& [name, t] : SmallTensors()) {
    data.append(static_cast<const char*>(t.const_data_ptr()), t.nbytes());
  }
  CHECK(DataOf(bytes) == data);
}

TEST_CASE("Scalars, empty tensors and non-contiguous views round-trip") {
  const TempDir dir;
  const at::Tensor matrix = at::randn({4, 6});
  const NamedTensors tensors = {
      {"scalar", at::scalar_tensor(3.5)},
      {"empty", at::zeros({0, 5}, at::kBFloat16)},
      {"transposed", matrix.t()},
      {"strided", matrix.slice(/*dim=*/1, 0, 6, 2)},
  };
  WriteSafetensors(dir / "m.safetensors", tensors);
  const SafetensorsFile file = SafetensorsFile::Open(dir / "m.safetensors");
  for (const auto& [name, original] : tensors) {
    CAPTURE(name);
    const at::Tensor back = file.Get(name);
    CHECK(back.sizes() == original.sizes());
    CHECK(TensorSha256(back) == TensorSha256(original));
  }
  CHECK(file.Find("empty")->num_bytes() == 0);
}

TEST_CASE("CUDA tensors are written like their CPU copies") {
  if (!at::hasCUDA()) {
    WARN("SKIPPED: no CUDA device on this machine");
    return;
  }
  const TempDir dir;
  const at::Tensor cpu = at::randn({64, 32}).to(at::kBFloat16);
  WriteSafetensors(dir / "gpu.safetensors", {{"w", cpu.to(at::kCUDA).t()}});
  WriteSafetensors(dir / "cpu.safetensors", {{"w", cpu.t()}});
  CHECK(FileSha256(dir / "gpu.safetensors") == FileSha256(dir / "cpu.safetensors"));
}

TEST_CASE("A write replaces an existing file and leaves no temporary file behind") {
  const TempDir dir;
  WriteSafetensors(dir / "m.safetensors", SmallTensors());
  WriteSafetensors(dir / "m.safetensors", {{"only", at::ones({2})}});
  CHECK(SafetensorsFile::Open(dir / "m.safetensors").tensors().size() == 1);
  CHECK(ListFiles(dir.path()) == std::vector<std::string>{"m.safetensors"});
}

TEST_CASE("The writer refuses bad tensor lists and leaves no file behind") {
  const TempDir dir;
  const std::string path = dir / "m.safetensors";
  ExpectCheckpointError(
      [&] {
        WriteSafetensors(path, {{"x", at::ones({1})}, {"x", at::ones({1})}});
      },
      {path, "tensor 'x'", "appears twice"});
  ExpectCheckpointError(
      [&] {
        WriteSafetensors(path, {{"__metadata__", at::ones({1})}});
      },
      {path, "reserved"});
  ExpectCheckpointError(
      [&] {
        WriteSafetensors(path, {{"z", at::ones({1}, at::kComplexFloat)}});
      },
      {path, "tensor 'z'", "ComplexFloat", "no safetensors name"});
  ExpectCheckpointError(
      [&] {
        WriteSafetensors(path, {{"u", at::Tensor()}});
      },
      {path, "undefined"});
  ExpectCheckpointError(
      [&] {
        WriteSafetensors(path, {{"s", at::eye(2).to_sparse()}});
      },
      {path, "dense"});
  CHECK(ListFiles(dir.path()).empty());
  ExpectCheckpointError([&] { WriteSafetensors(dir / "missing/m.safetensors", SmallTensors()); },
                        {"missing/m.safetensors.tmp.", "cannot create"});
}

// ---------------------------------------------------------------------------------------------
// Checkpoint directories.

TEST_CASE("A sharded checkpoint reads back every tensor with identical bytes") {
  const TempDir dir;
  const NamedTensors tensors = SixTensors();
  const std::vector<std::string> written = WriteCheckpointShards(dir.path(), tensors, 40);
  CHECK(written == std::vector<std::string>{
                       "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                       "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
  const CheckpointReader reader = CheckpointReader::Open(dir.path());
  CHECK(reader.shards().size() == 3);
  CHECK(reader.names() == std::vector<std::string>{"t0", "t1", "t2", "t3", "t4", "t5"});
  for (const auto& [name, original] : tensors) {
    CAPTURE(name);
    CHECK(TensorSha256(reader.Get(name)) == TensorSha256(original));
  }
  CHECK(reader.index_metadata().at("total_size").AsInt64() == 96);
  CHECK(reader.shards()[0].metadata().at("format") == "pt");
}

TEST_CASE("The index follows the transformers layout") {
  const TempDir dir;
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  const json::Value index = json::ParseFile(dir / "model.safetensors.index.json");
  CHECK(index.at("metadata").at("total_size").AsInt64() == 96);
  const json::Value& weight_map = index.at("weight_map");
  CHECK(weight_map.AsObject().size() == 6);
  CHECK(weight_map.at("t0").AsString() == "model-00001-of-00003.safetensors");
  CHECK(weight_map.at("t1").AsString() == "model-00001-of-00003.safetensors");
  CHECK(weight_map.at("t2").AsString() == "model-00002-of-00003.safetensors");
  CHECK(weight_map.at("t5").AsString() == "model-00003-of-00003.safetensors");
}

TEST_CASE("A checkpoint that fits one shard is a single model.safetensors") {
  const TempDir dir;
  CHECK(WriteCheckpointShards(dir.path(), SixTensors(), 1 << 20, {{"step", "7"}}) ==
        std::vector<std::string>{"model.safetensors"});
  const CheckpointReader reader = CheckpointReader::Open(dir.path());
  CHECK(reader.shards().size() == 1);
  CHECK(reader.index_metadata().is_null());
  CHECK(reader.shards()[0].metadata() ==
        std::map<std::string, std::string>{{"format", "pt"}, {"step", "7"}});
  CHECK(reader.Get("t3")[0].item<float>() == 3.0f);
}

TEST_CASE("A tensor larger than the shard limit gets a shard of its own") {
  const TempDir dir;
  const NamedTensors tensors = {
      {"small", at::ones({2})}, {"big", at::ones({100})}, {"tail", at::ones({2})}};
  CHECK(WriteCheckpointShards(dir.path(), tensors, 64).size() == 4);
  const CheckpointReader reader = CheckpointReader::Open(dir.path());
  CHECK(reader.shards()[1].tensors().size() == 1);
  CHECK(reader.shards()[1].tensors()[0].name == "big");
}

TEST_CASE("Writing a checkpoint into a directory that holds one is refused") {
  const TempDir dir;
  WriteCheckpointShards(dir.path(), SixTensors(), 40);
  ExpectCheckpointError([&] { WriteCheckpointShards(dir.path(), SixTensors(), 40); },
                        {dir.path(), "already holds a checkpoint", "fresh directory"});
}

}  // namespace
}  // namespace rl::model
