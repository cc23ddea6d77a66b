// The rollout engine's inference layout of the weights, and the mapping from the trainer's
// Hugging Face (HF) tensor names into it.
//
// An inference engine fuses some HF tensors into one (Note [Engine fusion rules]) and keeps all of
// its weights in one flat byte storage (Note [Engine storage layout]). MakeEngineLayout computes
// that layout from the list of HF tensors, once; HfViews and EngineViews turn a storage into named
// tensors: the engine's own fused tensors, or one tensor per HF name aliasing the row range of the
// fused tensor that holds it. Weight sync writes actor tensors through the HF views; the engine
// computes with the engine views; the update-equality check hashes the HF views.
//
// Note [Engine fusion rules]
// For every prefix X (X ends at the module, e.g. "model.layers.3"):
//   X.self_attn.{q,k,v}_proj.weight -> X.self_attn.qkv_proj.weight  (rows: q, then k, then v)
//   X.self_attn.{q,k,v}_proj.bias   -> X.self_attn.qkv_proj.bias    (same order)
//   X.gate_proj.weight + X.up_proj.weight -> X.gate_up_proj.weight   (rows: gate, then up)
// The gate/up rule covers dense MLPs (X = model.layers.N.mlp) and shared experts
// (X = ...mlp.shared_experts); the trainer's routed experts arrive already stacked and fused
// (...mlp.experts.gate_up_proj [E, 2I, H], Note [Stacked experts] in trainer/model/params.h) and
// map 1:1, while per-expert names (X = ...mlp.experts.E) still fuse by the rule. A group is fused
// only when all of its parts are in the HF list with the same dtype, at least one dimension, and
// equal trailing dimensions (all but dim 0); otherwise each part maps 1:1 under its own name.
// Every other HF tensor maps 1:1 (same name, shape and dtype). Fusion concatenates along dim 0, so
// each part is a contiguous row range [row_begin, row_begin + rows) of the fused tensor.
//
// Note [Engine storage layout]
// Engine tensors are laid out in the order their first part appears in the HF list, each one
// contiguous (row-major) at `offset_bytes`, every offset a multiple of kEngineAlignmentBytes.
// total_bytes is the end of the last tensor rounded up to kEngineAlignmentBytes. The storage is a
// 1-D uint8 (at::kByte) contiguous tensor of at least total_bytes on any device, owned by the
// engine; views made from it hold a reference to it, so it stays alive while any view does.
//
// Expert flag: an engine tensor is `expert` when its name names a routed expert (contains
// ".experts." but not ".shared_experts."; the reference's is_routed_expert_param). Parts of one
// fused tensor always share the flag, since they share the prefix.
//
// Failures: MakeEngineLayout throws rl::Error for a duplicate HF name, an HF name that collides
// with a fused engine name, or a negative dimension. HfViews / EngineViews throw rl::Error when
// the storage is not a contiguous 1-D uint8 tensor of at least total_bytes.
// Thread safety: the layout is an immutable value after construction; the functions are
// stateless.
#ifndef RL_WEIGHT_SYNC_ENGINE_LAYOUT_H_
#define RL_WEIGHT_SYNC_ENGINE_LAYOUT_H_

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace rl::weight_sync {

inline constexpr int64_t kEngineAlignmentBytes = 256;

// One tensor as the trainer names it (HF checkpoint name), with its shape and dtype.
struct TensorDecl {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

// One HF tensor inside a fused engine tensor: rows [row_begin, row_begin + rows) of dim 0.
struct Part {
  std::string hf_name;
  int64_t row_begin = 0;
  int64_t rows = 0;  // rows of the engine tensor's dim 0
};

struct EngineTensor {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  int64_t offset_bytes = 0;
  // The HF tensors this engine tensor is made of, in row order; one part covering all rows for a
  // 1:1 tensor (rows = 1 for a 0-d tensor).
  std::vector<Part> parts;
  bool expert = false;  // routed expert
};

struct EngineLayout {
  std::vector<EngineTensor> tensors;  // in the order of the HF list
  int64_t total_bytes = 0;            // each offset aligned to 256 bytes
  // hf_name -> {engine tensor index, row_begin, rows}
  struct Location {
    size_t tensor = 0;
    int64_t row_begin = 0;
    int64_t rows = 0;
  };
  std::unordered_map<std::string, Location> locations;
};

// True for routed-expert tensors: ".experts." in the name and not ".shared_experts.".
bool IsRoutedExpert(const std::string& name);

// numel(shape) * element size of dtype.
int64_t NumBytes(const std::vector<int64_t>& shape, at::ScalarType dtype);

EngineLayout MakeEngineLayout(const std::vector<TensorDecl>& hf_tensors);

// name -> tensor aliasing `storage` (1-D uint8 of at least total_bytes, any device) for every HF
// name: row slices of the fused tensors are contiguous views, so a Decoder can run on them
// directly. Shapes and dtypes are the HF declarations'.
std::unordered_map<std::string, at::Tensor> HfViews(const EngineLayout& layout,
                                                    const at::Tensor& storage);

// name -> the engine's own (fused) tensors.
std::unordered_map<std::string, at::Tensor> EngineViews(const EngineLayout& layout,
                                                        const at::Tensor& storage);

}  // namespace rl::weight_sync

#endif  // RL_WEIGHT_SYNC_ENGINE_LAYOUT_H_
