// The timeline of a step, as the simulator predicts it and as the runtime measures it: per rank
// (lane), the intervals of every operation on its streams and its memory over time. Both write
// these records, so a simulated and a measured step open side by side in one trace viewer.
#pragma once

#include <string>
#include <vector>

#include "plan/schedule.hpp"

namespace alloy {

// all_to_all: Mixture-of-Experts dispatch and combine of a forward or backward operation's blocks.
enum class SimStream {
  SimStream_compute,
  SimStream_send,
  SimStream_recv,
  SimStream_collective,
  SimStream_copy,
  SimStream_all_to_all,
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
  std::vector<CriticalStep> critical_path;  // from the first operation to the last, in time order
  std::vector<RankSchedule> schedules;    // what each lane ran
  int64_t simulated_ops = 0;
};

}  // namespace alloy
