// Layer offload at run time: a plan with offloaded blocks (weights, saved activations or both)
// trains with losses and weights bit-identical to the same plan without offload, needs less device memory, shows its copies in
// the trace and resumes exactly; under data parallelism (ZeRO 0-3) it matches the same layout
// without offload; offload with sharded gradients, and offloaded state over the host memory, are
// refused before training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "dist_plans.hpp"
#include "hw/catalog.hpp"
#include "runtime/io/safetensors.hpp"

namespace alloy::testing {

class OffloadTest : public DistGptSuite<OffloadTest> {
 protected:

  static ClusterSpec cluster() { return cluster_load(cluster_path_, catalog_builtin()); }

  // A 2-stage 1F1B pipeline of gpt-6 over 3 ranks: tp 2 then tp 1, 4 micro-batches, mixed
  // recomputation; `offloaded` marks blocks 0-5 (stage 0 holds 0-2, stage 1 3-5).
  using R = Recompute;

  static Plan pipeline(const std::vector<bool>& offloaded, int depth, const ClusterSpec& on = cluster(),
                       const std::vector<bool>& activations = {}) {
    Plan plan = test_plan(model_load(gpt_path_), on,
                          {{2, 1, 0, {3}, {R::Recompute_none, R::Recompute_full, R::Recompute_none}},
                           {1, 1, 0, {3}, {R::Recompute_selective, R::Recompute_none, R::Recompute_none}}},
                          Schedule::Schedule_1f1b, 4);
    for (size_t s = 0; s < 2; ++s) {
      plan.stages[s].offload.assign(offloaded.begin() + 3 * static_cast<long>(s), offloaded.begin() + 3 * static_cast<long>(s) + 3);
      plan.stages[s].offload_prefetch_depth = depth;
      if (!activations.empty())
        plan.stages[s].offload_activations.assign(activations.begin() + 3 * static_cast<long>(s),
                                                  activations.begin() + 3 * static_cast<long>(s) + 3);
    }
    return plan;
  }

  static CommandResult train(const Plan& plan, const std::string& name, int steps, const std::string& extra = "",
                             const std::string& cluster_file = cluster_path_) {
    const std::string plan_path = dir_->path() + "/" + name + ".json";
    plan_save(plan, plan_path);
    return run_command(fmt::format("mpirun -np {} --oversubscribe --bind-to none {} train --model {} --data {} --train "
                                   "{}/dist-train.yaml --steps {} --no-progress --plan {} --cluster {} "
                                   "--log {}/{}.jsonl {}",
                                   plan.num_used_devices(), ALLOY_BINARY, gpt_path_, data_, dir_->path(), steps,
                                   plan_path, cluster_file, dir_->path(), name, extra),
                       300);
  }

