// RoPE scaling and sliding windows in model configs: Llama 3.1's and linear scaling read from
// config.json and Alloy YAML and turned into RoPE frequencies as Hugging Face defines them,
// Mistral's window read, and what Alloy does not implement refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "../common/test_util.hpp"
#include "plan/plan.hpp"
#include "spec/error.hpp"
#include "spec/model.hpp"

namespace alloy {
namespace {

// LLaMA-3-8B's config with `extra` fields added (Llama 3.1 is this with rope_scaling).
std::string llama_config(const std::string& extra) {
  return R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072, "vocab_size": 128256,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0)" +
         extra + "}";
}

constexpr const char* kLlama31Scaling = R"(, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"})";

TEST(RopeSpec, Llama31ScalingKeepsHighFrequenciesAndStretchesLowOnes) {
  testing::TempDir dir;
  const ModelSpec m = model_load(dir.write("llama-3.1-8b.json", llama_config(kLlama31Scaling)));
  ASSERT_EQ(m.rope_scaling.type, RopeScalingType::RopeScalingType_llama3);
  EXPECT_EQ(m.rope_scaling.original_max_positions, 8192);
  const std::vector<double> scaled = model_rope_inverse_frequencies(m);
  ASSERT_EQ(scaled.size(), 64u);
  int kept = 0, stretched = 0, blended = 0;
  for (size_t i = 0; i < scaled.size(); ++i) {
    const double plain = std::pow(500000.0, -2.0 * static_cast<double>(i) / 128.0);
    const double wavelength = 2 * std::numbers::pi / plain;
    if (wavelength < 8192.0 / 4) {
      EXPECT_DOUBLE_EQ(scaled[i], plain) << i;
      ++kept;
    } else if (wavelength > 8192.0 / 1) {
      EXPECT_DOUBLE_EQ(scaled[i], plain / 8) << i;
      ++stretched;
    } else {
      EXPECT_GT(scaled[i], plain / 8) << i;
      EXPECT_LT(scaled[i], plain) << i;
      ++blended;
    }
    if (i > 0) {
      EXPECT_LT(scaled[i], scaled[i - 1]) << "frequencies fall along the head";
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(blended, 0);
  // It is another model than LLaMA-3-8B's shape without scaling, and reads back from Alloy YAML.
  const ModelSpec plain = model_load(dir.write("plain.json", llama_config("")));
  EXPECT_NE(model_fingerprint(m), model_fingerprint(plain));
  const ModelSpec back = model_load_text(model_to_yaml(m), "kept.yaml");
  EXPECT_EQ(model_fingerprint(back), model_fingerprint(m));
  EXPECT_EQ(model_rope_inverse_frequencies(back), scaled);
}

TEST(RopeSpec, LinearScalingDividesEveryFrequency) {
  testing::TempDir dir;
  const ModelSpec m = model_load(dir.write(
      "linear.yaml", "family: llama\nlayers: 2\nhidden_size: 64\nheads: 4\nvocab_size: 256\nmax_seq_len: 128\n"
                     "rope_scaling: {type: linear, factor: 4}\n"));
  ModelSpec unscaled = m;
  unscaled.rope_scaling = {};
  const std::vector<double> a = model_rope_inverse_frequencies(m), b = model_rope_inverse_frequencies(unscaled);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(a[i], b[i] / 4) << i;
}

TEST(RopeSpec, SlidingWindowsAreReadOrRefused) {
  testing::TempDir dir;
  const std::string mistral = R"({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    "vocab_size": 32000, "rope_theta": 10000.0, "sliding_window": )";
  EXPECT_EQ(model_load(dir.write("mistral.json", mistral + "4096}")).sliding_window, 4096);
  EXPECT_EQ(model_load(dir.write("mistral-full.json", mistral + "null}")).sliding_window, 0);
  EXPECT_EQ(model_load("mistral-7b").sliding_window, 4096) << "the shipped preset";
  // In Alloy YAML a window is a window, whatever the model_type.
  EXPECT_EQ(model_load(dir.write("qwen-like.yaml", "family: llama\nmodel_type: qwen2\nlayers: 2\nhidden_size: 64\n"
                                                   "heads: 4\nvocab_size: 256\nmax_seq_len: 64\nsliding_window: 16\n"))
                .sliding_window,
            16);
  try {
    model_load(dir.write("qwen.json", R"({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
      "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
      "vocab_size": 151936, "use_sliding_window": true, "sliding_window": 32768})"));
    FAIL() << "qwen2 windows";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "use_sliding_window");
  }
}

TEST(RopeSpec, ScalingAlloyDoesNotImplementIsRefusedByName) {
  testing::TempDir dir;
  const struct {
    const char* scaling;
    const char* field;
  } cases[] = {
      {R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})",
       "rope_scaling.rope_type"},
      {R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0})", "rope_scaling.type"},
      {R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})", "rope_scaling.low_freq_factor"},
      {R"(, "rope_scaling": {"rope_type": "linear", "factor": -1})", "rope_scaling.factor"},
  };
  for (const auto& c : cases) {
    try {
      model_load(dir.write("scaled.json", llama_config(c.scaling)));
      FAIL() << c.scaling;
    } catch (const Error& e) {
      EXPECT_EQ(e.where().field, c.field) << c.scaling;
      EXPECT_FALSE(e.hint().empty());
    }
  }
  EXPECT_EQ(model_load(dir.write("default.json", llama_config(R"(, "rope_scaling": {"rope_type": "default"})")))
                .rope_scaling.type,
            RopeScalingType::RopeScalingType_none);
  EXPECT_THROW(model_load(dir.write("gpt.yaml", "family: gpt2\nlayers: 2\nhidden_size: 64\nheads: 4\nvocab_size: "
                                                "256\nmax_seq_len: 64\nrope_scaling: {type: linear, factor: 2}\n")),
               Error);
}

}  // namespace
}  // namespace alloy
