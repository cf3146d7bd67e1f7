// The planner emits only plans the runtime accepts, and accepts every pin some runnable plan
// has: random small models (odd key/value heads included) on the shipped clusters with random
// pins, each emitted plan put through the runtime's plan checks (without training), and each
// refused pin checked against the runtime's own answer.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "../support/specs.hpp"
#include "hw/catalog.hpp"
#include "plan/runnable.hpp"
#include "runtime/stage_backend.hpp"
#include "runtime/trainer.hpp"
#include "runtime/trainer_setup.hpp"
#include "search/planner.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

ClusterSpec shipped_cluster(const std::string& name) {
  return cluster_load(std::string(ALLOY_SOURCE_DIR) + "/examples/clusters/" + name + ".yaml", catalog_builtin());
}

// Every check `alloy train --plan` makes before it allocates anything, on the CPU backend.
void runtime_checks_run(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster) {
  plan_validate_for(plan, model, cluster, "plan.json");
  stage_backend_check_plan("cpu", plan, "plan.json");
  TrainerOptions options;
  options.plan_path = "plan.json";
  trainer_check_plan(plan, model, cluster, options);
}

// A small model of either family: heads 1-8 with a random divisor as key/value heads (odd counts
// included), an FFN width that is sometimes odd, a vocabulary that sometimes is.
ModelSpec random_model(std::mt19937& rng, int index) {
  auto pick = [&](std::vector<int> values) { return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)]; };
  const int heads = pick({1, 2, 3, 4, 6, 8});
  std::vector<int> divisors;
  for (int d = 1; d <= heads; ++d)
    if (heads % d == 0) divisors.push_back(d);
  const int head_dim = pick({8, 16});
  const int hidden = heads * head_dim;
  const int layers = pick({1, 2, 3, 4, 6});
  const int vocab = pick({256, 250, 97});
  const std::string name = "random-" + std::to_string(index);
  ModelSpec m = pick({0, 1}) == 0 ? testing::gpt2(name, layers, hidden, heads, vocab, 128)
                                  : testing::llama(name, layers, hidden, heads, pick(divisors), hidden * 2 + pick({0, 8, 3}), vocab);
  m.max_seq_len = 128;
  return m;
}

// Random pins, each set with probability 1/4.
SearchOptions random_pins(std::mt19937& rng) {
  auto maybe = [&]() { return std::uniform_int_distribution<int>(0, 3)(rng) == 0; };
  auto pick = [&](std::vector<int> values) { return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)]; };
  SearchOptions o;
  if (maybe()) o.tp = pick({1, 2, 4, 8});
  if (maybe()) o.dp = pick({1, 2, 3, 4, 8});
  if (maybe()) o.pp = pick({1, 2, 3, 4});
  if (maybe()) o.zero = pick({0, 1, 2, 3});
  if (maybe()) o.recompute = static_cast<Recompute>(pick({0, 1, 2}));
  if (maybe()) o.allow_offload = false;
  if (maybe()) o.micro_batch_sequences = pick({1, 2, 4});
  if (maybe()) o.sequence_parallel = pick({0, 1}) == 1;
  if (maybe()) o.shard_gradients = pick({0, 1}) == 1;
  o.runner_ups = 3;
  o.threads = 1;
  return o;
}

std::string pins_describe(const SearchOptions& o) {
  return "tp " + std::to_string(o.tp) + " dp " + std::to_string(o.dp) + " pp " + std::to_string(o.pp) + " zero " +
         std::to_string(o.zero) + " recompute " + (o.recompute ? recompute_name(*o.recompute) : "free") + " offload " +
         (o.allow_offload ? "yes" : "no") + " micro " + std::to_string(o.micro_batch_sequences) + " sp " +
         (o.sequence_parallel ? (*o.sequence_parallel ? "1" : "0") : "free") + " gradients " +
         (o.shard_gradients ? (*o.shard_gradients ? "shard" : "full") : "free");
}

// The emitted plan has what was pinned; a pinned ZeRO stage on a stage of one replica, which
// has nothing to shard over, runs as ZeRO 0 and the plan says so.
void expect_pins_kept(const Plan& plan, const SearchOptions& o) {
  EXPECT_TRUE(o.pp == 0 || static_cast<int>(plan.stages.size()) == o.pp);
  EXPECT_TRUE(o.micro_batch_sequences == 0 || plan.micro_batch_sequences == o.micro_batch_sequences);
  for (const PlanStage& st : plan.stages) {
    EXPECT_TRUE(o.tp == 0 || st.tp == o.tp);
    EXPECT_TRUE(o.dp == 0 || st.dp == o.dp);
    EXPECT_TRUE(o.zero < 0 || st.zero == o.zero || (st.dp == 1 && st.zero == 0));
    if (o.zero >= 1 && st.dp == 1) {
      EXPECT_TRUE(std::any_of(plan.notes.begin(), plan.notes.end(),
                              [](const std::string& n) { return n.find("nothing to shard over") != std::string::npos; }));
    }
    if (o.shard_gradients && st.zero >= 2 && st.dp > 1) {
      EXPECT_EQ(st.gradients_sharded(), *o.shard_gradients);
    }
    EXPECT_TRUE(!o.sequence_parallel || st.tp == 1 || st.sequence_parallel == *o.sequence_parallel);
    EXPECT_TRUE(o.allow_offload || std::count(st.offload.begin(), st.offload.end(), true) == 0);
    for (Recompute r : st.recompute) EXPECT_TRUE(!o.recompute || r == *o.recompute);
  }
}

