#include "spec/topology.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "spec/units.hpp"

namespace alloy {

namespace {

// The slower of two links, with the latency of the slower to answer.
Link topology_slower_link(const Link& a, const Link& b) {
  Link out = a.bandwidth_bytes_per_second <= b.bandwidth_bytes_per_second ? a : b;
  out.latency_seconds = std::max(a.latency_seconds, b.latency_seconds);
  return out;
}

// The hop alone: its level, the slower NIC and the path's latency; nothing shared yet.
HopLinks topology_hop_alone(const ClusterSpec& cluster, int from, int to) {
  HopLinks hop;
  hop.level = topology_level_between(cluster, from, to);
  if (hop.level == TopologyLevel::TopologyLevel_node) return hop;
  const Device& a = cluster.devices[from];
  const Device& b = cluster.devices[to];
  hop.nic = topology_slower_link(topology_group_network(cluster, a.node_group),
                                 topology_group_network(cluster, b.node_group));
  if (const MeasuredLink* measured = topology_measured_link(cluster, a.node_group, b.node_group)) {
    hop.nic.bandwidth_bytes_per_second = measured->bandwidth_bytes_per_second;
    hop.nic.latency_seconds = measured->latency_seconds;  // of the whole path
    hop.measured = true;
    return hop;
  }
  const int rack_a = cluster.node_groups[a.node_group].rack;
  const int rack_b = cluster.node_groups[b.node_group].rack;
  if (hop.level >= TopologyLevel::TopologyLevel_rack && rack_a >= 0 && rack_b >= 0)
    hop.nic.latency_seconds += cluster.racks[rack_a].latency_seconds + cluster.racks[rack_b].latency_seconds;
  if (hop.level == TopologyLevel::TopologyLevel_site) hop.nic.latency_seconds += cluster.wan.latency_seconds;
  return hop;
}

// Keeps `share` of the link named `name` where it is narrower than what the hop has.
void topology_hop_narrow(HopLinks* hop, double share, const std::string& name, int streams) {
  if (share < hop->shared_bytes_per_second) {
    hop->shared_bytes_per_second = share;
    hop->shared_name = name;
    hop->shared_hops = streams;
  }
}

std::string topology_format_bits(double bytes_per_second) {
  const double bits = bytes_per_second * 8;
  if (bits >= 1e12) return fmt::format("{:.3g} Tb/s", bits / 1e12);
  if (bits >= 1e9) return fmt::format("{:.3g} Gb/s", bits / 1e9);
  return fmt::format("{:.3g} Mb/s", bits / 1e6);
}

std::string topology_describe_link(const Link& link, const char* per) {
  return fmt::format("{} {}{}, latency {}", link.kind, topology_format_bits(link.bandwidth_bytes_per_second), per,
                     units_format_seconds(link.latency_seconds));
}

std::string topology_describe_group(const ClusterSpec& cluster, int gi, const std::string& indent) {
  const NodeGroup& g = cluster.node_groups[gi];
  return fmt::format("{}{}: {} node{} x {} {}; NIC {}; intra-node {} {}\n", indent, g.name, g.count,
                     g.count == 1 ? "" : "s", g.devices_per_node, cluster.device_types[g.device_type_index].name,
                     topology_describe_link(topology_group_network(cluster, gi), " per node"), g.intra_node.kind,
                     units_format_bandwidth(g.intra_node.bandwidth_bytes_per_second));
}

std::string topology_describe_rack(const ClusterSpec& cluster, int rack, const std::string& indent) {
  const Rack& r = cluster.racks[rack];
  const double uplink = topology_rack_uplink_bytes_per_second(cluster, rack);
  const int nodes = topology_rack_nodes(cluster, rack);
  std::string out = fmt::format("{}rack {}: ", indent, r.name);
  if (uplink == kUnlimitedBytesPerSecond) {
    out += "uplink not limiting (no oversubscription)";
  } else {
    double nic_sum = 0;
    for (size_t gi = 0; gi < cluster.node_groups.size(); ++gi)
      if (cluster.node_groups[gi].rack == rack)
        nic_sum += cluster.node_groups[gi].count *
                   topology_group_network(cluster, static_cast<int>(gi)).bandwidth_bytes_per_second;
    const std::string ratio = nic_sum > uplink ? fmt::format("{:.3g}:1 oversubscribed", nic_sum / uplink) : "not oversubscribed";
    out += fmt::format("uplink {}, {} -> {} per node when its {} nodes leave the rack at once", topology_format_bits(uplink),
                       ratio, topology_format_bits(topology_rack_per_node_bytes_per_second(cluster, rack)), nodes);
  }
  if (r.latency_seconds > 0) out += fmt::format(", +{} to leave", units_format_seconds(r.latency_seconds));
  out += "\n";
  for (size_t gi = 0; gi < cluster.node_groups.size(); ++gi)
    if (cluster.node_groups[gi].rack == rack) out += topology_describe_group(cluster, static_cast<int>(gi), indent + "  ");
  return out;
}

// Racks of a site (site -1: a cluster without sites) and the groups there outside any rack.
std::string topology_describe_site_body(const ClusterSpec& cluster, int site, const std::string& indent) {
  std::string out;
  for (size_t k = 0; k < cluster.racks.size(); ++k)
    if (cluster.racks[k].site == site) out += topology_describe_rack(cluster, static_cast<int>(k), indent);
  for (size_t gi = 0; gi < cluster.node_groups.size(); ++gi) {
    const NodeGroup& g = cluster.node_groups[gi];
    if (g.rack < 0 && g.site == site) out += topology_describe_group(cluster, static_cast<int>(gi), indent);
  }
  return out;
}

}  // namespace

const char* topology_level_name(TopologyLevel level) {
  switch (level) {
    case TopologyLevel::TopologyLevel_node: return "node";
    case TopologyLevel::TopologyLevel_network: return "network";
    case TopologyLevel::TopologyLevel_rack: return "rack";
    case TopologyLevel::TopologyLevel_site: return "site";
  }
  return "?";
}

bool topology_is_flat(const ClusterSpec& cluster) {
  if (!cluster.racks.empty() || !cluster.sites.empty() || !cluster.measured_links.empty()) return false;
  for (const NodeGroup& g : cluster.node_groups) {
    if (g.network.bandwidth_bytes_per_second <= 0) continue;
    if (g.network.bandwidth_bytes_per_second != cluster.network.bandwidth_bytes_per_second ||
        g.network.latency_seconds != cluster.network.latency_seconds)
      return false;
  }
  return true;
}

Link topology_group_network(const ClusterSpec& cluster, int node_group) {
  const Link& own = cluster.node_groups[node_group].network;
  return own.bandwidth_bytes_per_second > 0 ? own : cluster.network;
}

const MeasuredLink* topology_measured_link(const ClusterSpec& cluster, int from_group, int to_group) {
  const MeasuredLink* reverse = nullptr;
  for (const MeasuredLink& link : cluster.measured_links) {
    if (link.from_group == from_group && link.to_group == to_group) return &link;
    if (link.from_group == to_group && link.to_group == from_group) reverse = &link;
  }
  return reverse;
}

double topology_pair_bytes_per_second(const ClusterSpec& cluster, int from_group, int to_group) {
  if (const MeasuredLink* measured = topology_measured_link(cluster, from_group, to_group))
    return measured->bandwidth_bytes_per_second;
  return std::min(topology_group_network(cluster, from_group).bandwidth_bytes_per_second,
                  topology_group_network(cluster, to_group).bandwidth_bytes_per_second);
}

int topology_rack_nodes(const ClusterSpec& cluster, int rack) {
  int nodes = 0;
  for (const NodeGroup& g : cluster.node_groups)
    if (g.rack == rack) nodes += g.count;
  return nodes;
}

double topology_rack_uplink_bytes_per_second(const ClusterSpec& cluster, int rack) {
  const Rack& r = cluster.racks[rack];
  if (r.uplink_bytes_per_second > 0) return r.uplink_bytes_per_second;
  if (r.oversubscription <= 1) return kUnlimitedBytesPerSecond;
  double nic_sum = 0;
  for (size_t gi = 0; gi < cluster.node_groups.size(); ++gi)
    if (cluster.node_groups[gi].rack == rack)
      nic_sum += cluster.node_groups[gi].count * topology_group_network(cluster, static_cast<int>(gi)).bandwidth_bytes_per_second;
  return nic_sum / r.oversubscription;
}

double topology_rack_per_node_bytes_per_second(const ClusterSpec& cluster, int rack) {
  return topology_rack_uplink_bytes_per_second(cluster, rack) / std::max(1, topology_rack_nodes(cluster, rack));
}

TopologyLevel topology_level_between(const ClusterSpec& cluster, int device_a, int device_b) {
  const Device& a = cluster.devices[device_a];
  const Device& b = cluster.devices[device_b];
  if (a.node == b.node) return TopologyLevel::TopologyLevel_node;
  const NodeGroup& ga = cluster.node_groups[a.node_group];
  const NodeGroup& gb = cluster.node_groups[b.node_group];
  if (ga.site != gb.site) return TopologyLevel::TopologyLevel_site;
  if (ga.rack != gb.rack) return TopologyLevel::TopologyLevel_rack;
  return TopologyLevel::TopologyLevel_network;
}

std::vector<HopLinks> topology_hops(const ClusterSpec& cluster, const std::vector<TopologyHop>& hops) {
  std::vector<HopLinks> out;
  out.reserve(hops.size());
  // Hops leaving and entering each rack and site at once: they divide its uplink or WAN port.
  std::vector<int> rack_out(cluster.racks.size(), 0), rack_in(cluster.racks.size(), 0);
  std::vector<int> site_out(cluster.sites.size(), 0), site_in(cluster.sites.size(), 0);
  for (const TopologyHop& h : hops) {
    out.push_back(topology_hop_alone(cluster, h.from_device, h.to_device));
    const NodeGroup& ga = cluster.node_group(cluster.devices[h.from_device]);
    const NodeGroup& gb = cluster.node_group(cluster.devices[h.to_device]);
    if (out.back().level >= TopologyLevel::TopologyLevel_rack && ga.rack >= 0 && gb.rack >= 0) {
      ++rack_out[ga.rack];
      ++rack_in[gb.rack];
    }
    if (out.back().level == TopologyLevel::TopologyLevel_site) {
      ++site_out[ga.site];
      ++site_in[gb.site];
    }
  }
  for (size_t i = 0; i < hops.size(); ++i) {
    HopLinks& hop = out[i];
    const NodeGroup& ga = cluster.node_group(cluster.devices[hops[i].from_device]);
    const NodeGroup& gb = cluster.node_group(cluster.devices[hops[i].to_device]);
    if (hop.level >= TopologyLevel::TopologyLevel_rack && ga.rack >= 0 && gb.rack >= 0) {
      topology_hop_narrow(&hop, topology_rack_uplink_bytes_per_second(cluster, ga.rack) / rack_out[ga.rack],
                          "rack " + cluster.racks[ga.rack].name + " uplink", rack_out[ga.rack]);
      topology_hop_narrow(&hop, topology_rack_uplink_bytes_per_second(cluster, gb.rack) / rack_in[gb.rack],
                          "rack " + cluster.racks[gb.rack].name + " uplink", rack_in[gb.rack]);
    }
    if (hop.level == TopologyLevel::TopologyLevel_site) {
      const int streams = std::max(site_out[ga.site], site_in[gb.site]);
      topology_hop_narrow(&hop, cluster.wan.bandwidth_bytes_per_second / streams,
                          "wan " + cluster.sites[ga.site].name + " - " + cluster.sites[gb.site].name, streams);
    }
  }
  return out;
}

RingLinks topology_rings(const ClusterSpec& cluster, const std::vector<std::vector<int>>& rings) {
  std::vector<TopologyHop> hops;
  for (const std::vector<int>& ring : rings) {
    const size_t n = ring.size();
    if (n < 2) continue;
    for (size_t i = 0; i < n; ++i) hops.push_back({ring[i], ring[(i + 1) % n]});
  }
  RingLinks out;
  bool any_network = false;
  for (const HopLinks& hop : topology_hops(cluster, hops)) {
    out.level = std::max(out.level, hop.level);
    if (hop.level == TopologyLevel::TopologyLevel_node) continue;
    if (!any_network || hop.nic.bandwidth_bytes_per_second < out.nic.bandwidth_bytes_per_second) out.measured = hop.measured;
    out.nic = any_network ? topology_slower_link(out.nic, hop.nic) : hop.nic;
    any_network = true;
    if (hop.shared_bytes_per_second < out.shared_bytes_per_second) {
      out.shared_bytes_per_second = hop.shared_bytes_per_second;
      out.shared_name = hop.shared_name;
      out.rings_on_shared = hop.shared_hops;
    }
  }
  return out;
}

TopologySharedLinks topology_shared_links(const ClusterSpec& cluster) {
  TopologySharedLinks out;
  auto add = [&](const std::string& name, double bytes_per_second) {
    out.links.push_back({name + " out", bytes_per_second});
    out.links.push_back({name + " in", bytes_per_second});
    const int out_id = static_cast<int>(out.links.size()) - 2;
    return std::array<int, 2>{out_id, out_id + 1};
  };
  for (size_t k = 0; k < cluster.racks.size(); ++k) {
    const double uplink = topology_rack_uplink_bytes_per_second(cluster, static_cast<int>(k));
    out.rack_links.push_back(uplink == kUnlimitedBytesPerSecond ? std::array<int, 2>{-1, -1}
                                                                 : add("rack " + cluster.racks[k].name + " uplink", uplink));
  }
  if (cluster.sites.size() >= 2)
    for (const Site& site : cluster.sites) out.site_links.push_back(add("wan " + site.name, cluster.wan.bandwidth_bytes_per_second));
  return out;
}

std::vector<int> topology_hop_shared_links(const ClusterSpec& cluster, const TopologySharedLinks& shared, int from_device,
                                           int to_device) {
  std::vector<int> ids;
  const TopologyLevel level = topology_level_between(cluster, from_device, to_device);
  const NodeGroup& ga = cluster.node_group(cluster.devices[from_device]);
  const NodeGroup& gb = cluster.node_group(cluster.devices[to_device]);
  if (level >= TopologyLevel::TopologyLevel_rack && ga.rack >= 0 && gb.rack >= 0) {
    if (shared.rack_links[ga.rack][0] >= 0) ids.push_back(shared.rack_links[ga.rack][0]);
    if (shared.rack_links[gb.rack][1] >= 0) ids.push_back(shared.rack_links[gb.rack][1]);
  }
  if (level == TopologyLevel::TopologyLevel_site && !shared.site_links.empty()) {
    ids.push_back(shared.site_links[ga.site][0]);
    ids.push_back(shared.site_links[gb.site][1]);
  }
  return ids;
}

int topology_domain(const ClusterSpec& cluster, int device, TopologyLevel level) {
  const Device& d = cluster.devices[device];
  switch (level) {
    case TopologyLevel::TopologyLevel_site: return cluster.node_groups[d.node_group].site;
    case TopologyLevel::TopologyLevel_rack: return cluster.node_groups[d.node_group].rack;
    case TopologyLevel::TopologyLevel_network: return d.node_group;
    case TopologyLevel::TopologyLevel_node: return d.node;
  }
  return d.node;
}

std::string topology_describe(const ClusterSpec& cluster) {
  std::string out = "Topology (per direction; sites > racks > node groups > nodes x devices):\n";
  out += "  network between nodes (default): " + topology_describe_link(cluster.network, " per node") + "\n";
  if (cluster.sites.empty()) return out + topology_describe_site_body(cluster, -1, "  ");
  for (size_t s = 0; s < cluster.sites.size(); ++s)
    out += fmt::format("  site {}\n", cluster.sites[s].name) +
           topology_describe_site_body(cluster, static_cast<int>(s), "    ");
  out += "  wan between sites: " + topology_describe_link(cluster.wan, " per site") + "\n";
  return out;
}

}  // namespace alloy
