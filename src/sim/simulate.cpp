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
#include "sim/simulator.hpp"
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

// What the running transfers ask of each link: a lane's links count whole transfers, a shared
// link the sum of its transfers' shares. A transfer runs at 1 / the most oversubscribed of them.
class LinkLoads {
 public:
  LinkLoads(size_t lane_links, size_t shared_links)
      : load_(lane_links + shared_links, 0.0), shared_users_(shared_links, 0), first_shared_(lane_links) {}

  void add(const SimTask& t) {
    for (int r : t.resources) load_[static_cast<size_t>(r)] += 1;
    for (const SharedLinkShare& l : t.links) {
      load_[first_shared_ + static_cast<size_t>(l.link)] += l.share;
      ++shared_users_[static_cast<size_t>(l.link)];
    }
  }
  void remove(const SimTask& t) {
    for (int r : t.resources) load_[static_cast<size_t>(r)] -= 1;
    for (const SharedLinkShare& l : t.links) {
      double& load = load_[first_shared_ + static_cast<size_t>(l.link)];
      load = --shared_users_[static_cast<size_t>(l.link)] == 0 ? 0 : load - l.share;  // no rounding left behind
    }
  }
  double slowdown(const SimTask& t) const {
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

}  // namespace

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
    SimTask& t = tasks_[id];
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
      SimTask& t = tasks_[id];
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
      const SimTask& t = tasks_[id];
      if (t.stream == SimStream::SimStream_compute) lane.busy_seconds += t.end - t.start;
      if (t.stream == SimStream::SimStream_send || t.stream == SimStream::SimStream_collective ||
          t.stream == SimStream::SimStream_copy || t.stream == SimStream::SimStream_copy_out ||
          t.stream == SimStream::SimStream_all_to_all)
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
    const SimTask& t = tasks_[id];
    out->critical_path.push_back({t.lane, t.op_index, t.kind, lanes_[t.lane].ops[t.op_index].micro_batch, t.start, t.end});
  }
  std::reverse(out->critical_path.begin(), out->critical_path.end());
  std::vector<std::vector<LinkSpan>> spans(link_demands_.links().size());
  for (const SimTask& t : tasks_)
    for (const SharedLinkShare& l : t.links) spans[static_cast<size_t>(l.link)].push_back({t.start, t.end, l.share});
  out->shared_links = sim_shared_link_usage(link_demands_.links(), spans);
  if (options_.record_intervals) {
    out->intervals.reserve(tasks_.size());
    for (const SimTask& t : tasks_) {
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
  offload_uses_.assign(num_lanes, {});
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
