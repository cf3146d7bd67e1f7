// Emulated devices on this machine's CPU cores: how much longer a rank's compute takes than on a
// free core. A device type's `speed` (or ALLOY_DEVICE_SPEED for one process, to emulate a device
// slower than its entry says), and a time dilation that keeps ranks from competing for cores:
// with more busy threads than cores every rank would share, so every rank is slowed by the same
// factor and sleeps instead (ALLOY_TIME_DILATION overrides it).
#pragma once

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

}  // namespace alloy
