// The timeline of a step, as the simulator predicts it and as the runtime measures it: per rank
// (lane), the intervals of every operation on its streams and its memory over time. Both write
// these records, so a simulated and a measured step open side by side in one trace viewer. The
// simulator adds the rack uplinks and WAN ports its transfers crossed and how loaded they were.
#pragma once

#include <string>
#include <vector>

#include "plan/schedule.hpp"
#include "spec/topology.hpp"

namespace alloy {

// all_to_all: Mixture-of-Experts dispatch and combine of a forward or backward operation's blocks.
// copy: host to device (offloaded weights, parked activations); copy_out: device to host
// (gradients written back, activations parked), at the same time on the other direction.
enum class SimStream {
  SimStream_compute,
  SimStream_send,
  SimStream_recv,
  SimStream_collective,
  SimStream_copy,
  SimStream_all_to_all,
  SimStream_copy_out,
};
const char* sim_stream_name(SimStream stream);

struct SimInterval {
  int lane = 0;  // into SimResult::lanes
  SimStream stream = SimStream::SimStream_compute;
  OpKind kind = OpKind::OpKind_forward;
  int op_index = 0;  // into the lane's schedule
  int micro_batch = -1;
  int chunk = 0;
  double start_seconds = 0;
  double end_seconds = 0;
  // The shared links its transfer crossed: SimResult::link_uses[first_link_use, + num_link_uses).
  int first_link_use = 0;
  int num_link_uses = 0;
};

// A rack uplink or WAN port (one direction) over the simulated step.
struct SimSharedLink {
  std::string name;                 // "rack r1 uplink out", "wan east in"
  double bytes_per_second = 0;
  double busy_seconds = 0;          // something crossed it
  double contended_seconds = 0;     // its transfers together asked for more than it carries
};

struct MemorySample {
  double seconds = 0;
  double bytes = 0;
};

// One simulated rank: the first rank of a stage (tp rank 0, dp rank 0) standing for all of the
// stage's ranks, which run the same operations at the same times by symmetry.
struct SimLane {
  int rank = 0;
  int stage = 0;
  int device_id = 0;
  std::string device_type;
  int represented_ranks = 1;          // tp x dp of the stage
  double busy_seconds = 0;            // compute stream
  double idle_seconds = 0;
  double bubble_fraction = 0;         // idle / step
  double communication_seconds = 0;  // sum of send, collective and copy spans
  double static_memory_bytes = 0;     // model states, buffers, context: resident all step
  double peak_memory_bytes = 0;
  double peak_memory_seconds = 0;     // when the peak is first reached
  std::vector<MemorySample> memory;   // after every change, in time order
};

struct CriticalStep {
  int lane = 0;
  int op_index = 0;
  OpKind kind = OpKind::OpKind_forward;
  int micro_batch = -1;
  double start_seconds = 0;
  double end_seconds = 0;
};

struct SimResult {
  double step_seconds = 0;
  std::vector<SimLane> lanes;             // one per stage, pipeline order
  std::vector<SimInterval> intervals;
  std::vector<SimSharedLink> shared_links;  // none on a cluster without racks and sites
  std::vector<SharedLinkShare> link_uses;   // the intervals' shares of shared_links, by link id
  std::vector<CriticalStep> critical_path;  // from the first operation to the last, in time order
  std::vector<RankSchedule> schedules;    // what each lane ran
  int64_t simulated_ops = 0;
};

// The intervals whose transfers crossed shared link `link` (into SimResult::shared_links), in
// rows where none overlaps another: in start order, each in the first row free by its start.
std::vector<std::vector<int>> timeline_link_rows(const SimResult& result, int link);

// The part of a shared link its transfers asked for together (above 1: they slowed each other).
struct LinkLoadSample {
  double seconds = 0;
  double share = 0;
};
// A transfer's time on a link and the part of the link it asked for.
struct LinkSpan {
  double start_seconds = 0;
  double end_seconds = 0;
  double share = 0;
};
// The load after every change, in time order, from 0 (nothing) to the last transfer's end.
std::vector<LinkLoadSample> timeline_load_of_spans(std::vector<LinkSpan> spans);
std::vector<LinkLoadSample> timeline_link_load(const SimResult& result, int link);

}  // namespace alloy
