// Numerical guards of a rank's step on one rank: NaN or Inf in the loss or a gradient skips the
// update and leaves the weights as they were; non-finite weights are never saved or exported,
// and never loaded from a checkpoint; non-finite optimizer settings are refused up front.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "../common/test_util.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/parallel/agree.hpp"
#include "runtime/parallel/dist_report.hpp"
#include "runtime/trainer.hpp"
#include "runtime/trainer_setup.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::TempDir;

constexpr int kBatch = 2;
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

TrainSpec small_train() {
  TrainSpec t;
  t.seq_len = 16;
  t.global_batch_sequences = kBatch;
  t.precision = Precision::Precision_fp32;
  t.steps = 10;
  t.learning_rate = 1e-3;
  t.min_learning_rate = 1e-4;
  t.warmup_steps = 0;
  return t;
}

// One rank over the one-stage plan of tiny-gpt, with a fixed batch of token ids.
class OneRankGuard : public ::testing::Test {
 protected:
  OneRankGuard() : model_(model_load("tiny-gpt")), train_(small_train()), comm_(communicator_local()) {
    TrainerOptions options;
    options.batch_size = kBatch;
    one_ = trainer_one_stage(model_, train_, options);
    RankResources resources;
    resources.memory_cap_bytes = int64_t{1} << 30;
    runtime_ = std::make_unique<RankRuntime>(one_.plan, model_, train_, *comm_, resources);
    for (size_t i = 0; i < tokens_.size(); ++i) tokens_[i] = static_cast<int32_t>((i * 37 + 11) % 256);
  }

  RankStepStats step() { return runtime_->step(tokens_.data(), tokens_.data() + train_.seq_len * kBatch / 2); }
  std::vector<float> weights() { return runtime_->full_parameters(); }
  // The first element of the tensor called `name` set to `value`.
  void weight_set(const std::string& name, float value) {
    for (const TensorView& v : runtime_->model().views)
      if (v.name == name) *runtime_->backend().parameters_at(v.offset, 1) = value;
  }
  static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }

  ModelSpec model_;
  TrainSpec train_;
  std::unique_ptr<Communicator> comm_;
  OneStage one_;
  std::unique_ptr<RankRuntime> runtime_;
  std::vector<int32_t> tokens_ = std::vector<int32_t>(static_cast<size_t>(16 * kBatch * 2));
};

TEST_F(OneRankGuard, PoisonedGradientSkipsTheUpdateAndNamesTheTensor) {
  ASSERT_FALSE(step().update_skipped);
  const std::vector<float> before = weights();
  runtime_->gradient_poison_next_step();
  const RankStepStats bad = step();
  EXPECT_TRUE(bad.update_skipped);
  EXPECT_TRUE(bad.loss_finite);
  EXPECT_TRUE(std::isfinite(bad.loss_sum));
  EXPECT_TRUE(same_bits(before, weights())) << "the update ran on a NaN gradient";
  EXPECT_EQ(runtime_->gradient_nonfinite_name(), runtime_->model().views.front().name + "'s gradient");
  // The next clean step updates again.
  const RankStepStats good = step();
  EXPECT_FALSE(good.update_skipped);
  EXPECT_FALSE(same_bits(before, weights()));
  EXPECT_EQ(runtime_->gradient_nonfinite_name(), "");
}

TEST_F(OneRankGuard, NanWeightMakesTheLossNonFiniteAndTheStepIsSkipped) {
  weight_set("layers.1.mlp.up.weight", kNan);
  const std::vector<float> before = weights();
  const RankStepStats stats = step();
  EXPECT_TRUE(stats.update_skipped);
  EXPECT_FALSE(stats.loss_finite);
  EXPECT_TRUE(same_bits(before, weights())) << "the update ran on a NaN loss";
}

TEST_F(OneRankGuard, CheckpointOfNonFiniteWeightsIsRefusedBeforeWriting) {
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  step();
  weight_set("layers.0.attn.qkv.weight", std::numeric_limits<float>::infinity());
  CheckpointState state;
  state.step = 1;
  state.fingerprint = "f";
  try {
    runtime_->checkpoint_save_to(ckpt, state);
    FAIL() << "a checkpoint of Inf weights was saved";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(e.message().find("layers.0.attn.qkv.weight holds NaN or Inf"), std::string::npos) << e.format();
    EXPECT_EQ(e.where().file, ckpt);
  }
  EXPECT_FALSE(std::filesystem::exists(ckpt));
  EXPECT_FALSE(std::filesystem::exists(ckpt + ".tmp"));
}

TEST_F(OneRankGuard, ExportOfNonFiniteWeightsIsRefusedBeforeWriting) {
  TempDir dir;
  const std::string path = dir.path() + "/weights.safetensors";
  weight_set("embed.position", kNan);
  weight_set("final_norm.weight", kNan);
  try {
    dist_export_weights(*runtime_, one_.plan, *comm_, path);
    FAIL() << "NaN weights were exported";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(e.message().find("refusing to export the weights"), std::string::npos) << e.format();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(OneRankGuard, CheckpointHoldingNanIsRefusedOnLoadNamingFileAndTensor) {
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  // A checkpoint as an earlier version could write it: valid checksums, a NaN in one weight.
  std::vector<std::vector<float>> storage;
  std::vector<TensorRef> params, moments;
  const std::vector<float> full = weights();
  for (const TensorView& v : runtime_->model().views) {
    storage.emplace_back(full.begin() + v.offset, full.begin() + v.offset + v.numel);
    if (v.name == "layers.1.attn.out.weight") storage.back()[3] = kNan;
    params.push_back({v.name, v.shape, storage.back().data()});
  }
  for (const char* moment : {"m", "v"})
    for (const TensorView& v : runtime_->model().views) {
      storage.emplace_back(static_cast<size_t>(v.numel), 0.0f);
      moments.push_back({std::string("adamw.") + moment + "." + v.name, v.shape, storage.back().data()});
    }
  CheckpointState state;
  state.step = 3;
  state.fingerprint = "f";
  checkpoint_save(ckpt, params, moments, state);
  try {
    runtime_->checkpoint_load_from(ckpt, "f");
    FAIL() << "a checkpoint holding NaN was loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().file, ckpt + "/" + kCheckpointModelFile) << e.format();
    EXPECT_EQ(e.where().field, "layers.1.attn.out.weight") << e.format();
  }
}

TEST(TrainerNumbers, NonFiniteOrNonPositiveSettingsAreRefusedNamingTheField) {
  const TrainerOptions options;
  auto field_of = [&](const TrainSpec& t, const TrainerOptions& o) -> std::string {
    try {
      trainer_check_numbers(t, o);
    } catch (const Error& e) {
      return e.where().field;
    }
    return "";
  };
  EXPECT_EQ(field_of(small_train(), options), "");
  for (double lr : {std::numeric_limits<double>::infinity(), std::nan(""), -1.0, 0.0, 1e39}) {
    TrainSpec t = small_train();
    t.learning_rate = lr;
    EXPECT_EQ(field_of(t, options), "--lr") << lr;
  }
  TrainSpec t = small_train();
  t.weight_decay = std::nan("");
  EXPECT_EQ(field_of(t, options), "weight_decay");
  t = small_train();
  t.grad_clip = std::numeric_limits<double>::infinity();
  EXPECT_EQ(field_of(t, options), "grad_clip");
  TrainerOptions none_tolerated;
  none_tolerated.max_bad_steps = 0;
  EXPECT_EQ(field_of(small_train(), none_tolerated), "--max-bad-steps");
}

}  // namespace
}  // namespace alloy
