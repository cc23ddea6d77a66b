#include "trainer/model/safetensors.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "launch/atomic_file.h"
#include "launch/check.h"

namespace rl::model {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors is little-endian; this code copies host bytes as they are");

struct DtypeName {
  std::string_view name;
  at::ScalarType type;
};

constexpr DtypeName kDtypes[] = {
    {"BOOL", c10::ScalarType::Bool},
    {"U8", c10::ScalarType::Byte},
    {"I8", c10::ScalarType::Char},
    {"I16", c10::ScalarType::Short},
    {"I32", c10::ScalarType::Int},
    {"I64", c10::ScalarType::Long},
    {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16},
    {"F32", c10::ScalarType::Float},
    {"F64", c10::ScalarType::Double},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn},
    {"F8_E5M2", c10::ScalarType::Float8_e5m2},
};

// A JSON value for an error message, cut short.
std::string Quote(const json::Value& v) {
  std::string text = json::Dump(v);
  constexpr size_t kMaxBytes = 60;
  if (text.size() > kMaxBytes) text = text.substr(0, kMaxBytes) + "...";
  return text;
}

// Every file opens with the 8-byte header length.
void CheckHasHeaderLength(const std::string& path, uint64_t file_bytes) {
  if (file_bytes < kSafetensorsLengthBytes) {
    throw CheckpointError(fmt::format(
        "{}: the file has {} bytes, fewer than the 8-byte header length; it is truncated or not a "
        "safetensors file",
        path, file_bytes));
  }
}

// a * b, or nullopt when it overflows int64.
std::optional<int64_t> CheckedMultiply(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Validates one header entry. `data_bytes` is the size of the data section.
TensorInfo ParseTensorEntry(const std::string& path, const std::string& name,
                            const json::Value& entry, int64_t data_bytes) {
  const auto fail = [&](const std::string& what) {
    return CheckpointError(fmt::format("{}: tensor '{}': {}", path, name, what));
  };
  if (!entry.is_object()) throw fail("header entry is " + Quote(entry) + ", not an object");
  for (const auto& [key, unused] : entry.AsObject()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      throw fail(fmt::format("unknown field \"{}\" (expected dtype, shape, data_offsets)", key));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (entry.Find(key) == nullptr) throw fail(fmt::format("missing field \"{}\"", key));
  }

  TensorInfo info;
  info.name = name;
  const json::Value& dtype = entry.at("dtype");
  if (!dtype.is_string()) throw fail("dtype is " + Quote(dtype) + ", not a string");
  info.dtype_name = dtype.AsString();
  const std::optional<at::ScalarType> type = ScalarTypeFromSafetensorsDtype(info.dtype_name);
  if (!type) {
    throw fail(
        fmt::format("unknown dtype \"{}\" (known: {})", info.dtype_name, KnownSafetensorsDtypes()));
  }
  info.dtype = *type;

  const json::Value& shape = entry.at("shape");
  if (!shape.is_array()) throw fail("shape is " + Quote(shape) + ", not an array");
  int64_t num_elements = 1;
  for (const json::Value& dim : shape.AsArray()) {
    if (!dim.is_integer()) {
      throw fail("shape " + Quote(shape) + " holds " + Quote(dim) + ", not an integer");
    }
    if (dim.AsInt64() < 0) {
      throw fail(fmt::format("shape {} has a negative dimension", Quote(shape)));
    }
    info.shape.push_back(dim.AsInt64());
    const std::optional<int64_t> product = CheckedMultiply(num_elements, dim.AsInt64());
    if (!product)
      throw fail(fmt::format("shape {} has more elements than int64 counts", Quote(shape)));
    num_elements = *product;
  }
  const std::optional<int64_t> needed_bytes =
      CheckedMultiply(num_elements, static_cast<int64_t>(c10::elementSize(info.dtype)));
  if (!needed_bytes) {
    throw fail(fmt::format("shape {} of {} needs more bytes than int64 counts", Quote(shape),
                           info.dtype_name));
  }

  const json::Value& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.AsArray().size() != 2 || !offsets.AsArray()[0].is_integer() ||
      !offsets.AsArray()[1].is_integer() || offsets.AsArray()[0].AsInt64() < 0 ||
      offsets.AsArray()[1].AsInt64() < 0) {
    throw fail("data_offsets is " + Quote(offsets) +
               ", not two non-negative integers [begin, end]");
  }
  info.data_begin = offsets.AsArray()[0].AsInt64();
  info.data_end = offsets.AsArray()[1].AsInt64();
  if (info.data_begin > info.data_end) {
    throw fail(
        fmt::format("data_offsets [{}, {}] begin after they end", info.data_begin, info.data_end));
  }
  if (info.data_end > data_bytes) {
    throw fail(fmt::format(
        "data_offsets [{}, {}] end beyond the {}-byte data section; the file is truncated",
        info.data_begin, info.data_end, data_bytes));
  }
  if (info.num_bytes() != *needed_bytes) {
    throw fail(fmt::format("data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}",
                           info.data_begin, info.data_end, info.num_bytes(), ShapeText(info.shape),
                           info.dtype_name, *needed_bytes));
  }
  return info;
}

