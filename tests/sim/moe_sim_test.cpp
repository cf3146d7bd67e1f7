// The simulator replays a Mixture-of-Experts plan within 5% of the cost model's step and shows
// its all-to-alls.
#include <gtest/gtest.h>

#include <cmath>

#include "cost/moe_cost.hpp"
#include "hw/catalog.hpp"
#include "search/planner.hpp"
#include "sim/simulate.hpp"

namespace alloy {
namespace {

TEST(MoeSim, MixtralPlanAgreesWithThePrediction) {
  const ModelSpec model = model_load("mixtral-8x7b");
  const ClusterSpec cluster = cluster_load("h100-a100", catalog_builtin());
  const CostModel cost(model, cluster, TrainSpec{});
  SearchOptions options;
  options.runner_ups = 0;
  const Plan plan = plan_search(cost, options).plan;
  SimOptions sim_options;
  sim_options.record_intervals = true;
  const SimResult sim = simulate(plan, model, cluster, sim_options);
  EXPECT_LT(std::abs(sim.step_seconds / plan.step_seconds - 1.0), 0.05)
      << "simulated " << sim.step_seconds << " s, predicted " << plan.step_seconds << " s";
  // Every forward and backward pass of a stage with ep > 1 shows its dispatch and combine.
  int passes = 0, exchanges = 0;
  for (const SimInterval& iv : sim.intervals) {
    if (iv.stream == SimStream::SimStream_compute && iv.kind != OpKind::OpKind_optimizer) ++passes;
    if (iv.stream == SimStream::SimStream_all_to_all) {
      ++exchanges;
      EXPECT_GT(iv.end_seconds, iv.start_seconds);
    }
  }
  EXPECT_GT(plan.stages[0].ep, 1);
  EXPECT_EQ(exchanges, passes);
}

// ep 2 under ZeRO 3 with dp 8: each member's routed experts are gathered and reduce-scattered over
// the 4 members holding the same ones, the rest over all 8. The schedule's gathers and reductions
// carry the experts apart, and the simulation agrees with the prediction.
TEST(MoeSim, ExpertDataParallelGroupCarriesTheExperts) {
  const ModelSpec model = model_load("mixtral-8x7b");
  const ClusterSpec cluster = cluster_load("h100-a100", catalog_builtin());
  const CostModel cost(model, cluster, TrainSpec{});
  SearchOptions options;
  options.runner_ups = 0;
  options.dp = 8;
  options.ep = 2;
  options.zero = 3;
  const Plan plan = plan_search(cost, options).plan;
  SimOptions sim_options;
  const SimResult sim = simulate(plan, model, cluster, sim_options);
  EXPECT_LT(std::abs(sim.step_seconds / plan.step_seconds - 1.0), 0.05)
      << "simulated " << sim.step_seconds << " s, predicted " << plan.step_seconds << " s";
  const int64_t expert = 3 * model.hidden_size * model.moe.expert_ffn_hidden_size;
  for (const RankSchedule& lane : sim.schedules) {
    const PlanStage& st = plan.stages[static_cast<size_t>(lane.stage)];
    ASSERT_EQ(st.ep, 2);
    ASSERT_EQ(st.dp, 8);
    int64_t gathered_experts = 0;
    for (const ScheduleOp& op : lane.ops) {
      if (!op_kind_is_collective(op.kind)) continue;
      // Four of the eight experts of every MoE block the op covers, at the op's element size.
      const int64_t per_element = op.expert_bytes / (4 * expert * (op.block_end - op.block_begin));
      EXPECT_EQ(op.expert_bytes, per_element * 4 * expert * (op.block_end - op.block_begin)) << schedule_op_describe(op);
      EXPECT_GE(per_element, 2) << schedule_op_describe(op);
      if (op.kind == OpKind::OpKind_all_gather) gathered_experts += op.expert_bytes;
    }
    EXPECT_GT(gathered_experts, 0);
  }
}

// DeepSeek-MoE-16B with its leading dense block alone on the first stage: that stage holds the
// embedding and a dense block's parameters, exactly, and runs no all-to-all; the other holds 27
// MoE blocks with the experts of its members. The simulator agrees with the prediction.
TEST(MoeSim, DeepSeekLeadingDenseBlockIsPricedAndSimulatedAsDense) {
  const ModelSpec model = model_load("deepseek-moe-16b");
  const ClusterSpec cluster = cluster_load("h100-a100", catalog_builtin());
  const CostModel cost(model, cluster, TrainSpec{});
  SearchOptions options;
  options.runner_ups = 0;
  options.pp = 2;
  options.schedule = Schedule::Schedule_1f1b;
  options.layer_split = {1, 27};
  const Plan plan = plan_search(cost, options).plan;
  ASSERT_EQ(plan.stages.size(), size_t{2});
  const ModelParameterCounts counts = model_parameter_counts(model);
  const double e = precision_bytes(plan.precision);
  const auto parameters = [&](const PlanStage& st) {
    for (const MemoryTerm& t : st.memory)
      if (t.name == "parameters") return t.bytes / e;
    return 0.0;
  };
  // Under ZeRO 3 a member keeps a 1/dp piece of its parameters, of its routed experts one of the
  // dp / ep members holding the same ones.
  const auto kept = [](const PlanStage& st, double held, double routed) {
    return st.zero < 3 || st.dp <= 1 ? held : (held - routed) / st.dp + routed * st.ep / st.dp;
  };
  const PlanStage& first = plan.stages[0];
  EXPECT_NEAR(parameters(first), kept(first, static_cast<double>(embedding_parameters(model) + counts.per_block) / first.tp, 0),
              1e-9 * parameters(first));
  const PlanStage& rest = plan.stages[1];
  const double experts_not_held = (64.0 - 64.0 / rest.ep) * static_cast<double>(moe_expert_parameters(model));
  const double routed_held = 27 * 64.0 / rest.ep * static_cast<double>(moe_expert_parameters(model)) / rest.tp;
  EXPECT_NEAR(parameters(rest),
              kept(rest,
                   (27 * (static_cast<double>(counts.per_moe_block) - experts_not_held) +
                    static_cast<double>(head_parameters(model, true))) / rest.tp,
                   routed_held),
              1e-9 * parameters(rest));
  const SimResult sim = simulate(plan, model, cluster, SimOptions{});
  EXPECT_LT(std::abs(sim.step_seconds / plan.step_seconds - 1.0), 0.05)
      << "simulated " << sim.step_seconds << " s, predicted " << plan.step_seconds << " s";
  SimOptions traced;
  traced.record_intervals = true;
  int exchanges = 0;
  for (const SimInterval& iv : simulate(plan, model, cluster, traced).intervals) {
    if (iv.stream != SimStream::SimStream_all_to_all) continue;
    EXPECT_EQ(iv.lane, 1) << "the dense stage exchanges nothing";
    ++exchanges;
  }
  EXPECT_EQ(exchanges > 0, rest.ep > 1);
}

}  // namespace
}  // namespace alloy