  static std::vector<nlohmann::json> log(const std::string& name) {
    std::vector<nlohmann::json> lines;
    std::istringstream in(read_text(dir_->path() + "/" + name + ".jsonl"));
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  // 4 steps in one run against 2, a checkpoint, and 2 more resumed from it: the same losses.
  static void expect_resume_exact(const Plan& plan, const std::string& name) {
    const std::string ck = dir_->path() + "/" + name + "-ck";
    ASSERT_EQ(train(plan, name + "-full", 4).exit_code, 0);
    ASSERT_EQ(train(plan, name + "-part", 2, "--checkpoint " + ck).exit_code, 0);
    CommandResult r = train(plan, name + "-part", 4, fmt::format("--checkpoint {} --resume", ck));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<nlohmann::json> full = log(name + "-full"), part = log(name + "-part");
    ASSERT_EQ(full.size(), 4u);
    ASSERT_EQ(part.size(), 4u);
    for (size_t i = 0; i < full.size(); ++i)
      EXPECT_EQ(full[i].at("loss").get<double>(), part[i].at("loss").get<double>()) << name << " step " << i + 1;
  }

  static std::vector<float> weights(const std::string& path, const std::string& name) {
    SafetensorsFile file = safetensors_open(path);
    const SafetensorsEntry* e = file.entry_find(name);
    if (e == nullptr) return {};
    std::vector<float> values((e->end_bytes - e->begin_bytes) / 4);
    file.entry_copy(*e, values.data());
    return values;
  }
};

TEST_F(OffloadTest, LossesAndWeightsAreBitIdenticalToTheSamePlanWithoutOffload) {
  const std::vector<bool> none(6, false), some = {true, true, false, false, true, true};
  const std::vector<bool> others = {true, false, true, true, true, false};
  const std::string trace = dir_->path() + "/offload-trace.json";
  for (const auto& [name, offloaded, depth, activations, extra] :
       {std::tuple{"plain", none, 1, none, std::string()}, std::tuple{"offload-1", some, 1, none, std::string()},
        std::tuple{"offload-2", some, 2, none, "--trace " + trace},
        std::tuple{"offload-activations", none, 1, others, std::string()},
        std::tuple{"offload-both", some, 2, others, std::string()}}) {
    CommandResult r = train(pipeline(offloaded, depth, cluster(), activations), name, 6,
                            fmt::format("--export {}/{}.safetensors {}", dir_->path(), name, extra));
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
  }
  const std::vector<nlohmann::json> plain = log("plain");
  ASSERT_EQ(plain.size(), 6u);
  for (const char* name : {"offload-1", "offload-2", "offload-activations", "offload-both"}) {
    const std::vector<nlohmann::json> got = log(name);
    ASSERT_EQ(got.size(), plain.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].at("loss").get<double>(), plain[i].at("loss").get<double>()) << name << " step " << i + 1;
      EXPECT_EQ(got[i].at("grad_norm").get<double>(), plain[i].at("grad_norm").get<double>()) << name << " step " << i + 1;
      // Stage 1 (rank 2) keeps one block of three resident, or the activations of one: its
      // arena peak must drop.
      EXPECT_LT(got[i].at("ranks")[2].at("peak_arena_bytes").get<double>(),
                plain[i].at("ranks")[2].at("peak_arena_bytes").get<double>()) << name;
    }
    const std::string a = dir_->path() + "/plain.safetensors", b = dir_->path() + fmt::format("/{}.safetensors", name);
    for (const char* tensor : {"layers.0.attn.qkv.weight", "layers.4.mlp.up.weight", "layers.5.mlp.down.bias"}) {
      const std::vector<float> x = weights(a, tensor), y = weights(b, tensor);
      ASSERT_FALSE(x.empty()) << tensor;
      EXPECT_EQ(x, y) << name << " " << tensor;
    }
  }
  // The real run's trace shows the copies over the host link as their own stream.
  std::set<std::string> copies;
  const nlohmann::json doc = nlohmann::json::parse(read_text(trace));
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "X" && (e.at("cat") == "prefetch" || e.at("cat") == "evict")) copies.insert(e.at("cat").get<std::string>());
  EXPECT_EQ(copies, (std::set<std::string>{"prefetch", "evict"}));
}

TEST_F(OffloadTest, ResumeWithOffloadContinuesExactly) {
  expect_resume_exact(pipeline({false, true, false, true, false, true}, 1), "resume");
}

TEST_F(OffloadTest, ActivationOffloadRunsWithShardedDataParallelism) {
  // ZeRO 1 over dp 2 keeps each member's moments sharded; parked activations do not change that.
  Plan plain = test_plan(model_load(gpt_path_), cluster(), {{1, 2, 1, {6}}}, Schedule::Schedule_1f1b, 2);
  Plan parked = plain;
  parked.stages[0].offload_activations = {true, true, true, false, false, false};
  ASSERT_EQ(train(plain, "zero1-plain", 3).exit_code, 0);
  CommandResult r = train(parked, "zero1-parked", 3);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<nlohmann::json> a = log("zero1-plain"), b = log("zero1-parked");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at("loss").get<double>(), b[i].at("loss").get<double>()) << "step " << i + 1;
    for (size_t rank = 0; rank < 2; ++rank)
      EXPECT_LT(b[i].at("ranks")[rank].at("peak_arena_bytes").get<double>(),
                a[i].at("ranks")[rank].at("peak_arena_bytes").get<double>()) << "rank " << rank;
  }
}

