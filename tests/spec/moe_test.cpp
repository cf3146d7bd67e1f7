// Mixture-of-Experts model specs: exact total and active counts against the published figures,
// the three Hugging Face config types and Alloy's moe section, and precise errors for bad input.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "plan/plan.hpp"
#include "spec/error.hpp"
#include "spec/model.hpp"
#include "spec/moe.hpp"

namespace alloy {
namespace {

using testing::TempDir;

// Mixtral-8x7B's shape with small sizes, so edits of one field show in its error.
const char* kSmallMixtral = R"({
  "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
  "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 128,
  "vocab_size": 1000, "num_local_experts": 8, "num_experts_per_tok": 2
})";

const char* kSmallQwenMoe = R"({
  "model_type": "qwen2_moe", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
  "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 128,
  "vocab_size": 1000, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
  "shared_expert_intermediate_size": 256, "decoder_sparse_step": 1, "mlp_only_layers": []
})";

const char* kSmallDeepseekMoe = R"({
  "model_type": "deepseek", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
  "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 128,
  "vocab_size": 1000, "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 64,
  "n_shared_experts": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1, "scoring_func": "softmax"
})";

const char* kTinyMoeYaml = R"(family: llama
layers: 2
hidden_size: 64
heads: 4
vocab_size: 256
max_seq_len: 64
moe:
  experts: 4
  experts_per_token: 2
  expert_ffn_hidden_size: 96
)";

