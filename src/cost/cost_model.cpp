// The cost model: unit costs of a stage shape, a stage's time and memory from its layer choices,
// devices, links and collectives. Offload pricing is in offload_cost.cpp, one block's dense
// arithmetic in block_costs.cpp, ZeRO-3 first gathers in zero3_gathers.cpp.
#include "cost/cost_model.hpp"
#include "cost/moe_cost.hpp"
#include "cost/network_paths.hpp"
#include "spec/topology.hpp"
#include "spec/units.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace alloy {

namespace {

// The element-wise kernels' bytes of a pass: the forward's, twice over in backward.
double pass_elementwise_bytes(const LayerWork& work, bool backward) {
  return (backward ? 2.0 : 1.0) * work.forward_elementwise_bytes;
}

// Host memory bandwidth one device's share of a CPU optimizer step gets (offloaded layers).
constexpr double kHostOptimizerBytesPerSecond = 20e9;
// Latency assumed for an intra-node link that a cluster file gives without one.
constexpr double kDefaultIntraNodeLatencySeconds = 5e-6;
constexpr double kNoHostLinkSeconds = 1e9;

int optimizer_states(const TrainSpec& train) { return train.optimizer == "sgd" ? 1 : 2; }

}  // namespace

double MemoryBreakdown::total_bytes() const {
  return parameters_bytes + gradients_bytes + master_weights_bytes + optimizer_states_bytes +
         zero3_gather_bytes + offload_window_bytes + activations_bytes + workspace_bytes +
         communication_buffers_bytes + framework_context_bytes + allocator_margin_bytes;
}

double compute_efficiency(const DeviceType& type, Precision precision, double rows, double cols) {
  const RuntimeTraits& runtime = runtime_traits(type);
  return matmul_peak_share(type, precision) * (rows / (rows + runtime.matmul_half_rows)) *
         (cols / (cols + runtime.matmul_half_cols));
}

double device_memory_bytes_per_second(const DeviceType& type) {
  const bool scales = runtime_traits(type).memory_bandwidth_scales_with_speed;
  return type.memory_bandwidth_bytes_per_second * (scales ? type.speed : 1.0);
}

double compute_seconds(const DeviceType& type, Precision precision, const LayerWork& work, bool backward) {
  const double flops = backward ? work.backward_flops : work.forward_flops;
  const double bytes = backward ? work.backward_bytes : work.forward_bytes;
  const RuntimeTraits& runtime = runtime_traits(type);
  const Precision run = precision_run_on(type, precision);  // what the device really runs
  const auto rate = [&](Precision p) {
    return type.peak_flops(p) * compute_efficiency(type, p, work.matmul_rows, work.matmul_cols);
  };
  // An fp8 run computes the attention core and the output layer at 16 bits.
  const double sixteen_bit =
      run == Precision::Precision_fp8 ? std::min(flops, (backward ? 2.0 : 1.0) * work.sixteen_bit_forward_flops) : 0.0;
  const double math = flops > 0 ? (flops - sixteen_bit) / rate(run) +
                                      (sixteen_bit > 0 ? sixteen_bit / rate(precision_run_on(type, Precision::Precision_bf16)) : 0.0)
                                : 0;
  const double bandwidth = device_memory_bytes_per_second(type);
  if (!runtime.elementwise_kernels_separate) return std::max(math, bytes / bandwidth);
  const double elementwise = pass_elementwise_bytes(work, backward);
  const double scores = runtime.attention_memory == AttentionMemory::AttentionMemory_fused ? (backward ? 2.0 : 1.0) * work.forward_score_bytes : 0;
  const double weights = cold_weight_seconds(type, work, backward);
  return (weights > 0 ? math + weights : std::max(math, (bytes - elementwise) / bandwidth)) + (elementwise - scores) / bandwidth;
}

double cold_weight_seconds(const DeviceType& type, const LayerWork& work, bool backward) {
  const double share = runtime_traits(type).cold_weight_bandwidth_share;
  if (share <= 0) return 0;
  const double weight_bytes = (backward ? work.backward_bytes : work.forward_bytes) - pass_elementwise_bytes(work, backward);
  return weight_bytes / (share * device_memory_bytes_per_second(type));
}

