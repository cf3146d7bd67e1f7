// Pricing of the simulator's data-parallel collectives over their groups, and ZeRO 3's gathers.
#include "sim/collectives.hpp"

#include <algorithm>

#include "cost/comm.hpp"
#include "cost/network_paths.hpp"
#include "cost/runtime_traits.hpp"

namespace alloy {

namespace {

// One part of a collective: `bytes` over group `g` (`experts`: the expert-dp group), added to `out`.
void add_group_part(const ClusterSpec& cluster, const Profile* profile, SimLinkDemands* demands, int stage,
                    const PlanStage& st, int device_id, CollectiveOp cop, double bytes, const GroupPlacement& g,
                    bool experts, SimCollective* out) {
  if (g.ranks <= 1 || bytes <= 0) return;
  const bool network = g.nodes > 1;
  (network ? out->network : out->intra_node) = true;
  const ProfiledCollective* measured =
      profile && !g.crosses_measured_link ? profile->find_collective(st.device_type, cop, g.ranks, network) : nullptr;
  // A measured collective or a runtime that rings only: the shared links the flat rings cross.
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::CollectiveAlgorithm_ring;
  const RuntimeTraits& runtime =
      runtime_traits(cluster.device_types[static_cast<size_t>(cluster.devices[static_cast<size_t>(device_id)].device_type_index)]);
  const double dilation = shared_cores_collective_dilation(runtime, shared_cores_of(cluster));
  const GroupPlacement slowed = group_bandwidth_divided(g, dilation);
  double seconds = 0;
  if (measured)
    seconds = measured->seconds(bytes);
  else if (runtime.collectives_flat_ring_only)
    seconds = collective_seconds_with(cop, bytes, slowed, algorithm);
  else
    seconds = collective_seconds(cop, bytes, slowed, &algorithm);
  if (!measured) seconds += dilation * collective_runtime_seconds(runtime, cop, bytes, g.ranks);
  out->seconds += seconds;
  if (!network || seconds <= 0) return;
  // The parts run one after the other: a link both cross is taken by the larger share.
  for (const SharedLinkShare& l : demands->collective(stage, g, algorithm, experts)) {
    auto same = std::find_if(out->links.begin(), out->links.end(), [&](const SharedLinkShare& o) { return o.link == l.link; });
    if (same == out->links.end()) out->links.push_back(l);
    else same->share = std::max(same->share, l.share);
  }
}

}  // namespace

SimCollective sim_collective(const Plan& plan, const ClusterSpec& cluster, const Profile* profile, SimLinkDemands* demands,
                             int stage, int dp_rank, int device_id, const ScheduleOp& op) {
  const PlanStage& st = plan.stages[static_cast<size_t>(stage)];
  const Link intra = cluster.node_group(cluster.devices[static_cast<size_t>(device_id)]).intra_node;
  const CollectiveOp cop = op.kind == OpKind::OpKind_all_reduce       ? CollectiveOp::CollectiveOp_all_reduce
                           : op.kind == OpKind::OpKind_reduce_scatter ? CollectiveOp::CollectiveOp_reduce_scatter
                                                                      : CollectiveOp::CollectiveOp_all_gather;
  SimCollective out;
  const GroupPlacement dp = network_dp_group(cluster, st.device_ids, st.tp, st.dp, intra);
  add_group_part(cluster, profile, demands, stage, st, device_id, cop, static_cast<double>(op.bytes), dp, false, &out);
  if (op.expert_bytes > 0) {  // the routed experts over the members that hold the same ones
    const std::vector<int> ids = plan_stage_expert_dp_ids(st, dp_rank);
    const GroupPlacement experts = network_dp_group(cluster, ids, st.tp, static_cast<int>(ids.size()) / st.tp, intra);
    add_group_part(cluster, profile, demands, stage, st, device_id, cop, static_cast<double>(op.expert_bytes), experts,
                   true, &out);
  }
  return out;
}

int sim_zero3_first_block(const RankSchedule& rs, size_t gather, const PlanStage& stage) {
  for (size_t j = gather + 1; j < rs.ops.size(); ++j) {
    const ScheduleOp& pass = rs.ops[j];
    if (pass.kind == OpKind::OpKind_backward) return pass.block_end - 1;
    if (pass.kind != OpKind::OpKind_forward) continue;
    if (stage.has_embedding && pass.block_begin == stage.chunks.front().begin) return pass.block_begin;
    int local = 0;  // the block's index among the stage's (chunks in order), as `offload` counts
    for (const LayerRange& chunk : stage.chunks)
      for (int b = chunk.begin; b < chunk.end; ++b, ++local) {
        const bool offloaded = local < static_cast<int>(stage.offload.size()) && stage.offload[static_cast<size_t>(local)];
        if (b >= pass.block_begin && b < pass.block_end && !offloaded) return b;
      }
    return pass.block_begin;
  }
  return rs.ops[gather].block_begin;
}

ScheduleOp sim_zero3_gather_op(const Plan& plan, const ModelSpec& model, int stage, int dp_rank, const ScheduleOp& pass,
                               int begin, int end) {
  const PlanStage& st = plan.stages[static_cast<size_t>(stage)];
  ScheduleOp g = pass;
  g.kind = OpKind::OpKind_all_gather;
  g.block_begin = begin;
  g.block_end = end;
  g.bytes = g.expert_bytes = 0;
  int local = 0;  // the block's index among the stage's (chunks in order), as `offload` counts
  for (const LayerRange& chunk : st.chunks) {
    for (int b = chunk.begin; b < chunk.end; ++b, ++local) {
      if (b < begin || b >= end || (!st.offload.empty() && st.offload[static_cast<size_t>(local)])) continue;
      g.bytes += schedule_parameter_bytes(plan, model, stage, b, b + 1);
      g.expert_bytes += schedule_expert_bytes(plan, model, stage, dp_rank, b, b + 1, precision_bytes(plan.precision));
    }
  }
  return g;
}

}  // namespace alloy
