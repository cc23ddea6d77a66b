// The parameters of a decoder: their names, shapes and roles, and the helpers that allocate,
// initialise, load and save them.
//
// Ownership (Note [Caller-owned params]): the model never allocates its parameters. The caller
// (the optimizer, which makes every parameter a view into one flat buffer; or a tool or test,
// through AllocateParams) owns the storage and hands the model a TensorMap of handles. The model
// reads the tensors through those handles on every forward pass, so an in-place update of the
// buffer (optimizer step, rematerialize, weight restore) is seen without telling the model.
//
// Names are the Hugging Face checkpoint names (model.layers.N.mlp.experts.E.gate_proj.weight, ...),
// without a checkpoint-specific prefix (Kimi-K2.5's "language_model." is added and removed by
// LoadParams / SaveHfCheckpoint). ListParams returns them in order of first use in the forward
// pass; the optimizer lays its buffers out in the reverse of that order (Note [Param buffer
// layout]).
//
// Roles: routed-expert params (names containing ".experts." but not ".shared_experts.") live in
// their own optimizer buffer; kFp32Extra tensors (the fp32 MoE `e_score_correction_bias` buffer)
// are not trained and are saved/restored by the backuper as "extras".
//
// Failures: LoadParams throws rl::CheckpointError naming the missing, unexpected and mismatched
// tensors; CheckParams throws rl::Error with the same lists for tensors handed in by a caller.
//
// Thread safety: stateless functions; the TensorMap is not synchronised.
#ifndef RL_TRAINER_MODEL_PARAMS_H_
#define RL_TRAINER_MODEL_PARAMS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "launch/param_spec.h"
#include "trainer/model/model_config.h"

namespace rl::model {

class CheckpointReader;  // trainer/model/safetensors.h

using TensorMap = std::unordered_map<std::string, at::Tensor>;

// Every parameter of the model described by `config`, in order of first use in the forward pass.
std::vector<ParamSpec> ListParams(const ModelConfig& config);

// The dtype a parameter of `spec` has in a model computing in `dtype`: kFp32Extra tensors are fp32
// (fp64 in an fp64 model), everything else `dtype`.
at::ScalarType ParamDtype(const ParamSpec& spec, at::ScalarType dtype);

// Plain, zero-filled allocation of every parameter (tools and tests; the trainer's optimizer
// allocates views into its buffers instead).
TensorMap AllocateParams(const std::vector<ParamSpec>& specs, at::ScalarType dtype,
                         at::Device device);

// Fills every tensor: normal(0, 0.02) for matrices, ones for norm weights, zeros for biases and
// e_score_correction_bias. Values are drawn on the CPU in fp32 from one generator seeded with
// `seed`, in ListParams order, so they do not depend on the device or the dtype's layout.
void InitParamsRandom(const std::vector<ParamSpec>& specs, TensorMap& params, uint64_t seed);

// Checks that `params` holds exactly the tensors of `specs`, with the right shapes; that the
// trained ones share one floating dtype and device and the extras are fp32 or fp64. Throws
// rl::Error listing what is missing, unexpected or mismatched.
void CheckParams(const std::vector<ParamSpec>& specs, const TensorMap& params);

// Copies every tensor of `params` from the checkpoint (converting dtype and device). Understands
// per-expert tensors and transformers-v5 fused experts (mlp.experts.gate_up_proj [E, 2I, H],
// mlp.experts.down_proj [E, H, I]), FP8 weights with a block `weight_scale_inv`, and ignores MTP
// layers (model.layers.{num_hidden_layers}+) and rotary buffers. Throws rl::CheckpointError naming
// every missing, unexpected or wrongly shaped tensor.
void LoadParams(const CheckpointReader& reader, const ModelConfig& config, TensorMap& params);

// Writes `params` as a Hugging Face checkpoint into `dir`: safetensors shards (with an index when
// there is more than one) and config.json, so that transformers' from_pretrained loads it.
void SaveHfCheckpoint(const std::string& dir, const ModelConfig& config, const TensorMap& params,
                      int64_t max_shard_bytes = int64_t{5} << 30);

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_PARAMS_H_
