// Sharded gradients (ZeRO 2-3, shard_gradients): every micro-batch's buckets are reduce-scattered
// into each member's shard. Under mpirun, plans covering pipelines, interleaving, tensor and
// sequence parallelism, recomputation, tied embeddings, LLaMA and uneven replicas must give the
// same losses and weights as the same layout without ZeRO, while each rank's gradient memory at
// its arena peak stays at its shard plus the buckets in use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/io/safetensors.hpp"
#include "cost/cost_model.hpp"
#include "runtime/parallel/agree.hpp"
#include "runtime/parallel/dist_report.hpp"
#include "search/planner.hpp"
#include "spec/train.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/parallel/param_layout.hpp"

namespace alloy::testing {
namespace {

constexpr int kShardedSteps = 10;
// Largest weight difference from ZeRO 0 measured over these plans (10 steps, fp32): 2.4e-7 with
// OpenBLAS's AVX-512 kernels, 1.04e-6 with its AVX2 ones (an AMD EPYC, sanitized build), whose
// sums of the sharded buckets' products fall in another order. A wrong shard moves a weight by
// about the learning rate (1e-4 to 1e-3 a step here).
constexpr double kWeightTolerance = 5e-6;

struct ShardSuite {};

class ZeroGradientsTest : public DistGptSuite<ShardSuite> {
 protected:
  static void SetUpTestSuite() {
    DistGptSuite<ShardSuite>::SetUpTestSuite();
    llama_path_ = dir_->write("llama-4.yaml", kLlama4Yaml);
    std::string odd = kGpt6Yaml;
    odd.replace(odd.find("vocab_size: 256"), 15, "vocab_size: 257");
    odd.replace(odd.find("ffn_hidden_size: 128"), 20, "ffn_hidden_size: 256");
    gpt_odd_path_ = dir_->write("gpt-6-v257.yaml", odd);
  }
  static ModelSpec gpt() { return model_load(gpt_path_); }
  static ModelSpec llama() { return model_load(llama_path_); }
  static ClusterSpec cluster() { return cluster_load(cluster_path_, catalog_builtin()); }

  struct Run {
    std::vector<double> losses;
    std::string weights;                  // exported safetensors
    std::map<int, std::map<std::string, double>> peak_by_name;  // rank -> arena name -> bytes
  };

  static Run run(const Plan& plan, const std::string& model_path, const std::string& name,
                 const std::string& train_file = "dist-train.yaml") {
    const std::string plan_path = dir_->path() + "/" + name + ".json";
    plan_save(plan, plan_path);
    const std::string out = dir_->path() + "/" + name;
    const CommandResult r = run_command(
        fmt::format("mpirun -np {} --oversubscribe --bind-to none -x ALLOY_ARENA_REPORT=1 {} train --model {} --data {} "
                    "--train {}/{} --steps {} --no-progress --plan {} --cluster {} --log "
                    "{}.jsonl --export {}.safetensors",
                    plan.num_used_devices(), ALLOY_BINARY, model_path, data_, dir_->path(), train_file, kShardedSteps, plan_path,
                    cluster_path_, out, out),
        300);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    Run result;
    if (r.exit_code != 0) return result;
    std::istringstream log(read_text(out + ".jsonl"));
    for (std::string line; std::getline(log, line);)
      result.losses.push_back(nlohmann::json::parse(line).at("loss").get<double>());
    result.weights = out + ".safetensors";
    result.peak_by_name = arena_reports(r.output);
    return result;
  }

