// The supervisor's decisions between launches: the lost rank, and the cluster file without its device.
#include "runtime/elastic.hpp"

#include <cstdlib>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "spec/error.hpp"

namespace alloy {

int elastic_lost_rank(const std::string& launcher_output) {
  const std::string marker = "noticed that process rank ";
  const size_t at = launcher_output.find(marker);
  if (at == std::string::npos) return -1;
  const char* digits = launcher_output.c_str() + at + marker.size();
  char* end = nullptr;
  const long rank = std::strtol(digits, &end, 10);
  return end == digits || rank < 0 ? -1 : static_cast<int>(rank);
}

std::string elastic_cluster_without(const ClusterSpec& cluster, int device_id) {
  if (device_id < 0 || device_id >= static_cast<int>(cluster.devices.size()))
    throw Error(fmt::format("device {} is not in cluster {} ({} devices)", device_id, cluster.name, cluster.devices.size()));
  if (cluster.devices.size() == 1)
    throw Error(fmt::format("cluster {} loses its only device", cluster.name), {cluster.source_path, "nodes"},
                "add devices to the cluster file and run again; the run resumes from its last checkpoint");
  YAML::Node root = YAML::Load(cluster.source_text);
  YAML::Node nodes = root["nodes"];
  const size_t g = static_cast<size_t>(cluster.devices[static_cast<size_t>(device_id)].node_group);
  YAML::Node group = nodes[g];
  const int per_node = cluster.node_groups[g].devices_per_node;
  const int count = cluster.node_groups[g].count;
  YAML::Node smaller = YAML::Clone(group);
  smaller["count"] = 1;
  smaller["devices_per_node"] = per_node - 1;
  if (group["name"]) smaller["name"] = group["name"].as<std::string>() + "-less-one";
  YAML::Node rebuilt(YAML::NodeType::Sequence);
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (k != g) {
      rebuilt.push_back(nodes[k]);
      continue;
    }
    if (count > 1) {
      YAML::Node rest = YAML::Clone(group);
      rest["count"] = count - 1;
      rebuilt.push_back(rest);
    }
    if (per_node > 1) rebuilt.push_back(smaller);
  }
  root["nodes"] = rebuilt;
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace alloy
