// The single-rank model: parameter layout, initialisation, activation bytes measured by the arena
// against the analytic formula of activation_memory.hpp, recomputation levels giving identical
// gradients, input errors, and loss going down under the one-rank executor's steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "runtime/activation_memory.hpp"
#include "runtime/model.hpp"
#include "runtime/threads.hpp"
#include "../common/one_rank.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

ModelSpec tiny_gpt() {
  ModelSpec spec;
  spec.name = "tiny-gpt";
  spec.family = ModelFamily::ModelFamily_gpt2;
  spec.num_layers = 2;
  spec.hidden_size = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 4;
  spec.head_dim = 16;
  spec.ffn_hidden_size = 256;
  spec.vocab_size = 256;
  spec.max_seq_len = 64;
  spec.tied_embeddings = true;
  spec.qkv_bias = spec.linear_bias = spec.norm_bias = true;
  return spec;
}

ModelSpec tiny_llama() {
  ModelSpec spec;
  spec.name = "tiny-llama";
  spec.family = ModelFamily::ModelFamily_llama;
  spec.num_layers = 2;
  spec.hidden_size = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.ffn_hidden_size = 176;
  spec.vocab_size = 256;
  spec.max_seq_len = 64;
  spec.tied_embeddings = false;
  return spec;
}

std::vector<int32_t> token_batch(int n, int vocab, int salt) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; i++) tokens[static_cast<size_t>(i)] = (i * 37 + salt * 11 + i * i) % vocab;
  return tokens;
}