CostModel::CostModel(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                     const Profile* profile)
    : model_(model),
      cluster_(profile && !profile->links.empty() ? profile_apply_links(*profile, cluster) : cluster),
      train_(train),
      profile_(profile) {
  dense_part_ = model_is_moe(model) ? moe_dense_part(model) : model;
  leading_dense_ = model;
  leading_dense_.moe = MixtureOfExperts{};
  expert_shares_ = moe_expert_shares(model, train.expert_tokens);
  type_links_.resize(cluster.device_types.size());
  std::vector<bool> seen(cluster.device_types.size(), false);
  for (const NodeGroup& g : cluster.node_groups) {
    if (g.device_type_index < 0 || g.device_type_index >= static_cast<int>(seen.size())) continue;
    Link link = g.intra_node;
    if (link.bandwidth_bytes_per_second <= 0)
      link.bandwidth_bytes_per_second = cluster.device_types[g.device_type_index].intra_node_link_bytes_per_second;
    if (link.latency_seconds <= 0) link.latency_seconds = kDefaultIntraNodeLatencySeconds;
    Link& slot = type_links_[g.device_type_index];
    if (!seen[g.device_type_index] || link.bandwidth_bytes_per_second < slot.bandwidth_bytes_per_second) slot = link;
    seen[g.device_type_index] = true;
  }
  std::vector<std::string> cpu_types;
  for (size_t t = 0; t < seen.size(); ++t) {
    const std::string note = precision_fallback_note(cluster.device_types[t], train.precision);
    if (seen[t] && !note.empty()) notes_.insert(note);
    if (seen[t] && cluster.device_types[t].is_cpu) cpu_types.push_back(cluster.device_types[t].name);
  }
  // The cpu entry describes the host it was measured on, which need not be this one.
  if (!cpu_types.empty() && !(profile != nullptr && !profile->device_types.empty()))
    notes_.insert(fmt::format("{}: priced from the catalog's cpu entry, measured on a 2-core AMD EPYC with OpenBLAS's "
                              "Haswell kernels (docs/catalog.md); `alloy profile` measures this machine",
                              fmt::join(cpu_types, ", ")));
  priced_types_set();
}

void CostModel::priced_types_set() {
  shared_cores_ = shared_cores_of(cluster_);
  const SharedCores& shared = shared_cores_;
  priced_types_ = cluster_.device_types;
  for (DeviceType& type : priced_types_)
    if (runtime_traits(type).devices_share_host_cores) type.speed /= shared.dilation;
  if (shared.dilation > 1 && !(profile_ && !profile_->device_types.empty()))
    notes_.insert(fmt::format("{} CPU devices on this machine's {} cores: their compute is priced {:.2g}x slower, as the runtime "
                              "slows each rank (docs/runtime-distributed.md)", shared.devices, shared.cores, shared.dilation));
}

double CostModel::device_memory_bytes(int device_type) const {
  return cluster_.device_types[device_type].memory_bytes;
}

double CostModel::host_memory_share_bytes(int device_type) const {
  double share = 0;
  for (const NodeGroup& g : cluster_.node_groups) {
    if (g.device_type_index != device_type || g.devices_per_node <= 0) continue;
    const double per_device = g.host_memory_bytes / g.devices_per_node;
    if (share == 0 || per_device < share) share = per_device;
  }
  return share;
}

Link CostModel::type_intra_node_link(int device_type) const { return type_links_[device_type]; }

std::vector<std::string> CostModel::fallback_notes() const {
  std::lock_guard<std::mutex> lock(notes_mutex_);
  return {notes_.begin(), notes_.end()};
}

StageShape CostModel::stage_shape(const std::vector<int>& ids, int tp, int dp, int64_t micro_batch) const {
  StageShape s;
  s.device_type = cluster_.devices[ids.front()].device_type_index;
  s.tp = tp;
  s.dp = dp;
  s.micro_batch = micro_batch;
  s.zero_share = 1.0 / dp;
  const Link link = type_links_[s.device_type];
  s.tp_group.ranks = tp;
  s.tp_group.nodes = 1;
  s.tp_group.concurrent_per_node = tp;
  s.tp_group.intra_node = link;
  s.tp_group.network = cluster_.network;
  s.dp_group = network_dp_group(cluster_, ids, tp, dp, link);
  s.held_experts = static_cast<double>(model_.moe.num_experts);
  s.expert_zero_share = s.zero_share;
  s.expert_dp_group = s.dp_group;
  return s;
}

BoundaryLink CostModel::boundary_link(const std::vector<int>& from, const std::vector<int>& to) const {
  BoundaryLink b;
  b.lanes = static_cast<int>(std::min(from.size(), to.size()));
  const Device& a = cluster_.devices[from.front()];
  const Device& z = cluster_.devices[to.front()];
  b.intra_node = type_links_[a.device_type_index];
  const BoundaryNetwork net = network_boundary(cluster_, from, to);
  b.network = net.network;
  boundary_link_apply_profile(&b, profile_, cluster_.device_type(a).name, net.measured);
  const int from_nodes = network_distinct_nodes(cluster_, from);
  const int to_nodes = network_distinct_nodes(cluster_, to);
  // On a flat cluster a profile's measured network link sets the aggregate; on a tiered one the
  // cluster file's NICs and uplinks do (a profile's point_to_point is one link per device type,
  // not per path), or the links measured between node groups where the profile has them.
  b.aggregate_network_bytes_per_second = topology_is_flat(cluster_)
                                             ? std::min(from_nodes, to_nodes) * b.network.bandwidth_bytes_per_second
                                             : net.aggregate_bytes_per_second;
  if (from_nodes == 1 && to_nodes == 1 && a.node == z.node) {
    b.path = P2pPath::P2pPath_intra_node;
  } else if (cluster_.device_type(a).vendor != cluster_.device_type(z).vendor) {
    b.path = P2pPath::P2pPath_host_staged;
    b.host_link_from_bytes_per_second = cluster_.node_group(a).host_link_bytes_per_second;
    b.host_link_to_bytes_per_second = cluster_.node_group(z).host_link_bytes_per_second;
  } else {
    b.path = P2pPath::P2pPath_network;
  }
  return b;
}

