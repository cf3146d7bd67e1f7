#include "runtime/dist/collective_join.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "runtime/dist/gather_records.hpp"

namespace alloy {

namespace {

// What one rank sends rank 0 per timing: its group by members, not by its local id.
struct TimingRecord {
  uint64_t members_key = 0;  // FNV-1a of the member ranks
  int64_t sequence = 0;
  int32_t op = 0;
  int32_t group_size = 0;
  int32_t spans_nodes = 0;
  int32_t blocked = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

uint64_t members_key(const std::vector<int>& members) {
  uint64_t h = 1469598103934665603ull;
  for (int r : members) {
    h ^= static_cast<uint64_t>(r) + 1;
    h *= 1099511628211ull;
  }
  return h;
}

bool group_spans_nodes(const std::vector<int>& members, const std::vector<RankInfo>& ranks, const ClusterSpec& cluster) {
  const auto node = [&](int r) { return cluster.devices[static_cast<size_t>(ranks[static_cast<size_t>(r)].device_id)].node; };
  return std::any_of(members.begin(), members.end(), [&](int r) { return node(r) != node(members.front()); });
}

}  // namespace

std::vector<JoinedCollective> collectives_joined(Communicator& comm, const std::vector<CollectiveTiming>& mine,
                                                 const std::vector<CommGroup>& groups, const Plan& plan,
                                                 const ClusterSpec& cluster) {
  const std::vector<RankInfo> ranks = plan_rank_map(plan);
  std::vector<TimingRecord> records;
  for (const CollectiveTiming& t : mine) {
    const auto group = std::find_if(groups.begin(), groups.end(), [&](const CommGroup& g) { return g.id == t.group_id; });
    if (group == groups.end() || group->size() < 2) continue;
    records.push_back({members_key(group->members), t.sequence, static_cast<int32_t>(t.op), group->size(),
                       group_spans_nodes(group->members, ranks, cluster) ? 1 : 0, t.blocked ? 1 : 0, t.bytes,
                       t.seconds});
  }
  // [members, sequence] -> the collective and which ranks timed it
  std::map<std::pair<uint64_t, int64_t>, JoinedCollective> joined;
  for (int source = 0; source < comm.world_size(); ++source) {
    for (const TimingRecord& r : gather_records_on_root(comm, records, source)) {
      JoinedCollective& j = joined[{r.members_key, r.sequence}];
      if (j.ranks.empty()) {
        j = {static_cast<CollectiveOp>(r.op), r.group_size, r.spans_nodes != 0, r.bytes, r.seconds, {}, true};
      }
      j.seconds = std::min(j.seconds, r.seconds);
      j.blocked = j.blocked && r.blocked != 0;
      j.ranks.push_back(source);
    }
  }
  std::vector<JoinedCollective> out;
  for (auto& [key, j] : joined)
    if (static_cast<int>(j.ranks.size()) == j.group_size) out.push_back(std::move(j));
  return out;
}

}  // namespace alloy