TEST(Model, LayoutHasTheDocumentedNamesAndSizes) {
  Arena arena(int64_t{1} << 28);
  Model gpt(tiny_gpt(), arena);
  // Counted by hand: wte 256*64, wpe 64*64, per block 2 LayerNorms (2*128), qkv 192*64+192,
  // out 64*64+64, up 256*64+256, down 64*256+64; final norm 128; tied head.
  const int64_t gpt_block = 256 + 192 * 64 + 192 + 64 * 64 + 64 + 256 * 64 + 256 + 64 * 256 + 64;
  EXPECT_EQ(gpt.num_parameters, 256 * 64 + 64 * 64 + 2 * gpt_block + 128);
  EXPECT_EQ(gpt.views.front().name, "embed.token");
  EXPECT_EQ(model_view(gpt, "embed.position").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(model_view(gpt, "layers.1.attn.qkv.weight").shape, (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(model_view(gpt, "layers.0.mlp.up.bias").shape, (std::vector<int64_t>{256}));
  EXPECT_THROW(model_view(gpt, "lm_head.weight"), Error);
  EXPECT_EQ(gpt.weights.lm_head, gpt.weights.token);
  int64_t end = 0;
  for (const TensorView& view : gpt.views) {
    EXPECT_EQ(view.offset, end) << view.name;  // contiguous, in order
    EXPECT_EQ(view.weight_decay, view.shape.size() == 2) << view.name;
    end += view.numel;
  }
  EXPECT_EQ(end, gpt.num_parameters);

  Model llama(tiny_llama(), arena);
  // wte and lm_head 256*64 each; per block 2 RMSNorms, qkv (4+2+2)*16 x 64, out 64x64,
  // gate_up 352x64, down 64x176; final norm 64.
  const int64_t llama_block = 128 + 128 * 64 + 64 * 64 + 352 * 64 + 64 * 176;
  EXPECT_EQ(llama.num_parameters, 2 * 256 * 64 + 2 * llama_block + 64);
  EXPECT_EQ(model_view(llama, "layers.0.mlp.gate_up.weight").shape,
            (std::vector<int64_t>{352, 64}));
  EXPECT_EQ(model_view(llama, "lm_head.weight").offset + 256 * 64, llama.num_parameters);
  EXPECT_THROW(model_view(llama, "embed.position"), Error);
  EXPECT_EQ(arena.bytes_in_use(), arena_rounded_bytes(gpt.num_parameters * 4) * 2 +
                                      arena_rounded_bytes(llama.num_parameters * 4) * 2);
}

TEST(Model, InitialisationIsSeededAndScaled) {
  Arena arena(int64_t{1} << 28);
  Model a(tiny_gpt(), arena);
  Model b(tiny_gpt(), arena);
  model_init_weights(a, 7);
  model_init_weights(b, 7);
  EXPECT_EQ(std::memcmp(a.params, b.params, static_cast<size_t>(a.num_parameters) * 4), 0);
  model_init_weights(b, 8);
  EXPECT_NE(std::memcmp(a.params, b.params, static_cast<size_t>(a.num_parameters) * 4), 0);
  auto stddev = [&](const std::string& name) {
    const TensorView& view = model_view(a, name);
    double sum = 0.0;
    for (int64_t i = 0; i < view.numel; i++) sum += std::pow(a.params[view.offset + i], 2);
    return std::sqrt(sum / static_cast<double>(view.numel));
  };
  EXPECT_NEAR(stddev("layers.0.attn.qkv.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("layers.1.mlp.down.weight"), 0.02 / 2.0, 0.0005);  // 1 / sqrt(2 L), L = 2
  EXPECT_EQ(a.params[model_view(a, "layers.0.attn_norm.weight").offset], 1.0f);
  EXPECT_EQ(a.params[model_view(a, "layers.0.attn.qkv.bias").offset], 0.0f);
}

// The arena's bytes after a forward, minus before, equal the analytic formula exactly.
void check_activation_bytes(const ModelSpec& spec, const std::vector<Recompute>& levels) {
  const int B = 3, T = 20;
  Arena arena(int64_t{1} << 30);
  Model model(spec, arena);
  model_init_weights(model, 1);
  model.recompute = levels;
  auto inputs = token_batch(B * T, static_cast<int>(spec.vocab_size), 1);
  auto targets = token_batch(B * T, static_cast<int>(spec.vocab_size), 2);
  const int64_t before = arena.bytes_in_use();
  model_forward(model, inputs.data(), targets.data(), B, T);
  const int64_t kept = arena.bytes_in_use() - before;
  EXPECT_EQ(kept, model_activation_bytes(spec, B, T, levels));
  model_backward(model);
  EXPECT_EQ(arena.bytes_in_use(), before) << "backward must free every activation";
  std::printf("  %-10s levels %s/%s: forward keeps %lld bytes, step peak %lld bytes over weights\n",
              spec.name.c_str(), recompute_name(levels[0]), recompute_name(levels[1]),
              static_cast<long long>(kept), static_cast<long long>(arena.peak_bytes() - before));
}

TEST(Model, ActivationBytesMatchTheFormulaAtEveryRecomputeLevel) {
  for (const ModelSpec& spec : {tiny_gpt(), tiny_llama()}) {
    for (Recompute level : {Recompute::Recompute_none, Recompute::Recompute_selective,
                            Recompute::Recompute_full}) {
      check_activation_bytes(spec, {level, level});
    }
    check_activation_bytes(spec, {Recompute::Recompute_full, Recompute::Recompute_selective});
  }
}

TEST(Model, RecomputeLevelsParseAndNameTheirTensors) {
  Recompute parsed = Recompute::Recompute_none;
  EXPECT_TRUE(recompute_parse("selective", &parsed));
  EXPECT_EQ(parsed, Recompute::Recompute_selective);
  EXPECT_FALSE(recompute_parse("partial", &parsed));
  auto names = [](Recompute level) {
    std::vector<std::string> result;
    for (const ActivationTensor& t : block_activation_tensors(tiny_gpt(), 2, 8, level)) {
      result.push_back(t.name);
      EXPECT_EQ(t.bytes % kArenaAlignmentBytes, 0) << t.name;
      EXPECT_GE(t.bytes, t.floats * 4) << t.name;
    }
    return result;
  };
  EXPECT_EQ(names(Recompute::Recompute_full), std::vector<std::string>{"output"});
  const auto none = names(Recompute::Recompute_none);
  const auto selective = names(Recompute::Recompute_selective);
  EXPECT_EQ(none.size(), selective.size() + 2);
  EXPECT_NE(std::find(none.begin(), none.end(), "attn.probs"), none.end());
  EXPECT_EQ(std::find(selective.begin(), selective.end(), "attn.probs"), selective.end());
}

TEST(Model, OneBlockKeepsWhatItsLevelPromises) {
  const ModelSpec spec = tiny_llama();
  const int64_t B = 2, T = 16, N = B * T;
  const int64_t none = block_activation_bytes(spec, B, T, Recompute::Recompute_none);
  const int64_t selective = block_activation_bytes(spec, B, T, Recompute::Recompute_selective);
  const int64_t full = block_activation_bytes(spec, B, T, Recompute::Recompute_full);
  // selective drops exactly the probabilities (B, Hq, T, T) and the context (B, T, Hq D)
  EXPECT_EQ(none - selective, (B * 4 * T * T + N * 64) * 4);
  EXPECT_EQ(full, N * 64 * 4);  // the block output only
  // Measured on the arena for the difference of two models that differ in one block's level.
  std::vector<int64_t> measured;
  for (Recompute level : {Recompute::Recompute_none, Recompute::Recompute_full}) {
    Arena arena(int64_t{1} << 28);
    Model model(spec, arena);
    model.recompute = {level, Recompute::Recompute_none};
    auto tokens = token_batch(static_cast<int>(N), 256, 3);
    const int64_t before = arena.bytes_in_use();
    model_forward(model, tokens.data(), tokens.data(), static_cast<int>(B), static_cast<int>(T));
    measured.push_back(arena.bytes_in_use() - before);
  }
  EXPECT_EQ(measured[0] - measured[1], none - full);
}

std::vector<float> gradients_at(const ModelSpec& spec, Recompute level, float* loss) {
  const int B = 2, T = 12;
  Arena arena(int64_t{1} << 28);
  Model model(spec, arena);
  model_init_weights(model, 5);
  model.recompute.assign(model.recompute.size(), level);
  auto inputs = token_batch(B * T, static_cast<int>(spec.vocab_size), 4);
  auto targets = token_batch(B * T, static_cast<int>(spec.vocab_size), 5);
  *loss = model_forward(model, inputs.data(), targets.data(), B, T);
  model_backward(model);
  return std::vector<float>(model.grads, model.grads + model.num_parameters);
}

TEST(Model, RecomputationLevelsGiveIdenticalGradients) {
  for (const ModelSpec& spec : {tiny_gpt(), tiny_llama()}) {
    float loss_none = 0.0f, loss_selective = 0.0f, loss_full = 0.0f;
    auto none = gradients_at(spec, Recompute::Recompute_none, &loss_none);
    auto selective = gradients_at(spec, Recompute::Recompute_selective, &loss_selective);
    auto full = gradients_at(spec, Recompute::Recompute_full, &loss_full);
    EXPECT_EQ(loss_none, loss_selective);
    EXPECT_EQ(loss_none, loss_full);
    EXPECT_EQ(none, selective) << spec.name;
    EXPECT_EQ(none, full) << spec.name;
    const double norm = std::sqrt(std::inner_product(none.begin(), none.end(), none.begin(), 0.0));
    EXPECT_GT(norm, 0.0);
  }
}

// A LLaMA with a sliding window shorter than the sequence and Llama 3.1's RoPE scaling: the
// recomputing passes apply both as the first pass did, a window as long as the sequence is plain
// causal attention, and a shorter one changes the loss.
TEST(Model, SlidingWindowAndRopeScalingHoldThroughRecomputation) {
  ModelSpec windowed = tiny_llama();
  windowed.sliding_window = 5;  // the sequences hold 12 tokens
  windowed.rope_scaling = {RopeScalingType::RopeScalingType_llama3, 8.0, 1.0, 4.0, 16};
  float loss_none = 0.0f, loss_full = 0.0f, loss_selective = 0.0f;
  const auto none = gradients_at(windowed, Recompute::Recompute_none, &loss_none);
  EXPECT_EQ(none, gradients_at(windowed, Recompute::Recompute_selective, &loss_selective));
  EXPECT_EQ(none, gradients_at(windowed, Recompute::Recompute_full, &loss_full));
  EXPECT_EQ(loss_none, loss_full);

  ModelSpec scaled_only = windowed;
  scaled_only.sliding_window = 0;
  float loss_scaled = 0.0f, loss_long_window = 0.0f, loss_plain = 0.0f;
  const auto causal = gradients_at(scaled_only, Recompute::Recompute_none, &loss_scaled);
  scaled_only.sliding_window = 12;
  EXPECT_EQ(causal, gradients_at(scaled_only, Recompute::Recompute_none, &loss_long_window));
  EXPECT_EQ(loss_scaled, loss_long_window);
  EXPECT_NE(loss_none, loss_scaled) << "a window of 5 of 12 tokens changes what attention sees";
  gradients_at(tiny_llama(), Recompute::Recompute_none, &loss_plain);
  EXPECT_NE(loss_plain, loss_scaled) << "the scaled frequencies change the rotations";
}

TEST(Model, LossScaleScalesEveryGradient) {
  float loss = 0.0f;
  const auto full = gradients_at(tiny_llama(), Recompute::Recompute_none, &loss);
  const int B = 2, T = 12;
  Arena arena(int64_t{1} << 28);
  Model model(tiny_llama(), arena);
  model_init_weights(model, 5);
  auto inputs = token_batch(B * T, 256, 4);
  auto targets = token_batch(B * T, 256, 5);
  for (int micro = 0; micro < 2; micro++) {  // two accumulated halves of the same batch
    model_forward(model, inputs.data(), targets.data(), B, T);
    model_backward(model, 0.5f);
  }
  for (int64_t i = 0; i < model.num_parameters; i++) {
    const float expected = full[static_cast<size_t>(i)];
    ASSERT_NEAR(model.grads[i], expected, 1e-6f + 1e-5f * std::fabs(expected)) << i;
  }
}

TEST(Model, BadInputsAreClearErrors) {
  Arena arena(int64_t{1} << 28);
  Model model(tiny_gpt(), arena);
  auto tokens = token_batch(2 * 8, 256, 1);
  tokens[5] = 256;
  try {
    model_forward(model, tokens.data(), tokens.data(), 2, 8);
    FAIL() << "expected an error for token id 256";
  } catch (const Error& error) {
    EXPECT_NE(error.format().find("token id 256"), std::string::npos) << error.format();
  }
  auto long_tokens = token_batch(65, 256, 1);
  EXPECT_THROW(model_forward(model, long_tokens.data(), long_tokens.data(), 1, 65), Error);
  EXPECT_THROW(model_backward(model), Error);  // no forward happened

  Arena small(arena_rounded_bytes(model.num_parameters * 4) * 2 + 4096);
  Model capped(tiny_gpt(), small);
  tokens[5] = 1;
  try {
    model_forward(capped, tokens.data(), tokens.data(), 2, 8);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& error) {
    EXPECT_NE(error.format().find("out of device memory"), std::string::npos) << error.format();
  }
  model_release_activations(capped);
  EXPECT_EQ(small.bytes_in_use(), arena_rounded_bytes(model.num_parameters * 4) * 2);
}

TEST(Model, TrainStepsLowerTheLossWithWarmupSchedule) {
  runtime_set_threads(1);  // the golden tests cover two threads; this one only needs the steps
  for (const ModelSpec& spec : {tiny_gpt(), tiny_llama()}) {
    TrainSpec train;
    train.seq_len = 32;
    train.learning_rate = 3e-3;
    train.min_learning_rate = 3e-4;
    train.warmup_steps = 5;
    train.steps = 25;
    train.seed = 11;
    testing::OneRank run(spec, train, 2, Recompute::Recompute_none, int64_t{1} << 28);
    auto inputs = token_batch(2 * 32, 256, 6);
    auto targets = token_batch(2 * 32, 256, 7);
    testing::OneRankStep first, last;
    for (int step = 0; step < train.steps; step++) {
      last = run.step(inputs.data(), targets.data());
      if (step == 0) {
        first = last;
        EXPECT_FLOAT_EQ(last.learning_rate, 3e-3f / 5);
      }
    }
    EXPECT_NEAR(first.loss, std::log(256.0), 0.05) << "small init gives a near-uniform guess";
    EXPECT_LT(last.loss, 0.5 * first.loss) << spec.name << " memorises a fixed batch";
    EXPECT_GT(first.grad_norm, 0.0f);
    EXPECT_EQ(run.runtime().optimizer_steps(), train.steps);
  }
}

}  // namespace
}  // namespace alloy
