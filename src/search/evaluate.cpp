// Scores a complete plan with the cost model: per-stage times and memory, step time, tokens/s,
// MFU, HFU, bubble and price. The planner's fast paths are checked against this in tests.
#include <algorithm>

#include <fmt/format.h>

#include "search/planner.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

std::vector<MemoryTerm> memory_terms(const MemoryBreakdown& m) {
  return {{"parameters", m.parameters_bytes},
          {"gradients", m.gradients_bytes},
          {"master_weights", m.master_weights_bytes},
          {"optimizer_states", m.optimizer_states_bytes},
          {"zero3_gather", m.zero3_gather_bytes},
          {"offload_window", m.offload_window_bytes},
          {"activations", m.activations_bytes},
          {"workspace", m.workspace_bytes},
          {"communication_buffers", m.communication_buffers_bytes},
          {"framework_context", m.framework_context_bytes},
          {"allocator_margin", m.allocator_margin_bytes},
          {"host_offload", m.host_offload_bytes}};
}

}  // namespace

const char* objective_name(Objective objective) {
  return objective == Objective::Objective_cost ? "cost" : "throughput";
}

Objective objective_from_name(const std::string& name) {
  if (name == "throughput") return Objective::Objective_throughput;
  if (name == "cost") return Objective::Objective_cost;
  throw Error("unknown objective '" + name + "'", {"", "objective"},
              "use throughput (tokens per second) or cost (price per token)");
}

void plan_set_identity(Plan* plan, const CostModel& cost, Objective objective) {
  plan->model_name = cost.model().name;
  plan->model_fingerprint = model_fingerprint(cost.model());
  plan->num_layers = static_cast<int>(cost.model().num_layers);
  plan->cluster_name = cost.cluster().name;
  plan->cluster_fingerprint = cluster_fingerprint(cost.cluster());
  plan->num_devices = static_cast<int>(cost.cluster().devices.size());
  plan->objective = objective_name(objective);
  plan->seq_len = cost.train().seq_len;
  plan->precision = cost.train().precision;
}

