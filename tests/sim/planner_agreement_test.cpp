// Simulating the planner's own plans: their full schedules pass the checker, the simulated
// memory peak is the cost model's, and the step time difference is reported per schedule.
#include <gtest/gtest.h>

#include <cstdio>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"
#include "cost/network_paths.hpp"
#include "plan/schedule.hpp"
#include "search/planner.hpp"
#include "sim/simulate.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

struct Planned {
  ModelSpec model;
  ClusterSpec cluster;
  Plan plan;
};

Planned planned(Schedule schedule, int layers = 8, int virtual_chunks = 0) {
  Planned p;
  p.model = testing::gpt2("toy-gpt", layers, 512, 8, 2048, 1024);
  p.cluster = testing::cluster("toy", {testing::a100_80(), testing::v100_32()}, {{0, 1, 4}, {1, 1, 4}});
  const TrainSpec train = testing::train(512, 32);
  CostModel cost(p.model, p.cluster, train);
  SearchOptions options;
  options.schedule = schedule;
  options.pp = 2;
  options.num_micro_batches = 8;
  options.virtual_chunks = virtual_chunks;
  p.plan = plan_search(cost, options).plan;
  return p;
}

TEST(PlannerAgreement, PlannerPlansCheckAndPeakWhereTheCostModelSays) {
  for (Schedule kind : {Schedule::Schedule_gpipe, Schedule::Schedule_1f1b, Schedule::Schedule_interleaved}) {
    const Planned p = planned(kind);
    SCOPED_TRACE(schedule_name(kind));
    EXPECT_NO_THROW(schedule_check(schedule_build(p.plan, p.model)));
    const SimResult r = simulate(p.plan, p.model, p.cluster);
    std::printf("%-12s simulated %.5f s, cost model %.5f s, difference %+.2f%%\n", schedule_name(kind), r.step_seconds,
                p.plan.step_seconds, 100.0 * (r.step_seconds / p.plan.step_seconds - 1));
    EXPECT_NEAR(r.step_seconds / p.plan.step_seconds, 1.0, 0.25);
    for (const SimLane& lane : r.lanes) {
      const PlanStage& st = p.plan.stages[lane.stage];
      EXPECT_NEAR(lane.peak_memory_bytes / st.memory_total_bytes(), 1.0, 0.01) << "stage " << lane.stage;
    }
    EXPECT_NO_THROW(sim_check_memory(r, p.plan));
  }
}

// 9 layers on two stages in 4 chunks each: one stage's chunks are unequal (5 blocks: 2, 1, 1, 1).
// The cost model prices its fill and drain with its first, larger chunk, and its activation peak
// by the chunks its schedule holds at once, as the simulator runs them.
TEST(PlannerAgreement, UnequalChunksPriceAndPeakAsTheySimulate) {
  const Planned p = planned(Schedule::Schedule_interleaved, 9, 4);
  ASSERT_EQ(p.plan.virtual_chunks, 4);
  int unequal = 0;
  for (const PlanStage& st : p.plan.stages) unequal += st.chunks.front().size() != st.chunks.back().size();
  EXPECT_EQ(unequal, 1);
  EXPECT_NO_THROW(schedule_check(schedule_build(p.plan, p.model)));
  const SimResult r = simulate(p.plan, p.model, p.cluster);
  std::printf("unequal chunks: simulated %.5f s, cost model %.5f s, difference %+.2f%%\n", r.step_seconds,
              p.plan.step_seconds, 100.0 * (r.step_seconds / p.plan.step_seconds - 1));
  EXPECT_NEAR(r.step_seconds / p.plan.step_seconds, 1.0, 0.25);
  for (const SimLane& lane : r.lanes) {
    const PlanStage& st = p.plan.stages[lane.stage];
    EXPECT_NEAR(lane.peak_memory_bytes / st.memory_total_bytes(), 1.0, 0.01) << "stage " << lane.stage;
  }
}

// Two one-node stages joined by a slow network, a GPT whose head is tied to its embedding: the
// boundary sends and the tied table's sum between the stages dominate the step. The stage times
// include the sends the simulator runs as transfers of their own, and both price the table's sum
// before the optimizer step, so simulation and cost model agree.
TEST(PlannerAgreement, ASlowPipelineBoundaryIsCountedOnceAndTheTiedTableSumIsPriced) {
  const ModelSpec model = testing::gpt2("tied-gpt", 4, 512, 8, 2048, 1024);
  const ClusterSpec cluster = testing::cluster("slow-pair", {testing::a100_80()}, {{0, 2, 1}}, 50e6, 1e-3);
  CostModel cost(model, cluster, testing::train(512, 8));
  SearchOptions options;
  options.pp = 2;
  options.num_micro_batches = 4;
  const Plan plan = plan_search(cost, options).plan;
  ASSERT_EQ(plan.stages.size(), 2u);
  // The table's gradient (V x C fp32) summed by a ring of the two stages' devices: two steps of
  // half of it over 50 MB/s, plus 1 ms each.
  const double table_bytes = 2048.0 * 512 * 4;  // vocabulary 2048, width 512
  const double tied = 2 * (table_bytes / 2 / 50e6 + 1e-3);
  EXPECT_NEAR(network_tied_table_seconds(cluster, model, 4, plan.stages[0].device_ids, 1, plan.stages[1].device_ids, 1),
              tied, 1e-9);
  EXPECT_GE(plan.stages[0].gradient_sync_seconds, tied * 0.999);
  EXPECT_GT(plan.stages[0].boundary_send_seconds, 0.0);
  const SimResult r = simulate(plan, model, cluster);
  std::printf("slow boundary: simulated %.5f s, cost model %.5f s, difference %+.2f%%\n", r.step_seconds,
              plan.step_seconds, 100.0 * (r.step_seconds / plan.step_seconds - 1));
  EXPECT_NEAR(r.step_seconds / plan.step_seconds, 1.0, 0.05);
}

TEST(PlannerAgreement, RefusesPlansForAnotherModelAndPlansOverMemory) {
  Planned p = planned(Schedule::Schedule_1f1b);
  ModelSpec other = p.model;
  other.hidden_size = 768;
  EXPECT_THROW(simulate(p.plan, other, p.cluster), Error);
  // A hand edit: twice the activations on stage 1 no longer fits.
  Plan edited = p.plan;
  for (MemoryTerm& t : edited.stages[1].memory)
    if (t.name == "activations") t.bytes += edited.stages[1].memory_capacity_bytes;
  const SimResult r = simulate(edited, p.model, p.cluster);
  try {
    sim_check_memory(r, edited);
    FAIL() << "expected the edited plan to be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "stages[1].memory");
    EXPECT_NE(e.message().find("stage 1"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace alloy
