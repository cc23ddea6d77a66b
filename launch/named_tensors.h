// A list of tensors under their Hugging Face checkpoint names: what the model saves, the
// backuper hands out and the weight sync copies, so every layer passes the same type.
//
// Ownership: each entry holds an at::Tensor handle (shared storage), so a list may alias live
// parameters or own host copies; which one is up to whoever builds it. Order is meaningful (the
// producer's order). Plain data: no invariants, no failure modes, not synchronised.
#ifndef RL_LAUNCH_NAMED_TENSORS_H_
#define RL_LAUNCH_NAMED_TENSORS_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace rl {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};
using NamedTensors = std::vector<NamedTensor>;

}  // namespace rl

#endif  // RL_LAUNCH_NAMED_TENSORS_H_