// The tensors' byte ranges must tile [0, data_bytes); see Note [Safetensors layout].
void CheckTiling(const std::string& path, const std::vector<TensorInfo>& tensors,
                 int64_t data_bytes) {
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors) {
    if (t.num_bytes() > 0) by_offset.push_back(&t);  // empty tensors occupy nothing
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
  const TensorInfo* previous = nullptr;
  int64_t covered_end = 0;
  for (const TensorInfo* t : by_offset) {
    if (t->data_begin < covered_end) {
      throw CheckpointError(fmt::format(
          "{}: tensors '{}' (data_offsets [{}, {}]) and '{}' (data_offsets [{}, {}]) overlap", path,
          previous->name, previous->data_begin, previous->data_end, t->name, t->data_begin,
          t->data_end));
    }
    if (t->data_begin > covered_end) {
      throw CheckpointError(fmt::format(
          "{}: bytes [{}, {}) of the data section belong to no tensor (before tensor '{}')", path,
          covered_end, t->data_begin, t->name));
    }
    covered_end = t->data_end;
    previous = t;
  }
  if (covered_end != data_bytes) {
    throw CheckpointError(fmt::format(
        "{}: the data section has {} bytes, but the tensors end at byte {}; {} trailing bytes "
        "belong to no tensor",
        path, data_bytes, covered_end, data_bytes - covered_end));
  }
}

std::map<std::string, std::string> ParseMetadata(const std::string& path,
                                                 const json::Value& metadata) {
  if (!metadata.is_object()) {
    throw CheckpointError(
        fmt::format("{}: {} is {}, not an object", path, kSafetensorsMetadataKey, Quote(metadata)));
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata.AsObject()) {
    if (!value.is_string()) {
      throw CheckpointError(fmt::format("{}: {} \"{}\" is {}, not a string", path,
                                        kSafetensorsMetadataKey, key, Quote(value)));
    }
    out.emplace(key, value.AsString());
  }
  return out;
}

}  // namespace

std::optional<at::ScalarType> ScalarTypeFromSafetensorsDtype(std::string_view dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.name == dtype) return d.type;
  }
  return std::nullopt;
}

