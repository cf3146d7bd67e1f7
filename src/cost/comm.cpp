#include "cost/comm.hpp"

#include <algorithm>
#include <cmath>

namespace alloy {

namespace {

// Per-rank bandwidth and latency of the slowest hop a flat algorithm crosses.
void flat_link(const GroupPlacement& g, double* bw, double* alpha) {
  if (g.nodes <= 1) {
    *bw = g.intra_node.bandwidth_bytes_per_second;
    *alpha = g.intra_node.latency_seconds;
    return;
  }
  double net = g.network.bandwidth_bytes_per_second / std::max(1, g.concurrent_per_node);
  if (g.shared_bytes_per_second > 0) net = std::min(net, g.shared_bytes_per_second);
  *bw = std::min(net, g.intra_node.bandwidth_bytes_per_second > 0 ? g.intra_node.bandwidth_bytes_per_second : net);
  *alpha = std::max(g.network.latency_seconds, g.intra_node.latency_seconds);
}

// Per-ring bandwidth of the hierarchical algorithm's step across nodes.
double across_nodes_bytes_per_second(const GroupPlacement& g) {
  double net_bw = g.network.bandwidth_bytes_per_second / std::max(1, g.concurrent_per_node);
  if (g.shared_across_nodes_bytes_per_second > 0) net_bw = std::min(net_bw, g.shared_across_nodes_bytes_per_second);
  return net_bw;
}

// Steps of `bytes / n` each: all-reduce 2(n-1), all-gather and reduce-scatter (n-1).
double ring_seconds(CollectiveOp op, double bytes, int n, double bw, double alpha) {
  if (n <= 1) return 0;
  const int steps = op == CollectiveOp::CollectiveOp_all_reduce ? 2 * (n - 1) : n - 1;
  return steps * (alpha + bytes / n / bw);
}

// Double binary tree, pipelined: latency grows with depth, bandwidth term about 2x the buffer.
double tree_seconds(CollectiveOp op, double bytes, int n, double bw, double alpha) {
  if (n <= 1) return 0;
  const double depth = std::ceil(std::log2(static_cast<double>(n)));
  const double passes = op == CollectiveOp::CollectiveOp_all_reduce ? 2.0 : 1.0;
  return passes * (depth * alpha + bytes / bw);
}

// `ranks` members of a ring, each hop at `bytes_per_second` with `latency_seconds` per step.
struct RingTier {
  int ranks = 1;
  double bytes_per_second = 0;
  double latency_seconds = 0;
};

// Reduce-scatter inside each of the inner rings, the op across on 1/inner of the data (inner
// rings at once), all-gather inside.
double two_level_seconds(CollectiveOp op, double bytes, const RingTier& inner, const RingTier& across) {
  const bool reduces = op != CollectiveOp::CollectiveOp_all_gather;
  const bool gathers = op != CollectiveOp::CollectiveOp_reduce_scatter;
  double t = 0;
  if (reduces)
    t += ring_seconds(CollectiveOp::CollectiveOp_reduce_scatter, bytes, inner.ranks, inner.bytes_per_second, inner.latency_seconds);
  t += ring_seconds(op, bytes / inner.ranks, across.ranks, across.bytes_per_second, across.latency_seconds);
  if (gathers)
    t += ring_seconds(CollectiveOp::CollectiveOp_all_gather, bytes, inner.ranks, inner.bytes_per_second, inner.latency_seconds);
  return t;
}

}  // namespace

const char* collective_algorithm_name(CollectiveAlgorithm a) {
  switch (a) {
    case CollectiveAlgorithm::CollectiveAlgorithm_ring: return "ring";
    case CollectiveAlgorithm::CollectiveAlgorithm_tree: return "tree";
    case CollectiveAlgorithm::CollectiveAlgorithm_hierarchical: return "hierarchical";
    case CollectiveAlgorithm::CollectiveAlgorithm_domains: return "hierarchical-domains";
  }
  return "?";
}

double collective_seconds_with(CollectiveOp op, double bytes, const GroupPlacement& g, CollectiveAlgorithm a) {
  if (g.ranks <= 1 || bytes <= 0) return 0;
  double bw = 0;
  double alpha = 0;
  flat_link(g, &bw, &alpha);
  switch (a) {
    case CollectiveAlgorithm::CollectiveAlgorithm_ring: return ring_seconds(op, bytes, g.ranks, bw, alpha);
    case CollectiveAlgorithm::CollectiveAlgorithm_tree: return tree_seconds(op, bytes, g.ranks, bw, alpha);
    case CollectiveAlgorithm::CollectiveAlgorithm_hierarchical: {
      const int per_node = std::max(1, g.ranks / std::max(1, g.nodes));
      return two_level_seconds(op, bytes, {per_node, g.intra_node.bandwidth_bytes_per_second, g.intra_node.latency_seconds},
                               {g.nodes, across_nodes_bytes_per_second(g), g.network.latency_seconds});
    }
    case CollectiveAlgorithm::CollectiveAlgorithm_domains:
      if (g.domains <= 1) return collective_seconds_with(op, bytes, g, CollectiveAlgorithm::CollectiveAlgorithm_ring);
      return two_level_seconds(op, bytes, {g.ranks_per_domain, g.inside_bytes_per_second, g.inside_latency_seconds},
                               {g.domains, g.across_bytes_per_second, g.across_latency_seconds});
  }
  return 0;
}

GroupPlacement group_bandwidth_divided(const GroupPlacement& group, double factor) {
  GroupPlacement out = group;
  out.intra_node.bandwidth_bytes_per_second /= factor;
  out.network.bandwidth_bytes_per_second /= factor;
  out.shared_bytes_per_second /= factor;
  out.shared_across_nodes_bytes_per_second /= factor;
  out.inside_bytes_per_second /= factor;
  out.across_bytes_per_second /= factor;
  return out;
}

double collective_network_hop_bytes_per_second(const GroupPlacement& g, CollectiveAlgorithm a) {
  if (a == CollectiveAlgorithm::CollectiveAlgorithm_hierarchical) return across_nodes_bytes_per_second(g);
  if (a == CollectiveAlgorithm::CollectiveAlgorithm_domains && g.domains > 1) return g.across_bytes_per_second;
  double bw = 0;
  double alpha = 0;
  flat_link(g, &bw, &alpha);
  return bw;
}

double collective_seconds(CollectiveOp op, double bytes, const GroupPlacement& g, CollectiveAlgorithm* chosen) {
  CollectiveAlgorithm best = CollectiveAlgorithm::CollectiveAlgorithm_ring;
  double best_seconds = collective_seconds_with(op, bytes, g, best);
  auto consider = [&](CollectiveAlgorithm a) {
    const double t = collective_seconds_with(op, bytes, g, a);
    if (t < best_seconds) {
      best_seconds = t;
      best = a;
    }
  };
  if (op == CollectiveOp::CollectiveOp_all_reduce) consider(CollectiveAlgorithm::CollectiveAlgorithm_tree);
  if (g.nodes > 1 && g.ranks > g.nodes) consider(CollectiveAlgorithm::CollectiveAlgorithm_hierarchical);
  if (g.domains > 1 && g.ranks_per_domain > 1) consider(CollectiveAlgorithm::CollectiveAlgorithm_domains);
  if (chosen) *chosen = best;
  return best_seconds;
}

const char* p2p_path_name(P2pPath path) {
  switch (path) {
    case P2pPath::P2pPath_intra_node: return "intra-node";
    case P2pPath::P2pPath_network: return "network";
    case P2pPath::P2pPath_host_staged: return "host-staged";
  }
  return "?";
}

void boundary_link_apply_profile(BoundaryLink* link, const Profile* profile, const std::string& sender_type,
                                 bool network_measured) {
  if (profile == nullptr) return;
  link->intra_node = profile->point_to_point_link(sender_type, false, link->intra_node);
  if (!network_measured) link->network = profile->point_to_point_link(sender_type, true, link->network);
  link->extra_seconds = profile->boundary_transfer_seconds(sender_type);
}

double boundary_seconds(double bytes, const BoundaryLink& link) {
  if (bytes <= 0) return 0;
  const double lanes = std::max(1, link.lanes);
  switch (link.path) {
    case P2pPath::P2pPath_intra_node:
      return link.extra_seconds + link.intra_node.latency_seconds +
             bytes / lanes / link.intra_node.bandwidth_bytes_per_second;
    case P2pPath::P2pPath_network:
      return link.extra_seconds + link.network.latency_seconds + bytes / link.aggregate_network_bytes_per_second;
    case P2pPath::P2pPath_host_staged:
      // Store and forward: device to host, across the network, host to device.
      return link.extra_seconds + link.network.latency_seconds + bytes / lanes / link.host_link_from_bytes_per_second +
             bytes / link.aggregate_network_bytes_per_second + bytes / lanes / link.host_link_to_bytes_per_second;
  }
  return 0;
}

double boundary_transfer_bytes(double hidden_bytes, int receiving_tp, bool sequence_shards) {
  return sequence_shards ? hidden_bytes : hidden_bytes * std::max(1, receiving_tp);
}

double boundary_transfer_seconds(double hidden_bytes, const BoundaryLink& link, int from_tp, int to_tp,
                                 bool sequence_shards) {
  return 0.5 * (boundary_seconds(boundary_transfer_bytes(hidden_bytes, to_tp, sequence_shards), link) +
                boundary_seconds(boundary_transfer_bytes(hidden_bytes, from_tp, sequence_shards), link));
}

}  // namespace alloy
