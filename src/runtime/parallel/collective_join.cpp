#include "runtime/parallel/collective_join.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "runtime/parallel/gather_records.hpp"

namespace alloy {

namespace {

uint64_t members_key(const std::vector<int>& members) {
  uint64_t h = 1469598103934665603ull;
  for (int r : members) {
    h ^= static_cast<uint64_t>(r) + 1;
    h *= 1099511628211ull;
  }
  return h;
}

bool group_spans_nodes(const std::vector<int>& members, const std::vector<RankInfo>& ranks,
                       const ClusterSpec& cluster) {
  const auto node = [&](int r) {
    return cluster.devices[static_cast<size_t>(ranks[static_cast<size_t>(r)].device_id)].node;
  };
  return std::any_of(members.begin(), members.end(), [&](int r) { return node(r) != node(members.front()); });
}

}  // namespace

std::vector<JoinedCollective> collectives_match(const std::vector<std::vector<CollectiveRecord>>& by_rank) {
  struct Match {
    JoinedCollective joined;
    bool alike = true;  // every record agrees on kind and bytes, and no rank sent two
  };
  std::map<std::tuple<int32_t, uint64_t, int64_t>, Match> matches;  // [role, members, sequence]
  for (size_t source = 0; source < by_rank.size(); ++source) {
    for (const CollectiveRecord& r : by_rank[source]) {
      Match& m = matches[{r.group, r.members_key, r.sequence}];
      JoinedCollective& j = m.joined;
      if (j.ranks.empty()) {
        j = {static_cast<CollectiveOp>(r.op),
             static_cast<CollectiveGroup>(r.group),
             r.group_size,
             r.spans_nodes != 0,
             r.bytes,
             r.seconds,
             {},
             true};
      }
      const int rank = static_cast<int>(source);
      m.alike = m.alike && static_cast<int32_t>(j.op) == r.op && j.bytes == r.bytes &&
                std::find(j.ranks.begin(), j.ranks.end(), rank) == j.ranks.end();
      j.seconds = std::min(j.seconds, r.seconds);
      j.blocked = j.blocked && r.blocked != 0;
      j.ranks.push_back(rank);
    }
  }
  std::vector<JoinedCollective> out;
  for (auto& [key, m] : matches)
    if (m.alike && static_cast<int>(m.joined.ranks.size()) == m.joined.group_size) out.push_back(std::move(m.joined));
  return out;
}

std::vector<JoinedCollective> collectives_joined(Communicator& comm, const std::vector<CollectiveTiming>& mine,
                                                 const std::vector<std::pair<CollectiveGroup, CommGroup>>& groups,
                                                 const Plan& plan, const ClusterSpec& cluster) {
  const std::vector<RankInfo> ranks = plan_rank_map(plan);
  std::vector<CollectiveRecord> records;
  for (const CollectiveTiming& t : mine) {
    const auto found =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.second.id == t.group_id; });
    if (found == groups.end() || found->second.size() < 2) continue;
    const CommGroup& group = found->second;
    records.push_back({members_key(group.members), t.sequence, static_cast<int32_t>(found->first),
                       static_cast<int32_t>(t.op), group.size(),
                       group_spans_nodes(group.members, ranks, cluster) ? 1 : 0, t.blocked ? 1 : 0, t.bytes,
                       t.seconds});
  }
  std::vector<std::vector<CollectiveRecord>> by_rank;
  for (int source = 0; source < comm.world_size(); ++source)
    by_rank.push_back(gather_records_on_root(comm, records, source));
  return comm.rank() == 0 ? collectives_match(by_rank) : std::vector<JoinedCollective>{};
}

}  // namespace alloy
