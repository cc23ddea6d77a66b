#include "weight_sync/engine_layout.h"

#include <ATen/ATen.h>
#include <ATen/ops/from_blob.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <unordered_set>

#include "launch/check.h"

namespace rl::weight_sync {
namespace {

// One fusion rule of Note [Engine fusion rules]: HF names "<prefix><part><suffix>" for every part
// fuse into "<prefix><fused><suffix>", where <prefix> ends with `anchor`.
struct FusionRule {
  std::string_view anchor;
  std::vector<std::string_view> parts;  // in row order
  std::string_view fused;
  std::vector<std::string_view> suffixes;
};

const std::vector<FusionRule>& FusionRules() {
  static const std::vector<FusionRule> rules = {
      {".self_attn.", {"q_proj", "k_proj", "v_proj"}, "qkv_proj", {".weight", ".bias"}},
      {".", {"gate_proj", "up_proj"}, "gate_up_proj", {".weight"}},
  };
  return rules;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A candidate fused group: the engine name and the HF names of its parts, in row order.
struct Group {
  std::string fused_name;
  std::vector<std::string> part_names;
};

// The group `name` would belong to under some rule, if its name matches one.
std::optional<Group> CandidateGroup(const std::string& name) {
  for (const FusionRule& rule : FusionRules()) {
    for (std::string_view suffix : rule.suffixes) {
      for (std::string_view part : rule.parts) {
        std::string tail = std::string(rule.anchor) + std::string(part) + std::string(suffix);
        if (!EndsWith(name, tail)) continue;
        // The prefix keeps the anchor: name = prefix + part + suffix.
        const std::string prefix = name.substr(0, name.size() - part.size() - suffix.size());
        Group group;
        group.fused_name = prefix + std::string(rule.fused) + std::string(suffix);
        for (std::string_view p : rule.parts) {
          group.part_names.push_back(prefix + std::string(p) + std::string(suffix));
        }
        return group;
      }
    }
  }
  return std::nullopt;
}

bool Fusable(const Group& group,
             const std::unordered_map<std::string, const TensorDecl*>& by_name) {
  const TensorDecl* first = nullptr;
  for (const std::string& part : group.part_names) {
    auto it = by_name.find(part);
    if (it == by_name.end()) return false;
    const TensorDecl* decl = it->second;
    if (decl->shape.empty()) return false;
    if (first == nullptr) {
      first = decl;
      continue;
    }
    if (decl->dtype != first->dtype) return false;
    if (decl->shape.size() != first->shape.size()) return false;
    if (!std::equal(decl->shape.begin() + 1, decl->shape.end(), first->shape.begin() + 1)) {
      return false;
    }
  }
  return true;
}

int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

int64_t RowsOf(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }

void CheckStorage(const EngineLayout& layout, const at::Tensor& storage) {
  RL_CHECK(storage.defined(), Error, "engine weight storage is undefined");
  RL_CHECK(storage.dim() == 1 && storage.scalar_type() == at::kByte && storage.is_contiguous(),
           Error,
           "engine weight storage must be a contiguous 1-D uint8 tensor, got dim {} dtype {}",
           storage.dim(), c10::toString(storage.scalar_type()));
  RL_CHECK(storage.numel() >= layout.total_bytes, Error,
           "engine weight storage holds {} bytes but the layout needs {}; allocate total_bytes",
           storage.numel(), layout.total_bytes);
}

// A tensor of `shape`/`dtype` at byte `offset` of `storage`, keeping `storage` alive.
// A view of the storage's bytes, sharing its storage (so views of adjacent tensors are known to be
// adjacent: Decoder fuses projections whose weights lie back to back, Note [Inference kernels]).
at::Tensor ViewAt(const at::Tensor& storage, int64_t offset, const std::vector<int64_t>& shape,
                  at::ScalarType dtype) {
  return storage.narrow(0, offset, NumBytes(shape, dtype)).view(dtype).view(shape);
}

}  // namespace

bool IsRoutedExpert(const std::string& name) {
  return name.find(".experts.") != std::string::npos &&
         name.find(".shared_experts.") == std::string::npos;
}

int64_t NumBytes(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return numel * static_cast<int64_t>(c10::elementSize(dtype));
}

EngineLayout MakeEngineLayout(const std::vector<TensorDecl>& hf_tensors) {
  std::unordered_map<std::string, const TensorDecl*> by_name;
  for (const TensorDecl& decl : hf_tensors) {
    for (int64_t d : decl.shape) {
      RL_CHECK(d >= 0, Error, "tensor {} has a negative dimension ({})", decl.name, d);
    }
    RL_CHECK(by_name.emplace(decl.name, &decl).second, Error,
             "tensor {} appears twice in the weight list", decl.name);
  }

  EngineLayout layout;
  std::unordered_set<std::string> consumed;
  int64_t offset = 0;
  auto add = [&](EngineTensor tensor) {
    tensor.offset_bytes = AlignUp(offset, kEngineAlignmentBytes);
    offset = tensor.offset_bytes + NumBytes(tensor.shape, tensor.dtype);
    const size_t index = layout.tensors.size();
    for (const Part& part : tensor.parts) {
      layout.locations[part.hf_name] = {index, part.row_begin, part.rows};
    }
    layout.tensors.push_back(std::move(tensor));
  };

  for (const TensorDecl& decl : hf_tensors) {
    if (consumed.count(decl.name) != 0) continue;
    std::optional<Group> group = CandidateGroup(decl.name);
    if (group && Fusable(*group, by_name)) {
      RL_CHECK(by_name.count(group->fused_name) == 0, Error,
               "tensor {} collides with the engine tensor fused from {}", group->fused_name,
               fmt::join(group->part_names, ", "));
      const TensorDecl& first = *by_name.at(group->part_names.front());
      EngineTensor tensor;
      tensor.name = group->fused_name;
      tensor.dtype = first.dtype;
      tensor.shape = first.shape;
      tensor.shape[0] = 0;
      tensor.expert = IsRoutedExpert(tensor.name);
      for (const std::string& part_name : group->part_names) {
        const int64_t rows = by_name.at(part_name)->shape[0];
        tensor.parts.push_back({part_name, tensor.shape[0], rows});
        tensor.shape[0] += rows;
        consumed.insert(part_name);
      }
      add(std::move(tensor));
      continue;
    }
    EngineTensor tensor;
    tensor.name = decl.name;
    tensor.shape = decl.shape;
    tensor.dtype = decl.dtype;
    tensor.expert = IsRoutedExpert(decl.name);
    tensor.parts.push_back({decl.name, 0, RowsOf(decl.shape)});
    consumed.insert(decl.name);
    add(std::move(tensor));
  }
  layout.total_bytes = AlignUp(offset, kEngineAlignmentBytes);
  return layout;
}

std::unordered_map<std::string, at::Tensor> HfViews(const EngineLayout& layout,
                                                    const at::Tensor& storage) {
  CheckStorage(layout, storage);
  std::unordered_map<std::string, at::Tensor> views;
  for (const EngineTensor& tensor : layout.tensors) {
    if (tensor.parts.size() == 1 && tensor.parts[0].hf_name == tensor.name) {
      views.emplace(tensor.name, ViewAt(storage, tensor.offset_bytes, tensor.shape, tensor.dtype));
      continue;
    }
    // Fused: each part is a contiguous row range of dim 0.
    std::vector<int64_t> row_shape(tensor.shape.begin() + 1, tensor.shape.end());
    const int64_t row_bytes = NumBytes(row_shape, tensor.dtype);
    for (const Part& part : tensor.parts) {
      std::vector<int64_t> shape = tensor.shape;
      shape[0] = part.rows;
      views.emplace(part.hf_name, ViewAt(storage, tensor.offset_bytes + part.row_begin * row_bytes,
                                         shape, tensor.dtype));
    }
  }
  return views;
}

std::unordered_map<std::string, at::Tensor> EngineViews(const EngineLayout& layout,
                                                        const at::Tensor& storage) {
  CheckStorage(layout, storage);
  std::unordered_map<std::string, at::Tensor> views;
  for (const EngineTensor& tensor : layout.tensors) {
    views.emplace(tensor.name, ViewAt(storage, tensor.offset_bytes, tensor.shape, tensor.dtype));
  }
  return views;
}

}  // namespace rl::weight_sync
