// Expert parallelism in plans: the groups of a stage's ranks, the experts each member holds, the
// JSON round trip and the checks, each naming the stage and field.
#include <gtest/gtest.h>

#include "../support/specs.hpp"
#include "plan/plan.hpp"
#include "plan/schedule.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

// One stage of tp 2 x dp 4 on one 8-device node, 2 layers, ep 2.
Plan expert_plan() {
  Plan p;
  p.model_name = "toy-moe";
  p.model_fingerprint = "f";
  p.num_layers = 2;
  p.cluster_name = "node";
  p.cluster_fingerprint = "c";
  p.num_devices = 8;
  p.seq_len = 64;
  p.global_batch_sequences = 8;
  p.micro_batch_sequences = 4;
  p.num_micro_batches = 2;
  PlanStage st;
  st.device_type = "a100-80";
  st.device_ids = {0, 1, 2, 3, 4, 5, 6, 7};
  st.tp = 2;
  st.dp = 4;
  st.ep = 2;
  st.chunks = {{0, 2}};
  st.has_embedding = st.has_head = true;
  st.recompute = {Recompute::Recompute_none, Recompute::Recompute_none};
  st.offload = {false, false};
  p.stages.push_back(st);
  return p;
}

ModelSpec toy_moe(int64_t experts) {
  ModelSpec m = testing::llama("toy-moe", 2, 256, 4, 4, 768, 512);
  m.moe.num_experts = experts;
  m.moe.experts_per_token = 2;
  m.moe.expert_ffn_hidden_size = 128;
  return m;
}

std::string field_of_error(const Plan& p, const ModelSpec* model = nullptr) {
  try {
    if (model) {
      const ClusterSpec cluster = testing::cluster("node", {testing::a100_80()}, {{0, 1, 8}});
      Plan q = p;
      q.model_fingerprint = model_fingerprint(*model);
      q.cluster_fingerprint = cluster_fingerprint(cluster);
      plan_validate_for(q, *model, cluster, "plan.json");
    } else {
      plan_validate(p, "plan.json");
    }
  } catch (const Error& e) {
    return e.where().field + ": " + e.message();
  }
  return "";
}

TEST(ExpertParallelPlan, GroupsAreReplicasInARowAndTheirCounterparts) {
  const Plan p = expert_plan();
  // Rank r = dp_rank * 2 + tp_rank; ep groups of tp rank 1: dp {0, 1} -> ranks {1, 3}, dp {2, 3} -> {5, 7}.
  EXPECT_EQ(plan_ep_group(p, 3), (std::vector<int>{1, 3}));
  EXPECT_EQ(plan_ep_group(p, 4), (std::vector<int>{4, 6}));
  // The same experts as rank 3 (member 1 of its group): member 1 of the other group, rank 7.
  EXPECT_EQ(plan_expert_dp_group(p, 3), (std::vector<int>{3, 7}));
  EXPECT_EQ(plan_expert_dp_group(p, 0), (std::vector<int>{0, 4}));
}

TEST(ExpertParallelPlan, MembersHoldEvenOrStatedRangesOfExperts) {
  Plan p = expert_plan();
  EXPECT_EQ(plan_expert_range(p.stages[0], 8, 0), (std::pair<int, int>{0, 4}));
  EXPECT_EQ(plan_expert_range(p.stages[0], 8, 1), (std::pair<int, int>{4, 8}));
  p.stages[0].experts_per_member = {5, 3};
  EXPECT_EQ(plan_expert_range(p.stages[0], 8, 0), (std::pair<int, int>{0, 5}));
  EXPECT_EQ(plan_expert_range(p.stages[0], 8, 1), (std::pair<int, int>{5, 8}));
}

