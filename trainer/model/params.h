// The parameters of a decoder: their names, shapes and roles, and the helpers that allocate,
// initialise, load and save them.
//
// Ownership (Note [Caller-owned params]): the model never allocates its parameters. The caller
// (the optimizer, which makes every parameter a view into one flat buffer; or a tool or test,
// through AllocateParams) owns the storage and hands the model a TensorMap of handles. The model
// reads the tensors through those handles on every forward pass, so an in-place update of the
// buffer (optimizer step, rematerialize, weight restore) is seen without telling the model.
//
// Names are the Hugging Face checkpoint names without a checkpoint-specific prefix (Kimi-K2.5's
// "language_model." is added and removed by LoadParams / SaveHfCheckpoint), except that the routed
// experts of a layer are stacked (Note [Stacked experts]). ListParams returns them in order of
// first use in the forward pass; the optimizer lays its buffers out in the reverse of that order
// (Note [Param buffer layout]).
//
// Roles: routed-expert params (names containing ".experts." but not ".shared_experts.") live in
// their own optimizer buffer; kFp32Extra tensors (the fp32 MoE `e_score_correction_bias` buffer)
// are not trained and are saved/restored by the backuper as "extras".
//
// Note [Stacked experts]
// The routed experts of MoE layer N are two parameters, named and shaped as in transformers v5:
//   model.layers.N.mlp.experts.gate_up_proj [E, 2I, H]: expert e's gate_proj.weight is rows
//       [0, I) of [e], its up_proj.weight rows [I, 2I);
//   model.layers.N.mlp.experts.down_proj    [E, H, I]: expert e's down_proj.weight is [e].
// so that the MoE block runs every expert with one grouped GEMM per projection, and the ZeRO
// buffers, the rollout engine and the weight sync move two tensors per layer instead of 3E.
// Hugging Face checkpoints keep the per-expert names (model.layers.N.mlp.experts.E.up_proj.weight
// and the like): HfLayout maps every on-disk tensor to its rows of a parameter, and LoadParams,
// SaveHfCheckpoint and --freeze-params go through it, so files and user-facing names are those of
// the checkpoint.
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

// One Hugging Face checkpoint tensor inside a parameter (Note [Stacked experts]): `hf_name` is
// `param` itself (expert < 0), or rows [row_begin, row_begin + rows) of param[expert].
struct HfSlice {
  std::string hf_name;
  std::string param;
  int64_t expert = -1;
  int64_t row_begin = 0;
  int64_t rows = 0;
};

// Every checkpoint tensor of the parameters `specs` (a ListParams list or a subset), in the order
// Hugging Face checkpoints hold them: per layer and expert gate_proj, up_proj, down_proj. Stacked
// experts hold the experts from `first_expert` on (Note [Expert shard] in model_config.h): local
// expert e is named by its global id first_expert + e.
std::vector<HfSlice> HfLayout(const std::vector<ParamSpec>& specs, int64_t first_expert = 0);

// The view of `param` (the tensor of slice.param) that holds slice.hf_name.
at::Tensor SliceOf(const HfSlice& slice, const at::Tensor& param);

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
// `specs` are a model's without expert or tensor shards.
void InitParamsRandom(const std::vector<ParamSpec>& specs, TensorMap& params, uint64_t seed);
// The params of `config`'s expert and tensor shards (ListParams(config)) get their slices of the
// whole model's values, drawn as above: the values do not depend on the EP or TP layout either.
void InitParamsRandom(const ModelConfig& config, TensorMap& params, uint64_t seed);

// Checks that `params` holds exactly the tensors of `specs`, with the right shapes; that the
// trained ones share one floating dtype and device and the extras are fp32 or fp64. Throws
// rl::Error listing what is missing, unexpected or mismatched.
void CheckParams(const std::vector<ParamSpec>& specs, const TensorMap& params);

// Copies every tensor of `params` from the checkpoint (converting dtype and device). Understands
// per-expert tensors (stacked on load: Note [Stacked experts]) and transformers-v5 fused experts
// (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]), FP8 weights with a block
// `weight_scale_inv`, and ignores MTP layers (model.layers.{num_hidden_layers}+) and rotary
// buffers. Throws rl::CheckpointError naming every missing, unexpected or wrongly shaped tensor.
void LoadParams(const CheckpointReader& reader, const ModelConfig& config, TensorMap& params);

// Writes `params` as a Hugging Face checkpoint into `dir`: safetensors shards (with an index when
// there is more than one) and config.json, so that transformers' from_pretrained loads it. Stacked
// experts are written per expert, in HfLayout order.
void SaveHfCheckpoint(const std::string& dir, const ModelConfig& config, const TensorMap& params,
                      int64_t max_shard_bytes = int64_t{5} << 30);

// Note [Expert-parallel saves]
// Under expert parallelism (config.expert_shard) no rank holds every expert, and gathering them
// would put the whole model on one rank. The ranks write one checkpoint together instead: the
// dense tensors into files of their own (written by one rank, `write_dense`), each EP rank's
// experts into files of their own (written by one rank holding them, `write_experts`), all named
// model-0000i-of-0000K.safetensors in one numbering that every rank computes alike from the
// tensors' sizes (the same on every rank); then, once every part is on disk, one rank writes the
// index and the whole model's config.json (FinishHfCheckpointParts). `transformers` and LoadParams
// read the result like any sharded checkpoint. Files of the same names in `dir` are replaced
// (each file is written atomically).
void SaveHfCheckpointPart(const std::string& dir, const ModelConfig& config,
                          const TensorMap& params, bool write_dense, bool write_experts,
                          int64_t max_shard_bytes = int64_t{5} << 30);
void FinishHfCheckpointParts(const std::string& dir, const ModelConfig& config,
                             const TensorMap& params, int64_t max_shard_bytes = int64_t{5} << 30);

// Note [Tensor shard] (model_config.h): this rank's slices (views) of the whole model's params
// `whole`, for the specs of ListParams at the rank's tensor shard. Throws rl::Error naming a
// param `whole` lacks.
TensorMap ShardTensorParallel(const std::vector<ParamSpec>& specs, const TensorMap& whole);

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_PARAMS_H_
