// The collectives of a run as each one took once all its members had joined, put together on
// rank 0 from every rank's own timings (Communicator::take_collective_timings).
#pragma once

#include <vector>

#include "plan/plan.hpp"
#include "runtime/dist/communicator.hpp"
#include "runtime/dist/dist_trainer.hpp"
#include "spec/cluster.hpp"

namespace alloy {

// Every rank calls it with its timings and the groups it posted them on (world and the
// runtime's groups; timings on others are dropped). Returns, on rank 0, one entry per collective
// that every member timed; elsewhere none. Matching needs no common clock: each member's own
// post-to-completion time is compared, and the least kept.
std::vector<JoinedCollective> collectives_joined(Communicator& comm, const std::vector<CollectiveTiming>& mine,
                                                 const std::vector<CommGroup>& groups, const Plan& plan,
                                                 const ClusterSpec& cluster);

}  // namespace alloy
