// `alloy comm-check --cluster`: send bandwidth and latency measured between the node groups of a
// cluster file, beside what the file says, with the network emulated or as the hosts give it.
#pragma once

#include <cstdint>

#include "runtime/parallel/communicator.hpp"
#include "spec/cluster.hpp"

namespace alloy::cli {

// Between the first ranks of every two node groups (and of two nodes of one group): the median
// half round trip of 8 B and the best bandwidth of a `bytes` send (less the fastest 8-byte round trip) over
// three tries. World rank r stands for device r of `cluster`. Rank 0 prints the table; every rank
// takes part.
void comm_links_survey(Communicator& comm, const ClusterSpec& cluster, int64_t bytes);

}  // namespace alloy::cli