// Offloaded blocks under data parallelism: their gradients are reduced in host memory after the
// last write-back and (ZeRO 1-3) each member updates its piece there before the gather; under
// ZeRO 3 the device's blocks are gathered for each use as without offload. Losses
// and weights must match the same layout without offload (the reductions' pieces differ, so
// the gradient norm's sum may round differently: 1e-6, the ZeRO equivalence tolerance).
TEST_F(OffloadTest, DataParallelOffloadMatchesTheSameLayoutWithoutOffload) {
  const ModelSpec gpt = model_load(gpt_path_);
  // A slow host link (a gpt-6 block's gradients take ~5 ms back): a reduction that did not wait
  // for the write-back would sum stale gradients.
  const std::string slow_path = dir_->write("slow-host-link.yaml", R"(name: local-cpu-8-slow-link
device_types:
  cpu-fast: {base: cpu, memory: 2GiB}
nodes:
  - {name: host, count: 1, device: cpu-fast, devices_per_node: 8, host_memory: 16GiB, host_link: 10MB/s}
)");
  const ClusterSpec slow = cluster_load(slow_path, catalog_builtin());
  const auto offloading = [](Plan plan, const std::vector<std::vector<bool>>& flags) {
    for (size_t s = 0; s < flags.size(); ++s) plan.stages[s].offload = flags[s];
    return plan;
  };
  const std::vector<bool> some = {true, false, true, true, false, false};
  std::vector<std::pair<std::string, Plan>> cases;
  for (int zero = 0; zero <= 3; ++zero)
    cases.emplace_back(fmt::format("dp2-zero{}", zero),
                       offloading(test_plan(gpt, slow, {{1, 2, zero, {6}}}, Schedule::Schedule_1f1b, 2), {some}));
  // A pipeline with tensor parallelism, the tied table between its ends and 4 micro-batches.
  cases.emplace_back("pp2-tp2-dp2", offloading(test_plan(gpt, slow,
                                                         {{2, 2, 3, {3}, {R::Recompute_none, R::Recompute_full, R::Recompute_none}},
                                                          {1, 2, 1, {3}}},
                                                         Schedule::Schedule_1f1b, 4),
                                               {{false, true, true}, {true, false, true}}));
  // Interleaved: two chunks per stage, each stage offloading a block of one of them.
  cases.emplace_back("interleaved-zero3", offloading(test_plan(gpt, slow, {{1, 2, 3, {2, 1}}, {1, 2, 2, {1, 2}}},
                                                               Schedule::Schedule_interleaved, 2),
                                                     {{false, true, false}, {true, false, false}}));
  // Uneven replicas: 3 and 1 sequences of each micro-batch, so uneven ZeRO pieces.
  cases.emplace_back("uneven-zero1",
                     offloading(with_uneven_replicas(test_plan(gpt, slow, {{1, 2, 1, {6}}}, Schedule::Schedule_1f1b, 2), 0, {3, 1}),
                                {some}));
  for (const auto& [name, plan] : cases) {
    Plan resident = plan;
    for (PlanStage& st : resident.stages) st.offload.assign(st.offload.size(), false);
    for (const auto& [suffix, run] : {std::pair{"-resident", resident}, std::pair{"", plan}}) {
      CommandResult r =
          train(run, name + suffix, 4, fmt::format("--export {}/{}{}.safetensors", dir_->path(), name, suffix), slow_path);
      ASSERT_EQ(r.exit_code, 0) << name << suffix << "\n" << r.output;
    }
    const std::vector<nlohmann::json> want = log(name + "-resident"), got = log(name);
    ASSERT_EQ(got.size(), 4u) << name;
    ASSERT_EQ(want.size(), 4u) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      const double loss = want[i].at("loss").get<double>();
      EXPECT_NEAR(got[i].at("loss").get<double>(), loss, 1e-6 * loss) << name << " step " << i + 1;
      // Rank 0 offloads blocks of its stage in every case: its device arena peak must drop.
      EXPECT_LT(got[i].at("ranks")[0].at("peak_arena_bytes").get<double>(),
                want[i].at("ranks")[0].at("peak_arena_bytes").get<double>()) << name;
    }
    for (const char* tensor : {"layers.0.attn.qkv.weight", "layers.2.mlp.up.weight", "layers.5.mlp.down.bias", "embed.token"}) {
      const std::vector<float> x = weights(dir_->path() + "/" + name + "-resident.safetensors", tensor),
                               y = weights(dir_->path() + "/" + name + ".safetensors", tensor);
      ASSERT_EQ(x.size(), y.size()) << name << " " << tensor;
      ASSERT_FALSE(x.empty()) << name << " " << tensor;
      double worst = 0;
      for (size_t k = 0; k < x.size(); ++k) worst = std::max(worst, static_cast<double>(std::abs(x[k] - y[k])));
      EXPECT_LT(worst, 1e-6) << name << " " << tensor;
    }
  }
}

TEST_F(OffloadTest, ResumeWithDataParallelOffloadContinuesExactly) {
  // ZeRO 3 over dp 2: each member keeps pieces of the device's weights and whole offloaded
  // blocks, and moments of its pieces of both (the offloaded blocks' in host memory).
  Plan plan = test_plan(model_load(gpt_path_), cluster(), {{1, 2, 3, {6}}}, Schedule::Schedule_1f1b, 2);
  plan.stages[0].offload = {false, true, true, false, true, false};
  expect_resume_exact(plan, "dp-resume");
}

