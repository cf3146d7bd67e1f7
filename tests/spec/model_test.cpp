// Model specs: published parameter counts, every preset loads, and FLOPs follow 6N.
#include <gtest/gtest.h>

#include "spec/error.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace {

struct PublishedCount {
  const char* preset;
  int64_t parameters;
};

// Counts as published by the model authors / Hugging Face model cards.
const PublishedCount kPublished[] = {
    {"gpt2", 124439808},          {"llama-2-7b", 6738415616},  {"llama-3-8b", 8030261248},
    {"mistral-7b", 7241732096},   {"llama-2-70b", 68976648192}, {"gpt2-medium", 354823168},
    {"gpt2-large", 774030080},    {"gpt2-xl", 1557611200},      {"llama-2-13b", 13015864320},
    {"llama-3-70b", 70553706496}, {"qwen2.5-7b", 7615616512},
};

TEST(ModelSpec, ParameterCountsMatchPublished) {
  for (const auto& p : kPublished) {
    ModelSpec m = model_load(p.preset);
    EXPECT_EQ(model_parameter_counts(m).total, p.parameters) << p.preset;
  }
}

TEST(ModelSpec, EveryPresetLoadsAndValidates) {
  std::vector<std::string> names = model_preset_names();
  ASSERT_GE(names.size(), 13u);
  for (const auto& name : names) {
    ModelSpec m = model_load(name);
    EXPECT_EQ(m.name, name);
    EXPECT_GT(model_parameter_counts(m).total, 0) << name;
  }
}

TEST(ModelSpec, FamiliesAndFlagsFromHuggingFace) {
  ModelSpec gpt2 = model_load("gpt2");
  EXPECT_EQ(gpt2.family, ModelFamily::ModelFamily_gpt2);
  EXPECT_EQ(gpt2.ffn_hidden_size, 4 * 768);  // n_inner null means 4 x n_embd
  EXPECT_TRUE(gpt2.tied_embeddings && gpt2.linear_bias && gpt2.norm_bias);
  ModelSpec qwen = model_load("qwen2.5-7b");
  EXPECT_EQ(qwen.family, ModelFamily::ModelFamily_llama);
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.linear_bias);
  ModelSpec llama3 = model_load("llama-3-8b");
  EXPECT_EQ(llama3.num_kv_heads, 8);
  EXPECT_EQ(llama3.head_dim, 128);
  EXPECT_DOUBLE_EQ(llama3.rope_theta, 500000.0);
}

TEST(ModelSpec, TrainingFlopsAreAboutSixTimesParameters) {
  // At a short sequence the attention term is small, so training FLOPs per token approach
  // 6 x (parameters that take part in matrix products).
  ModelSpec m = model_load("llama-2-7b");
  ModelFlopsPerToken f = model_flops_per_token(m, 128);
  const ModelParameterCounts c = model_parameter_counts(m);
  const double matmul_parameters = static_cast<double>(c.total - c.embedding);
  EXPECT_NEAR(f.training / (6.0 * matmul_parameters), 1.0, 0.02);
  EXPECT_DOUBLE_EQ(f.training, 3.0 * f.forward);
  // Attention grows with the sequence.
  EXPECT_GT(model_flops_per_token(m, 4096).forward, f.forward);
}

TEST(ModelSpec, TinyModelsAreSmall) {
  ModelSpec gpt = model_load("tiny-gpt");
  ModelSpec llama = model_load("tiny-llama");
  EXPECT_LT(model_parameter_counts(gpt).total, 200000);
  EXPECT_LT(model_parameter_counts(llama).total, 200000);
  EXPECT_EQ(llama.num_kv_heads, 2);
  EXPECT_FALSE(llama.tied_embeddings);
}

TEST(ModelSpec, UnknownPresetSuggestsNearest) {
  try {
    model_load("llama-2-7");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.format().find("llama-2-7b"), std::string::npos) << e.format();
  }
}

}  // namespace
}  // namespace alloy
