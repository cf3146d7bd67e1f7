// Layer offload: the weights, gradients (and, kept by the optimizer, the moments) of offloaded
// blocks live in host memory; each use of such a block gets a slot of the device arena, filled
// by a copy thread `prefetch_depth` uses ahead, and a backward use sends its gradients back on a
// second thread. Both threads pace their copies to the host link's bandwidth, which emulates a
// PCIe-like link on a CPU (docs/runtime-offload.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "plan/schedule.hpp"
#include "runtime/model.hpp"

namespace alloy {

// The host link of one device, shared by every copy over it: per direction, copies take turns at
// the link's bandwidth (full duplex: the two directions do not slow each other).
class HostLink {
 public:
  explicit HostLink(double bytes_per_second) : bytes_per_second_(bytes_per_second) {}
  // For a copy of `bytes` whose data moved at `start_seconds` (system clock): sleeps until the
  // link, after the copies booked before it, would have carried it; returns that time. A link
  // without a bandwidth (<= 0) does not pace.
  double pace(int64_t bytes, bool to_device, double start_seconds);
  // When a copy of `bytes` that ended at `end_seconds` had the link to itself from.
  double start_of(int64_t bytes, double end_seconds) const {
    return bytes_per_second_ > 0 ? end_seconds - static_cast<double>(bytes) / bytes_per_second_ : end_seconds;
  }

 private:
  double bytes_per_second_;
  std::mutex mutex_;
  double busy_until_[2] = {0, 0};  // to host, to device
};

double offload_clock_seconds();

// One use of an offloaded block in a step, in the order the rank's schedule runs them.
struct OffloadUse {
  int block = 0;
  bool backward = false;
  bool first_backward = false;  // the step's first backward of the block: its gradients start at zero
  int op_index = 0;             // the schedule's compute operation that uses it
  int micro_batch = 0;
  int chunk = 0;
};

// Forward ops visit their chunk's blocks ascending, backward ops theirs descending; only blocks
// in `offloaded` (per global block) count.
std::vector<OffloadUse> offload_uses_from_schedule(const RankSchedule& schedule, const std::vector<bool>& offloaded);

// A copy over the host link, for the trace: seconds on the system clock since the epoch.
struct OffloadCopy {
  bool to_device = true;  // a prefetch (weights, and accumulated gradients); else a gradient write-back
  int64_t bytes = 0;
  double start_seconds = 0;
  double end_seconds = 0;
  OffloadUse use;
};

class LayerOffload : public ParameterSource {
 public:
  // model: its offloaded blocks are its host segments (one or two per block). Allocates min(depth + 1, blocks) slots
  // of (weights + gradients) in the device arena.
  LayerOffload(Model& model, std::vector<OffloadUse> uses, int prefetch_depth, HostLink& link);
  ~LayerOffload() override;
  LayerOffload(const LayerOffload&) = delete;
  LayerOffload& operator=(const LayerOffload&) = delete;

  // Starts fetching the step's first uses; the host parameters must not change until step_end.
  void step_begin();
  // Waits until every use has run and every gradient is back in host memory.
  void step_end();
  // Waits until the gradients of offloaded blocks in [block_begin, block_end) written back so far
  // are in host memory (after a block's last backward of the step: its summed gradients).
  void wait_gradients_home(int block_begin, int block_end);
  void acquire(int unit, bool backward) override;
  void release(int unit, bool backward) override;

  // Seconds the passes waited for a fetch since the last call.
  double take_wait_seconds();
  // The copies since the last call.
  std::vector<OffloadCopy> take_copies();
  int slots() const { return static_cast<int>(slots_.size()); }

 private:
  enum class UseState { UseState_waiting, UseState_fetching, UseState_ready, UseState_in_use, UseState_writing, UseState_done };
  struct Slot {
    float* weights = nullptr;  // (block floats)
    float* gradients = nullptr;
  };
  // The host segments of an offloaded block, in flat order (empty: not offloaded): one, or under
  // expert parallelism two, its routed experts lying after every other tensor of the shard. A
  // slot holds them one after another.
  const std::vector<const ParameterSegment*>& host_segments(int block) const;
  void copy_to_slot(float* slot, const std::vector<const ParameterSegment*>& host, bool gradients) const;
  bool can_fetch() const;  // under mutex_
  void fetch_loop();
  void write_back_loop();
  void bind(int block, const Slot* slot);

  Model& model_;
  std::vector<OffloadUse> uses_;
  int depth_;
  HostLink& link_;
  std::vector<float**> weight_slots_;    // per view of the model
  std::vector<float**> gradient_slots_;
  std::vector<Slot> slots_;
  std::vector<std::vector<const ParameterSegment*>> block_segments_;  // per global block
  float* slot_memory_ = nullptr;         // every slot, one arena allocation

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<UseState> states_;
  std::vector<int> use_slot_;
  std::vector<int> free_slots_;
  std::vector<int> pending_write_backs_;  // per global block
  std::deque<size_t> write_backs_;
  size_t cursor_ = 0;      // the use being run or next to run
  size_t next_fetch_ = 0;  // the next use to fetch
  bool running_ = false;   // between step_begin and step_end
  bool stop_ = false;
  double wait_seconds_ = 0;
  std::vector<OffloadCopy> copies_;
  std::thread fetcher_;
  std::thread writer_;
};

}  // namespace alloy
