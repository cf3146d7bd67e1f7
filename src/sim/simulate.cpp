// Event simulation of one optimizer step: a task graph from the lanes' schedules, replayed in
// time order; transfers progress at the rate their most loaded link allows (processor sharing).
#include "sim/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <queue>

#include <fmt/format.h>

#include "cost/comm.hpp"
#include "cost/cost_model.hpp"
#include "cost/network_paths.hpp"
#include "search/planner.hpp"
#include "sim/collectives.hpp"
#include "sim/shared_links.hpp"
#include "spec/error.hpp"
#include "spec/topology.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

// Per stage: one block's activations parked in host memory (all but its output) per
// micro-batch, at recomputation none and selective, from the cost model's activation formula.
std::vector<std::array<int64_t, 2>> parked_block_bytes(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster) {
  const CostModel cost(model, cluster, plan_train_spec(TrainSpec{}, plan));
  std::vector<std::array<int64_t, 2>> bytes;
  for (const PlanStage& st : plan.stages) {
    bytes.push_back({0, 0});
    if (std::find(st.offload_activations.begin(), st.offload_activations.end(), true) == st.offload_activations.end()) continue;
    const StageShape shape = cost.stage_shape(st.device_ids, st.tp, st.dp, st.replica_sequences(plan.micro_batch_sequences, 0));
    const StageUnitCosts unit = cost.unit_costs(shape, st.sequence_parallel);
    for (int level = 0; level < 2; ++level)
      bytes.back()[static_cast<size_t>(level)] =
          static_cast<int64_t>(std::max(0.0, unit.block_activation_bytes[level] - unit.block_output_bytes));
  }
  return bytes;
}

// Links of one lane's device that transfers share: fabric and network, each direction, and
// the host link for offload copies.
enum Resource { kIntraTx, kIntraRx, kNetTx, kNetRx, kHostIn, kHostOut, kNumResources };

struct Task {
  int lane = 0;
  int op_index = 0;
  OpKind kind = OpKind::OpKind_forward;
  SimStream stream = SimStream::SimStream_compute;
  double duration_seconds = 0;   // compute: fixed; transfers: alone on their links
  double remaining_seconds = 0;  // transfers: work left at full rate
  std::vector<int> resources;    // global resource ids, each taken whole
  std::vector<SharedLinkShare> links;  // rack uplinks and WAN ports crossed, and the part of each taken
  int unmet = 0;
  std::vector<int> dependents;
  int critical_pred = -1;
  double start = -1;
  double end = -1;
  double alloc_bytes = 0;        // allocated when the task starts
  std::vector<std::pair<int, double>> frees;  // (task whose end frees it, bytes)
};

// What the running transfers ask of each link: a lane's links count whole transfers, a shared
// link the sum of its transfers' shares. A transfer runs at 1 / the most oversubscribed of them.
class LinkLoads {
 public:
  LinkLoads(size_t lane_links, size_t shared_links)
      : load_(lane_links + shared_links, 0.0), shared_users_(shared_links, 0), first_shared_(lane_links) {}

  void add(const Task& t) {
    for (int r : t.resources) load_[static_cast<size_t>(r)] += 1;
    for (const SharedLinkShare& l : t.links) {
      load_[first_shared_ + static_cast<size_t>(l.link)] += l.share;
      ++shared_users_[static_cast<size_t>(l.link)];
    }
  }
  void remove(const Task& t) {
    for (int r : t.resources) load_[static_cast<size_t>(r)] -= 1;
    for (const SharedLinkShare& l : t.links) {
      double& load = load_[first_shared_ + static_cast<size_t>(l.link)];
      load = --shared_users_[static_cast<size_t>(l.link)] == 0 ? 0 : load - l.share;  // no rounding left behind
    }
  }
  double slowdown(const Task& t) const {
    double worst = 1;
    for (int r : t.resources) worst = std::max(worst, load_[static_cast<size_t>(r)]);
    for (const SharedLinkShare& l : t.links) worst = std::max(worst, load_[first_shared_ + static_cast<size_t>(l.link)]);
    return worst;
  }

