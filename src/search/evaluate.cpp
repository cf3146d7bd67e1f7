// Scores a complete plan with the cost model: per-stage times and memory, step time, tokens/s,
// MFU, HFU, bubble and price. The planner's fast paths are checked against this in tests.
#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "cost/moe_cost.hpp"
#include "cost/network_paths.hpp"
#include "cost/runtime_traits.hpp"
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

// Whether each of a stage's blocks (its chunks' in order, as PlanStage::recompute lists them)
// is one of an MoE model's leading dense blocks.
std::vector<bool> stage_dense_blocks(const PlanStage& st, const ModelSpec& model) {
  const int dense = model_is_moe(model) ? static_cast<int>(model.moe.first_dense_layers) : 0;
  std::vector<bool> out;
  for (const LayerRange& c : st.chunks)
    for (int b = c.begin; b < c.end; ++b) out.push_back(b < dense);
  return out;
}

// The layer choices of a plan's stage as the cost model counts them.
StageChoice stage_choice(const Plan& plan, int s, const ModelSpec& model) {
  const PlanStage& st = plan.stages[s];
  const int p = static_cast<int>(plan.stages.size());
  const int v = plan.virtual_chunks;
  StageChoice choice;
  choice.blocks = st.num_blocks();
  const std::vector<bool> dense = stage_dense_blocks(st, model);
  choice.dense_blocks = static_cast<int>(std::count(dense.begin(), dense.end(), true));
  for (size_t i = 0; i < st.recompute.size(); ++i) {
    const bool is_dense = i < dense.size() && dense[i];
    if (st.recompute[i] == Recompute::Recompute_selective) {
      ++choice.selective;
      choice.dense_selective += is_dense ? 1 : 0;
    }
    if (st.recompute[i] == Recompute::Recompute_full) {
      ++choice.full;
      choice.dense_full += is_dense ? 1 : 0;
    }
    if (st.offload[i]) {
      ++choice.offloaded;
      choice.dense_offloaded += is_dense ? 1 : 0;
    }
    if (i < st.offload_activations.size() && st.offload_activations[i]) {
      if (st.recompute[i] == Recompute::Recompute_selective) ++choice.parked_selective;
      if (st.recompute[i] == Recompute::Recompute_none) ++choice.parked_none;
    }
  }
  choice.prefetch_depth = st.offload_prefetch_depth;
  choice.micro_batches = plan.num_micro_batches;
  choice.zero = st.zero;
  choice.shard_gradients = st.gradients_sharded();
  choice.has_embedding = st.has_embedding;
  choice.has_head = st.has_head;
  choice.head_holds_lm_matrix = !(model.tied_embeddings && p == 1);
  const bool sends = (s + 1 < p || v > 1) && (s + 1) % p != s;
  choice.chunks_sent = sends ? (s + 1 < p ? v : v - 1) : 0;
  choice.chunks_received = p > 1 ? (s > 0 ? v : v - 1) : 0;
  choice.virtual_chunks = static_cast<int>(st.chunks.size());
  return choice;
}

struct ReplicaCosts {
  StageTiming timing;
  MemoryBreakdown memory;
  double capacity_bytes = 0;
  double peak_flops = 0;       // per device
  double recompute_flops = 0;  // per device and step
};

