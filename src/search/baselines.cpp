#include "search/baselines.hpp"

#include <fmt/format.h>

#include "plan/runnable.hpp"
#include "spec/error.hpp"

namespace alloy {

Plan plan_uniform(const CostModel& cost, int device_type, const UniformLayout& u) {
  const ClusterSpec& cluster = cost.cluster();
  const int layers = static_cast<int>(cost.model().num_layers);
  std::vector<int> ids;
  for (const Device& d : cluster.devices)
    if (d.device_type_index == device_type) ids.push_back(d.id);
  const int64_t batch = cost.train().global_batch_sequences;
  if (u.tp * u.pp * u.dp > static_cast<int>(ids.size()) || layers % u.pp != 0 || batch % u.num_micro_batches != 0 ||
      (batch / u.num_micro_batches) % u.dp != 0)
    throw Error(fmt::format("uniform layout tp {} pp {} dp {} m {} does not fit this cluster and batch", u.tp, u.pp,
                            u.dp, u.num_micro_batches));
  Plan plan;
  plan_set_identity(&plan, cost, Objective::Objective_throughput);
  plan.global_batch_sequences = batch;
  plan.num_micro_batches = u.num_micro_batches;
  plan.micro_batch_sequences = batch / u.num_micro_batches;
  plan.schedule = Schedule::Schedule_1f1b;
  plan.virtual_chunks = 1;
  const int per_stage = layers / u.pp;
  for (int s = 0; s < u.pp; ++s) {
    PlanStage st;
    st.device_type = cluster.device_types[device_type].name;
    st.device_ids.assign(ids.begin() + s * u.tp * u.dp, ids.begin() + (s + 1) * u.tp * u.dp);
    st.tp = u.tp;
    st.dp = u.dp;
    st.zero = u.zero;
    st.sequence_parallel = u.sequence_parallel;
    st.chunks = {{s * per_stage, (s + 1) * per_stage}};
    st.has_embedding = s == 0;
    st.has_head = s == u.pp - 1;
    st.recompute.assign(per_stage, u.recompute);
    st.offload.assign(per_stage, false);
    plan.stages.push_back(std::move(st));
  }
  plan_validate_for(plan, cost.model(), cluster);
  plan_evaluate(&plan, cost);
  return plan;
}

std::optional<Plan> best_uniform_plan(const CostModel& cost, int device_type, int* layouts_scored) {
  const ClusterSpec& cluster = cost.cluster();
  int devices = 0;
  int per_node = 0;
  for (const Device& d : cluster.devices) devices += d.device_type_index == device_type;
  for (const NodeGroup& g : cluster.node_groups)
    if (g.device_type_index == device_type) per_node = per_node == 0 ? g.devices_per_node : std::min(per_node, g.devices_per_node);
  const int layers = static_cast<int>(cost.model().num_layers);
  const int64_t batch = cost.train().global_batch_sequences;
  std::optional<Plan> best;
  int scored = 0;
  for (int tp = 1; tp <= per_node; tp *= 2) {
    if (per_node % tp != 0 || devices % tp != 0 || !tp_runnable(cost.model(), tp).ok) continue;
    for (int pp = 1; pp <= layers && tp * pp <= devices; ++pp) {
      if (layers % pp != 0 || (devices / tp) % pp != 0) continue;
      const int dp = devices / tp / pp;
      for (int m = 1; m <= batch; ++m) {
        if (batch % m != 0 || (batch / m) % dp != 0) continue;
        for (int zero : {0, 1})
          for (Recompute r : {Recompute::Recompute_none, Recompute::Recompute_selective, Recompute::Recompute_full})
            for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
              if (zero > 0 && dp == 1) continue;
              ++scored;
              Plan plan = plan_uniform(cost, device_type, {tp, pp, dp, m, zero, r, sp == 1});
              if (plan_memory_ratio(plan) > 1.0) continue;
              if (!best || plan.step_seconds < best->step_seconds) best = std::move(plan);
            }
      }
    }
  }
  if (layouts_scored) *layouts_scored = scored;
  return best;
}

}  // namespace alloy
