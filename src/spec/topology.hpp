// The network of a cluster as the links between its devices: the intra-node fabric, each node
// group's NIC, rack uplinks (oversubscribed or not) and the WAN between sites. Answers from the
// cluster spec alone which links a transfer or a ring crosses; the cost model prices them.
#pragma once

#include <array>
#include <limits>
#include <string>
#include <vector>

#include "spec/cluster.hpp"

namespace alloy {

inline constexpr double kUnlimitedBytesPerSecond = std::numeric_limits<double>::infinity();

// The highest link a path between two devices crosses.
enum class TopologyLevel {
  TopologyLevel_node,     // the same node: the intra-node fabric
  TopologyLevel_network,  // two nodes of one rack (or of a cluster without racks): their NICs
  TopologyLevel_rack,     // two racks of one site: their NICs and both racks' uplinks
  TopologyLevel_site,     // two sites: all of that and the WAN
};
const char* topology_level_name(TopologyLevel level);

// True when every node reaches every other over the cluster's one `network`: no node group has a
// network of its own that differs, there are no racks or sites and no measured links. Such a
// cluster prices as it always has.
bool topology_is_flat(const ClusterSpec& cluster);

// The NIC of a group's nodes: the group's own `network`, else the cluster's.
Link topology_group_network(const ClusterSpec& cluster, int node_group);
// The measured link from a node of `from_group` to one of `to_group` (the other direction's when
// only that one was measured); null when neither was.
const MeasuredLink* topology_measured_link(const ClusterSpec& cluster, int from_group, int to_group);
// Bandwidth of one transfer alone between nodes of two groups before any uplink or WAN: the
// measured link's, else the slower of the two NICs.
double topology_pair_bytes_per_second(const ClusterSpec& cluster, int from_group, int to_group);
int topology_rack_nodes(const ClusterSpec& cluster, int rack);
// A rack's uplink per direction: as given, or its nodes' NIC bandwidth over the oversubscription
// ratio; kUnlimitedBytesPerSecond for a rack that is neither.
double topology_rack_uplink_bytes_per_second(const ClusterSpec& cluster, int rack);
// What one node of the rack gets when all of them send out of the rack at once.
double topology_rack_per_node_bytes_per_second(const ClusterSpec& cluster, int rack);

TopologyLevel topology_level_between(const ClusterSpec& cluster, int device_a, int device_b);

// A transfer from one device to another, alone or among others running at the same time.
struct TopologyHop {
  int from_device = 0;
  int to_device = 0;
};

// The links one hop crosses and its share of them.
struct HopLinks {
  TopologyLevel level = TopologyLevel::TopologyLevel_node;
  Link nic;                      // between nodes: the slower NIC of the two ends (bandwidth per
                                 // node, not divided), latency of the whole path; else empty
  bool measured = false;         // `nic` is a measured link (ClusterSpec::measured_links)
  double shared_bytes_per_second = kUnlimitedBytesPerSecond;  // the hop's share of the narrowest
                                 // rack uplink or WAN port it crosses (divided among the hops
                                 // crossing it at once)
  std::string shared_name;       // that link for people: "rack r1 uplink", "wan"
  int shared_hops = 0;           // hops crossing that link in the same direction at once
};

// Every hop's links when all of `hops` run at once.
std::vector<HopLinks> topology_hops(const ClusterSpec& cluster, const std::vector<TopologyHop>& hops);

// The slowest of a set of concurrent rings: each ring lists its devices in ring order.
struct RingLinks {
  TopologyLevel level = TopologyLevel::TopologyLevel_node;  // the highest any hop crosses
  Link nic;                      // the slowest NIC a hop between nodes crosses; latency: the
                                 // longest such hop's; empty when no hop leaves a node
  bool measured = false;         // that slowest bandwidth is a measured link's
  double shared_bytes_per_second = kUnlimitedBytesPerSecond;  // the narrowest share a hop gets
  std::string shared_name;
  int rings_on_shared = 0;       // hops crossing that shared link in one direction at once
};
RingLinks topology_rings(const ClusterSpec& cluster, const std::vector<std::vector<int>>& rings);

// A link that transfers of different stages divide when they overlap: one direction of a rack's
// uplink or of a site's WAN port.
struct SharedLink {
  std::string name;  // for people: "rack r1 uplink out", "wan east in"
  double bytes_per_second = 0;
};

// The part of a shared link's capacity one operation takes (index into TopologySharedLinks::links).
struct SharedLinkShare {
  int link = 0;
  double share = 0;
};

// Every rack uplink that limits (given, or set by oversubscription) and, between two sites or
// more, every site's WAN port, each out of and into its rack or site. Empty on a cluster without
// racks and sites.
struct TopologySharedLinks {
  std::vector<SharedLink> links;
  std::vector<std::array<int, 2>> rack_links;  // per rack: ids of its uplink out and in; -1: not limiting
  std::vector<std::array<int, 2>> site_links;  // per site: ids of its WAN port out and in
};
TopologySharedLinks topology_shared_links(const ClusterSpec& cluster);

// Ids of the shared links a transfer from one device to another crosses: the uplinks out of its
// rack and into the other's, the WAN ports out of its site and into the other's (the links
// topology_hops divides).
std::vector<int> topology_hop_shared_links(const ClusterSpec& cluster, const TopologySharedLinks& shared, int from_device,
                                           int to_device);

// Which domain of the level just below `level` a device sits in: its site for
// TopologyLevel_site, its rack for TopologyLevel_rack, its node group for TopologyLevel_network
// (nodes behind different NICs), its node for TopologyLevel_node.
int topology_domain(const ClusterSpec& cluster, int device, TopologyLevel level);

// The tree `alloy check` prints: sites > racks > node groups > nodes x devices, with each
// level's bottleneck.
std::string topology_describe(const ClusterSpec& cluster);

}  // namespace alloy
