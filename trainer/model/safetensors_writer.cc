#include "trainer/model/safetensors_writer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <optional>
#include <set>
#include <string_view>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/json.h"
#include "trainer/model/safetensors.h"

namespace rl::model {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors is little-endian; this code writes host bytes as they are");

// A tensor ready to be written: its header entry and its row-major bytes.
struct PreparedTensor {
  const std::string* name;
  std::string_view dtype_name;
  at::Tensor tensor;  // on any device, any strides; made host-contiguous when written
  int64_t num_bytes;
};

std::vector<PreparedTensor> PrepareTensors(const std::string& context,
                                           const NamedTensors& tensors) {
  std::vector<PreparedTensor> prepared;
  std::set<std::string_view> names;
  for (const auto& [name_binding, tensor] : tensors) {
    // A named reference, not the binding itself: C++17 lambdas cannot capture structured bindings
    // (GCC allows it, clang, which builds fuzz/, does not).
    const std::string& name = name_binding;
    const auto fail = [&](const std::string& what) {
      return CheckpointError(fmt::format("{}: cannot write tensor '{}': {}", context, name, what));
    };
    if (name == kSafetensorsMetadataKey) throw fail("the name is reserved for the metadata");
    if (!names.insert(name).second) throw fail("the name appears twice");
    if (!tensor.defined()) throw fail("the tensor is undefined");
    if (tensor.layout() != at::kStrided || tensor.is_quantized()) {
      throw fail("only dense (strided), unquantized tensors can be written");
    }
    const std::optional<std::string_view> dtype =
        SafetensorsDtypeFromScalarType(tensor.scalar_type());
    if (!dtype) {
      throw fail(fmt::format("dtype {} has no safetensors name (known: {})",
                             c10::toString(tensor.scalar_type()), KnownSafetensorsDtypes()));
    }
    prepared.push_back(
        {&name, *dtype, tensor, tensor.numel() * static_cast<int64_t>(tensor.element_size())});
  }
  return prepared;
}

void WritePrepared(const std::string& path, const std::vector<PreparedTensor>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  json::Value::Object header;
  if (!metadata.empty()) {
    json::Value::Object entries;
    for (const auto& [key, value] : metadata) entries.emplace_back(key, json::Value::String(value));
    header.emplace_back(kSafetensorsMetadataKey, json::Value::MakeObject(std::move(entries)));
  }
  int64_t offset = 0;
  for (const PreparedTensor& t : tensors) {
    json::Value::Array shape;
    for (const int64_t size : t.tensor.sizes()) shape.push_back(json::Value::Int(size));
    header.emplace_back(
        *t.name,
        json::Value::MakeObject({
            {"dtype", json::Value::String(std::string(t.dtype_name))},
            {"shape", json::Value::MakeArray(std::move(shape))},
            {"data_offsets", json::Value::MakeArray({json::Value::Int(offset),
                                                     json::Value::Int(offset + t.num_bytes)})},
        }));
    offset += t.num_bytes;
  }
  std::string header_text;
  try {
    header_text = json::Dump(json::Value::MakeObject(std::move(header)));
  } catch (const json::TypeError& e) {
    throw CheckpointError(fmt::format("{}: cannot write the header: {}", path, e.what()));
  }
  // Pad so that the data section starts 8-byte aligned, as the reference writer does.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = header_text.size();

  AtomicFileWriter file(path);
  file.Write(&header_bytes, kSafetensorsLengthBytes);
  file.Write(header_text.data(), header_text.size());
  for (const PreparedTensor& t : tensors) {
    if (t.num_bytes == 0) continue;
    const at::Tensor host =
        t.tensor.resolve_conj().resolve_neg().contiguous().to(at::kCPU).contiguous();
    file.Write(host.const_data_ptr(), static_cast<size_t>(t.num_bytes));
  }
  file.Commit();
}

// True for `model-00001-of-00003.safetensors` and the like.
bool IsShardFileName(const std::string& name) {
  return name.size() == std::string_view("model-00001-of-00003.safetensors").size() &&
         name.compare(0, 6, "model-") == 0 && name.compare(11, 4, "-of-") == 0 &&
         name.compare(20, 12, ".safetensors") == 0;
}

}  // namespace

void WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  WritePrepared(path, PrepareTensors(path, tensors), metadata);
}

std::vector<std::string> WriteCheckpointShards(const std::string& dir, const NamedTensors& tensors,
                                               int64_t max_shard_bytes,
                                               const std::map<std::string, std::string>& metadata) {
  RL_CHECK(max_shard_bytes > 0, CheckpointError, "{}: max_shard_bytes must be positive, got {}",
           dir, max_shard_bytes);
  const std::vector<PreparedTensor> prepared = PrepareTensors(dir, tensors);

  MakeDirectories(dir);
  for (const std::string& name : ListFiles(dir)) {
    if (name == kSafetensorsFileName || name == kSafetensorsIndexFileName ||
        IsShardFileName(name)) {
      throw CheckpointError(fmt::format(
          "{}: already holds a checkpoint ({}); write each checkpoint to a fresh directory", dir,
          name));
    }
  }

  // Greedy, in order: a shard is closed when the next tensor would take it past the limit.
  std::vector<std::vector<PreparedTensor>> shards(1);
  int64_t shard_bytes = 0;
  int64_t total_bytes = 0;
  for (const PreparedTensor& t : prepared) {
    if (!shards.back().empty() && shard_bytes + t.num_bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += t.num_bytes;
    total_bytes += t.num_bytes;
  }

  std::map<std::string, std::string> shard_metadata = metadata;
  shard_metadata.emplace("format", "pt");
  if (shards.size() == 1) {
    WritePrepared(JoinPath(dir, kSafetensorsFileName), shards[0], shard_metadata);
    return {kSafetensorsFileName};
  }

  std::vector<std::string> written;
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    WritePrepared(JoinPath(dir, name), shards[i], shard_metadata);
    for (const PreparedTensor& t : shards[i]) weight_map.emplace_back(*t.name, name);
    written.push_back(name);
  }
  WriteShardIndex(dir, weight_map, total_bytes);
  written.push_back(kSafetensorsIndexFileName);
  return written;
}

void WriteShardIndex(const std::string& dir,
                     const std::vector<std::pair<std::string, std::string>>& weight_map,
                     int64_t total_bytes) {
  json::Value::Object map;
  for (const auto& [tensor, file] : weight_map) map.emplace_back(tensor, json::Value::String(file));
  const json::Value index = json::Value::MakeObject({
      {"metadata", json::Value::MakeObject({{"total_size", json::Value::Int(total_bytes)}})},
      {"weight_map", json::Value::MakeObject(std::move(map))},
  });
  const std::string index_text = json::Dump(index, 2) + "\n";
  AtomicFileWriter index_file(JoinPath(dir, kSafetensorsIndexFileName));
  index_file.Write(index_text.data(), index_text.size());
  index_file.Commit();
}

}  // namespace rl::model
