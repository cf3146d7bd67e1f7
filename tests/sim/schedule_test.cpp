// The step schedule: compute order of each pipeline schedule, transfers split and joined by
// sample range, gradient buckets, ZeRO and offload operations, and the deadlock checker.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "cost/cost_model.hpp"
#include "plan/schedule.hpp"
#include "plans.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::hand_plan;
using testing::model_with_layers;
using testing::StageSpec;

struct Item {
  bool forward;
  int mb;
  int chunk;
};

// Compute operations of a rank, with bucket pieces of one backward folded into one item.
std::vector<Item> compute_items(const RankSchedule& rs) {
  std::vector<Item> items;
  for (const ScheduleOp& op : rs.ops) {
    if (op.kind != OpKind::OpKind_forward && op.kind != OpKind::OpKind_backward) continue;
    if (op.bucket > 0) continue;
    items.push_back({op.kind == OpKind::OpKind_forward, op.micro_batch, op.chunk});
  }
  return items;
}

Plan uniform_plan(int p, int m, Schedule schedule, int v = 1, int dp = 1, int tp = 1, int zero = 0) {
  std::vector<StageSpec> specs(p, StageSpec{tp, dp, zero, 2});
  return hand_plan(model_with_layers(2 * p * v), p * tp * dp, specs, m, dp * 2, schedule, v);
}

TEST(Schedule, OneForwardOneBackwardWarmsUpByDistanceToTheEnd) {
  for (int m : {2, 3, 6}) {
    const int p = 4;
    const Plan plan = uniform_plan(p, m, Schedule::Schedule_1f1b);
    const StepSchedule sched = schedule_build(plan, model_with_layers(2 * p));
    for (int s = 0; s < p; ++s) {
      const std::vector<Item> items = compute_items(sched.ranks[s]);
      ASSERT_EQ(items.size(), static_cast<size_t>(2 * m));
      int leading_forwards = 0;
      while (leading_forwards < 2 * m && items[leading_forwards].forward) ++leading_forwards;
      EXPECT_EQ(leading_forwards, std::min(p - s - 1, m) + (p - s - 1 < m ? 1 : 0)) << "stage " << s << " m " << m;
      // Steady state: forwards and backwards alternate until the forwards run out.
      int next_forward = 0, next_backward = 0;
      for (const Item& it : items) {
        if (it.forward) EXPECT_EQ(it.mb, next_forward++);
        else EXPECT_EQ(it.mb, next_backward++);
        EXPECT_LE(next_backward, next_forward);
        EXPECT_LE(next_forward - next_backward, p - s) << "more micro-batches in flight than 1F1B allows";
      }
    }
  }
}

TEST(Schedule, GpipeRunsEveryForwardBeforeAnyBackward) {
  const Plan plan = uniform_plan(3, 5, Schedule::Schedule_gpipe);
  const StepSchedule sched = schedule_build(plan, model_with_layers(6));
  for (const RankSchedule& rs : sched.ranks) {
    const std::vector<Item> items = compute_items(rs);
    ASSERT_EQ(items.size(), 10u);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(items[i].forward, i < 5);
  }
}

TEST(Schedule, InterleavedRunsEveryChunkOfEveryMicroBatchInOrder) {
  for (int m : {4, 6, 8}) {
    const int p = 2, v = 3;
    const Plan plan = uniform_plan(p, m, Schedule::Schedule_interleaved, v);
    const StepSchedule sched = schedule_build(plan, model_with_layers(2 * p * v));
    for (const RankSchedule& rs : sched.ranks) {
      std::map<std::pair<int, int>, int> forwards, backwards;
      std::map<int, int> last_forward_chunk, last_backward_chunk;
      for (const Item& it : compute_items(rs)) {
        if (it.forward) {
          ++forwards[{it.mb, it.chunk}];
          EXPECT_EQ(it.chunk, last_forward_chunk.count(it.mb) ? last_forward_chunk[it.mb] + 1 : 0);
          last_forward_chunk[it.mb] = it.chunk;
        } else {
          ++backwards[{it.mb, it.chunk}];
          EXPECT_EQ(it.chunk, last_backward_chunk.count(it.mb) ? last_backward_chunk[it.mb] - 1 : v - 1);
          EXPECT_EQ((forwards[{it.mb, it.chunk}]), 1) << "backward before forward";
          last_backward_chunk[it.mb] = it.chunk;
        }
      }
      EXPECT_EQ(forwards.size(), static_cast<size_t>(m * v));
      EXPECT_EQ(backwards.size(), static_cast<size_t>(m * v));
    }
  }
}

