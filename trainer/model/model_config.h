// The architecture of a decoder checkpoint and the values derived from it.
//
// One typed struct covers every model family the trainer runs: Qwen3 and Qwen3-MoE (GQA, q/k norm,
// softmax router), GLM-4.5 (GQA with partial rotary and qkv bias, sigmoid router), GLM-4.7-Flash,
// DeepSeek-V3 and Kimi K2/K2.5 (MLA, sigmoid router, YaRN for DeepSeek/Kimi) and GLM-5/5.2 (MLA
// plus the DSA lightning indexer). Everything the model code needs is a typed field here; nothing
// downstream reads the JSON again. Reading and writing config.json is hf_config.h's job.
//
// Thread safety: plain values; the free functions are stateless. ModelTypeName throws rl::Error
// only for a value outside the enum.
#ifndef RL_TRAINER_MODEL_MODEL_CONFIG_H_
#define RL_TRAINER_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/json.h"

namespace rl::model {

enum class ModelType {
  kQwen3,        // "qwen3"
  kQwen3Moe,     // "qwen3_moe"
  kGlm4Moe,      // "glm4_moe"        GLM-4.5/4.6/4.7
  kGlm4MoeLite,  // "glm4_moe_lite"   GLM-4.7-Flash
  kDeepseekV3,   // "deepseek_v3"     also "kimi_k2", and the text model of "kimi_k25"
  kGlmMoeDsa,    // "glm_moe_dsa"     GLM-5, GLM-5.1, GLM-5.2
};

// The config.json spelling ("qwen3_moe", ...).
std::string_view ModelTypeName(ModelType type);

enum class AttentionKind { kGqa, kMla };
enum class RouterKind {
  kNone,            // dense model
  kSoftmax,         // Qwen3-MoE: softmax over experts, top-k, optional renormalisation
  kSigmoidNoauxTc,  // DeepSeek/GLM: sigmoid, bias-corrected group-limited selection, scaling
};
enum class MlpType { kDense, kSparse };
enum class IndexerType {
  kNone,    // no DSA indexer (every model but glm_moe_dsa)
  kFull,    // the layer runs its own indexer
  kShared,  // GLM-5.2 IndexShare: the layer reuses the previous full layer's top-k
};
enum class RopeType { kDefault, kYarn };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  // YaRN only (transformers _compute_yarn_parameters).
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;  // explicit override of the cos/sin multiplier
  bool truncate = true;
};

struct ModelConfig {
  ModelType model_type = ModelType::kQwen3;
  // The config.json's own model_type string ("kimi_k2" reads as kDeepseekV3 and is written back).
  std::string model_type_name;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP layers
  int64_t num_hidden_layers = 0;  // without MTP layers
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA; MLA: == num_attention_heads
  int64_t head_dim = 0;             // GQA per-head size; MLA: qk_rope_head_dim (as transformers)
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // GQA: q/k/v (+o for Qwen3); MLA: q_a, kv_a and o projections
  bool use_qk_norm = false;     // GQA q_norm/k_norm over head_dim before RoPE
  RopeConfig rope;
  // Main attention RoPE pairing: true = DeepSeek interleaved pairs (2i, 2i+1), false = half-rotate
  // pairs (j, j + d/2).
  bool rope_interleave = false;

  // MLA.
  std::optional<int64_t> q_lora_rank;  // nullopt: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // MoE.
  RouterKind router = RouterKind::kNone;
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_shared_experts = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = false;
  std::vector<MlpType> mlp_layer_types;  // one per layer

  // Note [Expert shard]
  // Under expert parallelism (EP) a model instance holds the routed experts of one EP rank only:
  // of the n_routed_experts of every MoE layer, the `local_experts()` consecutive ones starting at
  // `first_local_expert()` (rank r of size P holds [r * E / P, (r + 1) * E / P)). ListParams shapes
  // the stacked expert params [local_experts(), ...]; HfLayout, LoadParams and InitParamsRandom
  // name and fill them by their global expert ids, so a shard holds exactly the rows of the whole
  // model's experts it covers. The router always scores all n_routed_experts. Not part of the
  // checkpoint's config.json: a property of the run's layout. {0, 1}: every expert.
  struct ExpertShard {
    int64_t rank = 0;
    int64_t size = 1;
  };
  ExpertShard expert_shard;
  int64_t local_experts() const { return n_routed_experts / expert_shard.size; }
  int64_t first_local_expert() const { return expert_shard.rank * local_experts(); }

  // Note [Tensor shard]
  // Under tensor parallelism (TP, Note [Tensor-parallel mappings] in tensor_parallel.h) a model
  // instance holds rank `rank`'s slice of every column- or row-parallel param: ListParams gives
  // the local shapes, and each ParamSpec says along which dim (tp_dim) and from which index of the
  // whole tensor (tp_start) its slice lies; replicated params have tp_dim -1. Query heads,
  // intermediate features and MLA heads split evenly (TP must divide them); key/value heads as
  // KvHeadsOf; the vocabulary as VocabSlice. Not part of config.json. {0, 1}: no TP.
  struct TensorShard {
    int64_t rank = 0;
    int64_t size = 1;
  };
  TensorShard tensor_shard;

  // DSA indexer.
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  std::vector<IndexerType> indexer_types;  // one per layer
  bool indexer_rope_interleave = false;

  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  // Checkpoint tensor names carry this prefix (Kimi-K2.5: "language_model."); ListParams() names
  // do not.
  std::string weight_prefix;
  // Where the config came from, for error messages ("ckpt/config.json").
  std::string source_name;
  // The parsed config.json, written back by ToHfConfigJson() (hf_config.h); null for configs
  // built in code.
  json::Value hf_config;

  AttentionKind attention_kind() const;
  bool is_moe() const { return router != RouterKind::kNone; }
  bool has_indexer() const { return !indexer_types.empty(); }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Dimensions RoPE rotates per head: GQA head_dim * partial_rotary_factor; MLA qk_rope_head_dim.
  int64_t rope_dim() const;
  // Softmax scale of the main attention: head_dim^-0.5 (GQA), qk_head_dim^-0.5 times the YaRN
  // mscale^2 correction (MLA, as transformers' DeepSeek-V3 attention applies it).
  double attention_scale() const;
  // The multiplier transformers applies to cos and sin (1 except YaRN).
  double rope_attention_factor() const;
  // The indices of the MoE layers, and of the layers with their own DSA indexer, in order.
  std::vector<int64_t> moe_layers() const;
  std::vector<int64_t> indexer_layers() const;
};

// For each of `num_layers` model layers, its position in `layers` (a subset, in order), or -1.
std::vector<int64_t> LayerOrdinals(const std::vector<int64_t>& layers, int64_t num_layers);

// A run of `count` items (heads, vocabulary ids) from `first`.
struct HeadRange {
  int64_t first = 0;
  int64_t count = 0;
};
// The key/value heads TP rank `rank` of `tp_size` holds (Note [Tensor-parallel attention] in
// tensor_parallel.h): kv_heads / tp_size of them when that divides, else the one head
// rank * kv_heads / tp_size, replicated on tp_size / kv_heads ranks. Throws ConfigError when
// neither divides the other.
HeadRange KvHeadsOf(int64_t kv_heads, int64_t rank, int64_t tp_size);
// The vocabulary ids rank `rank` of `tp_size` holds: vocab / tp_size each, the remainder on the
// last rank.
HeadRange VocabSlice(int64_t vocab, int64_t rank, int64_t tp_size);

}  // namespace rl::model

#endif  // RL_TRAINER_MODEL_MODEL_CONFIG_H_