TEST_F(OffloadTest, OffloadWithShardedGradientsIsRefusedBeforeTraining) {
  Plan plan = test_plan(model_load(gpt_path_), cluster(), {{1, 2, 2, {6}}}, Schedule::Schedule_1f1b, 2);
  plan.stages[0].offload[0] = true;
  plan.stages[0].shard_gradients = true;
  CommandResult r = train(plan, "shard-offload", 2);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("stages[0].shard_gradients"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("set shard_gradients to false"), std::string::npos) << r.output;
}

TEST_F(OffloadTest, OffloadOverTheHostMemoryIsRefusedBeforeTraining) {
  // 8 devices share 64 KiB of host memory: 8 KiB each, less than one gpt-6 block's state.
  const std::string tight = dir_->write("tight-host.yaml", R"(name: local-cpu-8
device_types:
  cpu-fast: {base: cpu, memory: 2GiB}
nodes:
  - {name: host, count: 1, device: cpu-fast, devices_per_node: 8, host_memory: 64KiB}
)");
  const Plan plan = pipeline({true, false, false, false, false, false}, 1, cluster_load(tight, catalog_builtin()));
  const std::string plan_path = dir_->path() + "/tight.json";
  plan_save(plan, plan_path);
  CommandResult r = run_command(fmt::format("mpirun -np 3 --oversubscribe --bind-to none {} train --model {} --data {} "
                                            "--steps 2 --no-progress --plan {} --cluster {}",
                                            ALLOY_BINARY, gpt_path_, data_, plan_path, tight),
                                120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("host_memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("offload fewer blocks"), std::string::npos) << r.output;
}

TEST_F(OffloadTest, UnderACapNothingElseFitsThePlannerOffloadsAndTrainingStaysUnderIt) {
  // An 8-block model whose weights, gradients and moments alone (~100 MiB) exceed the 56 MiB device.
  const std::string model = dir_->write("gpt-8w.yaml", R"(name: gpt-8w
family: gpt2
layers: 8
hidden_size: 256
heads: 4
ffn_hidden_size: 1024
vocab_size: 256
max_seq_len: 64
tied_embeddings: true
norm_eps: 1.0e-5
)");
  const std::string tight = dir_->write("cpu-tight.yaml", R"(name: cpu-tight
device_types:
  cpu-small: {base: cpu, memory: 56MiB}
nodes:
  - {name: host, count: 1, device: cpu-small, devices_per_node: 1, host_memory: 4GiB, host_link: 4GB/s}
)");
  const std::string train = fmt::format("{}/examples/train/tiny-cpu.yaml", ALLOY_SOURCE_DIR);
  CommandResult refused = run_command(fmt::format("{} plan -m {} -c {} -t {} --no-offload", ALLOY_BINARY, model, tight, train));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  // The planner's own choice, then with four layers' activations parked in host memory as well.
  for (const std::string pins : {"", "--offload-activations 4"}) {
    const std::string plan_path = dir_->path() + "/tight-plan.json";
    CommandResult planned =
        run_command(fmt::format("{} plan -m {} -c {} -t {} {} -o {}", ALLOY_BINARY, model, tight, train, pins, plan_path));
    ASSERT_EQ(planned.exit_code, 0) << planned.output;
    const Plan plan = plan_load(plan_path);
    ASSERT_EQ(plan.stages.size(), 1u);
    const PlanStage& st = plan.stages[0];
    EXPECT_NE(std::find(st.offload.begin(), st.offload.end(), true), st.offload.end()) << pins;
    EXPECT_EQ(std::count(st.offload_activations.begin(), st.offload_activations.end(), true), pins.empty() ? 0 : 4);
    double predicted = 0;
    for (const MemoryTerm& t : st.memory)
      if (t.name != "framework_context" && t.name != "communication_buffers" && t.name != "allocator_margin" &&
          t.name != "host_offload")
        predicted += t.bytes;

    CommandResult r = run_command(fmt::format("{} train --model {} --data {} --steps 3 --no-progress --plan {} --cluster {} "
                                              "--log {}/tight.jsonl",
                                              ALLOY_BINARY, model, data_, plan_path, tight, dir_->path()),
                                  120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<nlohmann::json> steps = log("tight");
    ASSERT_GE(steps.size(), 3u);
    for (size_t i = steps.size() - 3; i < steps.size(); ++i) {
      const double peak = steps[i].at("peak_arena_bytes").get<double>();
      EXPECT_LE(peak, 56.0 * 1024 * 1024) << pins;
      EXPECT_NEAR(peak / predicted, 1.0, 0.05) << pins << ": measured " << peak << " B, predicted " << predicted << " B";
    }
  }
}

}  // namespace alloy::testing