TEST(Schedule, CostModelCountsTheActivationsInFlightThatTheScheduleHolds) {
  // The cost model's micro-batches in flight (activation memory) against the most chunk
  // forwards without their backward yet in each stage's built order, over 1/v per chunk.
  // Among the shapes: as many micro-batches as stages, where the interleaved warm-up is every
  // chunk (it was once counted as 2(p - s - 1) + (v - 1)p + 1 there, 11% short of a measured
  // arena peak).
  for (Schedule kind : {Schedule::Schedule_gpipe, Schedule::Schedule_1f1b, Schedule::Schedule_interleaved})
    for (int p : {2, 3, 4})
      for (int m : {1, 2, 3, 4, 6, 8})
        for (int v : kind == Schedule::Schedule_interleaved ? std::vector<int>{2, 3} : std::vector<int>{1}) {
          const Plan plan = uniform_plan(p, m, kind, v);
          const StepSchedule sched = schedule_build(plan, model_with_layers(2 * p * v));
          for (int s = 0; s < p; ++s) {
            int live = 0, peak = 0;
            for (const Item& it : compute_items(sched.ranks[s])) {
              live += it.forward ? 1 : -1;
              peak = std::max(peak, live);
            }
            EXPECT_DOUBLE_EQ(schedule_micro_batches_in_flight(kind, p, s, m, v), static_cast<double>(peak) / v)
                << schedule_name(kind) << " p " << p << " stage " << s << " m " << m << " v " << v;
          }
        }
}

// An interleaved plan whose stage s holds v + s + 1 blocks, its chunks as chunk_blocks sizes them
// (unequal but where v + s + 1 divides by v).
Plan unequal_chunk_plan(int p, int m, int v) {
  Plan plan = uniform_plan(p, m, Schedule::Schedule_interleaved, v);
  for (PlanStage& st : plan.stages) st.chunks.clear();
  int layer = 0;
  for (int c = 0; c < v; ++c)
    for (int s = 0; s < p; ++s) {
      const int size = chunk_blocks(v + s + 1, v, c);
      plan.stages[s].chunks.push_back({layer, layer + size});
      layer += size;
    }
  for (PlanStage& st : plan.stages) {
    st.recompute.assign(st.num_blocks(), Recompute::Recompute_none);
    st.offload.assign(st.num_blocks(), false);
  }
  plan.num_layers = layer;
  return plan;
}

TEST(Schedule, UnequalChunksPassTheCheckerAndPeakWhereTheCostModelSays) {
  // The held chunks' blocks at their most in each stage's built order, over the stage's blocks:
  // the steady state replaces a small chunk's activations by a large one's, so the peak can
  // come after the warm-up.
  int above_warmup = 0;
  for (int p : {2, 3, 4})
    for (int m : {2, 4, 6, 8})
      for (int v : {2, 3}) {
        const Plan plan = unequal_chunk_plan(p, m, v);
        ASSERT_NO_THROW(plan_validate(plan));
        const StepSchedule sched = schedule_build(plan, model_with_layers(plan.num_layers));
        EXPECT_NO_THROW(schedule_check(sched)) << "p " << p << " m " << m << " v " << v;
        for (int s = 0; s < p; ++s) {
          const PlanStage& st = plan.stages[s];
          std::vector<int> sizes;
          for (const LayerRange& c : st.chunks) sizes.push_back(c.size());
          int live = 0, peak = 0, forwards = 0, warmup_peak = 0;
          for (const Item& it : compute_items(sched.ranks[s])) {
            live += it.forward ? sizes[it.chunk] : -sizes[it.chunk];
            peak = std::max(peak, live);
            if (it.forward && ++forwards <= interleaved_warmup_chunks(p, s, m, v) + 1) warmup_peak = peak;
          }
          above_warmup += peak > warmup_peak;
          EXPECT_DOUBLE_EQ(schedule_micro_batches_in_flight(plan.schedule, p, s, m, sizes),
                           static_cast<double>(peak) / st.num_blocks())
              << "p " << p << " stage " << s << " m " << m << " v " << v;
        }
      }
  EXPECT_GT(above_warmup, 0);
}

