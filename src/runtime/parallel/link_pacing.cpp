// Times of transfers and ring collectives on emulated links (link_pacing.hpp).
#include "runtime/parallel/link_pacing.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "runtime/parallel/communicator.hpp"
#include "spec/cluster.hpp"
#include "spec/topology.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

// The slowest paced hop of a ring over `members`: its bandwidth (0: no paced hop) and the longest
// latency of the paced hops.
PacedLink pacing_ring_bottleneck(const LinkPacing& pacing, const std::vector<int>& members) {
  PacedLink slowest;
  const size_t n = members.size();
  for (size_t i = 0; i < n; ++i) {
    const PacedLink& hop = pacing.link(members[i], members[(i + 1) % n]);
    if (!hop.paced()) continue;
    if (!slowest.paced() || hop.bytes_per_second < slowest.bytes_per_second)
      slowest.bytes_per_second = hop.bytes_per_second;
    slowest.latency_seconds = std::max(slowest.latency_seconds, hop.latency_seconds);
  }
  return slowest;
}

// "0-1" or "0, 2": a sorted list of ranks, runs collapsed.
std::string pacing_ranks_text(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    i = j + 1;
  }
  return text;
}

}  // namespace

LinkPacing::LinkPacing(std::vector<std::vector<PacedLink>> links) : links_(std::move(links)) {
  for (size_t a = 0; a < links_.size(); ++a) {
    if (links_[a].size() != links_.size())
      throw Error(fmt::format("link pacing table row {} has {} entries for {} ranks", a, links_[a].size(), links_.size()));
    for (size_t b = 0; b < links_.size(); ++b) {
      const PacedLink& l = links_[a][b];
      if (!std::isfinite(l.bytes_per_second) || l.bytes_per_second < 0 || !std::isfinite(l.latency_seconds) ||
          l.latency_seconds < 0)
        throw Error(fmt::format("link pacing from rank {} to rank {}: bandwidth {} B/s, latency {} s", a, b,
                                l.bytes_per_second, l.latency_seconds),
                    {}, "give a finite, non-negative bandwidth and latency");
    }
  }
}

bool LinkPacing::paces_any() const {
  for (const auto& row : links_)
    for (const PacedLink& l : row)
      if (l.paced()) return true;
  return false;
}

double LinkPacing::occupy_seconds(int from, int to, int64_t bytes) const {
  const PacedLink& l = link(from, to);
  return l.paced() ? static_cast<double>(bytes) / l.bytes_per_second : 0.0;
}

double LinkPacing::transfer_seconds(int from, int to, int64_t bytes) const {
  const PacedLink& l = link(from, to);
  return l.paced() ? occupy_seconds(from, to, bytes) + l.latency_seconds : 0.0;
}

double LinkPacing::collective_seconds(PacedCollective kind, const std::vector<int>& members, int64_t bytes) const {
  const double n = static_cast<double>(members.size());
  if (members.size() < 2) return 0.0;
  if (kind == PacedCollective::PacedCollective_all_to_all) {
    const int64_t pair_bytes = bytes / static_cast<int64_t>(members.size() * members.size());
    return all_to_all_seconds(members, std::vector<std::vector<int64_t>>(
                                           members.size(), std::vector<int64_t>(members.size(), pair_bytes)));
  }
  const PacedLink hop = pacing_ring_bottleneck(*this, members);
  if (!hop.paced()) return 0.0;
  const double per_step_seconds = static_cast<double>(bytes) / n / hop.bytes_per_second;
  switch (kind) {
    case PacedCollective::PacedCollective_all_reduce:  // reduce-scatter, then all-gather
      return 2 * (n - 1) * (per_step_seconds + hop.latency_seconds);
    case PacedCollective::PacedCollective_reduce_scatter:
    case PacedCollective::PacedCollective_all_gather:
      return (n - 1) * (per_step_seconds + hop.latency_seconds);
    case PacedCollective::PacedCollective_broadcast:  // pipelined along the ring
      return static_cast<double>(bytes) / hop.bytes_per_second + (n - 1) * hop.latency_seconds;
    case PacedCollective::PacedCollective_all_to_all:  // priced above
      break;
  }
  return 0.0;
}

double LinkPacing::all_to_all_seconds(const std::vector<int>& members,
                                      const std::vector<std::vector<int64_t>>& bytes) const {
  const size_t n = members.size();
  if (bytes.size() != n)
    throw Error(fmt::format("all-to-all pricing given {} rows of bytes for {} members", bytes.size(), n));
  double seconds = 0;
  for (size_t r = 1; r < n; ++r) {
    double round_seconds = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t j = (i + r) % n;
      if (bytes[i].size() != n)
        throw Error(fmt::format("all-to-all pricing given {} columns of bytes for {} members", bytes[i].size(), n));
      round_seconds = std::max(round_seconds, transfer_seconds(members[i], members[j], bytes[i][j]));
    }
    seconds += round_seconds;
  }
  return seconds;
}

std::string LinkPacing::describe() const {
  // Paced pairs grouped by (bandwidth, latency); each group lists the ranks on either side.
  std::map<std::pair<double, double>, std::map<int, std::vector<int>>> classes;
  for (size_t a = 0; a < links_.size(); ++a)
    for (size_t b = a + 1; b < links_.size(); ++b) {
      const PacedLink& l = links_[a][b];
      if (l.paced()) classes[{l.bytes_per_second, l.latency_seconds}][static_cast<int>(a)].push_back(static_cast<int>(b));
    }
  std::string text;
  for (const auto& [link, pairs] : classes) {
    std::vector<std::string> sides;
    for (const auto& [from, to] : pairs) sides.push_back(fmt::format("{} <-> {}", from, pacing_ranks_text(to)));
    if (!text.empty()) text += "; ";
    text += fmt::format("{} at {}, {}", fmt::join(sides, ", "), units_format_bandwidth(link.first),
                        units_format_seconds(link.second));
  }
  return text.empty() ? "no link paced" : text;
}

// Communicators other than MPI's keep no emulated links: a table that paces nothing is accepted.
void Communicator::links_pace(std::shared_ptr<const LinkPacing> pacing) {
  if (pacing && pacing->paces_any())
    throw Error("this communicator cannot emulate network links", {"", "--emulate-network"},
                "run the ranks under mpirun on CPU devices to emulate links, or leave --emulate-network off");
}

LinkPacing link_pacing_for_cluster(const ClusterSpec& cluster, const std::vector<int>& device_of_rank) {
  const size_t n = device_of_rank.size();
  std::vector<std::vector<PacedLink>> links(n, std::vector<PacedLink>(n));
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b) {
      const int from = device_of_rank[a];
      const int to = device_of_rank[b];
      if (cluster.devices.at(static_cast<size_t>(from)).node == cluster.devices.at(static_cast<size_t>(to)).node)
        continue;
      // The path alone: the slower NIC of the two ends, no more than a rack uplink or the WAN
      // gives one stream, and the latency of every link on the way.
      const HopLinks path = topology_hops(cluster, {{from, to}}).front();
      links[a][b] = {std::min(path.nic.bandwidth_bytes_per_second, path.shared_bytes_per_second),
                     path.nic.latency_seconds};
    }
  return LinkPacing(std::move(links));
}

}  // namespace alloy