 private:
  std::vector<double> load_;
  std::vector<int> shared_users_;
  size_t first_shared_;
};

double memory_term(const PlanStage& st, const char* name) {
  for (const MemoryTerm& t : st.memory)
    if (t.name == name) return t.bytes;
  return 0;
}

// One stage's MoE blocks as the lanes' ops need them (sim_block_costs).
struct SimBlockCosts {
  double all_to_all_seconds = 0;
  double dense_forward = 1;
  double dense_backward = 1;
  double dense_activations = 1;
};

class Simulator {
 public:
  Simulator(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const SimOptions& options)
      : plan_(plan), model_(model), cluster_(cluster), options_(options), link_demands_(plan, cluster) {}

  SimResult run();

 private:
  void build_lane(int lane);
  void link_lane(int lane);
  double transfer_seconds(int lane, const ScheduleOp& op, std::vector<int>* resources, std::vector<SharedLinkShare>* links);
  // A reduction or gather alone on its links (sim_collective), with the lane's links it holds.
  double collective_alone_seconds(int lane, const ScheduleOp& op, std::vector<int>* resources,
                                  std::vector<SharedLinkShare>* links);
  ScheduleOp zero3_gather_op(int lane, const ScheduleOp& pass, int begin, int end) const {
    return sim_zero3_gather_op(plan_, model_, lane, lanes_[lane].dp_rank, pass, begin, end);
  }
  // The sum of a table tied between the first and last stage, before their optimizer step.
  double tied_table_seconds(int lane) const {
    if (lane != 0 && lane + 1 != static_cast<int>(plan_.stages.size())) return 0;
    return network_tied_table_seconds(cluster_, model_, plan_.gradient_bytes, plan_.stages.front().device_ids,
                                      plan_.stages.front().tp, plan_.stages.back().device_ids, plan_.stages.back().tp);
  }
  void add_dep(int task, int on) {
    if (on < 0) return;
    tasks_[task].unmet++;
    tasks_[on].dependents.push_back(task);
  }
  void replay();
  void finish(SimResult* out);

  const Plan& plan_;
  const ModelSpec& model_;
  const ClusterSpec& cluster_;
  const SimOptions& options_;
  SimLinkDemands link_demands_;
  std::vector<RankInfo> rank_map_;
  std::vector<RankSchedule> lanes_;
  std::vector<int> lane_first_task_;
  std::vector<Task> tasks_;
  // (lane, tag, recv kind) -> sends of that lane with the tag
  std::map<std::tuple<int, int, int>, std::vector<int>> sends_by_tag_;
  std::vector<double> static_bytes_;
  std::vector<std::vector<int>> op_task_;        // per lane and schedule op: its (first) task
  std::vector<SimBlockCosts> block_costs_;  // per lane
};

// Per stage, as the cost model prices replica 0: one MoE block's dispatch and combine for a whole
// micro-batch (0 for dense models and stages that hold every expert), and an MoE model's leading
// dense block's forward and backward time and activations over an MoE block's (1: alike).
std::vector<SimBlockCosts> sim_block_costs(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster) {
  std::vector<SimBlockCosts> out(plan.stages.size());
  if (!model_is_moe(model)) return out;
  const CostModel cost(model, cluster, plan_train_spec(TrainSpec{}, plan));
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    const bool dense_here = std::any_of(st.chunks.begin(), st.chunks.end(),
                                        [&](const LayerRange& c) { return c.begin < model.moe.first_dense_layers; });
    if (st.ep <= 1 && !dense_here) continue;
    StageShape shape = cost.stage_shape(st.device_ids, st.tp, st.dp, st.replica_sequences(plan.micro_batch_sequences, 0));
    plan_stage_set_experts(cost, plan, static_cast<int>(s), 0, &shape);
    const StageUnitCosts u = cost.unit_costs(shape, st.sequence_parallel);
    if (st.ep > 1) out[s].all_to_all_seconds = 2.0 * u.expert_all_to_all_seconds;
    if (!dense_here) continue;
    out[s].dense_forward = u.dense_block.times.forward_seconds / u.block.forward_seconds;
    out[s].dense_backward = u.dense_block.times.backward_seconds / u.block.backward_seconds;
    out[s].dense_activations = u.dense_block.activation_bytes[0] / u.block_activation_bytes[0];
  }
  return out;
}