TEST(Schedule, EveryScheduleAndShapePassesTheChecker) {
  int checked = 0;
  for (Schedule kind : {Schedule::Schedule_gpipe, Schedule::Schedule_1f1b, Schedule::Schedule_interleaved})
    for (int p : {1, 2, 3, 4})
      for (int m : {1, 2, 3, 4, 5, 8})
        for (int zero : {0, 3}) {
          const int v = kind == Schedule::Schedule_interleaved ? 2 : 1;
          if (v > 1 && p == 1) continue;
          // Mixed shapes: the data-parallel degree changes between stages, tp too.
          std::vector<StageSpec> specs;
          for (int s = 0; s < p; ++s) specs.push_back(StageSpec{s % 2 == 0 ? 1 : 2, s % 2 == 0 ? 2 : 1, zero, 1});
          const Plan plan = hand_plan(model_with_layers(p * v), 4 * p, specs, m, 2, kind, v);
          const StepSchedule sched = schedule_build(plan, model_with_layers(p * v));
          EXPECT_NO_THROW(schedule_check(sched)) << schedule_name(kind) << " p " << p << " m " << m << " zero " << zero;
          ++checked;
        }
  EXPECT_GT(checked, 100);
}

TEST(Schedule, StagesWithDifferentDataParallelismSplitAndJoinBySamples) {
  // Stage 0: dp 2 (ranks 0, 1); stage 1: tp 2 (ranks 2, 3). A micro-batch holds 4 samples.
  const ModelSpec model = model_with_layers(2);
  const Plan plan = hand_plan(model, 4, {StageSpec{1, 2, 0, 1}, StageSpec{2, 1, 0, 1}}, 3, 4, Schedule::Schedule_1f1b);
  const StepSchedule sched = schedule_build(plan, model);
  const int64_t sample_bytes = plan.seq_len * model.hidden_size * 2;
  std::set<std::pair<int, int64_t>> got;
  for (const ScheduleOp& op : sched.ranks[3].ops)
    if (op.kind == OpKind::OpKind_recv_activation && op.micro_batch == 1) {
      got.insert({op.peer, op.sample_begin});
      EXPECT_EQ(op.sample_end - op.sample_begin, 2);
      EXPECT_EQ(op.bytes, 2 * sample_bytes);
    }
  EXPECT_EQ(got, (std::set<std::pair<int, int64_t>>{{0, 4}, {1, 6}}));
  // Gradients come back from one tp rank each, and each replica gets only its own samples.
  int gradient_recvs = 0;
  for (const ScheduleOp& op : sched.ranks[1].ops)
    if (op.kind == OpKind::OpKind_recv_gradient) {
      ++gradient_recvs;
      EXPECT_EQ(op.peer, 2);
      EXPECT_EQ(op.sample_begin, op.micro_batch * 4 + 2);
    }
  EXPECT_EQ(gradient_recvs, 3);
  EXPECT_NO_THROW(schedule_check(sched));
}

// Bytes of one micro-batch's sends of `kind` across the boundary after stage `from`, summed over
// every rank of the schedule.
int64_t boundary_sent_bytes(const StepSchedule& sched, OpKind kind, int from_stage, int micro_batch) {
  int64_t bytes = 0;
  for (const RankSchedule& rs : sched.ranks)
    for (const ScheduleOp& op : rs.ops)
      if (op.kind == kind && op.micro_batch == micro_batch && rs.stage == from_stage) bytes += op.bytes;
  return bytes;
}

// What the cost model prices a boundary to move is what the schedule sends: every tp rank of the
// receiving stage takes its replica's samples whole, activations forward and gradients back,
// for equal tp (tp 2, pp 2) and unequal (dp 2 into tp 2).
TEST(Schedule, BoundaryBytesThatTheCostModelPricesAreWhatTheScheduleSends) {
  const ModelSpec model = model_with_layers(2);
  const ClusterSpec cluster = testing::cluster("four", {testing::a100_80()}, {{0, 1, 4}});
  struct Case {
    StageSpec first, second;
  };
  for (const Case& c : {Case{StageSpec{2, 1, 0, 1}, StageSpec{2, 1, 0, 1}}, Case{StageSpec{1, 2, 0, 1}, StageSpec{2, 1, 0, 1}},
                        Case{StageSpec{2, 1, 0, 1}, StageSpec{1, 2, 0, 1}}}) {
    const Plan plan = hand_plan(model, 4, {c.first, c.second}, 3, 4, Schedule::Schedule_1f1b);
    const StepSchedule sched = schedule_build(plan, model);
    const CostModel cost(model, cluster, testing::train(plan.seq_len, plan.global_batch_sequences, plan.precision));
    const PlanStage& sender = plan.stages[0];
    const int64_t per_replica = plan.micro_batch_sequences / sender.dp;
    const StageUnitCosts unit = cost.unit_costs(cost.stage_shape(sender.device_ids, sender.tp, sender.dp, per_replica), false);
    for (int mb = 0; mb < plan.num_micro_batches; ++mb) {
      EXPECT_DOUBLE_EQ(static_cast<double>(boundary_sent_bytes(sched, OpKind::OpKind_send_activation, 0, mb)),
                       boundary_transfer_bytes(unit.boundary_bytes, plan.stages[1].tp))
          << "tp " << c.first.tp << " -> " << c.second.tp;
      EXPECT_DOUBLE_EQ(static_cast<double>(boundary_sent_bytes(sched, OpKind::OpKind_send_gradient, 1, mb)),
                       boundary_transfer_bytes(unit.boundary_bytes, plan.stages[0].tp))
          << "tp " << c.first.tp << " -> " << c.second.tp;
    }
  }
}