// Costs of `b` sequences of each micro-batch in one pass on replica `dp_rank` of stage `s`.
ReplicaCosts pass_costs(const Plan& plan, int s, int dp_rank, int64_t b, const StageChoice& choice, const CostModel& cost) {
  const PlanStage& st = plan.stages[s];
  const int p = static_cast<int>(plan.stages.size());
  StageShape shape = cost.stage_shape(st.device_ids, st.tp, st.dp, b);
  shape.device_type = cost.cluster().devices[st.device_ids[static_cast<size_t>(dp_rank) * st.tp]].device_type_index;
  shape.zero_share = st.zero_share(plan.micro_batch_sequences, dp_rank);
  plan_stage_set_experts(cost, plan, s, dp_rank, &shape);
  const StageUnitCosts unit = cost.unit_costs(shape, st.sequence_parallel);
  double send_seconds = 0;
  if (choice.chunks_sent > 0) {
    const PlanStage& next = plan.stages[(s + 1) % p];
    const bool shards = runtime_traits(cost.cluster().device_types[shape.device_type]).pipeline_sends_sequence_shards &&
                        st.sequence_parallel && next.sequence_parallel;
    send_seconds = boundary_transfer_seconds(unit.boundary_bytes, cost.boundary_link(st.device_ids, next.device_ids),
                                             st.tp, next.tp, shards);
  }
  ReplicaCosts out;
  out.timing = cost.stage_timing(shape, unit, choice, send_seconds, choice.chunks_sent);
  out.memory = cost.stage_memory(shape, unit, choice, st.micro_batches_in_flight, p > 1);
  out.capacity_bytes = cost.device_memory_bytes(shape.device_type);
  out.peak_flops = cost.cluster().device_types[shape.device_type].peak_flops(
      precision_run_on(cost.cluster().device_types[shape.device_type], plan.precision));
  const LayerWork work = block_work(cost.model(), b, plan.seq_len, st.tp, st.sequence_parallel, plan.precision);
  out.recompute_flops = static_cast<double>(plan.num_micro_batches) *
                        (choice.full * work.full_recompute_flops + choice.selective * work.selective_flops);
  return out;
}

// Costs of replica `dp_rank` of stage `s` (its device type and share of each micro-batch). A share
// run in pieces takes the sum of the pieces' passes and the memory of the largest piece.
ReplicaCosts replica_costs(const Plan& plan, int s, int dp_rank, const StageChoice& choice, const CostModel& cost) {
  const PlanStage& st = plan.stages[s];
  if (st.replicas.empty() || st.replicas[static_cast<size_t>(dp_rank)].pieces == 1)
    return pass_costs(plan, s, dp_rank, st.replica_sequences(plan.micro_batch_sequences, dp_rank), choice, cost);
  const PlanReplica& replica = st.replicas[static_cast<size_t>(dp_rank)];
  ReplicaCosts out = pass_costs(plan, s, dp_rank, replica.piece_sequences(0), choice, cost);
  out.timing.forward_seconds = out.timing.backward_seconds = out.recompute_flops = 0;
  out.timing.first_gather_forward_seconds = out.timing.first_gather_backward_seconds = 0;
  out.timing.offload_forward_seconds = out.timing.offload_backward_seconds = 0;
  const int larger = static_cast<int>(replica.sequences % replica.pieces);  // pieces one sequence longer
  for (const auto& [sequences, count] : {std::pair{replica.piece_sequences(0), larger > 0 ? larger : replica.pieces},
                                         std::pair{replica.piece_sequences(replica.pieces - 1),
                                                   larger > 0 ? replica.pieces - larger : 0}}) {
    if (count == 0) continue;
    const ReplicaCosts piece = pass_costs(plan, s, dp_rank, sequences, choice, cost);
    out.timing.forward_seconds += count * piece.timing.forward_seconds;
    out.timing.backward_seconds += count * piece.timing.backward_seconds;
    out.timing.first_gather_forward_seconds += count * piece.timing.first_gather_forward_seconds;
    out.timing.first_gather_backward_seconds += count * piece.timing.first_gather_backward_seconds;
    out.timing.offload_forward_seconds += count * piece.timing.offload_forward_seconds;
    out.timing.offload_backward_seconds += count * piece.timing.offload_backward_seconds;
    out.recompute_flops += count * piece.recompute_flops;
  }
  return out;
}

}  // namespace

