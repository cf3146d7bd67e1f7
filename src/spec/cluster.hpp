// ClusterSpec: the machines a user has (nodes, device types, links), read from YAML and
// expanded into a flat list of devices with their node and type.
#pragma once

#include <string>
#include <vector>

#include "spec/device_type.hpp"

namespace alloy {

struct Link {
  std::string kind;                       // nvlink, xgmi, pcie, hccs, infiniband, roce, ethernet, shm
  double bandwidth_bytes_per_second = 0;  // per direction (network: per node)
  double latency_seconds = 0;
};

// `count` identical nodes, each with `devices_per_node` devices of one type.
struct NodeGroup {
  std::string name;                          // label for people, e.g. "a100-nodes"
  int count = 0;                             // number of nodes
  int devices_per_node = 0;
  int device_type_index = -1;                // into ClusterSpec::device_types
  double host_memory_bytes = 0;              // per node
  double host_link_bytes_per_second = 0;     // host <-> device, per device, per direction
  Link intra_node;                           // fabric between the node's devices
  double price_per_device_hour = 0;          // 0 when not given
  // Between this group's nodes and any other node: the NIC per node. Bandwidth 0: the cluster's
  // `network` (src/spec/topology.hpp resolves it).
  Link network;
  int rack = -1;                             // into ClusterSpec::racks; -1 without racks
  int site = -1;                             // into ClusterSpec::sites; -1 without sites
};

// Nodes behind one switch whose uplink to the spine may carry less than its nodes can send.
struct Rack {
  std::string name;
  int site = -1;                             // into ClusterSpec::sites; -1 without sites
  double uplink_bytes_per_second = 0;        // per direction; 0: set by oversubscription
  double oversubscription = 1;               // nodes' NIC bandwidth : uplink (1: not oversubscribed)
  double latency_seconds = 0;                // added to a path that leaves the rack (the spine)
};

// A place of its own; sites reach each other over ClusterSpec::wan.
struct Site {
  std::string name;
};

// A link between the nodes of two node groups as measured (a profile's `links`, applied by
// profile_apply_links in cost/profile.hpp). It replaces the cluster file's NICs, rack and WAN
// latencies for the path between a node of `from_group` and one of `to_group` (two nodes of one
// group when they are equal); rack uplinks and the WAN still divide among transfers at once.
struct MeasuredLink {
  int from_group = 0;  // into ClusterSpec::node_groups
  int to_group = 0;
  double bandwidth_bytes_per_second = 0;
  double latency_seconds = 0;
};

// A link slower than this, or slower to answer than kLinkMostLatencySeconds, is a typo in its
// unit, not a network.
inline constexpr double kLinkLeastBytesPerSecond = 1e6 / 8;  // 1 Mb/s
inline constexpr double kLinkMostLatencySeconds = 10;

struct Device {
  int id = 0;                 // global index, 0..num_devices-1, in node-group order
  int node = 0;               // global node index
  int local_index = 0;        // index inside its node
  int node_group = 0;         // into ClusterSpec::node_groups
  int device_type_index = 0;  // into ClusterSpec::device_types
};

struct ClusterSpec {
  std::string name;
  std::string source_path;
  std::string source_text;               // the YAML it was read from ("" for one built in code)
  std::vector<DeviceType> device_types;  // only the types this cluster uses, resolved
  std::vector<NodeGroup> node_groups;
  Link network;                          // between nodes; bandwidth is per node
  std::vector<Rack> racks;               // optional: empty, or every node group names one
  std::vector<Site> sites;               // optional: empty, or every node group sits in one
  Link wan;                              // between sites (each site's port, per direction)
  std::vector<Device> devices;           // expanded from node_groups
  std::vector<MeasuredLink> measured_links;  // empty: the file's figures on every path
  std::string measured_links_source;     // the profile they came from, for people
  int num_nodes = 0;

  const DeviceType& device_type(const Device& d) const { return device_types[d.device_type_index]; }
  const NodeGroup& node_group(const Device& d) const { return node_groups[d.node_group]; }
};

// Reads a cluster from a preset name (examples/clusters/) or a YAML path; device types come
// from `catalog` or are defined inline. Throws alloy::Error naming file, line and field.
ClusterSpec cluster_load(const std::string& name_or_path, const DeviceCatalog& catalog);
// The same for YAML in memory; `path` names it in errors, `name` is the cluster's when the text
// gives none.
ClusterSpec cluster_load_text(const std::string& text, const std::string& path, const std::string& name,
                              const DeviceCatalog& catalog);

// Checks counts, capacities and links; fills `devices` and `num_nodes`.
void cluster_finalize(ClusterSpec* cluster);

std::vector<std::string> cluster_preset_names();

}  // namespace alloy