LayerTimes CostModel::layer_times(const StageShape& shape, LayerKind kind, bool sp, const LayerWork& work) const {
  const DeviceType& type = priced_types_[shape.device_type];
  if (profile_ && !profile_->device_types.empty()) {  // a profile of links alone measures no layer
    if (profile_->model_name == model_.name) {
      const std::optional<ProfiledLayer> measured = profile_->layer_at(
          type.name, kind, static_cast<int>(shape.micro_batch), static_cast<int>(train_.seq_len), shape.tp, sp);
      // A layer is profiled alone, its weights warm in the caches; inside the model they are not.
      if (measured)
        return {measured->forward_seconds + cold_weight_seconds(type, work, false),
                measured->backward_seconds + cold_weight_seconds(type, work, true)};
    }
    std::lock_guard<std::mutex> lock(notes_mutex_);
    notes_.insert(fmt::format("{} {} micro-batch {} seq {} tp {}{}: not in profile, analytic model used", type.name,
                              layer_kind_name(kind), shape.micro_batch, train_.seq_len, shape.tp, sp ? " sp" : ""));
  }
  return {compute_seconds(type, train_.precision, work, false), compute_seconds(type, train_.precision, work, true)};
}

bool CostModel::profile_collectives_price(const GroupPlacement& group) const {
  // Over links measured between node groups the links price the group: a profile's collectives
  // were timed on a path it does not name.
  return profile_ && !profile_->device_types.empty() && !group.crosses_measured_link;
}

double CostModel::group_seconds(int device_type, CollectiveOp op, double bytes, const GroupPlacement& group,
                                bool note_fallback) const {
  if (group.ranks <= 1 || bytes <= 0) return 0;
  if (profile_collectives_price(group)) {
    const std::string& name = cluster_.device_types[device_type].name;
    const ProfiledCollective* measured = profile_->find_collective(name, op, group.ranks, group.nodes > 1);
    if (measured) return measured->seconds(bytes);
    if (note_fallback) {
      std::lock_guard<std::mutex> lock(notes_mutex_);
      notes_.insert(fmt::format("{} {} over {} ranks {}: not in profile, analytic model used", name,
                                collective_op_name(op), group.ranks, group.nodes > 1 ? "inter_node" : "intra_node"));
    }
  }
  const RuntimeTraits& runtime = runtime_traits(cluster_.device_types[device_type]);
  const double dilation = shared_cores_collective_dilation(runtime, shared_cores_);
  const double runtime_part = dilation * collective_runtime_seconds(runtime, op, bytes, group.ranks);
  const GroupPlacement slowed = group_bandwidth_divided(group, dilation);
  if (runtime.collectives_flat_ring_only)
    return collective_seconds_with(op, bytes, slowed, CollectiveAlgorithm::CollectiveAlgorithm_ring) + runtime_part;
  return collective_seconds(op, bytes, slowed) + runtime_part;
}

LayerSecondsBound CostModel::layer_seconds_bound(int device_type, int tp, int64_t micro_batch, bool sp) const {
  StageShape shape;
  shape.device_type = device_type;
  shape.tp = tp;
  shape.micro_batch = micro_batch;
  shape.tp_group.ranks = tp;
  shape.tp_group.concurrent_per_node = tp;
  shape.tp_group.intra_node = type_links_[device_type];
  shape.tp_group.network = cluster_.network;
  const StageUnitCosts u = unit_costs(shape, sp);
  // An MoE model's leading dense blocks may be the faster kind: the bound takes the faster.
  double block = u.block.forward_seconds + u.block.backward_seconds;
  if (model_is_moe(model_) && model_.moe.first_dense_layers > 0)
    block = std::min(block, u.dense_block.times.forward_seconds + u.dense_block.times.backward_seconds);
  return {block, u.embedding.forward_seconds + u.embedding.backward_seconds, u.head.forward_seconds + u.head.backward_seconds};
}