void plan_evaluate(Plan* plan, const CostModel& cost) {
  const ClusterSpec& cluster = cost.cluster();
  const ModelSpec& model = cost.model();
  const int p = static_cast<int>(plan->stages.size());
  const int v = plan->virtual_chunks;
  const int m = plan->num_micro_batches;
  std::vector<double> per_micro_batch(p);
  std::vector<double> without_copies(p);  // per micro-batch, exposed host copies left out
  std::vector<double> overhead(p);
  double peak_flops = 0;
  double recompute_flops = 0;
  double price_per_second = 0;
  for (int s = 0; s < p; ++s) {
    PlanStage& st = plan->stages[s];
    const int64_t b = plan->micro_batch_sequences / st.dp;
    const StageShape shape = cost.stage_shape(st.device_ids, st.tp, st.dp, b);
    const StageUnitCosts unit = cost.unit_costs(shape, st.sequence_parallel);
    StageChoice choice;
    choice.blocks = st.num_blocks();
    for (size_t i = 0; i < st.recompute.size(); ++i) {
      if (st.recompute[i] == Recompute::Recompute_selective) ++choice.selective;
      if (st.recompute[i] == Recompute::Recompute_full) ++choice.full;
      if (st.offload[i]) ++choice.offloaded;
      if (i < st.offload_activations.size() && st.offload_activations[i]) {
        if (st.recompute[i] == Recompute::Recompute_selective) ++choice.parked_selective;
        if (st.recompute[i] == Recompute::Recompute_none) ++choice.parked_none;
      }
    }
    choice.prefetch_depth = st.offload_prefetch_depth;
    choice.micro_batches = m;
    choice.zero = st.zero;
    choice.has_embedding = st.has_embedding;
    choice.has_head = st.has_head;
    choice.head_holds_lm_matrix = !(model.tied_embeddings && p == 1);
    double send_seconds = 0;
    int chunks_sent = 0;
    if (s + 1 < p || v > 1) {
      const int next = (s + 1) % p;
      if (next != s) {
        send_seconds = boundary_seconds(unit.boundary_bytes, cost.boundary_link(st.device_ids, plan->stages[next].device_ids));
        chunks_sent = s + 1 < p ? v : v - 1;
      }
    }
    choice.chunks_sent = chunks_sent;
    choice.chunks_received = p > 1 ? (s > 0 ? v : v - 1) : 0;
    const StageTiming timing = cost.stage_timing(shape, unit, choice, send_seconds, chunks_sent);
    st.micro_batches_in_flight = schedule_micro_batches_in_flight(plan->schedule, p, s, m, v);
    const MemoryBreakdown mem = cost.stage_memory(shape, unit, choice, st.micro_batches_in_flight, p > 1);
    st.forward_seconds = timing.forward_seconds;
    st.backward_seconds = timing.backward_seconds;
    st.gradient_sync_seconds = timing.gradient_sync_seconds;
    st.optimizer_seconds = timing.optimizer_seconds;
    st.offload_exposed_seconds = timing.offload_forward_seconds + timing.offload_backward_seconds;
    st.memory = memory_terms(mem);
    st.memory_capacity_bytes = cost.device_memory_bytes(shape.device_type);
    per_micro_batch[s] = timing.per_micro_batch_seconds();
    without_copies[s] = per_micro_batch[s] - st.offload_exposed_seconds;
    overhead[s] = timing.step_overhead_seconds();

    const DeviceType& type = cluster.device_types[shape.device_type];
    peak_flops += type.peak_flops(plan->precision) * static_cast<double>(st.device_ids.size());
    const LayerWork work = block_work(model, b, plan->seq_len, st.tp, st.sequence_parallel, plan->precision);
    recompute_flops += static_cast<double>(m) * static_cast<double>(st.device_ids.size()) *
                       (choice.full * work.forward_flops + choice.selective * work.selective_flops);
    for (int id : st.device_ids) price_per_second += cluster.node_group(cluster.devices[id]).price_per_device_hour / 3600.0;
  }
  plan->step_seconds = pipeline_step_seconds(per_micro_batch, overhead, m, v);
  plan->offload_step_seconds = plan->step_seconds - pipeline_step_seconds(without_copies, overhead, m, v);
  // The node whose offloaded state takes the largest share of its host memory.
  plan->host_offload_bytes_per_node = 0;
  plan->host_memory_bytes_per_node = 0;
  const std::vector<double> host_by_node = plan_host_offload_bytes_by_node(*plan, cluster);
  double worst_share = 0;
  for (const Device& d : cluster.devices) {
    const double capacity = cluster.node_group(d).host_memory_bytes;
    if (host_by_node[d.node] > 0 && host_by_node[d.node] / capacity > worst_share) {
      worst_share = host_by_node[d.node] / capacity;
      plan->host_offload_bytes_per_node = host_by_node[d.node];
      plan->host_memory_bytes_per_node = capacity;
    }
  }
  const double tokens = static_cast<double>(plan->global_batch_sequences) * static_cast<double>(plan->seq_len);
  plan->tokens_per_second = tokens / plan->step_seconds;
  const double model_flops = static_cast<double>(plan->global_batch_sequences) * model_flops_per_sequence(model, plan->seq_len);
  plan->mfu = model_flops / (plan->step_seconds * peak_flops);
  plan->hfu = (model_flops + recompute_flops) / (plan->step_seconds * peak_flops);
  const double slowest = *std::max_element(per_micro_batch.begin(), per_micro_batch.end());
  double sum = 0;
  for (double t : per_micro_batch) sum += t;
  const double pipe = sum / v + (m - 1.0 / v) * slowest;
  plan->bubble_fraction = pipe > 0 ? 1.0 - m * slowest / pipe : 0;
  plan->price_per_million_tokens = price_per_second * plan->step_seconds / tokens * 1e6;
}

double plan_memory_ratio(const Plan& plan) {
  double worst = 0;
  for (const PlanStage& s : plan.stages)
    if (s.memory_capacity_bytes > 0) worst = std::max(worst, s.memory_total_bytes() / s.memory_capacity_bytes);
  return worst;
}

}  // namespace alloy