void plan_stage_set_experts(const CostModel& cost, const Plan& plan, int s, int dp_rank, StageShape* shape) {
  if (!model_is_moe(cost.model())) return;
  // The member's experts run the rows its whole expert-parallel group routes to them.
  const PlanStage& st = plan.stages[static_cast<size_t>(s)];
  const int ep = std::max(1, st.ep);
  const int first = dp_rank / ep * ep;
  double group_sequences = 0;
  for (int d = first; d < first + ep; ++d)
    group_sequences += static_cast<double>(st.replica_sequences(plan.micro_batch_sequences, d));
  const std::pair<int, int> held = plan_expert_range(st, static_cast<int>(cost.model().moe.num_experts), dp_rank % ep);
  // A stage of even replicas is priced by one member: the one whose experts are most popular.
  const std::vector<double>& shares = cost.expert_token_shares();
  const double skew = st.experts_per_member.empty() && st.replicas.empty() ? moe_even_split_skew(shares, ep)
                                                    : moe_routing_skew(shares, held.first, held.second);
  moe_shape_set(cost, shape, st.device_ids, ep, held.second - held.first, dp_rank, group_sequences, skew);
}

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
  plan->gradient_bucket_bytes = cost.train().gradient_bucket_mib * 1024.0 * 1024.0;  // what it is priced with
  plan->gradient_bytes = static_cast<int>(cost.gradient_wire_bytes(0));
  plan->reduce_scatter_bytes = static_cast<int>(cost.gradient_wire_bytes(2));
  const ClusterSpec& cluster = cost.cluster();
  const ModelSpec& model = cost.model();
  const int p = static_cast<int>(plan->stages.size());
  const int m = plan->num_micro_batches;
  std::vector<double> per_micro_batch(p);
  std::vector<double> without_copies(p);  // per micro-batch, exposed host copies left out
  std::vector<double> overhead(p);
  std::vector<double> fill(p);  // each stage's share of its time in its first chunk
  double peak_flops = 0;
  double recompute_flops = 0;
  double price_per_second = 0;
  for (int s = 0; s < p; ++s) {
    PlanStage& st = plan->stages[s];
    const StageChoice choice = stage_choice(*plan, s, model);
    std::vector<int> chunk_sizes;
    for (const LayerRange& c : st.chunks) chunk_sizes.push_back(c.size());
    st.micro_batches_in_flight = schedule_micro_batches_in_flight(plan->schedule, p, s, m, chunk_sizes);
    // Every replica's costs. The group's gradient sync starts when the slowest replica's passes
    // end, and the step ends with the slowest optimizer (ZeRO 1-2 re-gather after it): the stage
    // takes the slowest passes and, apart, the slowest sync and optimizer, which under uneven data
    // parallelism can be another replica's (a slow device updates as many weights in its shard).
    // Its memory is the replica's nearest its capacity.
    double slowest_passes = -1, slowest_overhead = -1, fullest = -1;
    // replicas of one type, share, pieces and held experts
    std::map<std::tuple<int, int64_t, int, int>, ReplicaCosts> alike;
    const bool uneven_experts = !st.experts_per_member.empty();
    for (int d = 0; d < (st.replicas.empty() && !uneven_experts ? 1 : st.dp); ++d) {
      const int type = cluster.devices[st.device_ids[static_cast<size_t>(d) * st.tp]].device_type_index;
      const int held = uneven_experts ? st.experts_per_member[static_cast<size_t>(d % std::max(1, st.ep))] : 0;
      const auto key = std::make_tuple(type, st.replica_sequences(plan->micro_batch_sequences, d),
                                       st.replicas.empty() ? 1 : st.replicas[static_cast<size_t>(d)].pieces, held);
      auto known = alike.find(key);
      if (known == alike.end()) known = alike.emplace(key, replica_costs(*plan, s, d, choice, cost)).first;
      const ReplicaCosts& r = known->second;
      if (!st.replicas.empty()) {
        PlanReplica& out = st.replicas[static_cast<size_t>(d)];
        out.forward_seconds = r.timing.forward_seconds;
        out.backward_seconds = r.timing.backward_seconds;
        out.optimizer_seconds = r.timing.optimizer_seconds;
        out.memory = memory_terms(r.memory);
        out.memory_capacity_bytes = r.capacity_bytes;
      }
      if (r.timing.per_micro_batch_seconds() > slowest_passes) {
        slowest_passes = r.timing.per_micro_batch_seconds();
        st.forward_seconds = r.timing.forward_seconds;
        st.backward_seconds = r.timing.backward_seconds;
        st.offload_exposed_seconds = r.timing.offload_forward_seconds + r.timing.offload_backward_seconds;
        st.offload_exposed_forward_seconds = r.timing.offload_forward_seconds;
        st.boundary_send_seconds = r.timing.boundary_send_seconds;
        st.first_gather_forward_seconds = r.timing.first_gather_forward_seconds;
        st.first_gather_backward_seconds = r.timing.first_gather_backward_seconds;
        per_micro_batch[s] = r.timing.per_micro_batch_seconds();
      }
      if (r.timing.step_overhead_seconds() > slowest_overhead) {
        slowest_overhead = r.timing.step_overhead_seconds();
        st.gradient_sync_seconds = r.timing.gradient_sync_seconds;
        st.optimizer_seconds = r.timing.optimizer_seconds;
        overhead[s] = r.timing.step_overhead_seconds();
      }
      const double use = r.memory.total_bytes() / r.capacity_bytes;
      if (use > fullest) {
        fullest = use;
        st.memory = memory_terms(r.memory);
        st.memory_capacity_bytes = r.capacity_bytes;
      }
      const int devices = st.replicas.empty() && !uneven_experts ? static_cast<int>(st.device_ids.size()) : st.tp;
      peak_flops += r.peak_flops * devices;
      recompute_flops += r.recompute_flops * devices;
    }
    without_copies[s] = per_micro_batch[s] - st.offload_exposed_seconds;
    fill[s] = static_cast<double>(st.chunks.front().size()) / st.num_blocks();
    for (int id : st.device_ids) price_per_second += cluster.node_group(cluster.devices[id]).price_per_device_hour / 3600.0;
  }
  // A table tied between the first and last stage is summed between them before the optimizer
  // step: both stages' step overhead grows by it.
  const double tied_seconds = network_tied_table_seconds(
      cluster, model, plan->gradient_bytes, plan->stages.front().device_ids, plan->stages.front().tp,
      plan->stages.back().device_ids, plan->stages.back().tp);
  for (int s : {0, p - 1}) {
    if (tied_seconds <= 0) break;
    overhead[s] += tied_seconds;
    plan->stages[s].gradient_sync_seconds += tied_seconds;
  }
  plan->step_seconds = pipeline_step_seconds(per_micro_batch, fill, overhead, m);
  plan->offload_step_seconds = plan->step_seconds - pipeline_step_seconds(without_copies, fill, overhead, m);
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
  const int slowest = static_cast<int>(std::max_element(per_micro_batch.begin(), per_micro_batch.end()) - per_micro_batch.begin());
  double pipe = m * per_micro_batch[slowest];
  for (int s = 0; s < p; ++s) pipe += s == slowest ? 0 : fill[s] * per_micro_batch[s];
  plan->bubble_fraction = pipe > 0 ? 1.0 - m * per_micro_batch[slowest] / pipe : 0;
  plan->price_per_million_tokens = price_per_second * plan->step_seconds / tokens * 1e6;
}

double plan_memory_ratio(const Plan& plan) {
  double worst = 0;
  for (const PlanStage& s : plan.stages) {
    if (s.memory_capacity_bytes > 0) worst = std::max(worst, s.memory_total_bytes() / s.memory_capacity_bytes);
    for (const PlanReplica& r : s.replicas)
      if (r.memory_capacity_bytes > 0) worst = std::max(worst, r.memory_total_bytes() / r.memory_capacity_bytes);
  }
  return worst;
}

}  // namespace alloy