// Uneven data parallelism: replica r's compute ops cover exactly its share of each micro-batch,
// a share in pieces as forward/backward pairs one piece at a time; a pipeline's next stage takes
// its samples from whichever replicas hold them.
TEST(Schedule, UnevenReplicasComputeTheirOwnSharesInPieces) {
  const ModelSpec model = model_with_layers(2);
  Plan plan = hand_plan(model, 3, {StageSpec{1, 3, 1, 2}}, 2, 3, Schedule::Schedule_1f1b);
  plan.micro_batch_sequences = 8;
  plan.global_batch_sequences = 16;
  for (int64_t share : {5, 2, 1}) {
    PlanReplica r;
    r.device_type = plan.stages[0].device_type;
    r.sequences = share;
    r.pieces = share == 5 ? 2 : 1;
    plan.stages[0].replicas.push_back(r);
  }
  plan_validate(plan);
  const StepSchedule sched = schedule_build(plan, model);
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> expected = {
      {{0, 3}, {3, 5}, {8, 11}, {11, 13}}, {{5, 7}, {13, 15}}, {{7, 8}, {15, 16}}};
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<std::pair<int64_t, int64_t>> forwards;
    OpKind last = OpKind::OpKind_backward;
    for (const ScheduleOp& op : sched.ranks[rank].ops) {
      if (op.kind != OpKind::OpKind_forward && op.kind != OpKind::OpKind_backward) continue;
      if (op.kind == OpKind::OpKind_forward) {
        EXPECT_EQ(last, OpKind::OpKind_backward) << "rank " << rank << ": one piece alive at a time";
        forwards.push_back({op.sample_begin, op.sample_end});
      }
      last = op.kind;
    }
    EXPECT_EQ(forwards, expected[rank]) << "rank " << rank;
  }
  EXPECT_NO_THROW(schedule_check(sched));

  // Stage 1 (dp 2, shares 3 and 1) receives from stage 0 (dp 1).
  Plan pipeline = hand_plan(model, 3, {StageSpec{1, 1, 0, 1}, StageSpec{1, 2, 0, 1}}, 2, 4, Schedule::Schedule_1f1b);
  for (int64_t share : {3, 1}) {
    PlanReplica r;
    r.device_type = pipeline.stages[1].device_type;
    r.sequences = share;
    pipeline.stages[1].replicas.push_back(r);
  }
  plan_validate(pipeline);
  const StepSchedule piped = schedule_build(pipeline, model);
  for (const ScheduleOp& op : piped.ranks[2].ops)
    if (op.kind == OpKind::OpKind_recv_activation) {
      EXPECT_EQ(op.sample_begin, op.micro_batch * 4 + 3);
      EXPECT_EQ(op.sample_end, op.micro_batch * 4 + 4);
    }
  EXPECT_NO_THROW(schedule_check(piped));
}

int64_t sum_bytes(const RankSchedule& rs, OpKind kind, bool per_step_only) {
  int64_t total = 0;
  for (const ScheduleOp& op : rs.ops)
    if (op.kind == kind && (!per_step_only || op.micro_batch < 0)) total += op.bytes;
  return total;
}

