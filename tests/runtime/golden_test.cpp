// Alloy against PyTorch (float64) on the fixtures of scripts/golden.py and, for Mixture-of-Experts
// models, scripts/golden_moe.py: logits and every parameter gradient within 1e-4 of the tensor's
// largest magnitude, and the cross-entropy (and an MoE model's load-balancing loss, in its
// family's form) of the first forward and of 10 AdamW steps within 1e-5. Prints the largest
// relative difference per tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/model.hpp"
#include "runtime/threads.hpp"
#include "spec/moe.hpp"
#include "../common/one_rank.hpp"

namespace alloy {
namespace {

struct Fixture {
  nlohmann::json metadata;
  std::map<std::string, std::vector<float>> floats;
  std::map<std::string, std::vector<int32_t>> ints;
  std::map<std::string, std::vector<int64_t>> shapes;
};

// A minimal safetensors reader: 8-byte little-endian header length, JSON header, raw data.
Fixture fixture_load(const std::string& name) {
  const std::string path = std::string(ALLOY_TEST_DIR) + "/golden/" + name + ".safetensors";
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "missing fixture " << path << " (run scripts/golden.py)";
  uint64_t header_bytes = 0;
  file.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header_text(header_bytes, ' ');
  file.read(header_text.data(), static_cast<std::streamsize>(header_bytes));
  std::vector<char> data((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  Fixture fixture;
  const nlohmann::json header = nlohmann::json::parse(header_text);
  for (auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      for (auto& [meta_key, value] : entry.items()) {
        const std::string text = value.get<std::string>();
        fixture.metadata[meta_key] = nlohmann::json::accept(text) ? nlohmann::json::parse(text)
                                                                  : nlohmann::json(text);
      }
      continue;
    }
    const size_t begin = entry["data_offsets"][0].get<size_t>();
    const size_t end = entry["data_offsets"][1].get<size_t>();
    fixture.shapes[key] = entry["shape"].get<std::vector<int64_t>>();
    if (entry["dtype"] == "F32") {
      std::vector<float>& values = fixture.floats[key];
      values.resize((end - begin) / 4);
      std::memcpy(values.data(), data.data() + begin, end - begin);
    } else {
      std::vector<int32_t>& values = fixture.ints[key];
      values.resize((end - begin) / 4);
      std::memcpy(values.data(), data.data() + begin, end - begin);
    }
  }
  return fixture;
}

ModelSpec spec_from_fixture(const nlohmann::json& cfg, const std::string& name) {
  ModelSpec spec;
  spec.name = name;
  spec.family = cfg["family"] == "gpt2" ? ModelFamily::ModelFamily_gpt2
                                        : ModelFamily::ModelFamily_llama;
  spec.num_layers = cfg["layers"];
  spec.hidden_size = cfg["hidden"];
  spec.num_heads = cfg["heads"];
  spec.num_kv_heads = cfg["kv_heads"];
  spec.head_dim = cfg["head_dim"];
  spec.ffn_hidden_size = cfg["ffn"];
  spec.vocab_size = cfg["vocab"];
  spec.max_seq_len = cfg["max_seq_len"];
  spec.tied_embeddings = cfg["tied"];
  spec.qkv_bias = cfg["qkv_bias"];
  spec.linear_bias = cfg["linear_bias"];
  spec.norm_bias = cfg["norm_bias"];
  spec.norm_eps = cfg["eps"];
  spec.rope_theta = cfg["rope_theta"];
  if (cfg.contains("moe")) {
    const nlohmann::json& moe = cfg["moe"];
    spec.moe.num_experts = moe["experts"];
    spec.moe.experts_per_token = moe["experts_per_token"];
    spec.moe.expert_ffn_hidden_size = moe["expert_ffn"];
    spec.moe.num_shared_experts = moe["shared_experts"];
    spec.moe.shared_expert_ffn_hidden_size = moe["shared_ffn"];
    spec.moe.shared_expert_gate = moe["shared_gate"];
    spec.moe.first_dense_layers = moe["first_dense_layers"];
    spec.moe.norm_topk_prob = moe["norm_topk_prob"];
    spec.moe.router_aux_loss_coef = moe["aux_coef"];
    spec.moe.balance = moe["balance"] == "pooled" ? MoeBalance::MoeBalance_pooled : MoeBalance::MoeBalance_per_block;
  }
  return spec;
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The weights of golden.py's golden_weights() (golden_moe.py's, with its router scale, for MoE
// models), element for element.
void golden_weights_set(Model& model, double router_scale) {
  for (size_t k = 0; k < model.views.size(); k++) {
    const TensorView& view = model.views[k];
    float* data = model.params + view.offset;
    for (int64_t i = 0; i < view.numel; i++) {
      const uint64_t key = (static_cast<uint64_t>(k) << 32) | static_cast<uint64_t>(i);
      const double u = static_cast<double>(splitmix64(key) >> 40) / static_cast<double>(1 << 24);
      const double x = 2.0 * u - 1.0;
      double value = 0.05 * x;
      if (ends_with(view.name, "router.weight")) {
        value = router_scale * x;
      } else if (view.shape.size() == 2) {
        double scale = 0.08;
        if (ends_with(view.name, "attn.out.weight") || ends_with(view.name, "mlp.down.weight")) {
          scale /= std::sqrt(2.0 * static_cast<double>(model.spec.num_layers));
        }
        value = scale * x;
      } else if (ends_with(view.name, "norm.weight")) {
        value = 1.0 + 0.2 * x;
      }
      data[i] = static_cast<float>(value);
    }
  }
}

// Largest |alloy - reference| over the reference's largest magnitude.
double relative_difference(const float* alloy, const std::vector<float>& reference) {
  double max_ref = 1e-30;
  double max_diff = 0.0;
  for (size_t i = 0; i < reference.size(); i++) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(reference[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(alloy[i]) - reference[i]));
  }
  return max_diff / max_ref;
}

void check_golden(const std::string& name, Recompute level) {
  runtime_set_threads(2);
  Fixture fixture = fixture_load(name);
  ASSERT_FALSE(fixture.floats.empty());
  const ModelSpec spec = spec_from_fixture(fixture.metadata["config"], name);
  Arena arena(int64_t{1} << 30);
  Model model(spec, arena);
  model.recompute.assign(model.recompute.size(), level);
  const double router_scale =
      fixture.metadata.contains("router_scale") ? fixture.metadata["router_scale"].get<double>() : 0.0;
  golden_weights_set(model, router_scale);
  for (const TensorView& view : model.views) {
    double sum = 0.0;
    for (int64_t i = 0; i < view.numel; i++) sum += model.params[view.offset + i];
    const double expected = fixture.metadata["weight_sums"][view.name].get<double>();
    ASSERT_NEAR(sum, expected, 1e-9 * std::max(1.0, std::fabs(expected))) << view.name;
  }

  const std::vector<int64_t>& shape = fixture.shapes["inputs"];
  const int B = static_cast<int>(shape[0]);
  const int T = static_cast<int>(shape[1]);
  const std::vector<int32_t>& inputs = fixture.ints["inputs"];
  const std::vector<int32_t>& targets = fixture.ints["targets"];
  std::printf("%s (recompute %s), B=%d T=%d: largest relative difference per tensor\n",
              name.c_str(), recompute_name(level), B, T);

  model_zero_grad(model);
  const float loss = model_forward(model, inputs.data(), targets.data(), B, T);
  const double logits_diff = relative_difference(model.pass.head.logits, fixture.floats["logits"]);
  std::printf("  %-32s %.2e\n", "logits", logits_diff);
  EXPECT_LT(logits_diff, 1e-4);
  const double reference_loss = fixture.floats["loss"][0];
  std::printf("  %-32s %.2e (alloy %.7f, torch %.7f)\n", "loss",
              std::fabs(loss - reference_loss), loss, reference_loss);
  EXPECT_NEAR(loss, reference_loss, 1e-5);
  if (model_is_moe(spec)) {
    const double reference_aux = fixture.floats["aux_loss"][0];
    const double other_form = fixture.floats["aux_loss_other_form"][0];
    std::printf("  %-32s %.2e (alloy %.7f, torch %.7f; %s; the other form %.7f)\n", "load-balancing loss",
                std::fabs(model.pass.aux_loss - reference_aux), static_cast<double>(model.pass.aux_loss), reference_aux,
                moe_balance_name(spec.moe.balance), other_form);
    EXPECT_NEAR(model.pass.aux_loss, reference_aux, 1e-5);
  }

  model_backward(model);
  for (const TensorView& view : model.views) {
    const std::vector<float>& reference = fixture.floats["grad." + view.name];
    ASSERT_EQ(static_cast<int64_t>(reference.size()), view.numel) << view.name;
    const double diff = relative_difference(model.grads + view.offset, reference);
    std::printf("  grad %-27s %.2e\n", view.name.c_str(), diff);
    EXPECT_LT(diff, 1e-4) << view.name;
  }

  const nlohmann::json& hyper = fixture.metadata["hyper"];
  TrainSpec train;
  train.learning_rate = hyper["lr"];
  train.min_learning_rate = hyper["lr"];
  train.warmup_steps = 0;
  train.beta1 = hyper["beta1"];
  train.beta2 = hyper["beta2"];
  train.adam_eps = hyper["eps"];
  train.weight_decay = hyper["weight_decay"];
  train.grad_clip = hyper["grad_clip"];
  const std::vector<float>& step_losses = fixture.floats["step_losses"];
  const std::vector<float>& step_norms = fixture.floats["step_grad_norms"];
  const std::vector<float>& step_aux = fixture.floats["step_aux_losses"];  // MoE models only
  train.steps = static_cast<int64_t>(step_losses.size());
  train.seq_len = T;
  // The steps `alloy train` runs: the executor of one rank, from the same weights.
  testing::OneRank run(spec, train, B, level);
  golden_weights_set(run.model(), router_scale);
  // Validation (a forward without backward) reports the cross-entropy, without the load-balancing loss.
  const double validation = run.runtime().loss_sum(inputs.data(), targets.data()) / (static_cast<double>(B) * T);
  std::printf("  %-32s %.2e (alloy %.7f, torch %.7f)\n", "validation loss", std::fabs(validation - reference_loss),
              validation, reference_loss);
  EXPECT_NEAR(validation, reference_loss, 1e-5);
  double worst_loss = 0.0, worst_aux = 0.0;
  float last_loss = 0.0f;
  for (size_t step = 0; step < step_losses.size(); step++) {
    const testing::OneRankStep result = run.step(inputs.data(), targets.data());
    last_loss = result.loss;
    worst_loss =
        std::max(worst_loss, std::fabs(static_cast<double>(result.loss) - step_losses[step]));
    EXPECT_NEAR(result.loss, step_losses[step], 1e-5) << "step " << step;
    if (model_is_moe(spec)) {
      worst_aux = std::max(worst_aux, std::fabs(static_cast<double>(result.aux_loss) - step_aux[step]));
      EXPECT_NEAR(result.aux_loss, step_aux[step], 1e-5) << "step " << step;
    }
    EXPECT_NEAR(result.grad_norm, step_norms[step], 1e-4 * step_norms[step]) << "step " << step;
    EXPECT_FLOAT_EQ(result.learning_rate, static_cast<float>(train.learning_rate));
  }
  std::printf("  %-32s %.2e (last: alloy %.7f, torch %.7f)\n", "10-step losses", worst_loss,
              static_cast<double>(last_loss), static_cast<double>(step_losses.back()));
  if (model_is_moe(spec)) std::printf("  %-32s %.2e\n", "10-step load-balancing losses", worst_aux);
}

TEST(Golden, TinyGptMatchesPyTorch) { check_golden("tiny_gpt", Recompute::Recompute_none); }

TEST(Golden, TinyLlamaMatchesPyTorch) { check_golden("tiny_llama", Recompute::Recompute_none); }

TEST(Golden, TinyGptWithFullRecomputationMatchesPyTorch) {
  check_golden("tiny_gpt", Recompute::Recompute_full);
}

TEST(Golden, TinyLlamaWithSelectiveRecomputationMatchesPyTorch) {
  check_golden("tiny_llama", Recompute::Recompute_selective);
}

// Mixture-of-Experts: renormalised top-k (Mixtral), a sigmoid-gated shared expert without
// renormalisation (Qwen2-MoE), a leading dense block and two ungated shared experts (DeepSeek).
TEST(Golden, TinyMoeMixtralMatchesPyTorch) { check_golden("tiny_moe_mixtral", Recompute::Recompute_none); }

TEST(Golden, TinyMoeQwenMatchesPyTorch) { check_golden("tiny_moe_qwen", Recompute::Recompute_none); }

TEST(Golden, TinyMoeDeepSeekMatchesPyTorch) { check_golden("tiny_moe_deepseek", Recompute::Recompute_none); }

TEST(Golden, TinyMoeQwenWithFullRecomputationMatchesPyTorch) {
  check_golden("tiny_moe_qwen", Recompute::Recompute_full);
}

TEST(Golden, TinyMoeDeepSeekWithSelectiveRecomputationMatchesPyTorch) {
  check_golden("tiny_moe_deepseek", Recompute::Recompute_selective);
}

}  // namespace
}  // namespace alloy
