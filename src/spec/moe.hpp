// Mixture-of-Experts in model specs (the types are ModelSpec's, in spec/model.hpp): reading them
// from Hugging Face configs and Alloy YAML, checking them, writing them back and counting them.
#pragma once

#include <cstdint>
#include <string>

#include "spec/field_reader.hpp"
#include "spec/model.hpp"

namespace alloy {

// Hugging Face model_types Alloy reads as MoE models: mixtral, qwen2_moe, deepseek (DeepSeek-MoE).
bool moe_is_hf_type(const std::string& model_type);

// Refuses MoE architectures Alloy does not read (deepseek_v2, qwen3_moe, dbrx, ...) by name.
void moe_refuse_unread_type(const FieldReader& config, const std::string& model_type);

// Refuses a config of a dense model_type that carries expert counts: a mislabelled MoE config,
// which would otherwise load as a dense model without its experts.
void moe_refuse_experts_in_dense(const FieldReader& config, const std::string& model_type);

// The MoE fields of a Hugging Face config of an MoE `model_type`; layouts Alloy cannot count
// exactly (Qwen2-MoE's decoder_sparse_step or mlp_only_layers, DeepSeek's moe_layer_freq,
// routers other than softmax) are refused naming the field.
MixtureOfExperts moe_read_hf(const FieldReader& config, const std::string& model_type);

// The `moe:` section of an Alloy YAML model; none (num_experts 0) when absent.
MixtureOfExperts moe_read_yaml(const FieldReader& model);

// "moe: {experts: 8, ...}\n" for Alloy YAML, or "" for a dense model.
std::string moe_yaml(const MixtureOfExperts& moe);

// Checks the MoE fields of `model` (top-k within the experts, positive widths, at least one MoE
// block); errors name model.source_path and the field as that file spells it.
void moe_validate(const ModelSpec& model);

// Parameters of the MLP part of one MoE block: router, every routed expert, shared experts and
// Qwen2-MoE's shared-expert gate; `active` keeps only the experts_per_token routed experts.
struct MoeMlpParameters {
  int64_t all = 0;
  int64_t active = 0;
};
MoeMlpParameters moe_mlp_parameters(const ModelSpec& model);

// "pooled" or "per_block", as the `moe:` section's balance_loss spells it.
const char* moe_balance_name(MoeBalance balance);

// The load-balancing loss's weight and form in words, for `alloy check`.
std::string moe_balance_describe(const MixtureOfExperts& moe);

// "8 experts, 2 per token": the short description errors and `alloy check` use.
std::string moe_summary(const MixtureOfExperts& moe);

}  // namespace alloy
