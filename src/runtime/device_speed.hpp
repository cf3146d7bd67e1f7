// Emulated devices on this machine's CPU cores: how much longer a rank's compute takes than on a
// free core. A device type's `speed` (or ALLOY_DEVICE_SPEED for one process, to emulate a device
// slower than its entry says), and a time dilation that keeps ranks from competing for cores:
// with more busy threads than cores every rank would share, so every rank is slowed by the same
// factor and sleeps instead (ALLOY_TIME_DILATION overrides it).
#pragma once

#include <functional>

#include "spec/cluster.hpp"
#include "spec/device_type.hpp"

namespace alloy {

// In (0, 1] for emulated slower devices, 1 for full speed. Throws alloy::Error for a malformed
// ALLOY_DEVICE_SPEED.
double device_speed(const DeviceType& type);

// Ranks that share this host's cores in the emulation: every CPU device of the cluster when the
// whole job runs on this host (so a plan that uses fewer devices is dilated like one that uses
// all, and profiles and runs compare), else this host's ranks.
int emulated_ranks_on_host(const ClusterSpec& cluster, int local_ranks, bool single_host);

// max(1, ranks_on_host * threads_per_rank / cores), or ALLOY_TIME_DILATION (>= 1).
double emulation_dilation(int ranks_on_host, int threads_per_rank);

// Factor a CPU rank's compute time is stretched by: dilation / speed; 1 for other devices.
double device_slowdown(const DeviceType& type, int ranks_on_host, int threads_per_rank);

// Emulates a device `slowdown` times slower: after a compute operation that ran `cpu_seconds`
// on this thread's CPU clock and took `elapsed_seconds` of wall time (waits on peers left out),
// sleeps until the operation has taken slowdown x cpu_seconds. CPU time, not wall time, is what
// gets stretched: a rank that shared a core with another ran longer on the wall clock without
// doing more work, and stretching that would count the sharing twice. Returns the seconds slept.
double device_stretch(double slowdown, double elapsed_seconds, double cpu_seconds);

// One compute operation of an emulated slow device (a pass, the optimizer) on this thread, split
// by the waits inside it: tensor-parallel sums, ZeRO-3 gathers, offload copies. Each stretch of
// compute between two waits is made to take slowdown x its CPU time before the wait begins
// (device_stretch), so a transfer posted ahead of its use runs while the emulated device computes,
// as it would on a real one. Stretching the whole operation once at its end instead would leave
// such a transfer only the core's undilated compute to hide behind, and expose it.
class ComputeStretch {
 public:
  // Begins the operation on this thread; waits made through compute_wait pause it. One at a time
  // per thread.
  explicit ComputeStretch(double slowdown);
  ~ComputeStretch();
  ComputeStretch(const ComputeStretch&) = delete;
  ComputeStretch& operator=(const ComputeStretch&) = delete;

  // Ends the operation: stretches the compute since the last wait. Returns the seconds slept in
  // the whole operation.
  double finish();

 private:
  friend double compute_wait(const std::function<void()>& blocking);
  void pause();   // before a wait: stretch the compute since resume()
  void resume();  // after it: the next stretch of compute begins
  double slowdown_;
  double wall_mark_ = 0;
  double cpu_mark_ = 0;
  double slept_ = 0;
  bool finished_ = false;
};

// Runs `blocking` (a wait on peers or on copies) and returns the seconds it blocked. Inside a
// ComputeStretch of this thread, the compute before it is stretched first and the wait is not.
double compute_wait(const std::function<void()>& blocking);

}  // namespace alloy