StageUnitCosts CostModel::unit_costs(const StageShape& shape, bool sp) const {
  // MoE models: the dense arithmetic prices attention and shared experts; the router, the
  // routed experts and their all-to-alls are added below.
  const ModelSpec& m = dense_part_;
  const Precision p = train_.precision;
  const int64_t b = shape.micro_batch;
  const int64_t s = train_.seq_len;
  const double e = precision_bytes(p);
  const int tp = shape.tp;
  StageUnitCosts u;
  u.sequence_parallel = sp;

  const DenseBlockCosts dense = dense_block_costs(m, shape, sp, !model_is_moe(model_));
  const LayerTimes compute_only = dense.compute;
  u.block = dense.times;
  u.recompute_selective_seconds = dense.recompute_selective_seconds;
  u.recompute_full_seconds = dense.recompute_full_seconds;
  u.block_parameters = dense.parameters;
  u.fp8_weight_cast_seconds = dense.fp8_weight_cast_seconds;
  if (model_is_moe(model_) && model_.moe.first_dense_layers > 0) {
    u.dense_block = dense_block_costs(leading_dense_, shape, sp, true);
  }
  MoeRoutedWork routed;
  if (model_is_moe(model_)) {
    routed = moe_routed_work(model_, shape, s, p);
    const DeviceType& type = priced_types_[shape.device_type];
    const double routed_forward = compute_seconds(type, p, routed.work, false);
    // Dispatch and combine in forward, their gradients' in backward: none hidden by compute
    // (the experts wait for their rows, the next layer for the combined output).
    u.expert_all_to_all_seconds = all_to_all_seconds(routed.dispatch_bytes, shape.ep_group);
    u.block.forward_seconds += routed_forward + 2.0 * u.expert_all_to_all_seconds;
    u.block.backward_seconds += compute_seconds(type, p, routed.work, true) + 2.0 * u.expert_all_to_all_seconds;
    // Full recomputation runs the routed part's forward again, dispatch and combine included.
    u.recompute_full_seconds += routed_forward + 2.0 * u.expert_all_to_all_seconds;
    // Every tp rank holds the router and its experts whole (the runtime replicates the MoE MLP
    // over tp).
    u.block_expert_parameters = shape.held_experts * static_cast<double>(moe_expert_parameters(model_));
    u.block_parameters += u.block_expert_parameters + static_cast<double>(moe_router_parameters(model_)) +
                          moe_shared_parameters_beyond_share(model_, tp);
  }
  double host_link = 0;
  for (const NodeGroup& g : cluster_.node_groups)
    if (g.device_type_index == shape.device_type && (host_link == 0 || g.host_link_bytes_per_second < host_link))
      host_link = g.host_link_bytes_per_second;
  // Without a host link offloading is impossible: a prohibitive cost keeps the planner away.
  const double g = gradient_element_bytes();
  u.offload_weights_seconds = host_link > 0 ? u.block_parameters * e / host_link : kNoHostLinkSeconds;
  u.offload_gradients_seconds = host_link > 0 ? u.block_parameters * g / host_link : kNoHostLinkSeconds;
  if (u.dense_block.parameters > 0) {
    u.dense_block.offload_weights_seconds = host_link > 0 ? u.dense_block.parameters * e / host_link : kNoHostLinkSeconds;
    u.dense_block.offload_gradients_seconds = host_link > 0 ? u.dense_block.parameters * g / host_link : kNoHostLinkSeconds;
  }
  if (shape.dp > 1) {
    // Under expert parallelism the member's routed experts are gathered over the members holding
    // the same ones, the rest of the block over dp.
    const double expert_bytes = shape.ep > 1 ? u.block_expert_parameters * e : 0;
    double gather = group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_gather,
                                  u.block_parameters * e - expert_bytes, shape.dp_group);
    if (expert_bytes > 0)
      gather += group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_gather, expert_bytes, shape.expert_dp_group);
    // The gradients' reduce-scatters go in buckets, priced per step by
    // stage_gradient_sync_seconds, not one per block.
    // A prefetched gather runs under the previous block's compute, unless it copies on the same
    // cores (runtime_traits.cpp) and adds its whole time.
    const bool shares_cores = runtime_traits(cluster_.device_types[shape.device_type]).collectives_share_compute_cores;
    u.zero3_hiding = shares_cores ? LayerTimes{} : compute_only;
    u.zero3_forward_seconds = std::max(0.0, gather - u.zero3_hiding.forward_seconds);
    u.zero3_backward_seconds = std::max(0.0, gather - u.zero3_hiding.backward_seconds);
  }

  u.embedding = layer_times(shape, LayerKind::LayerKind_embedding, sp, embedding_work(m, b, s, tp, p));
  const RuntimeTraits& runtime = runtime_traits(cluster_.device_types[shape.device_type]);
  u.head = layer_times(shape, LayerKind::LayerKind_head, sp, head_work(m, b, s, tp, p, runtime.loss_logits));
  if (tp > 1) {
    // Vocabulary-parallel embedding all-reduces its output; the head all-reduces its input gradient.
    const double hidden = hidden_state_bytes(m, b, s, p);
    const double ar = group_seconds(shape.device_type, CollectiveOp::CollectiveOp_all_reduce, hidden, shape.tp_group);
    u.embedding.forward_seconds += ar;
    u.head.backward_seconds += ar;
  }
  u.embedding_parameters = static_cast<double>(embedding_parameters(m)) / tp;
  u.head_parameters = static_cast<double>(head_parameters(m, true)) / tp;

  for (int r = 0; r < 3; ++r)
    u.block_activation_bytes[r] = dense.activation_bytes[r] + (r == 2 ? 0 : routed.activation_bytes);
  u.head_activation_bytes = head_activation_bytes(m, b, s, tp, p, runtime.attention_memory, runtime.loss_logits);
  u.head_backward_workspace_bytes = head_backward_workspace_bytes(m, b, s, tp, runtime.loss_logits);
  u.backward_workspace_bytes = std::max(dense.backward_workspace_bytes, routed.workspace_bytes);
  u.boundary_bytes = hidden_state_bytes(m, b * shape.dp, s, p);
  u.block_output_bytes = hidden_state_bytes(m, b, s, p) / (sp ? tp : 1);
  const bool keeps_whole = runtime.sequence_parallel_keeps_whole_hidden_states;
  u.embedding_activation_bytes = embedding_activation_bytes(m, b, s, tp, sp && !keeps_whole, p);
  if (sp && keeps_whole) {
    u.chunk_input_extra_bytes = hidden_state_bytes(m, b, s, p) - u.block_output_bytes;
    u.chunk_output_bytes = hidden_state_bytes(m, b, s, p);
  }
  for (int r = 0; r < 3; ++r)
    u.activations_link_seconds[r] = host_link > 0 ? std::max(0.0, u.block_activation_bytes[r] - u.block_output_bytes) / host_link
                                                  : kNoHostLinkSeconds;
  return u;
}

