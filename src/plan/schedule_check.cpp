// The schedule checker: matches every send with one receive and every collective across its
// group, then proves the dependency graph acyclic, so a plan never deadlocks at run time.
#include <map>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "plan/schedule.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

[[noreturn]] void fail_at(const StepSchedule& s, int rank, size_t op_index, const std::string& what,
                          const std::string& hint) {
  throw Error(fmt::format("rank {} op {} ({}): {}", rank, op_index,
                          schedule_op_describe(s.ranks[rank].ops[op_index]), what),
              {"", fmt::format("ranks[{}].ops[{}]", rank, op_index)}, hint);
}

OpKind matching_recv(OpKind send) {
  return send == OpKind::OpKind_send_activation ? OpKind::OpKind_recv_activation : OpKind::OpKind_recv_gradient;
}

int find_root(std::vector<int>& parent, int x) {
  while (parent[x] != x) {
    parent[x] = parent[parent[x]];
    x = parent[x];
  }
  return x;
}

}  // namespace

void schedule_check(const StepSchedule& s) {
  const int num_ranks = static_cast<int>(s.ranks.size());
  std::vector<int> offset(num_ranks + 1, 0);
  for (int r = 0; r < num_ranks; ++r) offset[r + 1] = offset[r] + static_cast<int>(s.ranks[r].ops.size());
  const int num_ops = offset[num_ranks];

  // Point-to-point matching: (from, to, tag, receive kind) -> the send.
  using Key = std::tuple<int, int, int, int>;
  std::map<Key, std::pair<int, size_t>> sends;
  for (int r = 0; r < num_ranks; ++r) {
    const std::vector<ScheduleOp>& ops = s.ranks[r].ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!op_kind_is_send(ops[i].kind)) continue;
      if (ops[i].peer < 0 || ops[i].peer >= num_ranks || ops[i].peer == r)
        fail_at(s, r, i, "sends to an invalid peer", "peers are other ranks of the plan");
      const Key key{r, ops[i].peer, ops[i].tag, static_cast<int>(matching_recv(ops[i].kind))};
      if (!sends.emplace(key, std::make_pair(r, i)).second)
        fail_at(s, r, i, "a second send with the same peer and tag", "tags must be unique per pair of ranks");
    }
  }
  std::vector<std::pair<int, int>> edges;  // node -> node, before merging collectives
  std::map<Key, bool> matched;
  for (int r = 0; r < num_ranks; ++r) {
    const std::vector<ScheduleOp>& ops = s.ranks[r].ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!op_kind_is_recv(ops[i].kind)) continue;
      const Key key{ops[i].peer, r, ops[i].tag, static_cast<int>(ops[i].kind)};
      auto it = sends.find(key);
      if (it == sends.end())
        fail_at(s, r, i, fmt::format("no matching send on rank {}", ops[i].peer),
                "every receive needs a send with the same peer, tag and payload kind");
      if (matched[key]) fail_at(s, r, i, "a second receive for the same send", "tags must be unique per pair of ranks");
      matched[key] = true;
      const ScheduleOp& send = s.ranks[it->second.first].ops[it->second.second];
      if (send.bytes != ops[i].bytes || send.sample_begin != ops[i].sample_begin || send.sample_end != ops[i].sample_end)
        fail_at(s, r, i,
                fmt::format("does not match its send on rank {} op {} ({})", it->second.first, it->second.second,
                            schedule_op_describe(send)),
                "sender and receiver must agree on bytes and sample range");
      edges.emplace_back(offset[it->second.first] + static_cast<int>(it->second.second), offset[r] + static_cast<int>(i));
    }
  }
  for (const auto& [key, where] : sends)
    if (!matched.count(key))
      fail_at(s, where.first, where.second, fmt::format("no matching receive on rank {}", std::get<1>(key)),
              "every send needs a receive with the same peer, tag and payload kind");

  // Collectives: members of a data-parallel group (same stage and tp rank) call the same
  // sequence; the k-th calls of all members become one node of the graph.
  std::vector<int> parent(num_ops);
  std::iota(parent.begin(), parent.end(), 0);
  std::map<std::pair<int, int>, std::vector<int>> groups;
  for (int r = 0; r < num_ranks; ++r) groups[{s.ranks[r].stage, s.ranks[r].tp_rank}].push_back(r);
  for (const auto& [id, members] : groups) {
    std::vector<std::vector<size_t>> calls(members.size());
    for (size_t k = 0; k < members.size(); ++k) {
      const std::vector<ScheduleOp>& ops = s.ranks[members[k]].ops;
      for (size_t i = 0; i < ops.size(); ++i)
        if (op_kind_is_collective(ops[i].kind)) calls[k].push_back(i);
    }
    for (size_t k = 1; k < members.size(); ++k) {
      const size_t n = std::min(calls[0].size(), calls[k].size());
      for (size_t c = 0; c < n; ++c) {
        const ScheduleOp& a = s.ranks[members[0]].ops[calls[0][c]];
        const ScheduleOp& b = s.ranks[members[k]].ops[calls[k][c]];
        if (a.kind != b.kind || a.bytes != b.bytes)
          fail_at(s, members[k], calls[k][c],
                  fmt::format("collective {} of the group differs from rank {} op {} ({})", c, members[0], calls[0][c],
                              schedule_op_describe(a)),
                  "every member of a data-parallel group must call the same collectives in the same order");
        parent[find_root(parent, offset[members[k]] + static_cast<int>(calls[k][c]))] =
            find_root(parent, offset[members[0]] + static_cast<int>(calls[0][c]));
      }
      if (calls[0].size() != calls[k].size()) {
        const bool first_longer = calls[0].size() > calls[k].size();
        const int r = first_longer ? members[0] : members[k];
        fail_at(s, r, first_longer ? calls[0][n] : calls[k][n],
                fmt::format("has no partner on rank {}", first_longer ? members[k] : members[0]),
                "every member of a data-parallel group must call the same collectives");
      }
    }
  }

  // Program order on every rank, then Kahn's algorithm over the merged nodes.
  for (int r = 0; r < num_ranks; ++r)
    for (int i = offset[r] + 1; i < offset[r + 1]; ++i) edges.emplace_back(i - 1, i);
  std::vector<std::vector<int>> next(num_ops);
  std::vector<int> indegree(num_ops, 0);
  for (const auto& [a, b] : edges) {
    const int ra = find_root(parent, a);
    const int rb = find_root(parent, b);
    next[ra].push_back(rb);
    ++indegree[rb];
  }
  std::vector<int> ready;
  int roots = 0;
  for (int n = 0; n < num_ops; ++n) {
    if (find_root(parent, n) != n) continue;
    ++roots;
    if (indegree[n] == 0) ready.push_back(n);
  }
  std::vector<bool> done(num_ops, false);
  int processed = 0;
  while (!ready.empty()) {
    const int n = ready.back();
    ready.pop_back();
    done[n] = true;
    ++processed;
    for (int m : next[n])
      if (--indegree[m] == 0) ready.push_back(m);
  }
  if (processed == roots) return;
  // The first operation that can never start on the first stuck rank names the deadlock.
  for (int r = 0; r < num_ranks; ++r)
    for (int i = offset[r]; i < offset[r + 1]; ++i) {
      if (done[find_root(parent, i)]) continue;
      const size_t op_index = static_cast<size_t>(i - offset[r]);
      std::string waits;
      const ScheduleOp& op = s.ranks[r].ops[op_index];
      if (op_kind_is_recv(op.kind)) {
        const auto it = sends.find(Key{op.peer, r, op.tag, static_cast<int>(op.kind)});
        waits = fmt::format("; its send is rank {} op {}, which can never run either", it->second.first, it->second.second);
      }
      fail_at(s, r, op_index, "deadlock: it waits in a dependency cycle" + waits,
              "with blocking receives, a rank must not wait for data its peer only sends after hearing from it");
    }
}

}  // namespace alloy