std::string moe_edited(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The error loading `text` as file `name` gives; fails the test when it loads.
Error moe_load_error(const std::string& name, const std::string& text) {
  TempDir dir;
  const std::string path = dir.write(name, text);
  try {
    model_load_file(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.where().file, path) << e.format();
    EXPECT_FALSE(e.hint().empty()) << e.format();
    return e;
  }
  ADD_FAILURE() << "expected alloy::Error for " << text;
  return Error("none");
}

void expect_moe_error(const std::string& name, const std::string& text, const std::string& field,
                      const std::string& words) {
  const Error e = moe_load_error(name, text);
  EXPECT_EQ(e.where().field, field) << e.format();
  EXPECT_NE(e.message().find(words), std::string::npos) << e.format();
}

struct MoeCount {
  const char* preset;
  int64_t total;
  int64_t active;
};

// Exact counts from each official config.json (copied into examples/models/), checked against
// the figures the authors publish:
// - mixtral-8x7b: "46.7B total parameters but only uses 12.9B parameters per token" (Mistral AI).
//   Per block: attention 41,943,040 + norms 8,192 + router 8 x 4096 + 8 experts x 3 x 4096 x 14336;
//   embeddings and the untied head 2 x 32000 x 4096; active keeps 2 of the 8 experts.
// - qwen1.5-moe-a2.7b: "14.3B parameters in total and 2.7B activated" (Qwen model card). Per block:
//   attention with q/k/v biases 16,783,360 + norms 4,096 + router 60 x 2048 + 60 experts x 3 x 2048 x
//   1408 + one shared expert 3 x 2048 x 5632 + its gate 2048; untied embeddings of 151936 x 2048.
// - deepseek-moe-16b: "16.4B" total, "2.8B" activated (DeepSeekMoE paper and model card). Block 0 is
//   dense (3 x 2048 x 10944); blocks 1-27 have 64 routed experts and 2 shared ones of 3 x 2048 x 1408,
//   6 routed per token; untied embeddings of 102400 x 2048.
const MoeCount kMoeCounts[] = {
    {"mixtral-8x7b", 46702792704, 12879925248},
    {"qwen1.5-moe-a2.7b", 14315784192, 2689173504},
    {"deepseek-moe-16b", 16375728128, 2828650496},
};

TEST(MoeSpec, CountsMatchPublishedTotalsAndActive) {
  const double published_total_billions[] = {46.7, 14.3, 16.4};
  const double published_active_billions[] = {12.9, 2.7, 2.8};
  for (size_t i = 0; i < std::size(kMoeCounts); ++i) {
    const MoeCount& p = kMoeCounts[i];
    const ModelParameterCounts c = model_parameter_counts(model_load(p.preset));
    EXPECT_EQ(c.total, p.total) << p.preset;
    EXPECT_EQ(c.active, p.active) << p.preset;
    EXPECT_NEAR(static_cast<double>(c.total) / 1e9, published_total_billions[i], 0.05) << p.preset;
    EXPECT_NEAR(static_cast<double>(c.active) / 1e9, published_active_billions[i], 0.05) << p.preset;
  }
}

TEST(MoeSpec, MixtralBlockByHand) {
  const ModelSpec m = model_load("mixtral-8x7b");
  EXPECT_EQ(m.moe.num_experts, 8);
  EXPECT_EQ(m.moe.experts_per_token, 2);
  EXPECT_EQ(m.moe.expert_ffn_hidden_size, 14336);
  EXPECT_TRUE(m.moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(m.moe.router_aux_loss_coef, 0.02);
  const ModelParameterCounts c = model_parameter_counts(m);
  const int64_t attention = 4096 * 4096 * 2 + 2 * 1024 * 4096, expert = 3 * int64_t{4096} * 14336;
  EXPECT_EQ(c.per_moe_block, attention + 2 * 4096 + 8 * 4096 + 8 * expert);
  EXPECT_EQ(c.per_moe_block_active, attention + 2 * 4096 + 8 * 4096 + 2 * expert);
  EXPECT_EQ(c.total - c.active, 32 * 6 * expert);
}

TEST(MoeSpec, TinyMoeByHand) {
  // 3 blocks of width 64 (4 heads, 2 key/value heads of 16), block 0 dense (SwiGLU 176), blocks 1-2
  // with 4 experts of 96 (2 per token) and one shared expert of 64; vocab 256, untied.
  const ModelSpec m = model_load("tiny-moe");
  const ModelParameterCounts c = model_parameter_counts(m);
  const int64_t attention = 64 * 64 + 2 * 32 * 64 + 64 * 64, norms = 2 * 64;
  EXPECT_EQ(c.per_block, attention + norms + 3 * 64 * 176);
  const int64_t router = 64 * 4, routed = 3 * 64 * 96, shared = 3 * 64 * 64;
  EXPECT_EQ(c.per_moe_block, attention + norms + router + 4 * routed + shared);
  EXPECT_EQ(c.per_moe_block_active, attention + norms + router + 2 * routed + shared);
  EXPECT_EQ(c.total, 2 * 256 * 64 + 64 + c.per_block + 2 * c.per_moe_block);
  EXPECT_EQ(c.total, 276416);
  EXPECT_EQ(c.active, 202688);
}

TEST(MoeSpec, DenseModelsAreAllActive) {
  for (const char* preset : {"gpt2", "llama-2-7b", "qwen2.5-7b", "tiny-llama"}) {
    const ModelSpec m = model_load(preset);
    EXPECT_FALSE(model_is_moe(m)) << preset;
    const ModelParameterCounts c = model_parameter_counts(m);
    EXPECT_EQ(c.active, c.total) << preset;
    EXPECT_EQ(c.per_moe_block, 0) << preset;
  }
}

TEST(MoeSpec, HuggingFaceFieldsPerType) {
  TempDir dir;
  const ModelSpec qwen = model_load_file(dir.write("qwen.json", kSmallQwenMoe));
  EXPECT_EQ(qwen.moe.num_experts, 6);
  EXPECT_EQ(qwen.moe.num_shared_experts, 1);
  EXPECT_EQ(qwen.moe.shared_expert_ffn_hidden_size, 256);
  EXPECT_TRUE(qwen.moe.shared_expert_gate);
  EXPECT_FALSE(qwen.moe.norm_topk_prob);
  EXPECT_TRUE(qwen.qkv_bias);
  const ModelSpec deepseek = model_load_file(dir.write("deepseek.json", kSmallDeepseekMoe));
  EXPECT_EQ(deepseek.moe.num_shared_experts, 2);
  EXPECT_EQ(deepseek.moe.shared_expert_ffn_hidden_size, 64);
  EXPECT_EQ(deepseek.moe.first_dense_layers, 1);
  EXPECT_FALSE(deepseek.moe.shared_expert_gate);
  EXPECT_FALSE(deepseek.qkv_bias);
  EXPECT_EQ(deepseek.ffn_hidden_size, 512);  // the dense first block's width
  const ModelSpec yaml = model_load_file(dir.write("tiny.yaml", kTinyMoeYaml));
  EXPECT_EQ(yaml.moe.experts_per_token, 2);
  EXPECT_TRUE(yaml.moe.norm_topk_prob);
  EXPECT_EQ(yaml.moe.num_shared_experts, 0);
}

// Each family's load-balancing loss: Hugging Face's Mixtral and Qwen2-MoE pool every layer's router
// statistics, DeepSeek-MoE sums each block's; Alloy YAML says which, pooled unless told.
TEST(MoeSpec, BalanceLossFormPerFamily) {
  TempDir dir;
  EXPECT_EQ(model_load("mixtral-8x7b").moe.balance, MoeBalance::MoeBalance_pooled);
  EXPECT_EQ(model_load_file(dir.write("qwen.json", kSmallQwenMoe)).moe.balance, MoeBalance::MoeBalance_pooled);
  EXPECT_EQ(model_load_file(dir.write("deepseek.json", kSmallDeepseekMoe)).moe.balance,
            MoeBalance::MoeBalance_per_block);
  EXPECT_EQ(model_load_file(dir.write("tiny.yaml", kTinyMoeYaml)).moe.balance, MoeBalance::MoeBalance_pooled);
  const ModelSpec per_block =
      model_load_file(dir.write("per-block.yaml", kTinyMoeYaml + std::string("  balance_loss: per_block\n")));
  EXPECT_EQ(per_block.moe.balance, MoeBalance::MoeBalance_per_block);
  // moe_yaml writes the form, so a model written back reads the same (and fingerprints apart).
  EXPECT_NE(moe_yaml(per_block.moe).find("balance_loss: per_block"), std::string::npos) << moe_yaml(per_block.moe);
  ModelSpec pooled = per_block;
  pooled.moe.balance = MoeBalance::MoeBalance_pooled;
  EXPECT_NE(model_fingerprint(pooled), model_fingerprint(per_block));
  // `alloy check` states the form.
  EXPECT_NE(moe_balance_describe(model_load("deepseek-moe-16b").moe).find("each block's own f and P"), std::string::npos);
  EXPECT_NE(moe_balance_describe(model_load("mixtral-8x7b").moe).find("pooled over every MoE block"), std::string::npos);
}

TEST(MoeSpec, FlopsCountActiveExpertsOnly) {
  // At a short sequence forward FLOPs approach 2 x the active parameters outside the embedding.
  const ModelSpec m = model_load("mixtral-8x7b");
  const ModelParameterCounts c = model_parameter_counts(m);
  const ModelFlopsPerToken f = model_flops_per_token(m, 128);
  EXPECT_NEAR(f.forward / (2.0 * static_cast<double>(c.active - c.embedding)), 1.0, 0.01);
}

TEST(MoeSpec, ExpertsChangeTheFingerprint) {
  ModelSpec m = model_load("tiny-moe");
  const std::string with_experts = model_fingerprint(m);
  m.moe.experts_per_token = 1;
  EXPECT_NE(model_fingerprint(m), with_experts);
  m.moe = MixtureOfExperts{};
  EXPECT_NE(model_fingerprint(m), with_experts);
}

TEST(MoeSpec, RequireDenseNamesTheModelAndItsExperts) {
  EXPECT_NO_THROW(model_require_dense(model_load("tiny-llama"), "the cost model"));
  try {
    model_require_dense(model_load("mixtral-8x7b"), "the cost model");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("Mixture-of-Experts models (model mixtral-8x7b: 8 experts, 2 per token) are not "
                               "supported here yet: the cost model"),
              std::string::npos)
        << e.format();
    EXPECT_EQ(e.where().field, "num_local_experts");
    EXPECT_NE(e.hint().find("alloy plan --model mixtral-8x7b"), std::string::npos) << e.format();
  }
}

TEST(MoeSpecErrors, TopKAndExpertCounts) {
  expect_moe_error("m.json", moe_edited(kSmallMixtral, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9"),
                   "num_experts_per_tok", "9 experts per token is more than the 8 experts (num_local_experts)");
  expect_moe_error("m.json", moe_edited(kSmallMixtral, "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 0"),
                   "num_experts_per_tok", "positive");
  expect_moe_error("m.json", moe_edited(kSmallMixtral, "\"num_local_experts\": 8", "\"num_local_experts\": 0"),
                   "num_local_experts", "positive");
  expect_moe_error("m.json", moe_edited(kSmallMixtral, "\"num_local_experts\": 8", "\"num_local_experts\": 1e9"),
                   "num_local_experts", "implausibly large");
  expect_moe_error("m.yaml", moe_edited(kTinyMoeYaml, "experts_per_token: 2", "experts_per_token: 5"),
                   "moe.experts_per_token", "more than the 4 experts (moe.experts)");
  expect_moe_error("m.yaml", moe_edited(kTinyMoeYaml, "  experts: 4", "  experts: 0"), "moe.experts", "positive");
}

TEST(MoeSpecErrors, ExpertWidths) {
  expect_moe_error("m.json",
                   moe_edited(kSmallQwenMoe, "\"moe_intermediate_size\": 64", "\"moe_intermediate_size\": -64"),
                   "moe_intermediate_size", "positive");
  expect_moe_error("m.json",
                   moe_edited(kSmallQwenMoe, "\"shared_expert_intermediate_size\": 256",
                              "\"shared_expert_intermediate_size\": 0"),
                   "shared_expert_intermediate_size", "positive");
  expect_moe_error("m.json", moe_edited(kSmallMixtral, "\"intermediate_size\": 512", "\"intermediate_size\": 0"),
                   "intermediate_size", "positive");
  expect_moe_error("m.yaml", moe_edited(kTinyMoeYaml, "expert_ffn_hidden_size: 96", "expert_ffn_hidden_size: 0"),
                   "moe.expert_ffn_hidden_size", "positive");
  expect_moe_error("m.yaml", moe_edited(kTinyMoeYaml, "expert_ffn_hidden_size: 96", "expert_ffn_hidden_size: 96\n  shared_experts: 1"),
                   "moe.shared_expert_ffn_hidden_size", "positive");
}

TEST(MoeSpecErrors, LayoutsAlloyDoesNotCount) {
  expect_moe_error("m.json", moe_edited(kSmallQwenMoe, "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2"),
                   "decoder_sparse_step", "decoder_sparse_step");
  expect_moe_error("m.json", moe_edited(kSmallQwenMoe, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [0]"),
                   "mlp_only_layers", "mlp_only_layers");
  expect_moe_error("m.json", moe_edited(kSmallDeepseekMoe, "\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2"),
                   "moe_layer_freq", "moe_layer_freq");
  expect_moe_error("m.json", moe_edited(kSmallDeepseekMoe, "\"softmax\"", "\"sigmoid\""), "scoring_func", "sigmoid");
  expect_moe_error("m.json",
                   moe_edited(kSmallDeepseekMoe, "\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 3"),
                   "first_k_dense_replace", "leave none of the 3 blocks MoE");
}

TEST(MoeSpecErrors, ModelTypes) {
  expect_moe_error("m.json", moe_edited(kSmallMixtral, "\"mixtral\"", "\"qwen3_moe\""), "model_type",
                   "'qwen3_moe' is a Mixture-of-Experts architecture Alloy does not read");
  expect_moe_error("m.json", moe_edited(kSmallMixtral, "\"mixtral\"", "\"deepseek_v2\""), "model_type",
                   "Mixture-of-Experts architecture");
  const Error typo = moe_load_error("m.json", moe_edited(kSmallMixtral, "\"mixtral\"", "\"mixtrl\""));
  EXPECT_EQ(typo.where().field, "model_type");
  EXPECT_NE(typo.hint().find("did you mean mixtral"), std::string::npos) << typo.format();
  // A Mixtral config labelled mistral would silently lose its experts.
  expect_moe_error("m.json", moe_edited(kSmallMixtral, "\"mixtral\"", "\"mistral\""), "num_local_experts",
                   "a mistral config has no experts");
}

TEST(MoeSpecErrors, AlloyYamlSection) {
  expect_moe_error("m.yaml", moe_edited(kTinyMoeYaml, "  experts: 4", "  expertz: 4"), "moe.expertz", "unknown field");
  expect_moe_error("m.yaml", moe_edited(kTinyMoeYaml, "family: llama", "family: gpt2"), "moe", "SwiGLU");
  expect_moe_error("m.yaml", kTinyMoeYaml + std::string("  first_dense_layers: 2\n"), "moe.first_dense_layers",
                   "leave none of the 2 blocks MoE");
  expect_moe_error("m.yaml", kTinyMoeYaml + std::string("  router_aux_loss_coef: -1\n"), "moe.router_aux_loss_coef",
                   "zero or a positive number");
  expect_moe_error("m.yaml", kTinyMoeYaml + std::string("  balance_loss: mean\n"), "moe.balance_loss",
                   "'mean' is not a form of the load-balancing loss");
  // A gate with nothing to scale would be counted but never built.
  expect_moe_error("m.yaml", kTinyMoeYaml + std::string("  shared_expert_gate: true\n"), "moe.shared_expert_gate",
                   "needs shared experts");
}

TEST(MoeSpecErrors, RouterNoiseIsRefused) {
  const std::string mixtral = R"({
  "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
  "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 128,
  "vocab_size": 1000, "num_local_experts": 4, "num_experts_per_tok": 2, "router_jitter_noise": 0.1
})";
  expect_moe_error("mixtral.json", mixtral, "router_jitter_noise", "not implemented");
}

// DeepSeek weighs every MoE block's term by aux_loss_alpha with expert fractions scaled by
// experts / top-k: in Alloy's mean over blocks that is alpha x MoE blocks / top-k.
TEST(MoeSpec, DeepseekAuxLossAlphaBecomesTheWeightOfTheMeanOverBlocks) {
  TempDir dir;
  const std::string config = moe_edited(kSmallDeepseekMoe, "\"scoring_func\": \"softmax\"",
                                        "\"scoring_func\": \"softmax\", \"aux_loss_alpha\": 0.003, \"seq_aux\": true");
  const ModelSpec m = model_load_file(dir.write("deepseek.json", config));
  EXPECT_DOUBLE_EQ(m.moe.router_aux_loss_coef, 0.003 * 2 / 3);  // 3 layers, 1 dense, top-3
  EXPECT_TRUE(m.moe.aux_per_sequence);
  EXPECT_NEAR(model_load("deepseek-moe-16b").moe.router_aux_loss_coef, 0.001 * 27 / 6, 1e-15);
}

}  // namespace
}  // namespace alloy
