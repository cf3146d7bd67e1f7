#include "cost/network_paths.hpp"

#include <algorithm>
#include <map>

#include "cost/runtime_traits.hpp"
#include "spec/topology.hpp"

namespace alloy {

namespace {

// Per-ring bandwidth and per-step latency of rings whose hops are `links`: the fabric where no
// hop leaves a node, else the slowest of the NIC (shared by the node's busy devices), the shared
// uplinks and the fabric.
void network_ring_rate(const RingLinks& links, const Link& intra, int concurrent_per_node, double* bytes_per_second,
                       double* latency_seconds) {
  if (links.level == TopologyLevel::TopologyLevel_node) {
    *bytes_per_second = intra.bandwidth_bytes_per_second;
    *latency_seconds = intra.latency_seconds;
    return;
  }
  double net = links.nic.bandwidth_bytes_per_second / std::max(1, concurrent_per_node);
  net = std::min(net, links.shared_bytes_per_second);
  *bytes_per_second = intra.bandwidth_bytes_per_second > 0 ? std::min(net, intra.bandwidth_bytes_per_second) : net;
  *latency_seconds = std::max(links.nic.latency_seconds, intra.latency_seconds);
}

// The level whose domains a two-level collective works inside: the highest the rings cross,
// where it is above a node's NIC or separates node groups joined by unequal links (unequal NICs,
// or measured links that differ between and inside groups).
TopologyLevel network_domain_level(const ClusterSpec& cluster, const std::vector<int>& members, const RingLinks& flat) {
  if (flat.level >= TopologyLevel::TopologyLevel_rack) return flat.level;
  if (flat.level != TopologyLevel::TopologyLevel_network) return TopologyLevel::TopologyLevel_node;
  std::vector<int> groups;
  for (int id : members) groups.push_back(cluster.devices[id].node_group);
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  const double first = topology_pair_bytes_per_second(cluster, groups.front(), groups.front());
  for (size_t a = 0; a < groups.size(); ++a)
    for (size_t b = a; b < groups.size(); ++b)
      if (topology_pair_bytes_per_second(cluster, groups[a], groups[b]) != first) return TopologyLevel::TopologyLevel_network;
  return TopologyLevel::TopologyLevel_node;
}

// Splits each ring's members by domain, in ring order.
std::vector<std::vector<std::vector<int>>> network_split_rings(const ClusterSpec& cluster,
                                                               const std::vector<std::vector<int>>& rings,
                                                               TopologyLevel level) {
  std::vector<std::vector<std::vector<int>>> out;
  for (const std::vector<int>& ring : rings) {
    std::map<int, size_t> slot;
    std::vector<std::vector<int>> parts;
    for (int id : ring) {
      const int domain = topology_domain(cluster, id, level);
      auto it = slot.find(domain);
      if (it == slot.end()) {
        it = slot.emplace(domain, parts.size()).first;
        parts.emplace_back();
      }
      parts[it->second].push_back(id);
    }
    out.push_back(std::move(parts));
  }
  return out;
}

// The rings of a two-level collective's step across domains of `level`: the j-th member in each
// domain of every ring, at once.
std::vector<std::vector<int>> network_across_rings(const ClusterSpec& cluster, const std::vector<std::vector<int>>& rings,
                                                   TopologyLevel level) {
  std::vector<std::vector<int>> across;
  for (const auto& parts : network_split_rings(cluster, rings, level)) {
    size_t per_domain = 0;
    for (const auto& part : parts) per_domain = std::max(per_domain, part.size());
    for (size_t j = 0; j < per_domain; ++j) {
      across.emplace_back();
      for (const auto& part : parts)
        if (j < part.size()) across.back().push_back(part[j]);
    }
  }
  return across;
}

// Fills the two-level fields of `g`: inside each domain, then across them.
void network_place_domains(const ClusterSpec& cluster, const std::vector<std::vector<int>>& rings, TopologyLevel level,
                           const Link& intra, GroupPlacement* g) {
  const auto split = network_split_rings(cluster, rings, level);
  std::vector<std::vector<int>> inside;
  size_t per_domain = 0;
  for (const auto& parts : split)
    for (const auto& part : parts) {
      inside.push_back(part);
      per_domain = std::max(per_domain, part.size());
    }
  g->domains = static_cast<int>(split.front().size());
  g->ranks_per_domain = static_cast<int>(per_domain);
  const int concurrent = g->concurrent_per_node;
  network_ring_rate(topology_rings(cluster, inside), intra, concurrent, &g->inside_bytes_per_second, &g->inside_latency_seconds);
  network_ring_rate(topology_rings(cluster, network_across_rings(cluster, rings, level)), intra, concurrent,
                    &g->across_bytes_per_second, &g->across_latency_seconds);
}

// The hierarchical step across nodes: the j-th member on each node of every ring, at once.
double network_across_nodes_share(const ClusterSpec& cluster, const std::vector<std::vector<int>>& rings) {
  const double share =
      topology_rings(cluster, network_across_rings(cluster, rings, TopologyLevel::TopologyLevel_node)).shared_bytes_per_second;
  return share == kUnlimitedBytesPerSecond ? 0 : share;
}

std::vector<int> network_dp_members(const std::vector<int>& stage_ids, int tp, int dp) {
  std::vector<int> members;
  for (int d = 0; d < dp; ++d) members.push_back(stage_ids[static_cast<size_t>(d) * tp]);
  return members;
}

void network_append_ring_hops(const std::vector<std::vector<int>>& rings, std::vector<TopologyHop>* hops) {
  for (const std::vector<int>& ring : rings)
    if (ring.size() >= 2)
      for (size_t i = 0; i < ring.size(); ++i) hops->push_back({ring[i], ring[(i + 1) % ring.size()]});
}

// What each node of one side of a boundary sends or receives at: the slowest NIC of its devices'
// groups, where a lane's path was measured the measured link instead. `side`: each lane's device
// on that side.
double network_side_bytes_per_second(const ClusterSpec& cluster, const std::vector<int>& side,
                                     const std::vector<HopLinks>& lanes) {
  double slowest = kUnlimitedBytesPerSecond;
  for (size_t i = 0; i < side.size(); ++i) {
    const double nic = topology_group_network(cluster, cluster.devices[side[i]].node_group).bandwidth_bytes_per_second;
    slowest = std::min(slowest, lanes[i].measured ? lanes[i].nic.bandwidth_bytes_per_second : nic);
  }
  return slowest;
}

// Whether a hop of the rings between nodes runs on a measured link.
bool network_rings_cross_measured(const ClusterSpec& cluster, const std::vector<std::vector<int>>& rings) {
  if (cluster.measured_links.empty()) return false;
  for (const std::vector<int>& ring : rings)
    for (size_t i = 0; ring.size() > 1 && i < ring.size(); ++i) {
      const Device& a = cluster.devices[ring[i]];
      const Device& b = cluster.devices[ring[(i + 1) % ring.size()]];
      if (a.node != b.node && topology_measured_link(cluster, a.node_group, b.node_group)) return true;
    }
  return false;
}

}  // namespace

std::vector<std::vector<int>> network_dp_rings(const std::vector<int>& stage_ids, int tp, int dp) {
  std::vector<std::vector<int>> rings(static_cast<size_t>(tp));
  for (int t = 0; t < tp; ++t)
    for (int d = 0; d < dp; ++d) rings[t].push_back(stage_ids[static_cast<size_t>(d) * tp + t]);
  return rings;
}

int network_distinct_nodes(const ClusterSpec& cluster, const std::vector<int>& ids) {
  // Stages built by the planner list devices node by node: count node changes.
  bool ordered = true;
  int changes = ids.empty() ? 0 : 1;
  for (size_t i = 1; i < ids.size() && ordered; ++i) {
    const int a = cluster.devices[ids[i - 1]].node;
    const int b = cluster.devices[ids[i]].node;
    ordered = a <= b;
    changes += a != b;
  }
  if (ordered) return changes;
  std::vector<int> nodes;
  for (int id : ids) nodes.push_back(cluster.devices[id].node);
  std::sort(nodes.begin(), nodes.end());
  return static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
}

int network_busiest_node_count(const ClusterSpec& cluster, const std::vector<int>& ids) {
  bool ordered = true;
  int run = 0;
  int longest = 0;
  for (size_t i = 0; i < ids.size() && ordered; ++i) {
    const int node = cluster.devices[ids[i]].node;
    const int previous = i > 0 ? cluster.devices[ids[i - 1]].node : node;
    ordered = previous <= node;
    run = (i > 0 && previous == node) ? run + 1 : 1;
    longest = std::max(longest, run);
  }
  if (ordered) return longest;
  std::map<int, int> per_node;
  int best = 0;
  for (int id : ids) best = std::max(best, ++per_node[cluster.devices[id].node]);
  return best;
}

GroupPlacement network_dp_group(const ClusterSpec& cluster, const std::vector<int>& stage_ids, int tp, int dp,
                                const Link& intra) {
  GroupPlacement g;
  const std::vector<int> members = network_dp_members(stage_ids, tp, dp);
  g.ranks = dp;
  g.nodes = network_distinct_nodes(cluster, members);
  g.concurrent_per_node = network_busiest_node_count(cluster, stage_ids);
  g.intra_node = intra;
  g.network = cluster.network;
  if (topology_is_flat(cluster) || g.nodes <= 1) return g;
  const std::vector<std::vector<int>> rings = network_dp_rings(stage_ids, tp, dp);
  const RingLinks flat = topology_rings(cluster, rings);
  g.network = flat.nic;
  g.crosses_measured_link = network_rings_cross_measured(cluster, rings);
  if (flat.shared_bytes_per_second != kUnlimitedBytesPerSecond) g.shared_bytes_per_second = flat.shared_bytes_per_second;
  g.shared_across_nodes_bytes_per_second = network_across_nodes_share(cluster, rings);
  const TopologyLevel level = network_domain_level(cluster, members, flat);
  if (level != TopologyLevel::TopologyLevel_node) network_place_domains(cluster, rings, level, intra, &g);
  return g;
}

std::vector<TopologyHop> network_boundary_hops(const std::vector<int>& from, const std::vector<int>& to) {
  std::vector<TopologyHop> hops;
  const size_t lanes = std::max(from.size(), to.size());
  for (size_t i = 0; i < lanes; ++i) hops.push_back({from[i % from.size()], to[i % to.size()]});
  return hops;
}

std::vector<TopologyHop> network_dp_group_hops(const ClusterSpec& cluster, const std::vector<int>& stage_ids, int tp, int dp,
                                               const GroupPlacement& group, CollectiveAlgorithm algorithm) {
  const std::vector<std::vector<int>> rings = network_dp_rings(stage_ids, tp, dp);
  std::vector<TopologyHop> hops;
  if (algorithm == CollectiveAlgorithm::CollectiveAlgorithm_hierarchical) {
    network_append_ring_hops(network_across_rings(cluster, rings, TopologyLevel::TopologyLevel_node), &hops);
  } else if (algorithm == CollectiveAlgorithm::CollectiveAlgorithm_domains && group.domains > 1) {
    const TopologyLevel level = network_domain_level(cluster, network_dp_members(stage_ids, tp, dp), topology_rings(cluster, rings));
    network_append_ring_hops(network_across_rings(cluster, rings, level), &hops);
  } else {
    network_append_ring_hops(rings, &hops);
  }
  return hops;
}

std::vector<SharedLinkShare> network_shared_link_shares(const ClusterSpec& cluster, const TopologySharedLinks& shared,
                                                        const std::vector<TopologyHop>& hops, double hop_bytes_per_second) {
  std::vector<int> crossing(shared.links.size(), 0);
  for (const TopologyHop& h : hops)
    for (int id : topology_hop_shared_links(cluster, shared, h.from_device, h.to_device)) ++crossing[static_cast<size_t>(id)];
  std::vector<SharedLinkShare> out;
  for (size_t id = 0; id < crossing.size(); ++id)
    if (crossing[id] > 0)
      out.push_back({static_cast<int>(id),
                     std::min(1.0, crossing[id] * hop_bytes_per_second / shared.links[id].bytes_per_second)});
  return out;
}

BoundaryNetwork network_boundary(const ClusterSpec& cluster, const std::vector<int>& from, const std::vector<int>& to) {
  BoundaryNetwork out;
  out.network = cluster.network;
  const int from_nodes = network_distinct_nodes(cluster, from);
  const int to_nodes = network_distinct_nodes(cluster, to);
  if (topology_is_flat(cluster)) {
    out.aggregate_bytes_per_second = std::min(from_nodes, to_nodes) * out.network.bandwidth_bytes_per_second;
    out.bottleneck = "network";
    return out;
  }
  // Lane i: the i-th device of the wider side to its partner on the other, all at once.
  const std::vector<TopologyHop> hops = network_boundary_hops(from, to);
  std::vector<int> senders, receivers;
  for (const TopologyHop& hop : hops) {
    senders.push_back(hop.from_device);
    receivers.push_back(hop.to_device);
  }
  const std::vector<HopLinks> lane_links = topology_hops(cluster, hops);
  const double from_nic = from_nodes * network_side_bytes_per_second(cluster, senders, lane_links);
  const double to_nic = to_nodes * network_side_bytes_per_second(cluster, receivers, lane_links);
  out.aggregate_bytes_per_second = std::min(from_nic, to_nic);
  out.bottleneck = from_nic <= to_nic ? "sending nodes' NICs" : "receiving nodes' NICs";
  // The shared links cap the aggregate only where every lane crosses one (their shares add up).
  double shared_sum = 0;
  bool all_shared = true, any_network = false;
  std::string shared_name;
  for (const HopLinks& hop : lane_links) {
    if (hop.level == TopologyLevel::TopologyLevel_node) continue;
    if (!any_network || hop.nic.bandwidth_bytes_per_second < out.network.bandwidth_bytes_per_second) out.measured = hop.measured;
    out.network = any_network ? Link{out.network.bandwidth_bytes_per_second <= hop.nic.bandwidth_bytes_per_second ? out.network.kind : hop.nic.kind,
                                     std::min(out.network.bandwidth_bytes_per_second, hop.nic.bandwidth_bytes_per_second),
                                     std::max(out.network.latency_seconds, hop.nic.latency_seconds)}
                              : hop.nic;
    any_network = true;
    if (hop.shared_bytes_per_second == kUnlimitedBytesPerSecond) {
      all_shared = false;
      continue;
    }
    shared_sum += hop.shared_bytes_per_second;
    shared_name = hop.shared_name;
  }
  if (any_network && all_shared && shared_sum < out.aggregate_bytes_per_second) {
    out.aggregate_bytes_per_second = shared_sum;
    out.bottleneck = shared_name;
  }
  return out;
}

double network_tied_table_seconds(const ClusterSpec& cluster, const ModelSpec& model, int gradient_bytes,
                                  const std::vector<int>& first_ids, int first_tp, const std::vector<int>& last_ids,
                                  int last_tp) {
  if (!model.tied_embeddings || first_ids == last_ids) return 0;
  const bool same_rows = first_tp == last_tp;
  std::vector<int> members = first_ids;
  members.insert(members.end(), last_ids.begin(), last_ids.end());
  const int tp = same_rows ? first_tp : 1;
  const int ranks = static_cast<int>(members.size()) / tp;
  const Link& intra = cluster.node_group(cluster.devices[static_cast<size_t>(first_ids.front())]).intra_node;
  const GroupPlacement group = network_dp_group(cluster, members, tp, ranks, intra);
  const double table_bytes = static_cast<double>(model.vocab_size) * static_cast<double>(model.hidden_size) /
                             (same_rows ? first_tp : 1) * gradient_bytes;
  const DeviceType& type = cluster.device_type(cluster.devices[static_cast<size_t>(first_ids.front())]);
  const RuntimeTraits& runtime = runtime_traits(type);
  const CollectiveOp op = CollectiveOp::CollectiveOp_all_reduce;
  const double dilation = shared_cores_collective_dilation(runtime, shared_cores_of(cluster));
  const GroupPlacement slowed = group_bandwidth_divided(group, dilation);
  const double link_seconds = runtime.collectives_flat_ring_only
                                  ? collective_seconds_with(op, table_bytes, slowed, CollectiveAlgorithm::CollectiveAlgorithm_ring)
                                  : collective_seconds(op, table_bytes, slowed);
  return link_seconds + dilation * collective_runtime_seconds(runtime, op, table_bytes, group.ranks);
}

}  // namespace alloy

