// The collectives of a run as each one took once all its members had joined, put together on
// rank 0 from every rank's own timings (Communicator::take_collective_timings).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "plan/plan.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/trainer.hpp"
#include "spec/cluster.hpp"

namespace alloy {

// What one rank sends rank 0 per timing: its group by role and members, not by its local id.
struct CollectiveRecord {
  uint64_t members_key = 0;  // FNV-1a of the member ranks
  int64_t sequence = 0;      // the group's n-th collective
  int32_t group = 0;         // CollectiveGroup
  int32_t op = 0;            // CollectiveOp
  int32_t group_size = 0;
  int32_t spans_nodes = 0;
  int32_t blocked = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

// Every rank's records, by world rank, matched by (role, members, sequence): one entry per
// collective that every member recorded, alike in kind and bytes, each member once. The least
// seconds over the members is kept, and it is blocked when every member's record is.
std::vector<JoinedCollective> collectives_match(const std::vector<std::vector<CollectiveRecord>>& by_rank);

// Every rank calls it with its timings and the groups it posted them on, each with its role (the
// same list on every rank; timings on other groups are dropped). Returns, on rank 0, the matched
// collectives (collectives_match); elsewhere none. Matching needs no common clock: each member's
// own call-to-completion time is compared.
std::vector<JoinedCollective> collectives_joined(Communicator& comm, const std::vector<CollectiveTiming>& mine,
                                                 const std::vector<std::pair<CollectiveGroup, CommGroup>>& groups,
                                                 const Plan& plan, const ClusterSpec& cluster);

}  // namespace alloy