double Simulator::transfer_seconds(int lane, const ScheduleOp& op, std::vector<int>* resources,
                                   std::vector<SharedLinkShare>* links) {
  const PlanStage& from = plan_.stages[lane];
  const RankInfo& peer = rank_map_.at(op.peer);
  const Device& a = cluster_.devices[lanes_[lane].device_id];
  const Device& b = cluster_.devices[peer.device_id];
  const int peer_lane = peer.stage;
  BoundaryLink link;
  link.intra_node = cluster_.node_group(a).intra_node;
  const bool flat = topology_is_flat(cluster_);
  const bool own_path = !flat && a.node != b.node;
  const HopLinks path = own_path ? topology_hops(cluster_, {{a.id, b.id}}).front() : HopLinks{};
  link.network = own_path ? path.nic : cluster_.network;
  boundary_link_apply_profile(&link, options_.profile, cluster_.device_type(a).name, path.measured);
  if (a.node == b.node) {
    link.path = P2pPath::P2pPath_intra_node;
    resources->assign({lane * kNumResources + kIntraTx, peer_lane * kNumResources + kIntraRx});
  } else {
    // Every device of the stage on this node sends at the same time, sharing the node's network;
    // on a tiered cluster the lanes also share the NICs on the way and any rack uplink or WAN.
    const int concurrent = network_busiest_node_count(cluster_, from.device_ids);
    if (!flat) {
      const std::vector<int>& to_ids = plan_.stages[peer_lane].device_ids;
      const BoundaryNetwork net = network_boundary(cluster_, from.device_ids, to_ids);
      const double lanes = static_cast<double>(std::max(from.device_ids.size(), to_ids.size()));
      link.aggregate_network_bytes_per_second =
          std::min(link.network.bandwidth_bytes_per_second / concurrent, net.aggregate_bytes_per_second / lanes);
    } else {
      link.aggregate_network_bytes_per_second = link.network.bandwidth_bytes_per_second / concurrent;
    }
    link.path = cluster_.device_type(a).vendor == cluster_.device_type(b).vendor ? P2pPath::P2pPath_network
                                                                                 : P2pPath::P2pPath_host_staged;
    link.host_link_from_bytes_per_second = cluster_.node_group(a).host_link_bytes_per_second;
    link.host_link_to_bytes_per_second = cluster_.node_group(b).host_link_bytes_per_second;
    resources->assign({lane * kNumResources + kNetTx, peer_lane * kNumResources + kNetRx});
    *links = link_demands_.boundary(lane, peer_lane, link.aggregate_network_bytes_per_second);
  }
  return boundary_seconds(static_cast<double>(op.bytes), link);
}

double Simulator::collective_alone_seconds(int lane, const ScheduleOp& op, std::vector<int>* resources,
                                           std::vector<SharedLinkShare>* links) {
  const SimCollective c =
      sim_collective(plan_, cluster_, options_.profile, &link_demands_, lane, lanes_[lane].dp_rank, lanes_[lane].device_id, op);
  if (c.intra_node) resources->insert(resources->end(), {lane * kNumResources + kIntraTx, lane * kNumResources + kIntraRx});
  if (c.network) resources->insert(resources->end(), {lane * kNumResources + kNetTx, lane * kNumResources + kNetRx});
  *links = c.links;
  return c.seconds;
}

