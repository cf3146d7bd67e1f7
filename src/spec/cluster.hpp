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
};

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
  std::vector<Device> devices;           // expanded from node_groups
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
