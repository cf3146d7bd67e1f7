// Shared-link demands of simulated transfers: hops crossing each link counted once per boundary
// and per collective algorithm, turned into shares of the link's capacity at the rate an
// operation runs alone.
#include "sim/shared_links.hpp"

#include <algorithm>

#include "cost/network_paths.hpp"

namespace alloy {

SimLinkDemands::SimLinkDemands(const Plan& plan, const ClusterSpec& cluster)
    : plan_(plan), cluster_(cluster), shared_(topology_shared_links(cluster)) {}

SimLinkDemands::Crossings SimLinkDemands::crossings(const std::vector<TopologyHop>& hops) const {
  std::vector<int> count(shared_.links.size(), 0);
  for (const TopologyHop& h : hops)
    for (int id : topology_hop_shared_links(cluster_, shared_, h.from_device, h.to_device)) ++count[static_cast<size_t>(id)];
  Crossings out;
  for (size_t id = 0; id < count.size(); ++id)
    if (count[id] > 0) out.emplace_back(static_cast<int>(id), count[id]);
  return out;
}

// What the hops take of each link together is capped at the whole link: where the cost model
// prices a set of hops at more than a link carries (it averages the lanes' shares), they fill it.
std::vector<SharedLinkShare> SimLinkDemands::shares(const Crossings& crossings, double hop_bytes_per_second,
                                                    double scale) const {
  std::vector<SharedLinkShare> out;
  for (const auto& [id, hops] : crossings)
    out.push_back({id, scale * std::min(1.0, hops * hop_bytes_per_second / shared_.links[static_cast<size_t>(id)].bytes_per_second)});
  return out;
}

std::vector<SharedLinkShare> SimLinkDemands::boundary(int from, int to, double lane_bytes_per_second) {
  if (shared_.links.empty()) return {};
  const std::vector<int>& from_ids = plan_.stages[static_cast<size_t>(from)].device_ids;
  const std::vector<int>& to_ids = plan_.stages[static_cast<size_t>(to)].device_ids;
  auto it = boundary_crossings_.find({from, to});
  if (it == boundary_crossings_.end())
    it = boundary_crossings_.emplace(std::make_pair(from, to), crossings(network_boundary_hops(from_ids, to_ids))).first;
  // A boundary has max(from, to) lanes; one send of the representative carries from / lanes of them.
  const double lanes = static_cast<double>(std::max(from_ids.size(), to_ids.size()));
  return shares(it->second, lane_bytes_per_second, static_cast<double>(from_ids.size()) / lanes);
}

std::vector<SharedLinkShare> SimLinkDemands::collective(int stage, const GroupPlacement& group, CollectiveAlgorithm algorithm,
                                                        bool experts) {
  if (shared_.links.empty() || group.nodes <= 1) return {};
  const std::tuple<int, int, bool> key{stage, static_cast<int>(algorithm), experts};
  auto it = collective_crossings_.find(key);
  if (it == collective_crossings_.end()) {
    const PlanStage& st = plan_.stages[static_cast<size_t>(stage)];
    const std::vector<int> ids = experts ? plan_stage_expert_dp_ids(st, 0) : st.device_ids;
    const int members = static_cast<int>(ids.size()) / st.tp;
    it = collective_crossings_.emplace(key, crossings(network_dp_group_hops(cluster_, ids, st.tp, members, group, algorithm)))
             .first;
  }
  return shares(it->second, collective_network_hop_bytes_per_second(group, algorithm), 1.0);
}

std::vector<SimSharedLink> sim_shared_link_usage(const std::vector<SharedLink>& links,
                                                 const std::vector<std::vector<LinkSpan>>& spans) {
  std::vector<SimSharedLink> out;
  for (size_t id = 0; id < links.size(); ++id) {
    SimSharedLink link{links[id].name, links[id].bytes_per_second, 0, 0};
    const std::vector<LinkLoadSample> load = timeline_load_of_spans(spans[id]);
    for (size_t i = 0; i + 1 < load.size(); ++i) {
      const double span = load[i + 1].seconds - load[i].seconds;
      if (load[i].share > 0) link.busy_seconds += span;
      if (load[i].share > 1 + 1e-9) link.contended_seconds += span;
    }
    out.push_back(link);
  }
  return out;
}

}  // namespace alloy