double CostModel::stage_head_parameters(const StageShape& shape, const StageUnitCosts& u, const StageChoice& c) const {
  if (!c.has_head) return 0;
  return c.head_holds_lm_matrix ? u.head_parameters : static_cast<double>(head_parameters(model_, false)) / shape.tp;
}

double CostModel::stage_unsharded_tied_parameters(const StageShape& shape, const StageChoice& c) const {
  const bool tied_across_stages = model_.tied_embeddings && !(c.has_embedding && c.has_head) &&
                                  (c.has_embedding || (c.has_head && c.head_holds_lm_matrix));
  return tied_across_stages ? static_cast<double>(model_.vocab_size * model_.hidden_size) / shape.tp : 0;
}

double CostModel::stage_parameters(const StageShape& shape, const StageUnitCosts& u, const StageChoice& c) const {
  return stage_blocks_sum(c, u.block_parameters, u.dense_block.parameters) + (c.has_embedding ? u.embedding_parameters : 0) +
         stage_head_parameters(shape, u, c);
}

StageTiming CostModel::stage_timing(const StageShape& shape, const StageUnitCosts& u, const StageChoice& c,
                                    double boundary_send_seconds, int chunks_sent) const {
  StageTiming t = stage_timing_without_sync(shape, u, c, boundary_send_seconds, chunks_sent);
  t.gradient_sync_seconds = stage_gradient_sync_seconds(shape, u, c);
  return t;
}

