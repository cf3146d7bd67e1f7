// ModelSpec: the transformer a user wants to train, read from a Hugging Face config.json,
// an Alloy YAML file or a preset name, and validated with precise errors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace alloy {

enum class ModelFamily {
  ModelFamily_gpt2,   // LayerNorm, learned positions, multi-head attention, GELU MLP, biases
  ModelFamily_llama,  // RMSNorm, RoPE, grouped-query attention, SwiGLU MLP (llama, mistral, qwen2)
};

enum class RopeScalingType {
  RopeScalingType_none,
  RopeScalingType_linear,  // every position divided by `factor`
  RopeScalingType_llama3,  // Llama 3.1: low frequencies stretched by `factor`, high ones kept, a blend between
};

// Hugging Face's rope_scaling, for the types Alloy implements (others are refused by name).
struct RopeScaling {
  RopeScalingType type = RopeScalingType::RopeScalingType_none;
  double factor = 1.0;
  double low_freq_factor = 1.0;        // llama3
  double high_freq_factor = 4.0;       // llama3
  int64_t original_max_positions = 0;  // llama3: the context the frequencies were trained for
};

// How the load-balancing loss aux = E * sum_e f_e P_e (f_e: share of the top-k picks that went to
// expert e, P_e: mean router probability of e) gathers its statistics over the MoE blocks.
enum class MoeBalance {
  MoeBalance_pooled,     // one f and one P over every MoE block's tokens together (Hugging Face's
                         // load_balancing_loss_func: Mixtral, Qwen2-MoE)
  MoeBalance_per_block,  // each block's own f and P, its terms averaged over the blocks (DeepSeek-MoE)
};

// Mixture-of-Experts MLPs (Mixtral, Qwen2-MoE, DeepSeek-MoE): in each MoE block a router (a
// hidden x num_experts matrix, no bias) picks experts_per_token of the routed SwiGLU experts
// for every token; shared experts see every token. num_experts == 0 means a dense model.
struct MixtureOfExperts {
  int64_t num_experts = 0;                    // routed experts per MoE block
  int64_t experts_per_token = 0;              // top-k the router picks
  int64_t expert_ffn_hidden_size = 0;         // inner width of each routed expert
  int64_t num_shared_experts = 0;             // experts every token passes through (DeepSeek 2, Qwen2-MoE 1)
  int64_t shared_expert_ffn_hidden_size = 0;  // inner width of each shared expert
  bool shared_expert_gate = false;            // Qwen2-MoE: a sigmoid gate (hidden x 1) scales the shared output
  int64_t first_dense_layers = 0;             // leading blocks with a dense MLP of ffn_hidden_size (DeepSeek)
  bool norm_topk_prob = true;                 // the top-k routing weights are renormalised to sum to 1
  double router_aux_loss_coef = 0;            // weight of the load-balancing loss in the training objective
  MoeBalance balance = MoeBalance::MoeBalance_pooled;  // the load-balancing loss's form
  bool aux_per_sequence = false;              // DeepSeek's seq_aux: balance statistics per sequence
};

struct ModelSpec {
  std::string name;         // preset name or file stem, e.g. "llama-2-7b"
  std::string source_path;  // file it was read from ("" for one built in code)
  std::string model_type;   // the Hugging Face model_type: gpt2, llama, mistral, qwen2
  ModelFamily family = ModelFamily::ModelFamily_gpt2;

  int64_t num_layers = 0;        // decoder blocks
  int64_t hidden_size = 0;       // C
  int64_t num_heads = 0;         // query heads Hq
  int64_t num_kv_heads = 0;      // key/value heads Hkv (== Hq for multi-head attention)
  int64_t head_dim = 0;          // D; usually C / Hq
  int64_t ffn_hidden_size = 0;   // F: MLP inner width (GELU: up/down; SwiGLU: gate/up/down); MoE: of the dense blocks
  int64_t vocab_size = 0;        // V
  int64_t max_seq_len = 0;       // longest sequence (positions) the model supports