std::optional<std::string_view> SafetensorsDtypeFromScalarType(at::ScalarType type) {
  for (const DtypeName& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  return std::nullopt;
}

std::string KnownSafetensorsDtypes() {
  std::string out;
  for (const DtypeName& d : kDtypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

// The read-only view of a whole file, private and copy-on-write; see the header's Ownership.
struct SafetensorsFile::Mapping {
  Mapping(void* address, size_t num_bytes) : address(address), num_bytes(num_bytes) {}
  ~Mapping() { ::munmap(address, num_bytes); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  uint8_t* bytes() const { return static_cast<uint8_t*>(address); }

  void* address;
  size_t num_bytes;
};

SafetensorsHeader ParseSafetensorsHeader(const std::string& path, std::string_view file) {
  const uint64_t file_bytes = file.size();
  CheckHasHeaderLength(path, file_bytes);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), kSafetensorsLengthBytes);
  if (header_bytes > file_bytes - kSafetensorsLengthBytes) {
    throw CheckpointError(fmt::format(
        "{}: the header length {} goes beyond the end of the file ({} bytes); it is truncated or "
        "not a safetensors file",
        path, header_bytes, file_bytes));
  }
  if (header_bytes > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    throw CheckpointError(fmt::format("{}: the header length {} exceeds the limit of {} bytes",
                                      path, header_bytes, kMaxSafetensorsHeaderBytes));
  }
  SafetensorsHeader parsed;
  parsed.header_bytes = static_cast<int64_t>(header_bytes);
  const std::string_view header_text = file.substr(kSafetensorsLengthBytes, header_bytes);
  json::Value header;
  try {
    header = json::Parse(header_text);
  } catch (const json::ParseError& e) {
    throw CheckpointError(fmt::format("{}: the header is not valid JSON: {}", path, e.what()));
  }
  if (!header.is_object()) {
    throw CheckpointError(fmt::format("{}: the header is a JSON {}, not an object", path,
                                      json::KindName(header.kind())));
  }

  const auto data_bytes = static_cast<int64_t>(file_bytes - kSafetensorsLengthBytes - header_bytes);
  for (const auto& [name, entry] : header.AsObject()) {
    if (name == kSafetensorsMetadataKey) {
      parsed.metadata = ParseMetadata(path, entry);
      continue;
    }
    parsed.tensors.push_back(ParseTensorEntry(path, name, entry, data_bytes));
  }
  CheckTiling(path, parsed.tensors, data_bytes);
  return parsed;
}

SafetensorsFile SafetensorsFile::Open(const std::string& path) {
  const FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw CheckpointError(fmt::format("{}: cannot open: {}", path, ErrnoText()));
  struct stat status {};
  if (::fstat(fd.get(), &status) != 0) {
    throw CheckpointError(fmt::format("{}: cannot stat: {}", path, ErrnoText()));
  }
  if (!S_ISREG(status.st_mode)) {
    throw CheckpointError(fmt::format("{}: not a regular file", path));
  }
  const auto file_bytes = static_cast<uint64_t>(status.st_size);
  CheckHasHeaderLength(path, file_bytes);  // before mmap, which refuses an empty file
  // MAP_NORESERVE: a private writable mapping would otherwise be charged against the commit limit
  // for its full size, though pages are only copied when written.
  void* address =
      ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd.get(), 0);
  if (address == MAP_FAILED) {
    throw CheckpointError(
        fmt::format("{}: cannot map {} bytes: {}", path, file_bytes, ErrnoText()));
  }
  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = std::make_shared<Mapping>(address, file_bytes);

  SafetensorsHeader header = ParseSafetensorsHeader(
      path, std::string_view(reinterpret_cast<const char*>(file.mapping_->bytes()), file_bytes));
  file.header_bytes_ = header.header_bytes;
  file.tensors_ = std::move(header.tensors);
  file.metadata_ = std::move(header.metadata);
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_.emplace(file.tensors_[i].name, i);
  return file;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

at::Tensor SafetensorsFile::Get(std::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    throw CheckpointError(fmt::format("{}: no tensor named '{}'", path_, name));
  }
  const at::TensorOptions options = at::TensorOptions().dtype(info->dtype).device(at::kCPU);
  if (info->num_bytes() == 0) return at::empty(info->shape, options);
  uint8_t* data = mapping_->bytes() + kSafetensorsLengthBytes + header_bytes_ + info->data_begin;
  if (reinterpret_cast<uintptr_t>(data) % c10::elementSize(info->dtype) != 0) {
    at::Tensor copy = at::empty(info->shape, options);
    std::memcpy(copy.mutable_data_ptr(), data, static_cast<size_t>(info->num_bytes()));
    return copy;
  }
  // The deleter owns a reference to the mapping: the tensor keeps the file mapped.
  return at::from_blob(
      data, info->shape, [mapping = mapping_](void*) {}, options);
}

CheckpointReader CheckpointReader::Open(const std::string& dir) {
  CheckpointReader reader;
  reader.dir_ = dir;
  const std::string index_path = JoinPath(dir, kSafetensorsIndexFileName);
  const std::string single_path = JoinPath(dir, kSafetensorsFileName);
  const bool has_index = PathExists(index_path);
  const bool has_single = PathExists(single_path);
  if (has_index && has_single) {
    throw CheckpointError(fmt::format(
        "{}: holds both {} and {}; it is unclear which is the checkpoint, remove the stale one",
        dir, kSafetensorsIndexFileName, kSafetensorsFileName));
  }
  if (!has_index && !has_single) {
    throw CheckpointError(fmt::format("{}: holds neither {} nor {}; not a checkpoint directory",
                                      dir, kSafetensorsIndexFileName, kSafetensorsFileName));
  }
  if (has_single) {
    reader.shards_.push_back(SafetensorsFile::Open(single_path));
    for (const TensorInfo& t : reader.shards_[0].tensors()) reader.shard_of_.emplace(t.name, 0);
    return reader;
  }

  const json::Value index = json::ParseFile(index_path);
  const auto fail = [&](const std::string& what) {
    return CheckpointError(fmt::format("{}: {}", index_path, what));
  };
  if (!index.is_object()) throw fail("the index is not a JSON object");
  if (const json::Value* metadata = index.Find("metadata")) reader.index_metadata_ = *metadata;
  const json::Value* weight_map = index.Find("weight_map");
  if (weight_map == nullptr) throw fail("missing \"weight_map\"");
  if (!weight_map->is_object()) throw fail("\"weight_map\" is not an object");

  // Open each shard once, in order of first mention.
  std::map<std::string, size_t> shard_position;
  for (const auto& [name, file_value] : weight_map->AsObject()) {
    if (!file_value.is_string()) {
      throw fail(fmt::format("tensor '{}' maps to {}, not a file name", name, Quote(file_value)));
    }
    const std::string& file_name = file_value.AsString();
    if (file_name.empty() || file_name == "." || file_name == ".." ||
        file_name.find('/') != std::string::npos) {
      throw fail(fmt::format("tensor '{}' maps to \"{}\", which is not a file name in {}", name,
                             file_name, dir));
    }
    if (shard_position.count(file_name) != 0) continue;
    const std::string shard_path = JoinPath(dir, file_name);
    if (!PathExists(shard_path)) {
      throw fail(fmt::format("shard {} (holding tensor '{}') is missing", shard_path, name));
    }
    shard_position.emplace(file_name, reader.shards_.size());
    reader.shards_.push_back(SafetensorsFile::Open(shard_path));
  }

  for (size_t shard = 0; shard < reader.shards_.size(); ++shard) {
    for (const TensorInfo& t : reader.shards_[shard].tensors()) {
      const auto [it, inserted] = reader.shard_of_.emplace(t.name, shard);
      if (!inserted) {
        throw CheckpointError(fmt::format("{}: tensor '{}' is in two shards, {} and {}", dir,
                                          t.name, reader.shards_[it->second].path(),
                                          reader.shards_[shard].path()));
      }
    }
  }
  for (const auto& [name, file_value] : weight_map->AsObject()) {
    const size_t shard = shard_position.at(file_value.AsString());
    if (reader.shards_[shard].Find(name) == nullptr) {
      throw fail(fmt::format("tensor '{}' is mapped to {}, which has no such tensor", name,
                             reader.shards_[shard].path()));
    }
  }
  for (const auto& [name, shard] : reader.shard_of_) {
    if (weight_map->Find(name) == nullptr) {
      throw fail(fmt::format("shard {} holds tensor '{}', which the weight_map does not list",
                             reader.shards_[shard].path(), name));
    }
  }
  return reader;
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const SafetensorsFile& shard : shards_) {
    for (const TensorInfo& t : shard.tensors()) out.push_back(t.name);
  }
  return out;
}

const TensorInfo* CheckpointReader::Find(std::string_view name) const {
  const auto it = shard_of_.find(name);
  return it == shard_of_.end() ? nullptr : shards_[it->second].Find(name);
}

at::Tensor CheckpointReader::Get(std::string_view name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    throw CheckpointError(fmt::format("{}: the checkpoint has no tensor named '{}'", dir_, name));
  }
  return shards_[it->second].Get(name);
}

}  // namespace rl::model