void Simulator::build_lane(int lane) {
  const RankSchedule& rs = lanes_[lane];
  const PlanStage& st = plan_.stages[lane];
  const SimBlockCosts& costs = block_costs_[static_cast<size_t>(lane)];
  // Blocks [begin, end) weighted by kind: an MoE model's leading dense blocks take `dense` of an
  // MoE block (the stage's times and activations split over its blocks so).
  const int dense_blocks = model_is_moe(model_) ? static_cast<int>(model_.moe.first_dense_layers) : 0;
  const auto weight = [&](int begin, int end, double dense) {
    const int dense_in = std::clamp(dense_blocks, begin, end) - begin;
    return (end - begin - dense_in) + dense_in * dense;
  };
  const auto stage_weight = [&](double dense) {
    double sum = 0;
    for (const LayerRange& c : st.chunks) sum += weight(c.begin, c.end, dense);
    return std::max(sum, 1e-30);
  };
  const double forward_total = stage_weight(costs.dense_forward), backward_total = stage_weight(costs.dense_backward);
  const double activation_total = stage_weight(costs.dense_activations);
  const double in_flight = st.micro_batches_in_flight > 0 ? st.micro_batches_in_flight : 0;
  const double activation_per_mb = in_flight > 0 ? memory_term(st, "activations") / in_flight : 0;
  const Device& dev = cluster_.devices[rs.device_id];
  const double host_link = cluster_.node_group(dev).host_link_bytes_per_second;

  int last_compute = -1, before_last_compute = -1, last_recv = -1, last_collective = -1, last_copy = -1;
  const bool gathers = st.zero == 3 && st.dp > 1;
  int first_gathered = -1;  // ZeRO 3: the block the current pass gathered alone
  std::vector<int> pending_inputs;
  std::map<std::pair<int, int>, int> activation_owner;  // (mb, chunk) -> forward task
  for (size_t i = 0; i < rs.ops.size(); ++i) {
    const ScheduleOp& op = rs.ops[i];
    const int id = static_cast<int>(tasks_.size());
    op_task_[lane].push_back(id);
    double all_to_all_seconds = 0;
    tasks_.emplace_back();
    Task& t = tasks_.back();
    t.lane = lane;
    t.op_index = static_cast<int>(i);
    t.kind = op.kind;
    // The op's share of the stage's time per micro-batch: its blocks', and, for a replica whose
    // share runs in pieces, its piece's sequences.
    const bool backward = op.kind == OpKind::OpKind_backward;
    double share = weight(op.block_begin, op.block_end, backward ? costs.dense_backward : costs.dense_forward) /
                   (backward ? backward_total : forward_total);
    double samples = 1;
    if (op.sample_end > op.sample_begin)
      samples = static_cast<double>(op.sample_end - op.sample_begin) / st.replica_sequences(plan_.micro_batch_sequences, rs.dp_rank);
    share *= samples;
    switch (op.kind) {
      case OpKind::OpKind_forward:
      case OpKind::OpKind_backward:
      case OpKind::OpKind_optimizer: {
        t.stream = SimStream::SimStream_compute;
        // The stage's times include its boundary sends and its passes' first ZeRO-3 gathers, which
        // run here as transfers and gathers of their own.
        t.duration_seconds =
            op.kind == OpKind::OpKind_forward
                ? (st.forward_seconds - st.boundary_send_seconds - st.first_gather_forward_seconds) * share
            : op.kind == OpKind::OpKind_backward
                ? (st.backward_seconds - st.boundary_send_seconds - st.first_gather_backward_seconds) * share
                : st.optimizer_seconds + tied_table_seconds(lane);
        // MoE blocks dispatch and combine their tokens inside the pass: shown apart, after it.
        if (op.kind != OpKind::OpKind_optimizer)
          all_to_all_seconds =
              std::min(t.duration_seconds, costs.all_to_all_seconds * weight(op.block_begin, op.block_end, 0) * samples);
        t.duration_seconds -= all_to_all_seconds;
        add_dep(id, last_compute);
        for (int in : pending_inputs) add_dep(id, in);
        pending_inputs.clear();
        if (op.kind == OpKind::OpKind_optimizer) {
          add_dep(id, last_collective);
          add_dep(id, last_copy);
        }
        const LayerRange& chunk = st.chunks[op.chunk];
        const double act = activation_per_mb * weight(chunk.begin, chunk.end, costs.dense_activations) / activation_total;
        if (op.kind == OpKind::OpKind_forward) {
          tasks_[id].alloc_bytes += act;
          activation_owner[{op.micro_batch, op.chunk}] = id;
        }
        if (op.kind == OpKind::OpKind_backward && op.block_begin == st.chunks[op.chunk].begin)
          tasks_[activation_owner[{op.micro_batch, op.chunk}]].frees.emplace_back(id, act);
        before_last_compute = last_compute;
        last_compute = id;
        break;
      }
      case OpKind::OpKind_send_activation:
      case OpKind::OpKind_send_gradient:
        t.stream = SimStream::SimStream_send;
        t.duration_seconds = transfer_seconds(lane, op, &t.resources, &t.links);
        add_dep(id, last_compute);
        add_dep(id, last_recv);
        sends_by_tag_[{lane, op.tag, static_cast<int>(op.kind)}].push_back(id);
        break;
      case OpKind::OpKind_recv_activation:
      case OpKind::OpKind_recv_gradient:
        t.stream = SimStream::SimStream_recv;
        pending_inputs.push_back(id);
        last_recv = id;
        break;
      case OpKind::OpKind_all_reduce:
      case OpKind::OpKind_reduce_scatter:
      case OpKind::OpKind_all_gather: {
        t.stream = SimStream::SimStream_collective;
        // ZeRO 3 gathers a pass's weights inside it (zero3.cpp): its first block when it starts,
        // alone; each next one a block ahead, under the compute (gathered_ahead below).
        const bool pass_gather = op.kind == OpKind::OpKind_all_gather && op.micro_batch >= 0;
        if (pass_gather) first_gathered = sim_zero3_first_block(rs, i, st);
        t.duration_seconds = collective_alone_seconds(
            lane, pass_gather ? zero3_gather_op(lane, op, first_gathered, first_gathered + 1) : op, &t.resources, &t.links);
        add_dep(id, last_collective);
        add_dep(id, last_recv);
        add_dep(id, last_compute);
        if (pass_gather) pending_inputs.push_back(id);
        last_collective = id;
        break;
      }
      case OpKind::OpKind_prefetch:
      case OpKind::OpKind_evict:
        t.stream = SimStream::SimStream_copy;
        t.duration_seconds = host_link > 0 ? static_cast<double>(op.bytes) / host_link : 0;
        t.resources.assign({lane * kNumResources + (op.kind == OpKind::OpKind_prefetch ? kHostIn : kHostOut)});
        add_dep(id, last_copy);
        if (op.kind == OpKind::OpKind_prefetch) {
          add_dep(id, before_last_compute);
          add_dep(id, last_recv);
          pending_inputs.push_back(id);
        } else {
          add_dep(id, last_compute);
        }
        last_copy = id;
        break;
    }
    tasks_[id].remaining_seconds = tasks_[id].duration_seconds;
    if (all_to_all_seconds > 0) {
      const int exchange = static_cast<int>(tasks_.size());
      tasks_.emplace_back();
      Task& x = tasks_.back();
      x.lane = lane;
      x.op_index = static_cast<int>(i);
      x.kind = op.kind;
      x.stream = SimStream::SimStream_all_to_all;
      x.duration_seconds = x.remaining_seconds = all_to_all_seconds;
      add_dep(exchange, id);
      last_compute = exchange;  // the next pass and the sends wait for the combined output
    }
    if (gathers && (op.kind == OpKind::OpKind_forward || op.kind == OpKind::OpKind_backward)) {
      // The pass's first resident block came alone (a forward's blocks before it are offloaded);
      // the other blocks of the op a block ahead of their use.
      int begin = op.block_begin, end = op.block_end;
      if (first_gathered >= begin && first_gathered < end) {
        if (op.kind == OpKind::OpKind_forward) {
          begin = first_gathered + 1;
        } else {
          end = first_gathered;
        }
      }
      first_gathered = -1;
      if (begin < end) {
        const int ahead = static_cast<int>(tasks_.size());
        tasks_.emplace_back();
        Task& g = tasks_.back();
        g.lane = lane;
        g.op_index = static_cast<int>(i);
        g.kind = OpKind::OpKind_all_gather;
        g.stream = SimStream::SimStream_collective;
        g.duration_seconds = collective_alone_seconds(lane, zero3_gather_op(lane, op, begin, end), &g.resources, &g.links);
        g.remaining_seconds = g.duration_seconds;
        add_dep(ahead, last_collective);
        add_dep(ahead, before_last_compute);
        last_collective = ahead;
        pending_inputs.push_back(ahead);  // the next compute waits for this one's weights
      }
    }
  }
  // Model states, buffers and context stay resident (the ZeRO-3 gather buffer and the offload
  // window are reused by every gather and prefetch, as the cost model counts them); activations
  // come and go with the micro-batches.
  static_bytes_[lane] = st.memory_total_bytes() - memory_term(st, "activations");
}