  bool tied_embeddings = true;   // LM head shares the token embedding matrix
  bool qkv_bias = false;         // bias on the q, k, v projections (gpt2, qwen2)
  bool linear_bias = false;      // bias on attention output and MLP projections (gpt2)
  bool norm_bias = false;        // LayerNorm has a bias (gpt2); RMSNorm does not
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;   // LLaMA family only
  RopeScaling rope_scaling;      // LLaMA family only
  int64_t sliding_window = 0;    // > 0: each query sees itself and the sliding_window - 1 keys before it
  MixtureOfExperts moe;          // LLaMA family only; moe.num_experts == 0: every block is dense
};

inline bool model_is_moe(const ModelSpec& model) { return model.moe.num_experts > 0; }
// An MoE model whose load-balancing loss pools its statistics over every MoE block.
inline bool model_balance_is_pooled(const ModelSpec& model) {
  return model_is_moe(model) && model.moe.balance == MoeBalance::MoeBalance_pooled;
}

// Throws alloy::Error when `model` is a Mixture-of-Experts model: `consumer` (e.g. "the cost
// model") knows only dense blocks and would treat the experts wrongly. One message for all.
void model_require_dense(const ModelSpec& model, const std::string& consumer);

// Parameter counts, exact, from the config alone.
struct ModelParameterCounts {
  int64_t embedding = 0;     // token (+ position) embeddings
  int64_t per_block = 0;     // one dense decoder block (MoE models: one of moe.first_dense_layers)
  int64_t per_moe_block = 0;         // one MoE block with every expert (0 for a dense model)
  int64_t per_moe_block_active = 0;  // the part of it one token passes through (top-k routed experts)
  int64_t final_norm = 0;
  int64_t lm_head = 0;       // 0 when tied
  int64_t total = 0;
  int64_t active = 0;        // parameters one token passes through: total less the experts not picked
};
ModelParameterCounts model_parameter_counts(const ModelSpec& model);

// Matrix-multiply FLOPs per token for one sequence of `seq_len` tokens: 2 per weight of every
// projection (LM head included, tied or not) plus QK^T and AV over the full sequence, the
// accounting Megatron-LM uses for model FLOPs utilisation. Training = 3 x forward. MoE blocks
// count the router, the experts_per_token routed experts and the shared experts.
struct ModelFlopsPerToken {
  double forward = 0;
  double training = 0;
};
ModelFlopsPerToken model_flops_per_token(const ModelSpec& model, int64_t seq_len);

// Reads a model from a preset name (see examples/models/) or a path to a config.json or a
// .yaml file. Throws alloy::Error naming the file and field on any problem.
ModelSpec model_load(const std::string& name_or_path);

// Parses one file; the format follows the extension (.json: Hugging Face, .yaml/.yml: Alloy).
ModelSpec model_load_file(const std::string& path);
// The same for text in memory; `path` names it in errors and gives its format.
ModelSpec model_load_text(const std::string& text, const std::string& path);
// Every field in Alloy's YAML format: model_load_text(model_to_yaml(m), "x.yaml") equals m (but
// for source_path).
std::string model_to_yaml(const ModelSpec& model);

// Checks sizes for consistency (heads divide hidden size, kv heads divide heads, positive
// counts). Throws alloy::Error naming `model.source_path` and the field.
void model_validate(const ModelSpec& model);

// Names of the shipped presets (files in examples/models/ without extension), sorted.
std::vector<std::string> model_preset_names();

const char* model_family_name(ModelFamily family);
const char* rope_scaling_type_name(RopeScalingType type);

// RoPE's inverse frequency of each of the head_dim / 2 rotated pairs: rope_theta^(-2i/D),
// stretched as model.rope_scaling says (Hugging Face's definitions).
std::vector<double> model_rope_inverse_frequencies(const ModelSpec& model);

}  // namespace alloy
