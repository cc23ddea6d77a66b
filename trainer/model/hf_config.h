// A checkpoint's Hugging Face `config.json`, read into a ModelConfig and written back from one.
//
// Two config.json dialects are read: the one real checkpoints carry (`rope_theta` and
// `rope_scaling` at top level, `partial_rotary_factor` at top level) and the one transformers 5
// writes (`rope_parameters` holding rope_theta, rope_type and the YaRN fields; per-layer lists such
// as `mlp_layer_types` and `indexer_types`). Keys that define a tensor shape are required; keys
// with a transformers default take that default when absent.
//
// The parsed document is kept (`ModelConfig::hf_config`) so that a checkpoint the trainer saves
// carries the same config.json it was loaded from; ToHfConfigJson() synthesises one for a config
// built in code (tests, tools).
//
// Failures: a missing required key, a value of the wrong type, an unsupported model_type or
// RoPE type, or inconsistent sizes throw rl::CheckpointError naming the file and the key.
//
// Thread safety: the functions are stateless.
#ifndef RL_TRAINER_MODEL_HF_CONFIG_H_
#define RL_TRAINER_MODEL_HF_CONFIG_H_

#include <string>
#include <string_view>

#include "launch/json.h"
#include "trainer/model/model_config.h"

namespace rl::model {

// Parses a config.json document. `source_name` names the file in error messages.
ModelConfig ParseModelConfig(const json::Value& doc, std::string_view source_name);

// Reads `<checkpoint_dir>/config.json`.
ModelConfig LoadModelConfig(const std::string& checkpoint_dir);

// A config.json that transformers loads into the same architecture: the stored document when the
// config was parsed from one, else one synthesised from the fields (transformers 5 dialect).
json::Value ToHfConfigJson(const ModelConfig& config);

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_HF_CONFIG_H_
