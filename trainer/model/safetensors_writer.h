// Writing model weights in the safetensors format (Note [Safetensors layout] in safetensors.h):
// one file, or a checkpoint directory of shards and an index, as Hugging Face `transformers` and
// the `safetensors` package write them, so that the reader (safetensors.h) and from_pretrained
// read them back.
//
// Ownership: the writers read the tensors they are given and keep nothing.
// Thread safety: they touch only the files they are given.
// Failures: rl::CheckpointError naming the file and the tensor (bad tensor, I/O error); a failed
// write leaves no partial file behind.
#ifndef RL_TRAINER_MODEL_SAFETENSORS_WRITER_H_
#define RL_TRAINER_MODEL_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launch/named_tensors.h"

namespace rl::model {

// Writes one safetensors file, tensors in the given order (no reordering for alignment: a tensor
// whose offset is not a multiple of its element size is read back through a copy). Tensors may
// live on any device and have any strides; they are written row-major. Atomic: writes
// `<path>.tmp.<pid>`, fsyncs it, renames it over `path`, fsyncs the directory. Throws
// CheckpointError for a repeated or reserved ("__metadata__") name, an undefined, sparse or
// unsupported-dtype tensor, or an I/O error.
void WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Writes a checkpoint directory that CheckpointReader and `transformers`' from_pretrained read
// (with a config.json, which is not written here). Tensors go, in order, into shards of at most
// `max_shard_bytes` of data each (a larger tensor gets a shard of its own); a single shard is
// written as `model.safetensors`, more as `model-0000i-of-0000K.safetensors` followed, last, by
// `model.safetensors.index.json`. Each shard's metadata is `metadata` plus {"format": "pt"}
// (which `transformers` requires) unless `metadata` sets "format". Creates `dir` if needed and
// refuses one that already holds a checkpoint, so that no stale shard is mixed in. Returns the
// file names written, in the order written.
std::vector<std::string> WriteCheckpointShards(
    const std::string& dir, const NamedTensors& tensors, int64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata = {});

// The index of a checkpoint whose shards were written separately (by several ranks):
// `model.safetensors.index.json` in `dir`, mapping each tensor name to its file, with the total
// bytes of tensor data. Atomic.
void WriteShardIndex(const std::string& dir,
                     const std::vector<std::pair<std::string, std::string>>& weight_map,
                     int64_t total_bytes);

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_SAFETENSORS_WRITER_H_
