// Reading model weights in the safetensors format, single-file and sharded, as Hugging Face
// `transformers` and the `safetensors` package write them (the writer: safetensors_writer.h).
//
// Note [Safetensors layout]
// A file is: an 8-byte little-endian uint64 N; N bytes of a UTF-8 JSON object (the header); the
// data section, to the end of the file. The header maps each tensor name to
//   {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]}
// with byte offsets relative to the start of the data section, and may hold "__metadata__": an
// object of string to string. Tensors are row-major and little-endian. The tensors' ranges tile
// the data section exactly: no overlap, no gap, nothing after the last one (the reference reader
// rejects anything else, so this reader does too). Writers pad the header with spaces so that N
// is a multiple of 8 and the data section starts 8-byte aligned.
// A sharded checkpoint is a directory holding `model-00001-of-0000K.safetensors` ... and
// `model.safetensors.index.json`:
//   {"metadata": {"total_size": <data bytes>}, "weight_map": {"<tensor name>": "<shard file>"}}
// An unsharded one holds `model.safetensors` alone.
//
// Ownership: SafetensorsFile memory-maps its file once; the mapping is shared (reference-counted)
// by the SafetensorsFile, its copies, and every tensor Get() returns, and is unmapped when the last
// of them is gone, so tensors stay valid after the reader is destroyed. The mapping is private and
// copy-on-write: writing into a returned tensor changes this process's copy, never the file, and is
// seen by every other tensor Get() returned for the same name. The file must not be truncated or
// rewritten in place while mapped (access would fault); replacing it by rename, as
// WriteSafetensors does, is safe.
//
// Thread safety: a SafetensorsFile / CheckpointReader is immutable after Open(); concurrent const
// calls are safe.
//
// Failures: every problem with a file throws rl::CheckpointError naming the file (and the tensor,
// where there is one) and saying what is wrong, e.g.
//   "/ckpt/model.safetensors: tensor 'lm_head.weight': data_offsets [0, 24] hold 24 bytes, but
//    shape [2, 4] of F32 needs 32"
#ifndef RL_TRAINER_MODEL_SAFETENSORS_H_
#define RL_TRAINER_MODEL_SAFETENSORS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/json.h"

namespace rl::model {

inline constexpr char kSafetensorsFileName[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFileName[] = "model.safetensors.index.json";
// Headers beyond this are refused unread, as the reference implementation does.
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// The little-endian uint64 header length that opens every file.
inline constexpr size_t kSafetensorsLengthBytes = 8;
// The header key of the string-to-string metadata; no tensor may have this name.
inline constexpr char kSafetensorsMetadataKey[] = "__metadata__";

// The dtypes this module reads and writes: "BOOL", "U8", "I8", "I16", "I32", "I64", "F16", "BF16",
// "F32", "F64", "F8_E4M3", "F8_E5M2". Anything else is refused with the list.
std::optional<at::ScalarType> ScalarTypeFromSafetensorsDtype(std::string_view dtype);
std::optional<std::string_view> SafetensorsDtypeFromScalarType(at::ScalarType type);
// "BOOL, U8, ...": the list above, for error messages.
std::string KnownSafetensorsDtypes();

// One tensor's header entry.
struct TensorInfo {
  std::string name;
  std::string dtype_name;  // as the header spells it, e.g. "BF16"
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t data_begin = 0;  // byte offsets into the data section: [data_begin, data_end)
  int64_t data_end = 0;

  int64_t num_bytes() const { return data_end - data_begin; }
};

// What a safetensors file's bytes say before any tensor is read: the header length, the tensors
// and the metadata.
struct SafetensorsHeader {
  int64_t header_bytes = 0;                     // N
  std::vector<TensorInfo> tensors;              // in header order
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
};

// Validates the bytes of a whole file (`file`: the length, the header and the data section, whose
// contents are not read) exactly as SafetensorsFile::Open() does; `path` names the file in
// messages. Throws CheckpointError; see Note [Safetensors layout]. Open() maps the file and calls
// this; fuzz/safetensors_fuzz.cc feeds it hostile bytes.
SafetensorsHeader ParseSafetensorsHeader(const std::string& path, std::string_view file);

class SafetensorsFile {
 public:
  // Maps and validates the whole header. Throws CheckpointError; see Note [Safetensors layout].
  static SafetensorsFile Open(const std::string& path);

  const std::string& path() const { return path_; }
  // In header order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* Find(std::string_view name) const;
  // A CPU tensor over the mapped bytes (no copy), or, when the bytes are not aligned to the
  // element size (a header length that is not a multiple of 8, odd-sized tensors before it), an
  // aligned copy. Throws CheckpointError naming the file when there is no such tensor.
  at::Tensor Get(std::string_view name) const;
  // "__metadata__", empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int64_t header_bytes() const { return header_bytes_; }  // N

 private:
  struct Mapping;
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  int64_t header_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// The tensors of a checkpoint directory, sharded or not, found by name.
class CheckpointReader {
 public:
  // Opens `<dir>/model.safetensors.index.json` and every shard it names, or
  // `<dir>/model.safetensors`. Throws CheckpointError when neither (or both) exist, a shard is
  // missing or corrupt, the index maps a tensor to a shard that lacks it, a shard holds a tensor
  // the index does not list, or a tensor is in two shards.
  static CheckpointReader Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Shard order, then header order.
  std::vector<std::string> names() const;
  const TensorInfo* Find(std::string_view name) const;  // nullptr when absent
  // Throws CheckpointError naming the directory when there is no such tensor.
  at::Tensor Get(std::string_view name) const;
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  // The index's "metadata" (e.g. {"total_size": 123}); null for an unsharded checkpoint.
  const json::Value& index_metadata() const { return index_metadata_; }

 private:
  CheckpointReader() = default;

  std::string dir_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, size_t, std::less<>> shard_of_;  // name -> position in shards_
  json::Value index_metadata_;
};

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_SAFETENSORS_H_