// A pin the planner refuses: when the refusal names tensor parallelism the runtime refuses that
// tp as well; otherwise the message says which other limit rules it out (the batch, the devices,
// memory), none of which is a runtime limit the planner does not know.
void expect_refusal_explained(const Error& e, const ModelSpec& model, const SearchOptions& o) {
  const std::string what = e.what();
  EXPECT_FALSE(e.hint().empty()) << what;
  if (what.find("--tp") != std::string::npos) {
    EXPECT_FALSE(tp_runnable(model, o.tp).ok) << what;
    return;
  }
  const bool explained = what.find("no layout matches") != std::string::npos ||
                         what.find("nothing fits") != std::string::npos || what.find("divisible") != std::string::npos ||
                         what.find("does not split") != std::string::npos || what.find("layer") != std::string::npos ||
                         what.find("host memory") != std::string::npos ||
                         what.find("nothing to shard") != std::string::npos ||
                         what.find("--gradients") != std::string::npos;
  EXPECT_TRUE(explained) << what;
}

TEST(RunnablePlans, EveryEmittedPlanPassesTheRuntimeChecks) {
  const std::vector<std::string> clusters = {"local-cpu-1", "local-cpu-2", "local-cpu-3", "local-cpu-4",
                                             "local-cpu-small", "a100-8", "h200-1", "a100-v100", "h100-a100-l4",
                                             "mi250x-a100"};
  std::vector<ClusterSpec> specs;
  for (const std::string& name : clusters) specs.push_back(shipped_cluster(name));
  std::mt19937 rng(30);
  const int problems = 5000;
  int plans = 0;
  int refused = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < problems; ++i) {
    const ModelSpec model = random_model(rng, i);
    const ClusterSpec& cluster = specs[std::uniform_int_distribution<size_t>(0, specs.size() - 1)(rng)];
    const TrainSpec train = testing::train(std::uniform_int_distribution<int>(0, 1)(rng) ? 64 : 32,
                                           std::vector<int>{4, 8, 12}[std::uniform_int_distribution<int>(0, 2)(rng)],
                                           Precision::Precision_fp32);
    const SearchOptions pins = random_pins(rng);
    SCOPED_TRACE(model.name + " (heads " + std::to_string(model.num_heads) + ", kv " + std::to_string(model.num_kv_heads) +
                 ", ffn " + std::to_string(model.ffn_hidden_size) + ", vocab " + std::to_string(model.vocab_size) +
                 ") on " + cluster.name + ", batch " + std::to_string(train.global_batch_sequences) + ", pins " +
                 pins_describe(pins));
    CostModel cost(model, cluster, train);
    SearchResult result;
    try {
      result = plan_search(cost, pins);
    } catch (const Error& e) {
      ++refused;
      expect_refusal_explained(e, model, pins);
      continue;
    }
    for (const Plan& plan : result.candidates) {
      ++plans;
      EXPECT_NO_THROW(runtime_checks_run(plan, model, cluster)) << plan_render_text(plan);
      expect_pins_kept(plan, pins);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("%d problems: %d plans checked, %d pinned problems refused, %.1f s\n", problems, plans, refused, seconds);
  EXPECT_GT(plans, problems);  // most problems plan, with runner-ups
  EXPECT_GT(refused, 0);       // and some pins are refused
}

TEST(RunnablePlans, TensorParallelismThatDoesNotDivideTheKvHeadsIsNeverPlanned) {
  const ClusterSpec cluster = testing::cluster("cpu4", {shipped_cluster("local-cpu-1").device_types.front()}, {{0, 1, 4}});
  for (int kv : {1, 2}) {
    const ModelSpec model = testing::llama("kv" + std::to_string(kv), 2, 64, 4, kv, 176, 256);
    CostModel cost(model, cluster, testing::train(64, 8, Precision::Precision_fp32));
    SearchOptions free_search;
    free_search.runner_ups = 8;
    for (const Plan& plan : plan_search(cost, free_search).candidates)
      for (const PlanStage& st : plan.stages) EXPECT_EQ(kv % st.tp, 0) << plan_render_text(plan);
    SearchOptions pinned;
    pinned.tp = kv * 2;
    try {
      plan_search(cost, pinned);
      FAIL() << "tp " << pinned.tp << " with " << kv << " key/value heads was planned";
    } catch (const Error& e) {
      EXPECT_EQ(e.where().field, "--tp");
      EXPECT_NE(std::string(e.what()).find("key/value heads (" + std::to_string(kv) + ")"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find(kv == 1 ? ": 1" : ": 1, 2"), std::string::npos) << e.hint();
    }
  }
}

TEST(RunnablePlans, PinnedDataParallelismOverEveryDeviceTypeIsAccepted) {
  const ClusterSpec cluster = shipped_cluster("local-cpu-4");
  const ModelSpec model = model_load(std::string(ALLOY_SOURCE_DIR) + "/examples/models/tiny-llama.yaml");
  CostModel cost(model, cluster, train_load(std::string(ALLOY_SOURCE_DIR) + "/examples/train/tiny-cpu.yaml"));
  SearchOptions free_search;
  const Plan chosen = plan_search(cost, free_search).plan;
  SearchOptions pinned;
  pinned.dp = 4;
  const Plan plan = plan_search(cost, pinned).plan;
  ASSERT_EQ(plan.stages.size(), 1u);
  EXPECT_EQ(plan.stages.front().dp, 4);
  EXPECT_NO_THROW(runtime_checks_run(plan, model, cluster));
  // Pinning what the planner picks by itself gives the same layout.
  if (chosen.stages.size() == 1 && chosen.stages.front().dp == 4) {
    EXPECT_EQ(plan_layout_fingerprint(plan), plan_layout_fingerprint(chosen));
  }
}

}  // namespace
}  // namespace alloy