// Receives wait for the sending lane's sends of the same tag (the representative's sends stand
// for those of its replicas, which run at the same times).
void Simulator::link_lane(int lane) {
  const RankSchedule& rs = lanes_[lane];
  for (size_t i = 0; i < rs.ops.size(); ++i) {
    const ScheduleOp& op = rs.ops[i];
    if (!op_kind_is_recv(op.kind)) continue;
    const int from_lane = rank_map_.at(op.peer).stage;
    const OpKind send_kind = op.kind == OpKind::OpKind_recv_activation ? OpKind::OpKind_send_activation
                                                                       : OpKind::OpKind_send_gradient;
    const auto it = sends_by_tag_.find({from_lane, op.tag, static_cast<int>(send_kind)});
    if (it == sends_by_tag_.end())
      throw Error(fmt::format("stage {} receives tag {} that stage {} never sends", lane, op.tag, from_lane),
                  {"", fmt::format("stages[{}]", lane)}, "run schedule_check on the full schedule");
    for (int send : it->second) add_dep(op_task_[lane][i], send);
  }
}

void Simulator::replay() {
  using Event = std::pair<double, int>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> ends;
  std::vector<int> active;
  LinkLoads loads(lanes_.size() * kNumResources, link_demands_.links().size());
  std::vector<int> ready;
  for (size_t i = 0; i < tasks_.size(); ++i)
    if (tasks_[i].unmet == 0) ready.push_back(static_cast<int>(i));
  double now = 0;
  size_t done = 0;
  auto complete = [&](int id) {
    Task& t = tasks_[id];
    t.end = now;
    ++done;
    for (int d : t.dependents) {
      tasks_[d].critical_pred = id;
      if (--tasks_[d].unmet == 0) ready.push_back(d);
    }
  };
  while (done < tasks_.size()) {
    while (!ready.empty()) {
      const int id = ready.back();
      ready.pop_back();
      Task& t = tasks_[id];
      t.start = now;
      if (t.resources.empty() || t.duration_seconds <= 0) {
        ends.push({now + t.duration_seconds, id});
      } else {
        active.push_back(id);
        loads.add(t);
      }
    }
    double next = ends.empty() ? INFINITY : ends.top().first;
    for (int id : active) next = std::min(next, now + tasks_[id].remaining_seconds * loads.slowdown(tasks_[id]));
    if (!std::isfinite(next))
      throw Error("the schedule stalls: operations wait for each other", {"", "schedule"},
                  "run schedule_check on the full schedule to find the rank and operation");
    const double dt = next - now;
    for (int id : active) tasks_[id].remaining_seconds -= dt / loads.slowdown(tasks_[id]);
    now = next;
    const double eps = 1e-12 * std::max(1.0, now);
    std::vector<int> finished;
    for (size_t k = 0; k < active.size();) {
      if (tasks_[active[k]].remaining_seconds <= eps) {
        finished.push_back(active[k]);
        loads.remove(tasks_[active[k]]);
        active[k] = active.back();
        active.pop_back();
      } else {
        ++k;
      }
    }
    while (!ends.empty() && ends.top().first <= now + eps) {
      finished.push_back(ends.top().second);
      ends.pop();
    }
    std::sort(finished.begin(), finished.end());
    for (int id : finished) complete(id);
  }
}

