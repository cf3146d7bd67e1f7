// The passes' parameter-gradient writes as a GradientSink sees them (model_gradients.cpp): every
// gradient announced before and after it is written, matrices in the row pieces the sink asks
// for, the whole backward in the reverse of the flat order (what lets sharded gradients keep one
// part at a time), and the same gradients as without a sink; for dense and MoE blocks alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "runtime/model.hpp"
#include "runtime/threads.hpp"

namespace alloy {
namespace {

ModelSpec tiny(ModelFamily family) {
  ModelSpec spec;
  spec.name = family == ModelFamily::ModelFamily_gpt2 ? "tiny-gpt" : "tiny-llama";
  spec.family = family;
  spec.num_layers = 3;
  spec.hidden_size = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = family == ModelFamily::ModelFamily_gpt2 ? 4 : 2;
  spec.head_dim = 16;
  spec.ffn_hidden_size = family == ModelFamily::ModelFamily_gpt2 ? 256 : 176;
  spec.vocab_size = 256;
  spec.max_seq_len = 64;
  spec.tied_embeddings = family == ModelFamily::ModelFamily_gpt2;
  spec.qkv_bias = spec.linear_bias = spec.norm_bias = family == ModelFamily::ModelFamily_gpt2;
  return spec;
}

// A Mixture-of-Experts LLaMA: a dense first block, then MoE blocks of eight experts (each
// written, rows or none) with a gated shared expert.
ModelSpec tiny_moe() {
  ModelSpec spec = tiny(ModelFamily::ModelFamily_llama);
  spec.name = "tiny-moe";
  spec.moe.num_experts = 8;
  spec.moe.experts_per_token = 2;
  spec.moe.expert_ffn_hidden_size = 48;
  spec.moe.num_shared_experts = 1;
  spec.moe.shared_expert_ffn_hidden_size = 32;
  spec.moe.shared_expert_gate = true;
  spec.moe.first_dense_layers = 1;
  spec.moe.router_aux_loss_coef = 0.01;
  return spec;
}

std::vector<ModelSpec> sink_specs() {
  return {tiny(ModelFamily::ModelFamily_llama), tiny(ModelFamily::ModelFamily_gpt2), tiny_moe()};
}

// Writes straight into the model's gradient buffer, cutting every matrix into three row pieces,
// and records where each announced write starts and ends (flat floats) and whether it was closed.
class RecordingSink final : public GradientSink {
 public:
  explicit RecordingSink(Model& model) : model_(model) {
    const std::vector<float**> slots = model_gradient_slots(model);
    for (size_t k = 0; k < slots.size(); ++k)
      if (slots[k] != nullptr) views_[slots[k]] = k;
    if (model.spec.tied_embeddings) views_[&model.gradients.lm_head] = views_.at(&model.gradients.token);
  }
  struct Write {
    int64_t begin = 0, end = 0;
    bool through_head = false;  // the tied head writing the table
    float* const* slot = nullptr;
    bool closed = false;
  };
  std::vector<Write> writes;

  std::vector<int64_t> row_cuts(float* const* slot, int64_t rows) override {
    if (views_.count(slot) == 0) return {0, rows};
    return {0, rows / 3, 2 * rows / 3, rows};
  }
  float* writing(float* const* slot, int64_t begin, int64_t end) override {
    const auto found = views_.find(slot);
    if (found == views_.end()) return *slot;  // a tensor this model does not have
    const TensorView& view = model_.views[found->second];
    const int64_t row_floats = view.shape.size() == 2 ? view.numel / view.shape[0] : 1;
    end = std::min(end, view.numel / row_floats);
    writes.push_back({view.offset + begin * row_floats, view.offset + end * row_floats,
                      slot == &model_.gradients.lm_head && model_.spec.tied_embeddings, slot});
    return *slot + begin * row_floats;
  }
  void written(float* const* slot, int64_t, int64_t) override {
    for (auto w = writes.rbegin(); w != writes.rend(); ++w)
      if (w->slot == slot && !w->closed) {
        w->closed = true;
        return;
      }
  }

 private:
  Model& model_;
  std::map<float* const*, size_t> views_;
};

struct Backward {
  std::vector<float> gradients;
  std::vector<RecordingSink::Write> writes;
};

Backward backward(const ModelSpec& spec, bool with_sink) {
  runtime_threads();
  Arena arena(int64_t{1} << 28);
  Model model(spec, arena);
  model_init_weights(model, 7);
  model_zero_grad(model);
  RecordingSink sink(model);
  if (with_sink) model.gradient_sink = &sink;
  const int B = 2, T = 16;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    inputs[static_cast<size_t>(i)] = (i * 37 + 5) % static_cast<int>(spec.vocab_size);
    targets[static_cast<size_t>(i)] = (i * 11 + 3) % static_cast<int>(spec.vocab_size);
  }
  model_forward(model, inputs.data(), targets.data(), B, T);
  model_backward(model);
  model.gradient_sink = nullptr;
  return {std::vector<float>(model.grads, model.grads + model.num_parameters), sink.writes};
}

TEST(GradientSink, WritesComeInPiecesInTheReverseOfTheFlatOrder) {
  for (const ModelSpec& spec : sink_specs()) {
    const Backward got = backward(spec, true);
    ASSERT_FALSE(got.writes.empty()) << spec.name;
    // Every write closed, and every float of the model written (the tied table twice: by the
    // head and by the embedding).
    int64_t total = 0;
    for (const RecordingSink::Write& w : got.writes) {
      EXPECT_TRUE(w.closed) << spec.name;
      total += w.end - w.begin;
    }
    const int64_t table = spec.tied_embeddings ? spec.vocab_size * spec.hidden_size : 0;
    int64_t floats = 0;
    for (const RecordingSink::Write& w : got.writes) floats = std::max(floats, w.end);
    EXPECT_EQ(total, floats + table) << spec.name;
    // Apart from the tied head's writes into the table, each write starts where the next one
    // (in flat order) begins or later: the backward walks the flat buffer from its end.
    int64_t previous_begin = floats;
    for (const RecordingSink::Write& w : got.writes) {
      if (w.through_head) continue;
      EXPECT_EQ(w.end, previous_begin) << spec.name << ": a write out of the flat order's reverse at " << w.begin;
      previous_begin = w.begin;
    }
    EXPECT_EQ(previous_begin, 0) << spec.name;
  }
}

TEST(GradientSink, PiecesGiveTheGradientsOfOneWrite) {
  for (const ModelSpec& spec : sink_specs()) {
    const Backward whole = backward(spec, false), pieces = backward(spec, true);
    ASSERT_EQ(whole.gradients.size(), pieces.gradients.size());
    // Pieces run the same products in other shapes, so OpenBLAS may sum them in another order
    // (its AVX2 kernels do; its AVX-512 ones did not): each gradient is compared on a scale of
    // at least 1/1000 of the largest, where fp32 sums of reordered terms differ in their last
    // places; a wrong piece would be off by its whole size.
    double largest = 0;
    for (float g : whole.gradients) largest = std::max(largest, std::abs(static_cast<double>(g)));
    double worst = 0;
    for (size_t i = 0; i < whole.gradients.size(); ++i) {
      const double scale = std::max(1e-3 * largest, std::abs(static_cast<double>(whole.gradients[i])));
      worst = std::max(worst, std::abs(static_cast<double>(whole.gradients[i]) - pieces.gradients[i]) / scale);
    }
    EXPECT_LT(worst, 1e-4) << spec.name;  // AVX2 kernels: 2e-5; AVX-512 ones: 0
  }
}

}  // namespace
}  // namespace alloy
