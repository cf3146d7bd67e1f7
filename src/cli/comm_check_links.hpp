// `alloy comm-check --cluster`: send bandwidth and latency measured between the node groups of a
// cluster file, beside what the file says, with the network emulated or as the hosts give it;
// recorded as a profile's links for the planner (`--write-profile`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "runtime/parallel/communicator.hpp"
#include "spec/cluster.hpp"

namespace alloy::cli {

// Between the first ranks of every two node groups (and of two nodes of one group): the median
// half round trip of 8 B and the best bandwidth of a `bytes` send (less the fastest 8-byte round trip) over
// three tries. World rank r stands for device r of `cluster`. Rank 0 prints the table; every rank
// takes part and gets the measured links, one per pair surveyed.
std::vector<ProfiledGroupLink> comm_links_survey(Communicator& comm, const ClusterSpec& cluster, int64_t bytes);

// Throws alloy::Error when `path` exists and is not a profile that links could be added to.
void comm_links_profile_check(const std::string& path);
// Writes `links` into the profile at `path`: merged into it when it exists (profile_merge_links),
// else a profile of links alone. Prints what it did.
void comm_links_profile_write(const std::string& path, const std::vector<ProfiledGroupLink>& links);

}  // namespace alloy::cli