TEST(Schedule, GradientBucketsCoverTheStageAndFollowZero) {
  const ModelSpec model = model_with_layers(8);
  for (int zero : {0, 1, 2, 3}) {
    const Plan plan = hand_plan(model, 8, {StageSpec{1, 4, zero, 4}, StageSpec{1, 4, zero, 4}}, 4, 8, Schedule::Schedule_1f1b);
    ScheduleOptions options;
    options.bucket_bytes = 1;  // one bucket per block
    const StepSchedule sched = schedule_build(plan, model, options);
    EXPECT_NO_THROW(schedule_check(sched));
    for (int s = 0; s < 2; ++s) {
      const RankSchedule& rs = sched.ranks[s * 4];
      // Weights move in the compute precision, gradients at the plan's gradient bytes (fp32).
      const int64_t stage_bytes = schedule_parameter_bytes(plan, model, s, s * 4, s * 4 + 4);
      const int64_t gradient_bytes = schedule_gradient_bytes(plan, model, s, s * 4, s * 4 + 4, plan.gradient_bytes);
      const OpKind reduce = zero <= 1 ? OpKind::OpKind_all_reduce : OpKind::OpKind_reduce_scatter;
      EXPECT_EQ(sum_bytes(rs, reduce, false), gradient_bytes) << "zero " << zero;
      EXPECT_EQ(sum_bytes(rs, zero <= 1 ? OpKind::OpKind_reduce_scatter : OpKind::OpKind_all_reduce, false), 0);
      int buckets = 0;
      for (const ScheduleOp& op : rs.ops) buckets += op.kind == reduce;
      EXPECT_EQ(buckets, 4);
      // Post-step parameter gathers for ZeRO 1 and 2; per-use gathers for ZeRO-3.
      EXPECT_EQ(sum_bytes(rs, OpKind::OpKind_all_gather, true), zero == 1 || zero == 2 ? stage_bytes : 0);
      int use_gathers = 0;
      for (const ScheduleOp& op : rs.ops) use_gathers += op.kind == OpKind::OpKind_all_gather && op.micro_batch >= 0;
      EXPECT_EQ(use_gathers, zero == 3 ? 2 * 4 : 0);
    }
  }
  EXPECT_GT(schedule_parameter_bytes(hand_plan(model, 8, {StageSpec{1, 4, 0, 4}, StageSpec{1, 4, 0, 4}}, 4, 8,
                                               Schedule::Schedule_1f1b),
                                     model, 0, 0, 1),
            schedule_parameter_bytes(hand_plan(model, 8, {StageSpec{1, 4, 0, 4}, StageSpec{1, 4, 0, 4}}, 4, 8,
                                               Schedule::Schedule_1f1b),
                                     model, 0, 1, 2))
      << "the first block of stage 0 carries the embedding";
}

TEST(Schedule, OffloadedBlocksArePrefetchedAndEvictedAroundTheirCompute) {
  const ModelSpec model = model_with_layers(4);
  StageSpec offloading{1, 1, 0, 2};
  offloading.offloaded_blocks = 1;
  const Plan plan = hand_plan(model, 2, {offloading, StageSpec{1, 1, 0, 2}}, 3, 1, Schedule::Schedule_1f1b);
  const StepSchedule sched = schedule_build(plan, model);
  const std::vector<ScheduleOp>& ops = sched.ranks[0].ops;
  int pairs = 0;
  for (size_t i = 0; i + 2 < ops.size(); ++i)
    if (ops[i].kind == OpKind::OpKind_prefetch) {
      EXPECT_TRUE(ops[i + 1].kind == OpKind::OpKind_forward || ops[i + 1].kind == OpKind::OpKind_backward);
      EXPECT_EQ(ops[i + 2].kind, OpKind::OpKind_evict);
      // The block alone: the embedding that its stage holds stays on the device.
      EXPECT_EQ(ops[i].bytes, schedule_offloaded_block_bytes(plan, model, 0, 0, 0, precision_bytes(plan.precision)));
      EXPECT_LT(ops[i].bytes, schedule_parameter_bytes(plan, model, 0, 0, 1));
      EXPECT_EQ(ops[i + 2].bytes, ops[i + 1].kind == OpKind::OpKind_backward ? ops[i].bytes : 0);
      ++pairs;
    }
  EXPECT_EQ(pairs, 6);
  for (const ScheduleOp& op : sched.ranks[1].ops) EXPECT_NE(op.kind, OpKind::OpKind_prefetch);
}