  // "rank R arena peak X MiB: name M; name M; ..." lines (ALLOY_ARENA_REPORT), in bytes. mpirun
  // merges the ranks' streams, so a report may start after another rank's unfinished line.
  static std::map<int, std::map<std::string, double>> arena_reports(const std::string& output) {
    std::map<int, std::map<std::string, double>> out;
    std::istringstream in(output);
    for (std::string whole; std::getline(in, whole);) {
      int rank = -1;
      const size_t at = whole.find("arena peak");
      const size_t starts = at == std::string::npos ? std::string::npos : whole.rfind("rank ", at);
      if (starts == std::string::npos) continue;
      const std::string line = whole.substr(starts);
      if (std::sscanf(line.c_str(), "rank %d arena peak", &rank) != 1) continue;
      std::istringstream items(line.substr(line.find(':') + 1));
      for (std::string item; std::getline(items, item, ';');) {
        const size_t space = item.find_last_of(' ');
        if (space == std::string::npos || space == 0) continue;
        const std::string label = item.substr(item.find_first_not_of(' '), space - item.find_first_not_of(' '));
        out[rank][label] = std::stod(item.substr(space + 1)) * 1048576.0;
      }
    }
    return out;
  }

  static double largest_weight_difference(const std::string& a_path, const std::string& b_path) {
    SafetensorsFile a = safetensors_open(a_path);
    SafetensorsFile b = safetensors_open(b_path);
    EXPECT_EQ(a.entries().size(), b.entries().size());
    double worst = 0;
    for (const SafetensorsEntry& ea : a.entries()) {
      const SafetensorsEntry* eb = b.entry_find(ea.name);
      EXPECT_NE(eb, nullptr) << ea.name;
      if (eb == nullptr || ea.shape != eb->shape) return 1e30;
      std::vector<float> x((ea.end_bytes - ea.begin_bytes) / 4), y(x.size());
      a.entry_copy(ea, x.data());
      b.entry_copy(*eb, y.data());
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(x[i] - y[i])));
    }
    return worst;
  }

  // `plan` with small buckets and sharded gradients on every stage under ZeRO 2-3 with dp > 1.
  static Plan sharded(Plan plan) {
    plan.gradient_bucket_bytes = kBucketBytes;
    for (PlanStage& st : plan.stages) st.shard_gradients = st.zero >= 2 && st.dp > 1;
    return plan;
  }

  // Runs `plan` and the same layout at ZeRO 0; returns the run of `plan` (checked against the other).
  static Run expect_matches_zero0(const Plan& plan, const std::string& model_path, const std::string& name) {
    Plan reference = plan;
    for (PlanStage& st : reference.stages) {
      st.zero = 0;
      st.shard_gradients = false;
    }
    const Run want = run(reference, model_path, name + "-zero0");
    const Run got = run(plan, model_path, name);
    EXPECT_EQ(got.losses.size(), static_cast<size_t>(kShardedSteps)) << name;
    EXPECT_EQ(got.losses.size(), want.losses.size()) << name;
    for (size_t i = 0; i < std::min(got.losses.size(), want.losses.size()); ++i)
      EXPECT_NEAR(got.losses[i], want.losses[i], 1e-6 * std::abs(want.losses[i])) << name << " step " << i + 1;
    if (!got.weights.empty() && !want.weights.empty()) {
      const double worst = largest_weight_difference(want.weights, got.weights);
      std::printf("%s: largest weight difference from ZeRO 0 %.3g\n", name.c_str(), worst);
      EXPECT_LT(worst, kWeightTolerance) << name;
    }
    return got;
  }