void Simulator::finish(SimResult* out) {
  const int num_lanes = static_cast<int>(lanes_.size());
  double step = 0;
  int last = -1;
  for (size_t i = 0; i < tasks_.size(); ++i)
    if (tasks_[i].end >= step) {
      step = tasks_[i].end;
      last = static_cast<int>(i);
    }
  out->step_seconds = step;
  out->simulated_ops = static_cast<int64_t>(tasks_.size());
  for (int l = 0; l < num_lanes; ++l) {
    const PlanStage& st = plan_.stages[l];
    SimLane lane;
    lane.rank = lanes_[l].rank;
    lane.stage = l;
    lane.device_id = lanes_[l].device_id;
    lane.device_type = st.device_type;
    lane.represented_ranks = st.tp * st.dp;
    lane.static_memory_bytes = static_bytes_[l];
    std::vector<std::pair<double, double>> changes;  // (time, delta)
    for (int id = lane_first_task_[l]; id < lane_first_task_[l + 1]; ++id) {
      const Task& t = tasks_[id];
      if (t.stream == SimStream::SimStream_compute) lane.busy_seconds += t.end - t.start;
      if (t.stream == SimStream::SimStream_send || t.stream == SimStream::SimStream_collective ||
          t.stream == SimStream::SimStream_copy || t.stream == SimStream::SimStream_all_to_all)
        lane.communication_seconds += t.end - t.start;
      if (t.alloc_bytes > 0) changes.emplace_back(t.start, t.alloc_bytes);
      for (const auto& [by, bytes] : t.frees) changes.emplace_back(tasks_[by].end, -bytes);
    }
    std::stable_sort(changes.begin(), changes.end(), [](const auto& a, const auto& b) {
      return a.first < b.first || (a.first == b.first && a.second < b.second);
    });
    double bytes = lane.static_memory_bytes;
    lane.peak_memory_bytes = bytes;
    lane.memory.push_back({0, bytes});
    for (const auto& [when, delta] : changes) {
      bytes += delta;
      // Changes at one instant (a backward frees, the next forward allocates) form one sample.
      if (lane.memory.back().seconds == when) lane.memory.back().bytes = bytes;
      else lane.memory.push_back({when, bytes});
      if (bytes > lane.peak_memory_bytes + 1e-6) {
        lane.peak_memory_bytes = bytes;
        lane.peak_memory_seconds = when;
      }
    }
    lane.memory.push_back({step, bytes});
    lane.idle_seconds = step - lane.busy_seconds;
    lane.bubble_fraction = step > 0 ? lane.idle_seconds / step : 0;
    out->lanes.push_back(std::move(lane));
  }
  for (int id = last; id >= 0; id = tasks_[id].critical_pred) {
    const Task& t = tasks_[id];
    out->critical_path.push_back({t.lane, t.op_index, t.kind, lanes_[t.lane].ops[t.op_index].micro_batch, t.start, t.end});
  }
  std::reverse(out->critical_path.begin(), out->critical_path.end());
  std::vector<std::vector<LinkSpan>> spans(link_demands_.links().size());
  for (const Task& t : tasks_)
    for (const SharedLinkShare& l : t.links) spans[static_cast<size_t>(l.link)].push_back({t.start, t.end, l.share});
  out->shared_links = sim_shared_link_usage(link_demands_.links(), spans);
  if (options_.record_intervals) {
    out->intervals.reserve(tasks_.size());
    for (const Task& t : tasks_) {
      const ScheduleOp& op = lanes_[t.lane].ops[t.op_index];
      SimInterval iv{t.lane, t.stream, t.kind, t.op_index, op.micro_batch, op.chunk, t.start, t.end,
                     static_cast<int>(out->link_uses.size()), static_cast<int>(t.links.size())};
      out->link_uses.insert(out->link_uses.end(), t.links.begin(), t.links.end());
      // A receive shows when its data was in flight: from its send's start to arrival.
      if (t.stream == SimStream::SimStream_recv && t.critical_pred >= 0) iv.start_seconds = tasks_[t.critical_pred].start;
      out->intervals.push_back(iv);
    }
  }
  out->schedules = std::move(lanes_);
}

