// Measured communication for `alloy profile` under mpirun: all-reduce, all-gather and
// reduce-scatter over groups of 2..N ranks, and point-to-point transfers, each fitted to
// time = latency + bytes / bandwidth.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "runtime/parallel/communicator.hpp"

namespace alloy {

// Collective over the world: every rank takes part. Groups are the first k ranks; each op is
// timed at a few buffer sizes (the slowest member's median) and fitted by least squares.
// `progress` (may be empty) receives a short line per measurement on rank 0.
std::vector<ProfiledCollective> comm_profile_measure(Communicator& comm, int repeats,
                                                     const std::function<void(const std::string&)>& progress);

// Point-to-point transfers from rank 0, by ping-pong at the same sizes: to rank 1 (in a node)
// and to the first rank of the next node (across nodes), where there are such ranks. Collective
// over the world, like comm_profile_measure.
std::vector<ProfiledLink> comm_profile_point_to_point(Communicator& comm, int repeats,
                                                     const std::function<void(const std::string&)>& progress);

}  // namespace alloy
