// Mixture-of-Experts model specs: Hugging Face's mixtral, qwen2_moe and deepseek configs and
// Alloy's `moe:` section, checked and counted exactly; layouts Alloy cannot count are refused.
#include "spec/moe.hpp"

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "spec/error.hpp"

namespace alloy {

namespace {

// Bounds that keep every parameter product in int64 (widths as for ffn_hidden_size).
constexpr int64_t kMaxExperts = 100000;
constexpr int64_t kMaxExpertWidth = 10000000;
constexpr double kMaxMoeParameters = 1e18;

// MoE architectures on the Hugging Face hub whose attention, routing or block layout differs
// from the three Alloy reads, so reading them as one of those would miscount them.
const std::vector<std::string> kUnreadMoeTypes = {"deepseek_v2", "deepseek_v3", "qwen3_moe", "dbrx", "olmoe",
                                                  "jamba", "phimoe", "granitemoe", "jetmoe", "arctic",
                                                  "minimax", "llama4", "switch_transformers"};
// Keys that give expert counts in the configs above: a dense model_type carrying one is likely a
// mislabelled MoE config.
const char* const kExpertCountKeys[] = {"num_local_experts", "num_experts", "n_routed_experts"};

enum class MoeField {
  MoeField_experts,
  MoeField_experts_per_token,
  MoeField_expert_width,
  MoeField_shared_experts,
  MoeField_shared_width,
  MoeField_first_dense_layers,
  MoeField_aux_loss,
};

// Each field as the model's file spells it: a Hugging Face config of its model_type, or YAML.
const char* moe_field_name(const ModelSpec& m, MoeField field) {
  using F = MoeField;
  const bool hf = m.source_path.ends_with(".json");
  const bool mixtral = m.model_type == "mixtral", deepseek = m.model_type == "deepseek";
  switch (field) {
    case F::MoeField_experts:
      return !hf ? "moe.experts" : mixtral ? "num_local_experts" : deepseek ? "n_routed_experts" : "num_experts";
    case F::MoeField_experts_per_token: return hf ? "num_experts_per_tok" : "moe.experts_per_token";
    case F::MoeField_expert_width:
      return !hf ? "moe.expert_ffn_hidden_size" : mixtral ? "intermediate_size" : "moe_intermediate_size";
    case F::MoeField_shared_experts:
      return !hf ? "moe.shared_experts" : deepseek ? "n_shared_experts" : "shared_expert_intermediate_size";
    case F::MoeField_shared_width:
      return !hf ? "moe.shared_expert_ffn_hidden_size" : deepseek ? "moe_intermediate_size"
                                                                   : "shared_expert_intermediate_size";
    case F::MoeField_first_dense_layers: return hf ? "first_k_dense_replace" : "moe.first_dense_layers";
    case F::MoeField_aux_loss:
      return !hf ? "moe.router_aux_loss_coef" : deepseek ? "aux_loss_alpha" : "router_aux_loss_coef";
  }
  return "moe";
}

void require_count(const ModelSpec& m, MoeField field, int64_t value, int64_t min, int64_t max) {
  if (value < min) {
    throw Error(fmt::format("must be {}, got {}", min == 0 ? "zero or more" : "a positive whole number", value),
                {m.source_path, moe_field_name(m, field)}, "set it to the model's published value");
  }
  if (value > max) {
    throw Error(fmt::format("value {} is implausibly large (limit {})", value, max),
                {m.source_path, moe_field_name(m, field)}, "check for a typo in the number");
  }
}

// Keys that switch on a layout where only some blocks are MoE; Alloy counts every block past
// first_dense_layers as MoE, so anything else is refused rather than miscounted.
void refuse_sparse_layouts(const FieldReader& r, const std::string& type) {
  if (type == "qwen2_moe") {
    if (r.get_int("decoder_sparse_step", 1) != 1)
      r.fail("decoder_sparse_step", "only every decoder_sparse_step-th block being MoE is not supported",
             "Alloy reads Qwen2-MoE configs whose every block is MoE: decoder_sparse_step 1, as published");
    if (!r.is_null("mlp_only_layers") && r.list_size("mlp_only_layers") > 0)
      r.fail("mlp_only_layers", "dense blocks among the MoE blocks (mlp_only_layers) are not supported",
             "Alloy reads Qwen2-MoE configs whose every block is MoE: mlp_only_layers [], as published");
  }
  if (type == "deepseek") {
    if (r.get_int("moe_layer_freq", 1) != 1)
      r.fail("moe_layer_freq", "only every moe_layer_freq-th block being MoE is not supported",
             "Alloy reads DeepSeek-MoE configs with moe_layer_freq 1, as published");
    const std::string scoring = r.get_string("scoring_func", "softmax");
    if (scoring != "softmax")
      r.fail("scoring_func", "router scoring '" + scoring + "' is not supported", "use softmax, as DeepSeek-MoE does");
  }
}

// `balance_loss` of a `moe:` section: pooled (the default) or per_block.
MoeBalance moe_balance_read(const FieldReader& r) {
  const std::string name = r.get_string("balance_loss", moe_balance_name(MoeBalance::MoeBalance_pooled));
  for (MoeBalance balance : {MoeBalance::MoeBalance_pooled, MoeBalance::MoeBalance_per_block})
    if (name == moe_balance_name(balance)) return balance;
  r.fail("balance_loss", fmt::format("'{}' is not a form of the load-balancing loss", name),
         "use pooled (one f and P over every MoE block's tokens: Mixtral, Qwen2-MoE) or per_block (each block's "
         "own, averaged over the blocks: DeepSeek-MoE)");
}

}  // namespace

bool moe_is_hf_type(const std::string& type) {
  return type == "mixtral" || type == "qwen2_moe" || type == "deepseek";
}

void moe_refuse_unread_type(const FieldReader& r, const std::string& type) {
  for (const std::string& unread : kUnreadMoeTypes) {
    if (type == unread)
      r.fail("model_type", fmt::format("'{}' is a Mixture-of-Experts architecture Alloy does not read", type),
             "Alloy reads the MoE model_types mixtral, qwen2_moe and deepseek (DeepSeek-MoE); others differ in "
             "attention, routing or block layout and would be miscounted");
  }
}

void moe_refuse_experts_in_dense(const FieldReader& r, const std::string& type) {
  if (moe_is_hf_type(type)) return;
  for (const char* key : kExpertCountKeys) {
    if (!r.is_null(key))
      r.fail(key, fmt::format("a {} config has no experts, but this one sets {}", type, key),
             "use the model_type of the MoE architecture (mixtral, qwen2_moe or deepseek), or remove the field");
  }
}

MixtureOfExperts moe_read_hf(const FieldReader& r, const std::string& type) {
  refuse_sparse_layouts(r, type);
  MixtureOfExperts moe;
  moe.experts_per_token = r.get_int("num_experts_per_tok");
  if (type == "mixtral") {
    moe.num_experts = r.get_int("num_local_experts");
    moe.expert_ffn_hidden_size = r.get_int("intermediate_size");
    moe.norm_topk_prob = true;  // Mixtral's softmax over the top-k logits is the renormalised top-k
    moe.router_aux_loss_coef = r.get_double("router_aux_loss_coef", 0.001);
    moe.balance = MoeBalance::MoeBalance_pooled;  // load_balancing_loss_func over every layer's router logits
    if (r.get_double("router_jitter_noise", 0.0) != 0)
      r.fail("router_jitter_noise", "router jitter (multiplicative noise on the router's input) is not implemented",
             "set router_jitter_noise to 0 (Mixtral's published configs do)");
  } else if (type == "qwen2_moe") {
    moe.num_experts = r.get_int("num_experts");
    moe.expert_ffn_hidden_size = r.get_int("moe_intermediate_size");
    moe.num_shared_experts = 1;
    moe.shared_expert_ffn_hidden_size = r.get_int("shared_expert_intermediate_size");
    moe.shared_expert_gate = true;
    moe.norm_topk_prob = r.get_bool("norm_topk_prob", false);
    moe.router_aux_loss_coef = r.get_double("router_aux_loss_coef", 0.001);
    moe.balance = MoeBalance::MoeBalance_pooled;  // Mixtral's load_balancing_loss_func
  } else {
    moe.num_experts = r.get_int("n_routed_experts");
    moe.expert_ffn_hidden_size = r.get_int("moe_intermediate_size");
    // Hugging Face's DeepseekMoE builds its shared experts as one MLP n_shared_experts times as wide.
    moe.num_shared_experts = r.get_int("n_shared_experts", 0);
    moe.shared_expert_ffn_hidden_size = moe.expert_ffn_hidden_size;
    moe.first_dense_layers = r.get_int("first_k_dense_replace", 0);
    moe.norm_topk_prob = r.get_bool("norm_topk_prob", false);
    // DeepSeek adds alpha x sum_e f_e P_e per MoE block with f_e scaled by experts / top-k, which
    // is alpha / top-k times Alloy's per-block term; summed over the blocks, Alloy's mean over
    // them takes alpha x blocks / top-k.
    moe.balance = MoeBalance::MoeBalance_per_block;
    const double alpha = r.get_double("aux_loss_alpha", 0.001);
    const int64_t moe_blocks = r.get_int("num_hidden_layers") - moe.first_dense_layers;
    moe.router_aux_loss_coef = moe.experts_per_token > 0 ? alpha * static_cast<double>(moe_blocks) /
                                                               static_cast<double>(moe.experts_per_token)
                                                         : alpha;
    moe.aux_per_sequence = r.get_bool("seq_aux", false);
  }
  // No experts would make the config silently dense.
  const char* experts_key = type == "mixtral"     ? "num_local_experts"
                            : type == "qwen2_moe" ? "num_experts"
                                                  : "n_routed_experts";
  if (moe.num_experts <= 0)
    r.fail(experts_key, fmt::format("must be a positive whole number, got {}", moe.num_experts),
           "set it to the model's published expert count");
  return moe;
}

MixtureOfExperts moe_read_yaml(const FieldReader& model) {
  MixtureOfExperts moe;
  if (model.is_null("moe")) return moe;
  const FieldReader r = model.child("moe");
  r.reject_unknown({"experts", "experts_per_token", "expert_ffn_hidden_size", "shared_experts",
                    "shared_expert_ffn_hidden_size", "shared_expert_gate", "first_dense_layers", "norm_topk_prob",
                    "router_aux_loss_coef", "balance_loss", "aux_per_sequence"});
  moe.num_experts = r.get_int("experts");
  moe.experts_per_token = r.get_int("experts_per_token");
  moe.expert_ffn_hidden_size = r.get_int("expert_ffn_hidden_size");
  moe.num_shared_experts = r.get_int("shared_experts", 0);
  moe.shared_expert_ffn_hidden_size = r.get_int("shared_expert_ffn_hidden_size", 0);
  moe.shared_expert_gate = r.get_bool("shared_expert_gate", false);
  moe.first_dense_layers = r.get_int("first_dense_layers", 0);
  moe.norm_topk_prob = r.get_bool("norm_topk_prob", true);
  moe.router_aux_loss_coef = r.get_double("router_aux_loss_coef", 0.001);
  moe.balance = moe_balance_read(r);
  moe.aux_per_sequence = r.get_bool("aux_per_sequence", false);
  // A section that names no experts would silently describe a dense model.
  if (moe.num_experts <= 0) r.fail("experts", "must be a positive whole number", "remove the moe section for a dense model");
  return moe;
}

std::string moe_yaml(const MixtureOfExperts& moe) {
  if (moe.num_experts == 0) return "";
  return fmt::format(
      "moe: {{experts: {}, experts_per_token: {}, expert_ffn_hidden_size: {}, shared_experts: {}, "
      "shared_expert_ffn_hidden_size: {}, shared_expert_gate: {}, first_dense_layers: {}, norm_topk_prob: {}, "
      "router_aux_loss_coef: {}, balance_loss: {}{}}}\n",
      moe.num_experts, moe.experts_per_token, moe.expert_ffn_hidden_size, moe.num_shared_experts,
      moe.shared_expert_ffn_hidden_size, moe.shared_expert_gate, moe.first_dense_layers, moe.norm_topk_prob,
      moe.router_aux_loss_coef, moe_balance_name(moe.balance), moe.aux_per_sequence ? ", aux_per_sequence: true" : "");
}

void moe_validate(const ModelSpec& m) {
  using F = MoeField;
  const MixtureOfExperts& moe = m.moe;
  if (!model_is_moe(m)) return;
  if (m.family != ModelFamily::ModelFamily_llama) {
    throw Error("Mixture-of-Experts blocks are SwiGLU experts of the llama family", {m.source_path, "moe"},
                "set family: llama, or remove the moe section");
  }
  require_count(m, F::MoeField_experts, moe.num_experts, 1, kMaxExperts);
  require_count(m, F::MoeField_experts_per_token, moe.experts_per_token, 1, kMaxExperts);
  if (moe.experts_per_token > moe.num_experts) {
    throw Error(fmt::format("{} experts per token is more than the {} experts ({})", moe.experts_per_token,
                            moe.num_experts, moe_field_name(m, F::MoeField_experts)),
                {m.source_path, moe_field_name(m, F::MoeField_experts_per_token)},
                "the router picks at most every expert: use a top-k of at most the expert count");
  }
  require_count(m, F::MoeField_expert_width, moe.expert_ffn_hidden_size, 1, kMaxExpertWidth);
  require_count(m, F::MoeField_shared_experts, moe.num_shared_experts, 0, kMaxExperts);
  if (moe.num_shared_experts > 0)
    require_count(m, F::MoeField_shared_width, moe.shared_expert_ffn_hidden_size, 1, kMaxExpertWidth);
  if (moe.shared_expert_gate && moe.num_shared_experts == 0)
    throw Error("a shared-expert gate needs shared experts to scale", {m.source_path, "moe.shared_expert_gate"},
                "set shared_experts to 1 or more, or shared_expert_gate to false");
  require_count(m, F::MoeField_first_dense_layers, moe.first_dense_layers, 0, kMaxExperts);
  if (moe.first_dense_layers >= m.num_layers) {
    throw Error(fmt::format("{} leading dense blocks leave none of the {} blocks MoE", moe.first_dense_layers,
                            m.num_layers),
                {m.source_path, moe_field_name(m, F::MoeField_first_dense_layers)},
                "use fewer leading dense blocks, or describe the model as dense (no experts)");
  }
  if (!(moe.router_aux_loss_coef >= 0) || !std::isfinite(moe.router_aux_loss_coef)) {
    throw Error("must be zero or a positive number", {m.source_path, moe_field_name(m, F::MoeField_aux_loss)},
                "typical values are 0.001 to 0.02");
  }
  const double expert_parameters =
      static_cast<double>(m.num_layers) * 3.0 * static_cast<double>(m.hidden_size) *
      (static_cast<double>(moe.num_experts) * static_cast<double>(moe.expert_ffn_hidden_size) +
       static_cast<double>(moe.num_shared_experts) * static_cast<double>(moe.shared_expert_ffn_hidden_size));
  if (expert_parameters > kMaxMoeParameters) {
    throw Error(fmt::format("{:.3g} expert parameters is implausibly many", expert_parameters),
                {m.source_path, moe_field_name(m, F::MoeField_experts)}, "check the expert count and widths for a typo");
  }
}

MoeMlpParameters moe_mlp_parameters(const ModelSpec& m) {
  const MixtureOfExperts& moe = m.moe;
  const int64_t C = m.hidden_size;
  const int64_t router = C * moe.num_experts;
  const int64_t routed_expert = 3 * C * moe.expert_ffn_hidden_size;  // SwiGLU: gate, up, down
  const int64_t shared = moe.num_shared_experts * 3 * C * moe.shared_expert_ffn_hidden_size +
                         (moe.shared_expert_gate ? C : 0);
  MoeMlpParameters out;
  out.all = router + moe.num_experts * routed_expert + shared;
  out.active = router + moe.experts_per_token * routed_expert + shared;
  return out;
}

std::string moe_summary(const MixtureOfExperts& moe) {
  return fmt::format("{} experts, {} per token", moe.num_experts, moe.experts_per_token);
}

const char* moe_balance_name(MoeBalance balance) {
  return balance == MoeBalance::MoeBalance_pooled ? "pooled" : "per_block";
}

std::string moe_balance_describe(const MixtureOfExperts& moe) {
  if (moe.balance == MoeBalance::MoeBalance_pooled)
    return fmt::format("{:g} x E sum_e f_e P_e, f and P pooled over every MoE block's tokens (balance_loss: pooled)",
                       moe.router_aux_loss_coef);
  return fmt::format("{:g} x the mean over MoE blocks of E sum_e f_e P_e, each block's own f and P "
                     "(balance_loss: per_block)",
                     moe.router_aux_loss_coef);
}

void model_require_dense(const ModelSpec& m, const std::string& consumer) {
  if (!model_is_moe(m)) return;
  const std::string name = m.name.empty() ? "<model>" : m.name;
  throw Error(fmt::format("Mixture-of-Experts models (model {}: {}) are not supported here yet: {} handles "
                          "dense MLP blocks only",
                          m.name, moe_summary(m.moe), consumer),
              {m.source_path, moe_field_name(m, MoeField::MoeField_experts)},
              fmt::format("`alloy plan --model {}` and `alloy simulate` price it without a profile, and "
                          "`alloy train` runs its plans on CPU ranks; profile and convert dense models for now",
                          name));
}

}  // namespace alloy