SimResult Simulator::run() {
  if (plan_.model_fingerprint.empty() && plan_.cluster_fingerprint.empty()) plan_validate(plan_);
  else plan_validate_for(plan_, model_, cluster_);
  if (plan_.num_devices != static_cast<int>(cluster_.devices.size()))
    throw Error(fmt::format("the plan is for {} devices, cluster '{}' has {}", plan_.num_devices, cluster_.name,
                            cluster_.devices.size()),
                {"", "num_devices"}, "simulate the plan on the cluster it was made for");
  rank_map_ = plan_rank_map(plan_);
  const int num_lanes = static_cast<int>(plan_.stages.size());
  ScheduleOptions schedule = options_.schedule;
  schedule.bucket_bytes = plan_.gradient_bucket_bytes;
  if (schedule.parked_block_bytes.empty()) schedule.parked_block_bytes = parked_block_bytes(plan_, model_, cluster_);
  int first = 0;
  for (int s = 0; s < num_lanes; ++s) {
    lanes_.push_back(schedule_build_rank(plan_, model_, first, schedule));
    first += plan_.stages[s].tp * plan_.stages[s].dp;
  }
  static_bytes_.assign(num_lanes, 0);
  op_task_.assign(num_lanes, {});
  block_costs_ = sim_block_costs(plan_, model_, cluster_);
  for (int l = 0; l < num_lanes; ++l) {
    lane_first_task_.push_back(static_cast<int>(tasks_.size()));
    build_lane(l);
  }
  lane_first_task_.push_back(static_cast<int>(tasks_.size()));
  for (int l = 0; l < num_lanes; ++l) link_lane(l);
  replay();
  SimResult out;
  finish(&out);
  return out;
}

}  // namespace


SimResult simulate(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const SimOptions& options) {
  std::optional<ClusterSpec> measured;  // the cluster with the profile's links between node groups
  if (options.profile && !options.profile->links.empty()) measured = profile_apply_links(*options.profile, cluster);
  Simulator sim(plan, model, measured ? *measured : cluster, options);
  return sim.run();
}

void sim_check_memory(const SimResult& result, const Plan& plan) {
  for (const SimLane& lane : result.lanes) {
    const double capacity = plan.stages[lane.stage].memory_capacity_bytes;
    if (capacity > 0 && lane.peak_memory_bytes > capacity)
      throw Error(fmt::format("stage {} ({}) peaks at {} at {:.3f} s in simulation, over its {} capacity",
                              lane.stage, lane.device_type, units_format_bytes(lane.peak_memory_bytes),
                              lane.peak_memory_seconds, units_format_bytes(capacity)),
                  {"", fmt::format("stages[{}].memory", lane.stage)},
                  "use more recomputation, ZeRO, offload or fewer micro-batches in flight; or re-run `alloy plan`");
  }
}

}  // namespace alloy
