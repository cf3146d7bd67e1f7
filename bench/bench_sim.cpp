// Simulator scale: wall time to simulate one step of a plan on the shipped 1024-GPU cluster and
// on the same cluster scaled to 16,384 GPUs (targets: under 1 s and under 10 s), plus the time
// to build and check the full schedule of every rank of the 1024-GPU plan.
#include <chrono>
#include <cstdio>
#include <vector>

#include "cost/cost_model.hpp"
#include "hw/catalog.hpp"
#include "plan/schedule.hpp"
#include "search/planner.hpp"
#include "sim/simulate.hpp"
#include "spec/model.hpp"

namespace {

using namespace alloy;

struct StageLayout {
  int type = 0;  // node group index; its devices are taken in order
  int devices = 0;
  int tp = 8;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Stages take devices of their node group in order; blocks split by peak throughput.
Plan layout_plan(const ClusterSpec& cluster, const ModelSpec& model, const TrainSpec& train,
                 const std::vector<StageLayout>& layout, int micro_batches, int64_t micro_batch_sequences) {
  Plan plan;
  plan.micro_batch_sequences = micro_batch_sequences;
  plan.num_micro_batches = micro_batches;
  plan.global_batch_sequences = micro_batch_sequences * micro_batches;
  plan.schedule = Schedule::Schedule_1f1b;
  std::vector<int> next_device(cluster.node_groups.size(), 0);
  std::vector<int> group_start(cluster.node_groups.size(), 0);
  for (const Device& d : cluster.devices)
    if (d.id > 0 && d.node_group != cluster.devices[d.id - 1].node_group) group_start[d.node_group] = d.id;
  std::vector<double> weight;
  double total_weight = 0;
  for (const StageLayout& l : layout) {
    const NodeGroup& g = cluster.node_groups[l.type];
    const DeviceType& type = cluster.device_types[g.device_type_index];
    PlanStage st;
    st.device_type = type.name;
    st.tp = l.tp;
    st.dp = l.devices / l.tp;
    st.zero = 1;
    for (int i = 0; i < l.devices; ++i) st.device_ids.push_back(group_start[l.type] + next_device[l.type]++);
    plan.stages.push_back(st);
    weight.push_back(type.peak_flops(train.precision) * l.devices);
    total_weight += weight.back();
  }
  const int p = static_cast<int>(layout.size());
  int layer = 0;
  for (int s = 0; s < p; ++s) {
    const int remaining_stages = p - s - 1;
    int blocks = static_cast<int>(model.num_layers * weight[s] / total_weight + 0.5);
    blocks = std::max(1, std::min(blocks, static_cast<int>(model.num_layers) - layer - remaining_stages));
    if (s == p - 1) blocks = static_cast<int>(model.num_layers) - layer;
    PlanStage& st = plan.stages[s];
    st.chunks = {{layer, layer + blocks}};
    layer += blocks;
    st.recompute.assign(blocks, Recompute::Recompute_full);
    st.offload.assign(blocks, false);
    st.has_embedding = s == 0;
    st.has_head = s == p - 1;
  }
  CostModel cost(model, cluster, train);
  plan_set_identity(&plan, cost, Objective::Objective_throughput);
  plan_evaluate(&plan, cost);
  return plan;
}

void report(const char* name, const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, double target_s) {
  const auto t0 = std::chrono::steady_clock::now();
  const SimResult r = simulate(plan, model, cluster);
  const double wall = seconds_since(t0);
  std::printf("%-28s %6d GPUs  %2zu stages  m %3d  %7lld ops  simulated step %8.3f s (cost model %8.3f s)  "
              "wall %.3f s  target < %.0f s: %s\n",
              name, plan.num_used_devices(), plan.stages.size(), plan.num_micro_batches,
              static_cast<long long>(r.simulated_ops), r.step_seconds, plan.step_seconds, wall, target_s,
              wall < target_s ? "ok" : "MISSED");
}

}  // namespace

int main() {
  const ModelSpec model = model_load("llama-3-70b");
  TrainSpec train;
  train.seq_len = 4096;
  train.precision = Precision::Precision_bf16;

  ClusterSpec c1k = cluster_load("hetero-1024", catalog_builtin());
  // hetero-1024: node groups h100 (512), a100 (384), v100 (128); tp 8 x dp 16 stages.
  std::vector<StageLayout> l1k;
  for (int i = 0; i < 4; ++i) l1k.push_back({0, 128, 8});
  for (int i = 0; i < 3; ++i) l1k.push_back({1, 128, 8});
  l1k.push_back({2, 128, 8});
  train.global_batch_sequences = 32 * 32;
  const Plan p1k = layout_plan(c1k, model, train, l1k, 32, 32);
  report("hetero-1024", p1k, model, c1k, 1.0);

  auto t0 = std::chrono::steady_clock::now();
  const StepSchedule full = schedule_build(p1k, model);
  const double build_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  schedule_check(full);
  size_t ops = 0;
  for (const RankSchedule& rs : full.ranks) ops += rs.ops.size();
  std::printf("%-28s %6zu ranks, %zu ops: built in %.3f s, checked in %.3f s\n", "hetero-1024 full schedule",
              full.ranks.size(), ops, build_s, seconds_since(t0));

  // The same three node types, sixteen times as many nodes; tp 8 x dp 128 stages.
  ClusterSpec c16k = c1k;
  c16k.name = "hetero-16384";
  for (NodeGroup& g : c16k.node_groups) g.count *= 16;
  cluster_finalize(&c16k);
  std::vector<StageLayout> l16k;
  for (int i = 0; i < 8; ++i) l16k.push_back({0, 1024, 8});
  for (int i = 0; i < 6; ++i) l16k.push_back({1, 1024, 8});
  for (int i = 0; i < 2; ++i) l16k.push_back({2, 1024, 8});
  train.global_batch_sequences = 128 * 64;
  const Plan p16k = layout_plan(c16k, model, train, l16k, 64, 128);
  report("hetero-16384 (scaled)", p16k, model, c16k, 10.0);
  return 0;
}