  // Per rank of a sharded stage: the gradient bytes at its arena peak (shard and parts) against
  // its shard plus one part, and below the stage's full gradients on the stages of `saving` (all
  // when empty).
  static void expect_gradient_memory(const Plan& plan, const ModelSpec& spec, const Run& got, const std::string& name,
                                     const std::set<int>& saving = {}) {
    ASSERT_EQ(got.peak_by_name.size(), static_cast<size_t>(plan.num_used_devices())) << name;
    const std::vector<RankInfo> ranks = plan_rank_map(plan);
    for (size_t q = 0; q < ranks.size(); ++q) {
      const PlanStage& stage = plan.stages[static_cast<size_t>(ranks[q].stage)];
      if (!stage.gradients_sharded()) continue;
      Arena arena(int64_t{1} << 30, "cpu");
      Model model(spec, arena, rank_shard(plan, ranks[q].stage, ranks[q].tp_rank));
      ScheduleOptions options;
      options.bucket_bytes = plan.gradient_bucket_bytes;
      const RankSchedule schedule = schedule_build_rank(plan, spec, static_cast<int>(q), options);
      const bool tied_sync = spec.tied_embeddings && plan.stages.size() > 1 && (stage.has_embedding || stage.has_head);
      const ParamLayout layout = param_layout_build(plan, model, schedule, tied_sync);
      int64_t largest = 0;
      for (const GradientBucket& b : layout.buckets) largest = std::max(largest, b.range.count);
      // The part being written (a CPU rank finishes the previous one's reduce-scatter first): at
      // most a bucket's size in fp32, or one row (or vector) of a wider tensor; a head tied to the
      // embedding on the same stage also holds the table's parts from its backward on.
      const int64_t widest = std::max({spec.hidden_size, spec.ffn_hidden_size * 2 / stage.tp,
                                       (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim / stage.tp});
      const int64_t part = std::min(largest, std::max(static_cast<int64_t>(plan.gradient_bucket_bytes / 4), widest));
      const bool tied_here = spec.tied_embeddings && stage.has_embedding && stage.has_head;
      const int64_t table = tied_here ? spec.vocab_size * spec.hidden_size / stage.tp + 1 : 0;
      const double allowed = 4.0 * static_cast<double>(layout.optimizer_floats() + part + table);
      const double full = 4.0 * static_cast<double>(model.num_parameters);
      const std::map<std::string, double>& names = got.peak_by_name.at(static_cast<int>(q));
      const double shard = names.count("sharded gradients") ? names.at("sharded gradients") : 0;
      const double buckets = names.count("gradient bucket") ? names.at("gradient bucket") : 0;
      std::printf("%s rank %zu: gradients at the arena peak %.0f bytes (shard %.0f, parts %.0f); allowed %.0f, "
                  "the stage's full gradients %.0f\n",
                  name.c_str(), q, shard + buckets, shard, buckets, allowed, full);
      EXPECT_GT(shard, 0.0) << name << " rank " << q;
      EXPECT_EQ(names.count("gradients"), 0u) << name << " rank " << q << ": the full gradient buffer is gone";
      // The report prints MiB with 4 decimals: up to 52 bytes off per name.
      EXPECT_LE(shard + buckets, allowed + 2 * 53) << name << " rank " << q;
      if (saving.empty() || saving.count(ranks[q].stage) > 0) {
        EXPECT_LT(shard + buckets, full) << name << " rank " << q;
      }
    }
  }

  static constexpr double kBucketBytes = 1024;  // the smallest: a bucket per block, parts of rows
  static inline std::string llama_path_, gpt_odd_path_;
};

using R = Recompute;
constexpr Schedule kShardedOneFOneB = Schedule::Schedule_1f1b;

TEST_F(ZeroGradientsTest, TiedGptOnOneStageZero2AndZero3) {
  for (int zero : {2, 3}) {
    const Plan plan = sharded(test_plan(gpt(), cluster(), {{1, 2, zero, {6}}}, kShardedOneFOneB, 2));
    const std::string name = fmt::format("dp2-zero{}-tied", zero);
    expect_gradient_memory(plan, gpt(), expect_matches_zero0(plan, gpt_path_, name), name);
  }
}

TEST_F(ZeroGradientsTest, FourReplicasZero3) {
  const Plan plan = sharded(test_plan(gpt(), cluster(), {{1, 4, 3, {6}}}, kShardedOneFOneB, 2));
  expect_gradient_memory(plan, gpt(), expect_matches_zero0(plan, gpt_path_, "dp4-zero3"), "dp4-zero3");
}

TEST_F(ZeroGradientsTest, LlamaFourReplicasZero2) {
  const Plan plan = sharded(test_plan(llama(), cluster(), {{1, 4, 2, {4}}}, kShardedOneFOneB, 2));
  expect_gradient_memory(plan, llama(), expect_matches_zero0(plan, llama_path_, "llama-dp4-zero2"), "llama-dp4-zero2");
}

// Two blocks a stage: on the last, the shard and the bucket of a block with the head hold more
// than the stage's gradients at dp 2, so only the bound is checked.
TEST_F(ZeroGradientsTest, LlamaPipeline) {
  const Plan plan = sharded(test_plan(llama(), cluster(), {{1, 2, 2, {2}}, {1, 2, 3, {2}}}, kShardedOneFOneB, 4));
  expect_gradient_memory(plan, llama(), expect_matches_zero0(plan, llama_path_, "llama-pp2-dp2"), "llama-pp2-dp2", {-1});
}

TEST_F(ZeroGradientsTest, LlamaInterleaved) {
  expect_matches_zero0(sharded(test_plan(llama(), cluster(), {{1, 2, 2, {1, 1}}, {1, 2, 3, {1, 1}}},
                                         Schedule::Schedule_interleaved, 2)),
                       llama_path_, "llama-interleaved-dp2");
}

TEST_F(ZeroGradientsTest, TensorAndSequenceParallelWithRecomputation) {
  const Plan plan =
      sharded(test_plan(gpt(), cluster(), {{2, 2, 3, {6}, {R::Recompute_full, R::Recompute_selective}, true}}, kShardedOneFOneB, 2));
  expect_gradient_memory(plan, gpt(), expect_matches_zero0(plan, gpt_path_, "tp2-sp-dp2-zero3"), "tp2-sp-dp2-zero3");
}

// 257 rows over tp 2 make the tp ranks' first buckets 32 floats apart, so the dp 2 pieces split
// block 0's MLP norm at different elements (its weight on tp rank 0, its bias on tp rank 1; an
// FFN width of 256 puts the split there): the norms' sums over tp must not pair pieces.
TEST_F(ZeroGradientsTest, SequenceParallelWithAnUnevenVocabularySplit) {
  const Plan plan = sharded(test_plan(model_load(gpt_odd_path_), cluster(), {{2, 2, 2, {6}, {}, true}}, kShardedOneFOneB, 2));
  expect_matches_zero0(plan, gpt_odd_path_, "tp2-sp-dp2-v257");
}

TEST_F(ZeroGradientsTest, TiedAcrossThePipelineWithRecomputation) {
  const Plan plan = sharded(test_plan(gpt(), cluster(),
                                      {{1, 2, 2, {3}, {R::Recompute_full, R::Recompute_selective, R::Recompute_none}},
                                       {1, 2, 3, {3}, {R::Recompute_selective, R::Recompute_full, R::Recompute_none}}},
                                      kShardedOneFOneB, 2));
  // The last stage keeps the whole tied table in its shard besides its 3 blocks' pieces.
  expect_gradient_memory(plan, gpt(), expect_matches_zero0(plan, gpt_path_, "tied-pp2-dp2"), "tied-pp2-dp2", {0});
}

TEST_F(ZeroGradientsTest, UnevenReplicas) {
  const Plan plan = sharded(with_uneven_replicas(test_plan(gpt(), cluster(), {{1, 3, 2, {6}}}, kShardedOneFOneB, 2), 0, {2, 1, 1}));
  expect_gradient_memory(plan, gpt(), expect_matches_zero0(plan, gpt_path_, "uneven-dp3-zero2"), "uneven-dp3-zero2");
}

// The cost model's arena bytes per rank against the measured peak, for sharded plans priced as
// the planner prices them (shard plus the buckets in use): dp 2, 4 and 8, ZeRO 2 and 3, with a
// pipeline, tensor and sequence parallelism, GPT-2 (tied) and LLaMA; and three plans that offload
// blocks under ZeRO 1, 2 and 3 with gradients accumulated in full.
TEST_F(ZeroGradientsTest, ArenaPeaksAsPredicted) {
  TrainSpec train = train_load(std::string(ALLOY_SOURCE_DIR) + "/examples/train/tiny-cpu.yaml");
  train.seq_len = kTestSeqLen;
  train.global_batch_sequences = kTestGlobalBatch;
  train.gradient_bucket_mib = kBucketBytes / (1024.0 * 1024.0);
  struct Case {
    std::string name;
    Plan plan;
    bool llama;
  };
  // Gradients accumulated in full with blocks offloaded (per stage): the window on the device,
  // the rest of the blocks' state in host memory.
  const auto offloaded = [](Plan plan, const std::vector<std::vector<bool>>& flags) {
    for (size_t s = 0; s < flags.size(); ++s) {
      plan.stages[s].offload = flags[s];
      plan.stages[s].shard_gradients = false;
    }
    return plan;
  };
  const std::vector<Case> cases = {
      {"predicted-dp2-zero2", sharded(test_plan(gpt(), cluster(), {{1, 2, 2, {6}}}, kShardedOneFOneB, 2)), false},
      {"predicted-dp4-zero3", sharded(test_plan(gpt(), cluster(), {{1, 4, 3, {6}}}, kShardedOneFOneB, 2)), false},
      {"predicted-dp8-zero2", sharded(test_plan(llama(), cluster(), {{1, 8, 2, {4}}}, kShardedOneFOneB, 1)), true},
      {"predicted-llama-dp4-zero3", sharded(test_plan(llama(), cluster(), {{1, 4, 3, {4}}}, kShardedOneFOneB, 2)), true},
      {"predicted-pp2-dp2", sharded(test_plan(llama(), cluster(), {{1, 2, 2, {2}}, {1, 2, 3, {2}}}, kShardedOneFOneB, 4)),
       true},
      {"predicted-tp2-sp-dp2-zero3",
       sharded(test_plan(gpt(), cluster(), {{2, 2, 3, {6}, {}, true}}, kShardedOneFOneB, 2)),
       false},
      {"predicted-dp2-zero2-offload",
       offloaded(sharded(test_plan(gpt(), cluster(), {{1, 2, 2, {6}}}, kShardedOneFOneB, 2)),
                 {{true, false, true, true, false, false}}),
       false},
      {"predicted-dp4-zero3-offload",
       offloaded(sharded(test_plan(gpt(), cluster(), {{1, 4, 3, {6}}}, kShardedOneFOneB, 2)),
                 {{false, true, true, false, true, false}}),
       false},
      {"predicted-pp2-dp2-zero1-offload",
       offloaded(sharded(test_plan(llama(), cluster(), {{1, 2, 1, {2}}, {1, 2, 0, {2}}}, kShardedOneFOneB, 4)),
                 {{false, true}, {true, false}}),
       true},
  };
  for (const Case& c : cases) {
    Plan plan = c.plan;
    const ModelSpec spec = c.llama ? llama() : gpt();
    plan_evaluate(&plan, CostModel(spec, cluster(), train));
    const Run got = run(plan, c.llama ? llama_path_ : gpt_path_, c.name);
    const std::vector<RankInfo> ranks = plan_rank_map(plan);
    ASSERT_EQ(got.peak_by_name.size(), ranks.size()) << c.name;
    for (size_t q = 0; q < ranks.size(); ++q) {
      double measured = 0;
      for (const auto& [label, bytes] : got.peak_by_name.at(static_cast<int>(q))) measured += bytes;
      const PlanStage& st = plan.stages[static_cast<size_t>(ranks[q].stage)];
      const double predicted = dist_predicted_arena_bytes(st.replica(plan.micro_batch_sequences, ranks[q].dp_rank).memory);
      const double error = (predicted - measured) / measured;
      std::printf("%s rank %zu: arena peak %.0f bytes, predicted %.0f (%+.1f%%)\n", c.name.c_str(), q, measured, predicted,
                  100 * error);
      EXPECT_LT(std::abs(error), 0.05) << c.name << " rank " << q;
    }
  }
}

// gradient_communication: bf16 sends ZeRO 2-3 reductions in bf16, summed in fp32: strategy (a)
// over 4 replicas (8 reduce-scatters of a step's two micro-batches) and (b) under ZeRO 3 with a
// pipeline. Each member's gradients are rounded to bf16 (relative error <= 2^-9) once per
// reduction. An AdamW step moves a weight by at most the learning rate, and over these 10
// warm-up steps the rates sum to 5.5e-3; rounding shifts m / sqrt(v) little, except for
// gradients near zero whose sign it may flip. Bounds: 1e-3 in weight (under a fifth of that sum)
// and 1e-4 in loss (relative); measured 2.0e-4 and 6.2e-7 at most. They must move too (the
// values do cross the wire in bf16); fp32 ZeRO runs stay within 2.4e-7 of ZeRO 0.
TEST_F(ZeroGradientsTest, Bf16OnTheWireStaysCloseToFp32) {
  std::string text = read_text(dir_->path() + "/dist-train.yaml");
  dir_->write("dist-train-bf16.yaml", text + "gradient_communication: bf16\n");
  const std::vector<std::pair<std::string, Plan>> cases = {
      {"bf16-dp4-zero2-sharded", sharded(test_plan(gpt(), cluster(), {{1, 4, 2, {6}}}, kShardedOneFOneB, 2))},
      {"bf16-pp2-dp2-zero3-full",
       test_plan(gpt(), cluster(), {{1, 2, 3, {3}}, {1, 2, 3, {3}}}, kShardedOneFOneB, 4)},
  };
  for (const auto& [name, plan] : cases) {
    const Run fp32 = run(plan, gpt_path_, name + "-fp32");
    const Run bf16 = run(plan, gpt_path_, name, "dist-train-bf16.yaml");
    ASSERT_EQ(bf16.losses.size(), fp32.losses.size()) << name;
    ASSERT_EQ(bf16.losses.size(), static_cast<size_t>(kShardedSteps)) << name;
    double moved = 0;
    for (size_t i = 0; i < fp32.losses.size(); ++i) {
      const double relative = std::abs(bf16.losses[i] - fp32.losses[i]) / fp32.losses[i];
      moved = std::max(moved, relative);
      EXPECT_LT(relative, 1e-4) << name << " step " << i + 1;
    }
    const double weights = largest_weight_difference(fp32.weights, bf16.weights);
    std::printf("%s: largest loss difference from fp32 on the wire %.3g (relative), weight %.3g\n", name.c_str(), moved,
                weights);
    EXPECT_GT(weights, 0.0) << name << ": nothing was rounded";
    EXPECT_LT(weights, 1e-3) << name;
  }
}

// A NaN injected into rank 1's shard (ALLOY_FAULT=nan:R:S) is found by the norm on every rank and
// named from the shard's pieces.
TEST_F(ZeroGradientsTest, NonFiniteGradientInTheShardStopsEveryRank) {
  const Plan plan = sharded(test_plan(gpt(), cluster(), {{1, 2, 2, {6}}}, kShardedOneFOneB, 2));
  const std::string plan_path = dir_->path() + "/nan-dp2.json";
  plan_save(plan, plan_path);
  const CommandResult r = run_command(
      fmt::format("env ALLOY_FAULT=nan:1:3 mpirun -np 2 --oversubscribe --bind-to none {} train --model {} --data {} "
                  "--train {}/dist-train.yaml --steps 5 --no-progress --plan {} --cluster {}",
                  ALLOY_BINARY, gpt_path_, data_, dir_->path(), plan_path, cluster_path_),
      120);
  EXPECT_EQ(r.exit_code, kExitNonFinite) << r.output;
  EXPECT_NE(r.output.find("step 3: layers."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'s gradient on rank 1 is not finite"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace alloy::testing