// Under ZeRO 3 with 5 and 3 experts per member, each gather and reduction carries the member's own
// experts apart (expert_bytes, over expert-dp) and the rest alike on every member (bytes, over dp):
// the members cut the same buckets and call the same collectives, and the schedule checks.
TEST(ExpertParallelPlan, ScheduleCarriesEachMembersExpertsApart) {
  const ModelSpec model = toy_moe(8);
  Plan p = expert_plan();
  p.stages[0].zero = 3;
  p.stages[0].experts_per_member = {5, 3};
  p.gradient_bucket_bytes = 1;  // a bucket per block
  const StepSchedule schedule = schedule_build(p, model);
  EXPECT_NO_THROW(schedule_check(schedule));
  const int64_t expert = 3 * 256 * 128;
  for (const RankSchedule& rs : schedule.ranks) {
    const int64_t held = rs.dp_rank % 2 == 0 ? 5 : 3;
    int collectives = 0;
    for (size_t i = 0; i < rs.ops.size(); ++i) {
      const ScheduleOp& op = rs.ops[i];
      const ScheduleOp& first = schedule.ranks[0].ops[i];
      EXPECT_EQ(op.kind, first.kind);
      if (!op_kind_is_collective(op.kind)) continue;
      ++collectives;
      const int element = op.kind == OpKind::OpKind_all_gather ? precision_bytes(p.precision)
                                                               : p.reduce_scatter_bytes;
      EXPECT_EQ(op.bytes, first.bytes) << schedule_op_describe(op);
      EXPECT_EQ(op.expert_bytes, (op.block_end - op.block_begin) * held * expert * element) << schedule_op_describe(op);
      EXPECT_EQ(op.expert_bytes + op.bytes,
                schedule_parameter_bytes(p, model, 0, op.block_begin, op.block_end) / precision_bytes(p.precision) * element +
                    schedule_expert_bytes(p, model, 0, rs.dp_rank, op.block_begin, op.block_end, element));
    }
    EXPECT_GT(collectives, 0);
  }
}

TEST(ExpertParallelPlan, JsonRoundTripKeepsTheSplit) {
  Plan p = expert_plan();
  p.stages[0].experts_per_member = {5, 3};
  const Plan back = plan_from_json(plan_to_json(p), "plan.json");
  EXPECT_EQ(back.stages[0].ep, 2);
  EXPECT_EQ(back.stages[0].experts_per_member, (std::vector<int>{5, 3}));
  // A dense plan's JSON has neither field, and reads back with ep 1.
  Plan dense = expert_plan();
  dense.stages[0].ep = 1;
  const std::string text = plan_to_json(dense);
  EXPECT_EQ(text.find("\"ep\""), std::string::npos);
  EXPECT_EQ(plan_from_json(text, "plan.json").stages[0].ep, 1);
}

TEST(ExpertParallelPlan, SplitsThatCannotBeMadeAreRefusedByField) {
  Plan p = expert_plan();
  p.stages[0].ep = 3;
  EXPECT_EQ(field_of_error(p).rfind("stages[0].ep: is 3; expert-parallel groups are made of data-parallel replicas", 0),
            0u)
      << field_of_error(p);
  p = expert_plan();
  p.stages[0].experts_per_member = {4};
  EXPECT_EQ(field_of_error(p).rfind("stages[0].experts_per_member: has 1 entries for ep 2", 0), 0u);
  p.stages[0].experts_per_member = {8, 0};
  EXPECT_EQ(field_of_error(p).rfind("stages[0].experts_per_member:", 0), 0u);

  const ModelSpec six = toy_moe(6);
  const ModelSpec eight = toy_moe(8);
  p = expert_plan();
  EXPECT_EQ(field_of_error(p, &eight), "");
  p.stages[0].ep = 4;
  EXPECT_EQ(field_of_error(p, &six), "stages[0].ep: 6 experts do not split evenly over ep 4");
  p.stages[0].experts_per_member = {2, 1, 1, 2};
  EXPECT_EQ(field_of_error(p, &six), "");
  EXPECT_EQ(field_of_error(p, &eight), "stages[0].experts_per_member: holds 6 experts in all; toy-moe has 8");
  const ModelSpec dense = testing::llama("toy-moe", 2, 256, 4, 4, 768, 512);
  EXPECT_EQ(field_of_error(expert_plan(), &dense).rfind("stages[0].ep: is 2 but toy-moe is a dense model", 0), 0u);
}

}  // namespace
}  // namespace alloy