StageTiming CostModel::stage_timing_without_sync(const StageShape& shape, const StageUnitCosts& u, const StageChoice& c,
                                                 double boundary_send_seconds, int chunks_sent) const {
  StageTiming t;
  const DenseBlockCosts& dense = u.dense_block;
  const OffloadExposure exposure = stage_offload_exposure(u, c);
  t.offload_forward_seconds = exposure.forward_seconds;
  t.offload_backward_seconds = exposure.backward_seconds;
  t.forward_seconds = stage_blocks_sum(c, u.block.forward_seconds, dense.times.forward_seconds) + t.offload_forward_seconds;
  t.backward_seconds = stage_blocks_sum(c, u.block.backward_seconds, dense.times.backward_seconds) +
                       (c.selective - c.dense_selective) * u.recompute_selective_seconds +
                       c.dense_selective * dense.recompute_selective_seconds +
                       (c.full - c.dense_full) * u.recompute_full_seconds + c.dense_full * dense.recompute_full_seconds +
                       t.offload_backward_seconds;
  if (c.zero == 3) {  // offloaded blocks come whole from host memory: only resident ones are gathered
    const Zero3FirstGathers first = stage_zero3_first_gathers(shape, u, c);
    t.first_gather_forward_seconds = first.forward_seconds;
    t.first_gather_backward_seconds = first.backward_seconds;
    const double gathered = c.blocks - c.offloaded;
    const double forward_gathers =
        first.forward_seconds + first.ahead_forward_seconds + (gathered - first.forward_blocks) * u.zero3_forward_seconds;
    const double backward_gathers =
        first.backward_seconds + first.ahead_backward_seconds + (gathered - first.backward_blocks) * u.zero3_backward_seconds;
    if (stage_keeps_weights_gathered(shape, c)) {
      // The step's first forward gathers every block; nothing after it does.
      t.forward_seconds += forward_gathers / std::max(1, c.micro_batches);
    } else {
      t.forward_seconds += forward_gathers;
      t.backward_seconds += backward_gathers;
    }
  }
  if (c.has_embedding) {
    t.forward_seconds += u.embedding.forward_seconds;
    t.backward_seconds += u.embedding.backward_seconds;
  }
  if (c.has_head) {
    t.forward_seconds += u.head.forward_seconds;
    t.backward_seconds += u.head.backward_seconds;
  }
  // Activations go forward, their gradients come back: one send each way per chunk.
  t.boundary_send_seconds = chunks_sent * boundary_send_seconds;
  t.forward_seconds += t.boundary_send_seconds;
  t.backward_seconds += t.boundary_send_seconds;

  const double e = precision_bytes(train_.precision);
  const double params = stage_parameters(shape, u, c);
  const int states = optimizer_states(train_);
  const bool master = train_.master_weights_fp32 && e < 4;
  const double bytes_per_update = 8.0 * states + e + (master ? 8.0 + e : 2.0 * e);
  const double share = c.zero >= 1 ? shape.zero_share : 1.0;
  const double offloaded_params = stage_offloaded_parameters(u, c);
  const DeviceType& type = priced_types_[shape.device_type];
  const double measured_rate = profile_ ? profile_->optimizer_rate(type.name) : 0.0;
  const double device_seconds_per_parameter =
      measured_rate > 0 ? measured_rate
                        : bytes_per_update / (device_memory_bytes_per_second(type) * runtime_traits(type).optimizer_bandwidth_share);
  const double host_seconds_per_parameter = runtime_traits(type).host_is_device
                                                ? device_seconds_per_parameter
                                                : bytes_per_update / kHostOptimizerBytesPerSecond;
  // ZeRO shards the routed experts over the dp / ep members holding them.
  const double offloaded_experts = stage_offloaded_expert_parameters(u, c);
  const double expert_params = (c.blocks - c.dense_blocks) * u.block_expert_parameters - offloaded_experts;
  const double expert_extra = c.zero >= 1 ? expert_params * (shape.expert_zero_share - share) : 0;
  // An offloaded block's routed experts update in host memory at the expert-dp share.
  const double expert_share = c.zero >= 1 ? shape.expert_zero_share : 1.0;
  // A tied table kept whole on this stage updates whole on every member.
  const double whole_extra = c.zero >= 1 ? stage_unsharded_tied_parameters(shape, c) * (1.0 - share) : 0;
  t.optimizer_seconds = ((params - offloaded_params) * share + expert_extra + whole_extra) * device_seconds_per_parameter +
                        ((offloaded_params - offloaded_experts) * share + offloaded_experts * expert_share) *
                            host_seconds_per_parameter;
  // A runtime that casts weights to fp8 once a step does so with the step's first micro-batch,
  // priced here with the step's other once-a-step work.
  t.optimizer_seconds += stage_blocks_sum(c, u.fp8_weight_cast_seconds, u.dense_block.fp8_weight_cast_seconds);
  // The optimizer waits for the last block's gradients to reach host memory: the stage's first,
  // a leading dense block if one is offloaded.
  if (c.offloaded > 0)
    t.optimizer_seconds += c.dense_offloaded > 0 ? u.dense_block.offload_gradients_seconds : u.offload_gradients_seconds;
  return t;
}

