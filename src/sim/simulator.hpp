// Inside the event simulator (simulate.cpp): its tasks and the Simulator that builds them from the
// lanes' schedules (lane_tasks.cpp) and replays them. Not for use outside src/sim.
#pragma once

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "cost/network_paths.hpp"
#include "sim/collectives.hpp"
#include "sim/offload_uses.hpp"
#include "sim/shared_links.hpp"
#include "sim/simulate.hpp"

namespace alloy {

// Links of one lane's device that transfers share: fabric and network, each direction, and
// the host link for offload copies.
enum SimResource { kIntraTx, kIntraRx, kNetTx, kNetRx, kHostIn, kHostOut, kNumResources };

struct SimTask {
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

// One stage's MoE blocks as the lanes' ops need them (sim_block_costs in simulate.cpp).
struct SimBlockCosts {
  double all_to_all_seconds = 0;
  double dense_forward = 1;
  double dense_backward = 1;
  double dense_activations = 1;
};

// What a lane's earlier tasks leave for its next ones while build_lane walks its schedule.
struct SimLaneCursor {
  int last_compute = -1;
  int before_last_compute = -1;  // the last compute before the latest pass's
  int last_recv = -1;
  int last_collective = -1;
  int last_fetch = -1;           // host-to-device copies run one after another
  int last_copy_out = -1;        // and so do device-to-host ones
  int first_gathered = -1;       // ZeRO 3: the block the current pass gathered alone
  int pass_prefetch = -1;        // the schedule's prefetch op of the current pass
  size_t next_use = 0;           // into the lane's offload uses
  std::vector<int> use_free;     // per offload use: the task whose end frees its slot
  std::vector<int> pending_inputs;  // what the next compute waits for
  std::map<std::pair<int, int>, int> activation_owner;  // (mb, chunk) -> the forward's first task
};

class Simulator {
 public:
  Simulator(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const SimOptions& options)
      : plan_(plan), model_(model), cluster_(cluster), options_(options), link_demands_(plan, cluster) {}

  SimResult run();

 private:
  // lane_tasks.cpp: the tasks of one lane's schedule, op by op.
  void build_lane(int lane);
  int add_task(int lane, size_t op_index, OpKind kind, SimStream stream, double seconds);
  int add_pass(int lane, size_t i, SimLaneCursor* c);
  int add_optimizer(int lane, size_t i, SimLaneCursor* c);
  int add_compute_piece(int lane, size_t i, double seconds, SimLaneCursor* c);
  int add_offloaded_block(int lane, size_t i, size_t use, double seconds, SimLaneCursor* c);
  int add_collective(int lane, size_t i, SimLaneCursor* c);
  void add_gathers_ahead(int lane, size_t i, SimLaneCursor* c);
  int add_activation_copy(int lane, size_t i, SimLaneCursor* c);
  double pass_seconds(int lane, const ScheduleOp& op) const;
  double op_samples(int lane, const ScheduleOp& op) const;
  double block_weight(int begin, int end, double dense) const;
  double copy_seconds(int lane, int64_t bytes) const;

  // simulate.cpp
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
  std::vector<SimTask> tasks_;
  // (lane, tag, recv kind) -> sends of that lane with the tag
  std::map<std::tuple<int, int, int>, std::vector<int>> sends_by_tag_;
  std::vector<double> static_bytes_;
  std::vector<std::vector<int>> op_task_;   // per lane and schedule op: its (first) task, -1 for none
  std::vector<SimBlockCosts> block_costs_;  // per lane
  std::vector<std::vector<SimOffloadUse>> offload_uses_;  // per lane
};

}  // namespace alloy
