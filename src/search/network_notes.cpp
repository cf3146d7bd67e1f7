#include "search/network_notes.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "cost/network_paths.hpp"
#include "spec/topology.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

// What crosses the network, and the narrowest link it meets (as each hop sees it while all of
// the transfer's hops run).
struct NetworkCrossing {
  std::string what;  // "the pipeline boundary stage 3 -> 4", "stage 2's data-parallel reduction"
  std::string link;
  double bytes_per_second = kUnlimitedBytesPerSecond;
};

std::string network_nic_name(const ClusterSpec& cluster, int from, int to) {
  const int a = cluster.devices[from].node_group;
  const int b = cluster.devices[to].node_group;
  const Link na = topology_group_network(cluster, a);
  const Link nb = topology_group_network(cluster, b);
  const int slower = na.bandwidth_bytes_per_second <= nb.bandwidth_bytes_per_second ? a : b;
  return fmt::format("the {} NICs of {}", topology_group_network(cluster, slower).kind, cluster.node_groups[slower].name);
}

std::string network_measured_name(const ClusterSpec& cluster, int from, int to) {
  const std::string& a = cluster.node_groups[cluster.devices[from].node_group].name;
  const std::string& b = cluster.node_groups[cluster.devices[to].node_group].name;
  return a == b ? fmt::format("the measured link between nodes of {}", a) : fmt::format("the measured link {} - {}", a, b);
}

NetworkCrossing network_narrowest(const ClusterSpec& cluster, const std::vector<TopologyHop>& hops, std::string what) {
  NetworkCrossing out;
  out.what = std::move(what);
  const std::vector<HopLinks> links = topology_hops(cluster, hops);
  for (size_t i = 0; i < links.size(); ++i) {
    const HopLinks& h = links[i];
    if (h.level == TopologyLevel::TopologyLevel_node) continue;
    const bool shared = h.shared_bytes_per_second < h.nic.bandwidth_bytes_per_second;
    const double rate = shared ? h.shared_bytes_per_second : h.nic.bandwidth_bytes_per_second;
    if (rate < out.bytes_per_second) {
      out.bytes_per_second = rate;
      out.link = shared       ? h.shared_name
                 : h.measured ? network_measured_name(cluster, hops[i].from_device, hops[i].to_device)
                              : network_nic_name(cluster, hops[i].from_device, hops[i].to_device);
    }
  }
  return out;
}

std::vector<NetworkCrossing> network_crossings(const Plan& plan, const ClusterSpec& cluster) {
  std::vector<NetworkCrossing> out;
  const size_t p = plan.stages.size();
  for (size_t s = 0; s < p; ++s) {
    const PlanStage& st = plan.stages[s];
    std::vector<TopologyHop> ring_hops;
    for (const std::vector<int>& ring : network_dp_rings(st.device_ids, st.tp, st.dp))
      for (size_t i = 0; ring.size() > 1 && i < ring.size(); ++i) ring_hops.push_back({ring[i], ring[(i + 1) % ring.size()]});
    out.push_back(network_narrowest(cluster, ring_hops, fmt::format("stage {}'s data-parallel reduction (dp {})", s, st.dp)));
    const bool wraps = plan.virtual_chunks > 1 && p > 1;
    if (s + 1 == p && !wraps) continue;
    const std::vector<int>& to = plan.stages[(s + 1) % p].device_ids;
    std::vector<TopologyHop> lanes;
    for (size_t i = 0; i < std::max(st.device_ids.size(), to.size()); ++i)
      lanes.push_back({st.device_ids[i % st.device_ids.size()], to[i % to.size()]});
    out.push_back(network_narrowest(cluster, lanes, fmt::format("the pipeline boundary stage {} -> {}", s, (s + 1) % p)));
  }
  return out;
}

// Two devices on different nodes of the groups, the first of each; -1s when group `a` is `b`
// and has one node.
std::pair<int, int> network_group_pair_devices(const ClusterSpec& cluster, int a, int b) {
  int first = -1, second = -1;
  for (const Device& d : cluster.devices) {
    if (first < 0 && d.node_group == a) {
      first = d.id;
    } else if (second < 0 && d.node_group == b && (first < 0 || d.node != cluster.devices[first].node)) {
      second = d.id;
    }
  }
  return first < 0 || second < 0 ? std::pair<int, int>{-1, -1} : std::pair<int, int>{first, second};
}

// "measured links (profile.json) replace the cluster file's: fast - slow 10 MB/s, 2 ms (file:
// 100 MB/s, 1 ms)": those between the groups the plan's devices are in.
std::string network_measured_note(const Plan& plan, const ClusterSpec& cluster) {
  std::vector<bool> used(cluster.node_groups.size(), false);
  for (const PlanStage& st : plan.stages)
    for (int id : st.device_ids) used[static_cast<size_t>(cluster.devices[id].node_group)] = true;
  ClusterSpec stated = cluster;
  stated.measured_links.clear();
  std::string links;
  for (const MeasuredLink& m : cluster.measured_links) {
    if (!used[static_cast<size_t>(m.from_group)] || !used[static_cast<size_t>(m.to_group)]) continue;
    const auto [from, to] = network_group_pair_devices(cluster, m.from_group, m.to_group);
    if (from < 0) continue;
    const HopLinks file = topology_hops(stated, {{from, to}}).front();
    links += fmt::format("{}{} - {} {}, {} (file: {}, {})", links.empty() ? "" : "; ", cluster.node_groups[m.from_group].name,
                         cluster.node_groups[m.to_group].name, units_format_bandwidth(m.bandwidth_bytes_per_second),
                         units_format_seconds(m.latency_seconds),
                         units_format_bandwidth(std::min(file.nic.bandwidth_bytes_per_second, file.shared_bytes_per_second)),
                         units_format_seconds(file.nic.latency_seconds));
  }
  if (links.empty()) return "";
  const std::string& source = cluster.measured_links_source;
  return fmt::format("network: links measured between node groups{} replace the cluster file's: {}",
                     source.empty() ? "" : " (" + source + ")", links);
}

}  // namespace

std::vector<std::string> network_notes(const Plan& plan, const ClusterSpec& cluster) {
  if (topology_is_flat(cluster) || plan.stages.empty()) return {};
  const std::vector<NetworkCrossing> crossings = network_crossings(plan, cluster);
  double slowest = kUnlimitedBytesPerSecond;
  std::string link;
  for (const NetworkCrossing& c : crossings)
    if (c.bytes_per_second < slowest) {
      slowest = c.bytes_per_second;
      link = c.link;
    }
  if (slowest == kUnlimitedBytesPerSecond) return {"network: the layout keeps all its traffic inside nodes"};
  std::string across;
  bool reductions = false, boundaries = false;
  for (const NetworkCrossing& c : crossings) {
    if (c.link != link || c.bytes_per_second > slowest * 1.01) continue;
    across += (across.empty() ? "" : ", ") + c.what;
    (c.what.find("reduction") != std::string::npos ? reductions : boundaries) = true;
  }
  std::string line = fmt::format("network: the slowest link this layout crosses is {} ({} per transfer); across it: {}", link,
                                 units_format_bandwidth(slowest), across);
  if (boundaries && !reductions) line += "; no data-parallel reduction crosses it";
  if (reductions && !boundaries) line += "; no pipeline boundary crosses it";
  const std::string measured = network_measured_note(plan, cluster);
  if (measured.empty()) return {line};
  return {line, measured};
}

}  // namespace alloy