MemoryBreakdown CostModel::stage_memory(const StageShape& shape, const StageUnitCosts& u, const StageChoice& c,
                                        double in_flight, bool has_next_stage) const {
  MemoryBreakdown mem;
  const double e = precision_bytes(train_.precision);
  const bool master = train_.master_weights_fp32 && e < 4;
  const int states = optimizer_states(train_);
  const double head_params = c.head_holds_lm_matrix ? u.head_parameters
                                                    : static_cast<double>(head_parameters(model_, false)) / shape.tp;
  const double offloaded_params = stage_offloaded_parameters(u, c);
  const double offloaded_experts = stage_offloaded_expert_parameters(u, c);
  const double params = stage_blocks_sum(c, u.block_parameters, u.dense_block.parameters) - offloaded_params +
                        (c.has_embedding ? u.embedding_parameters : 0) + (c.has_head ? head_params : 0);
  const double dp = shape.dp;
  const double whole = stage_unsharded_tied_parameters(shape, c);
  // The routed experts shard over the members holding the same ones (dp / ep of them).
  const double experts = (c.blocks - c.dense_blocks) * u.block_expert_parameters - offloaded_experts;
  const auto sharded = [&](bool by_zero) {
    return by_zero ? (params - whole - experts) * shape.zero_share + experts * shape.expert_zero_share + whole : params;
  };
  const RuntimeTraits& runtime = runtime_traits(cluster_.device_types[shape.device_type]);
  const bool no_compute_shard = c.zero >= 3 && master && !runtime.zero3_keeps_compute_precision_shard;
  mem.parameters_bytes = no_compute_shard ? 0 : sharded(c.zero >= 3) * e;
  // With fp32 master weights gradients accumulate in fp32, as Alloy's GPU runtime and
  // Megatron-LM's do.
  const double g = gradient_element_bytes();
  if (stage_gradients_sharded(shape, c)) {
    // Every micro-batch's backward writes its gradients a part at a time, each part
    // reduce-scattered into the member's shard once complete (a tied table sits whole in it, as
    // its parameters do): the shard, the part being written and, where the collectives have cores
    // of their own, the previous one still on the network (Alloy's CPU runtime finishes it first:
    // it would hide nothing). A part holds whole tensors or rows of a matrix up to the bucket size
    // (fp32), never less than a row, never more than a bucket. A head tied to the embedding on
    // this stage writes the table's gradient, so the table's parts are live from the head's
    // backward on.
    const StageBuckets buckets = stage_gradient_buckets(shape, u, c);
    const double widest_row = std::max<double>(model_.hidden_size, static_cast<double>(model_.ffn_hidden_size) / shape.tp);
    const double part_params =
        std::min(buckets.largest_bytes / g, std::max(train_.gradient_bucket_mib * kMiB / 4.0, widest_row));
    const bool several_parts = params > part_params;
    const bool tied_here = model_.tied_embeddings && c.has_embedding && c.has_head && several_parts;
    const double table_params = tied_here ? static_cast<double>(model_.vocab_size * model_.hidden_size) / shape.tp : 0;
    const bool overlapped =
        !runtime.collectives_share_compute_cores && several_parts;
    const double live_params = (overlapped ? 2.0 : 1.0) * part_params + table_params;
    mem.gradients_bytes = (sharded(true) + live_params) * g;
  } else {
    // Accumulated in full over the micro-batches and reduced once, after the last backward.
    mem.gradients_bytes = params * g;
  }
  const bool master_sharded = runtime.zero_shards_master_weights ? c.zero >= 1 : c.zero >= 3;
  mem.master_weights_bytes = master ? sharded(master_sharded) * 4.0 : 0;
  mem.optimizer_states_bytes = sharded(c.zero >= 1) * 4.0 * states;
  // ZeRO 3 gathers the unit in use and prefetches the next one (Alloy's runtime, like
  // DeepSpeed's prefetch): two blocks, or a block with the embedding or the head. Offloaded
  // blocks are not gathered (their weights come whole through the offload window).
  if (c.zero >= 3 && dp > 1 && stage_keeps_weights_gathered(shape, c)) {
    mem.zero3_gather_bytes = params * e;
  } else if (c.zero >= 3 && dp > 1) {
    const int gathered = c.blocks - c.offloaded;
    const double block = gathered > 0 ? u.block_parameters : 0;
    double pair = gathered > 1 ? 2 * block : block;
    if (c.has_head) pair = std::max(pair, block + head_params);
    if (c.has_embedding) pair = std::max(pair, u.embedding_parameters + block);
    mem.zero3_gather_bytes = pair * e;
  }
  // The block in use and `depth` fetched ahead are resident, each with its weights and its
  // gradient buffer (fp32 under master weights), in slots the size of the largest offloaded block.
  if (c.offloaded > 0) {
    const double slot_params = c.offloaded > c.dense_offloaded ? u.block_parameters : u.dense_block.parameters;
    mem.offload_window_bytes = std::min(c.offloaded, c.prefetch_depth + 1) * slot_params * (e + g);
  }
  // On the host: weights and gradients whole (reduced there once per step), the fp32 master copy
  // and the optimizer states sharded over the replicas from ZeRO 1 on: the routed experts (this
  // member's, under expert parallelism) over the members holding the same ones.
  const double host_share = c.zero >= 1 ? shape.zero_share : 1.0;
  const double expert_host_share = c.zero >= 1 ? shape.expert_zero_share : 1.0;
  const double per_sharded_param = (master ? 4.0 : 0) + 4.0 * states;
  mem.host_offload_bytes = offloaded_params * (e + g) + (offloaded_params - offloaded_experts) * host_share * per_sharded_param +
                           offloaded_experts * expert_host_share * per_sharded_param;

  const int none = c.blocks - c.selective - c.full;
  const int dense_none = c.dense_blocks - c.dense_selective - c.dense_full;
  const double* dense_bytes = u.dense_block.activation_bytes;
  const double per_micro_batch = (none - dense_none) * u.block_activation_bytes[0] +
                                 (c.selective - c.dense_selective) * u.block_activation_bytes[1] +
                                 (c.full - c.dense_full) * u.block_activation_bytes[2] + dense_none * dense_bytes[0] +
                                 c.dense_selective * dense_bytes[1] + c.dense_full * dense_bytes[2] +
                                 (c.has_embedding ? u.embedding_activation_bytes : 0) +
                                 (c.has_head ? u.head_activation_bytes : 0) +
                                 c.chunks_received * u.chunk_input_extra_bytes + c.chunks_sent * u.chunk_output_bytes;
  mem.activations_bytes = in_flight * per_micro_batch;
  // Parked activations (all but each block's output) wait in host memory. At the end of the
  // forward, one block's are on their way out while the link keeps up with the forward, and
  // `depth` more queue when it does not. When the backward reaches the parked blocks (the stage's
  // first), the block and `depth` fetched ahead are back, while the later blocks' and the head's
  // activations of that micro-batch are gone. The window is the larger of the two.
  const int parked = c.parked_selective + c.parked_none;
  if (parked > 0) {
    const auto leaves = [&](int level) { return std::max(0.0, u.block_activation_bytes[level] - u.block_output_bytes); };
    const int level = c.parked_none > 0 ? 0 : 1;
    const double per_micro_batch_parked = c.parked_none * leaves(0) + c.parked_selective * leaves(1);
    const bool link_behind = u.activations_link_seconds[level] > u.block.forward_seconds;
    const double freed_before = (none - c.parked_none) * leaves(0) + (c.selective - c.parked_selective) * leaves(1) +
                                (c.has_head ? u.head_activation_bytes : 0);
    const double forward_window = std::min(parked, link_behind ? c.prefetch_depth + 1 : 1) * leaves(level);
    const double backward_window = std::min(parked, c.prefetch_depth + 1) * leaves(level) - freed_before;
    mem.activations_bytes -= in_flight * per_micro_batch_parked;
    mem.offload_window_bytes += std::max(forward_window, backward_window);
    mem.host_offload_bytes += in_flight * per_micro_batch_parked;
  }

  // Recomputing a block rebuilds its activations for the duration of its backward: all of them
  // under full recomputation, the attention core's (what selective recomputation did not keep)
  // under selective. The larger of an MoE block's backward and a leading dense block's.
  const auto transient = [](int full, int selective, const double* bytes) {
    return full > 0 ? bytes[0] : selective > 0 ? bytes[0] - bytes[1] : 0.0;
  };
  double block_backward_peak =
      u.backward_workspace_bytes +
      transient(c.full - c.dense_full, c.selective - c.dense_selective, u.block_activation_bytes);
  if (c.dense_blocks > 0) {
    block_backward_peak = std::max(block_backward_peak, u.dense_block.backward_workspace_bytes +
                                                            transient(c.dense_full, c.dense_selective, dense_bytes));
  }
  // The head's backward runs before its stage's blocks', holding its loss's gradients.
  if (c.has_head) block_backward_peak = std::max(block_backward_peak, u.head_backward_workspace_bytes);
  if (c.has_head && runtime.head_stage_peak_is_larger_phase) {
    // Alloy's CPU runtime (measured; the GPU runtime's head stage is not, so it keeps the sum):
    // the stage peaks either in the head's backward (all of the micro-batch's activations held,
    // and the head's whole input and its gradient) or in its blocks' backward after it, once the
    // head's activations are gone: the larger of the two, not their sum (measured on small-gpt,
    // 8 sequences per micro-batch: the sum put a fully recomputed head stage 19% over its peak).
    const double head_backward_peak = 2.0 * u.boundary_bytes / shape.dp;
    block_backward_peak = std::max(head_backward_peak, block_backward_peak - u.head_activation_bytes);
  }
  mem.workspace_bytes = runtime.library_workspace_bytes + block_backward_peak;
  const double hidden_per_replica = u.boundary_bytes / dp;
  // Sharded gradients reduce in their buckets, already counted with the gradients.
  if (shape.dp > 1 && c.zero < 3 && !stage_gradients_sharded(shape, c))
    mem.communication_buffers_bytes += runtime.gradient_bucket_bytes;
  if (shape.tp > 1) mem.communication_buffers_bytes += hidden_per_replica;
  if (has_next_stage) mem.communication_buffers_bytes += 2.0 * hidden_per_replica / shape.tp;
  mem.framework_context_bytes = runtime.framework_context_bytes;
  mem.allocator_margin_bytes = runtime.allocator_margin_fraction *
                               (mem.activations_bytes + mem.workspace_bytes + mem.communication_buffers_bytes);
  const double allocated = mem.total_bytes() - mem.framework_context_bytes;
  mem.allocator_margin_bytes += allocated * runtime.allocator_fragmentation / (1.0 - runtime.allocator_fragmentation);
  return mem;
}

}  // namespace alloy
