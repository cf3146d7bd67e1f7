// Emulated network links between the ranks of one host: the time a transfer or a collective would
// take on the links a cluster file describes (bandwidth and latency per pair of ranks), so that a
// cluster of several nodes joined by slow links runs for real on local ranks. The MPI
// communicator delays sends and holds collectives by these times (communicator.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace alloy {

struct ClusterSpec;

// One direction of the link between two ranks; a bandwidth of 0 leaves it unpaced.
struct PacedLink {
  double bytes_per_second = 0;
  double latency_seconds = 0;
  bool paced() const { return bytes_per_second > 0; }
};

enum class PacedCollective {
  PacedCollective_all_reduce,
  PacedCollective_reduce_scatter,
  PacedCollective_all_gather,
  PacedCollective_broadcast,
  PacedCollective_all_to_all,  // pairwise rounds (LinkPacing::all_to_all_seconds)
};

// Links between every pair of world ranks, and the times transfers take on them. Collectives are
// priced as rings over the members in ascending order: every step moves one piece across every
// hop at once, so the slowest hop sets each step's bandwidth and the longest its latency; hops
// without pacing (ranks on one emulated node) cost nothing. Collectives of different groups that
// share a link are priced as if each had it alone.
class LinkPacing {
 public:
  LinkPacing() = default;
  // links[a][b]: from rank a to rank b; square, one row per world rank. Throws alloy::Error for a
  // table that is not square or has a negative or non-finite entry.
  explicit LinkPacing(std::vector<std::vector<PacedLink>> links);

  int world_size() const { return static_cast<int>(links_.size()); }
  const PacedLink& link(int from, int to) const { return links_[static_cast<size_t>(from)][static_cast<size_t>(to)]; }
  bool paces_any() const;

  // Seconds `bytes` keep the link from `from` to `to` busy (bytes / bandwidth); 0 when unpaced.
  double occupy_seconds(int from, int to, int64_t bytes) const;
  // Seconds until the last byte arrives on an idle link: occupy_seconds + latency.
  double transfer_seconds(int from, int to, int64_t bytes) const;
  // Seconds of a collective over `members` (world ranks, ascending) moving `bytes` in all (the
  // whole buffer: every member's piece); 0 when no hop of its ring is paced.
  double collective_seconds(PacedCollective kind, const std::vector<int>& members, int64_t bytes) const;

  // Seconds of an all-to-all over `members` (world ranks, ascending) where bytes[i][j] go from
  // member i to member j: n - 1 pairwise rounds (in round r member i sends to member (i + r) mod n),
  // each as long as its slowest transfer, bytes / bandwidth + latency (0 on an unpaced link):
  //   sum_{r=1}^{n-1} max_i transfer_seconds(m_i, m_{(i+r) mod n}, bytes[i][(i+r) mod n]).
  // collective_seconds prices PacedCollective_all_to_all with the bytes split evenly over the pairs.
  double all_to_all_seconds(const std::vector<int>& members, const std::vector<std::vector<int64_t>>& bytes) const;

  // "ranks 0-1 <-> 2-3: 12.5 MB/s, 2 ms": the paced links, for a run's first lines.
  std::string describe() const;

 private:
  std::vector<std::vector<PacedLink>> links_;
};

// The links a cluster file gives between the devices of `device_of_rank` (world rank -> device
// id): ranks on different nodes are paced to the path between them (spec/topology.hpp: the slower
// of the two node groups' networks, capped by a rack uplink or the WAN it crosses, with the
// latency of the whole path); ranks on one node are not (the host's own transfers stand for the
// node's fabric). Every pair of ranks gets the link's
// whole bandwidth: emulate one device per node where ranks of a node would share its network.
LinkPacing link_pacing_for_cluster(const ClusterSpec& cluster, const std::vector<int>& device_of_rank);

}  // namespace alloy