TEST(Schedule, ParkedActivationsLeaveAfterTheForwardAndReturnBeforeTheBackward) {
  const ModelSpec model = model_with_layers(4);
  Plan plan = hand_plan(model, 2, {StageSpec{1, 1, 0, 2}, StageSpec{1, 1, 0, 2}}, 3, 1, Schedule::Schedule_1f1b);
  plan.stages[0].offload_activations = {true, true};
  plan.stages[0].recompute = {Recompute::Recompute_none, Recompute::Recompute_selective};
  ScheduleOptions options;
  options.parked_block_bytes = {{1000, 600}, {0, 0}};
  const StepSchedule sched = schedule_build(plan, model, options);
  const std::vector<ScheduleOp>& ops = sched.ranks[0].ops;
  int forwards = 0, backwards = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == OpKind::OpKind_forward) {
      ++forwards;
      EXPECT_TRUE(i == 0 || ops[i - 1].kind != OpKind::OpKind_prefetch) << "no weights to fetch";
      ASSERT_EQ(ops[i + 1].kind, OpKind::OpKind_evict);
      EXPECT_EQ(ops[i + 1].bytes, 1600);
    }
    if (ops[i].kind == OpKind::OpKind_backward) {
      ++backwards;
      ASSERT_EQ(ops[i - 1].kind, OpKind::OpKind_prefetch);
      EXPECT_EQ(ops[i - 1].bytes, 1600);
      EXPECT_EQ(ops[i + 1].kind == OpKind::OpKind_evict ? ops[i + 1].bytes : 0, 0);  // nothing goes back
    }
  }
  EXPECT_EQ(forwards, 3);
  EXPECT_EQ(backwards, 3);
  for (const ScheduleOp& op : sched.ranks[1].ops) EXPECT_NE(op.kind, OpKind::OpKind_prefetch);
}

std::string check_message(const StepSchedule& sched) {
  try {
    schedule_check(sched);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ScheduleCheck, RejectsAReceiveMovedBeforeTheSendThatFeedsIt) {
  const ModelSpec model = model_with_layers(2);
  const Plan plan = hand_plan(model, 2, {StageSpec{}, StageSpec{}}, 2, 1, Schedule::Schedule_gpipe);
  StepSchedule sched = schedule_build(plan, model);
  ASSERT_EQ(check_message(sched), "");
  // Rank 0 now waits for the first gradient before sending its first activation.
  std::vector<ScheduleOp>& ops = sched.ranks[0].ops;
  auto recv = std::find_if(ops.begin(), ops.end(), [](const ScheduleOp& o) { return o.kind == OpKind::OpKind_recv_gradient; });
  ASSERT_NE(recv, ops.end());
  const ScheduleOp moved = *recv;
  ops.erase(recv);
  ops.insert(ops.begin(), moved);
  const std::string msg = check_message(sched);
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 op 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("recv_gradient mb 0"), std::string::npos) << msg;
}

TEST(ScheduleCheck, RejectsASendWithoutItsReceiveAndMismatchedBytes) {
  const ModelSpec model = model_with_layers(2);
  const Plan plan = hand_plan(model, 2, {StageSpec{}, StageSpec{}}, 2, 1, Schedule::Schedule_1f1b);
  StepSchedule sched = schedule_build(plan, model);
  std::vector<ScheduleOp>& ops = sched.ranks[1].ops;
  const auto recv = std::find_if(ops.begin(), ops.end(), [](const ScheduleOp& o) { return o.kind == OpKind::OpKind_recv_activation; });
  ASSERT_NE(recv, ops.end());
  StepSchedule changed = sched;
  changed.ranks[1].ops[recv - ops.begin()].bytes += 2;
  std::string msg = check_message(changed);
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not match its send on rank 0"), std::string::npos) << msg;
  ops.erase(recv);
  msg = check_message(sched);
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("send_activation mb 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no matching receive on rank 1"), std::string::npos) << msg;
}

TEST(ScheduleCheck, RejectsCollectivesThatDifferInsideTheGroup) {
  const ModelSpec model = model_with_layers(2);
  const Plan plan = hand_plan(model, 2, {StageSpec{1, 2, 0, 2}}, 2, 2, Schedule::Schedule_1f1b);
  StepSchedule sched = schedule_build(plan, model);
  ASSERT_EQ(check_message(sched), "");
  for (ScheduleOp& op : sched.ranks[1].ops)
    if (op.kind == OpKind::OpKind_all_reduce) {
      op.kind = OpKind::OpKind_reduce_scatter;
      break;
    }
  const std::string msg = check_message(sched);
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("differs from rank 0"), std::string::npos) << msg;
}

}  // namespace
}  // namespace alloy
