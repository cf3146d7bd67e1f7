// alloy comm-check's checks of every collective (comm_check_collectives.hpp).
#include "cli/comm_check_collectives.hpp"

#include <algorithm>

#include "cli/comm_check_all_to_all.hpp"
#include "runtime/bf16.hpp"
#include "spec/error.hpp"

namespace alloy::cli {

void check_run(CheckTable& table, const CheckGroup& g, const std::string& name, int rank,
               const std::function<std::string()>& check) {
  table.names.push_back(name);
  table.groups.push_back(g.label);
  table.notes.emplace_back();
  if (g.group.my_index < 0) {
    table.outcomes.push_back(static_cast<uint8_t>(CheckOutcome::CheckOutcome_not_member));
    return;
  }
  std::string problem = check();
  table.outcomes.push_back(static_cast<uint8_t>(problem.empty() ? CheckOutcome::CheckOutcome_pass
                                                                : CheckOutcome::CheckOutcome_fail));
  if (!problem.empty()) {
    fmt::print(stderr, "comm-check: {} on {} is wrong on rank {}: {}\n", name, g.label, rank, problem);
  }
}

namespace {

double sum_value(int rank, int64_t k) { return (rank + 1) * static_cast<double>(k % 97 + 1); }
double max_value(int rank, int64_t k) { return static_cast<double>((k * 7 + rank * 13) % 101); }

constexpr int64_t kCheckCount = (int64_t{1} << 16) + 17;

template <typename T>
std::string all_reduce_check(Communicator& comm, const CommGroup& group, ReduceOp op, bool corrupt) {
  bool sum = op == ReduceOp::ReduceOp_sum;
  std::vector<T> data(static_cast<size_t>(kCheckCount));
  for (int64_t k = 0; k < kCheckCount; ++k) {
    data[static_cast<size_t>(k)] = static_cast<T>(sum ? sum_value(comm.rank(), k) : max_value(comm.rank(), k));
  }
  if (corrupt) data[0] += 1000;
  comm.all_reduce(data.data(), kCheckCount, group, op).wait();
  return mismatch_find(
      0, kCheckCount, [&](int64_t k) { return data[static_cast<size_t>(k)]; },
      [&](int64_t k) {
        T expected = 0;
        for (int r : group.members) {
          expected = sum ? expected + static_cast<T>(sum_value(r, k)) : std::max(expected, static_cast<T>(max_value(r, k)));
        }
        return expected;
      });
}

std::vector<int64_t> uneven_counts(int members, int64_t base, int64_t step) {
  std::vector<int64_t> counts;
  for (int i = 0; i < members; ++i) counts.push_back(base + step * i + (i % 2) * 3);
  return counts;
}

std::string reduce_scatter_check(Communicator& comm, const CommGroup& group) {
  std::vector<int64_t> counts = uneven_counts(group.size(), 1001, 37);
  int64_t total = 0;
  int64_t my_offset = 0;
  for (int i = 0; i < group.size(); ++i) {
    if (i == group.my_index) my_offset = total;
    total += counts[static_cast<size_t>(i)];
  }
  auto value = [](int rank, int64_t k) { return static_cast<float>(rank + 1 + k % 11); };
  std::vector<float> data(static_cast<size_t>(total));
  for (int64_t k = 0; k < total; ++k) data[static_cast<size_t>(k)] = value(comm.rank(), k);
  comm.reduce_scatter(data.data(), counts, group).wait();
  return mismatch_find(
      my_offset, my_offset + counts[static_cast<size_t>(group.my_index)],
      [&](int64_t k) { return data[static_cast<size_t>(k)]; },
      [&](int64_t k) {
        float expected = 0;
        for (int r : group.members) expected += value(r, k);
        return expected;
      });
}

// Values bf16 cannot hold: the owner's sum must be that of every member's rounded value, added in
// member order in fp32 (a sum of unrounded values, or one rounded again, differs).
std::string reduce_scatter_bf16_check(Communicator& comm, const CommGroup& group) {
  std::vector<int64_t> counts = uneven_counts(group.size(), 700, 29);
  int64_t total = 0;
  int64_t my_offset = 0;
  for (int i = 0; i < group.size(); ++i) {
    if (i == group.my_index) my_offset = total;
    total += counts[static_cast<size_t>(i)];
  }
  auto value = [](int rank, int64_t k) { return 1.0f + static_cast<float>(rank + 1) / 1024 + static_cast<float>(k % 7) / 4096; };
  std::vector<float> data(static_cast<size_t>(total));
  for (int64_t k = 0; k < total; ++k) data[static_cast<size_t>(k)] = value(comm.rank(), k);
  comm.reduce_scatter_bf16(data.data(), counts, group).wait();
  return mismatch_find(
      my_offset, my_offset + counts[static_cast<size_t>(group.my_index)],
      [&](int64_t k) { return data[static_cast<size_t>(k)]; },
      [&](int64_t k) {
        float expected = 0;
        for (int r : group.members) expected += bf16_to_float(bf16_from_float(value(r, k)));
        return expected;
      });
}

std::string all_gather_check(Communicator& comm, const CommGroup& group) {
  std::vector<int64_t> counts = uneven_counts(group.size(), 500, 53);
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t count : counts) {
    offsets.push_back(total);
    total += count;
  }
  // Element k of member i's piece is members[i] * 10000 + k.
  std::vector<float> data(static_cast<size_t>(total), -1.0f);
  int me = group.my_index;
  for (int64_t k = 0; k < counts[static_cast<size_t>(me)]; ++k) {
    data[static_cast<size_t>(offsets[static_cast<size_t>(me)] + k)] = static_cast<float>(comm.rank() * 10000 + k);
  }
  comm.all_gather(data.data(), counts, group).wait();
  return mismatch_find(
      0, total, [&](int64_t k) { return data[static_cast<size_t>(k)]; },
      [&](int64_t k) {
        size_t i = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), k) - offsets.begin() - 1);
        return static_cast<float>(group.members[i] * 10000 + (k - offsets[i]));
      });
}

int byte_pattern(int rank, int64_t k) { return static_cast<int>((rank * 31 + k * 7) & 0xff); }

std::string broadcast_check(Communicator& comm, const CommGroup& group) {
  constexpr int64_t bytes = 100003;
  int root = group.size() - 1;
  std::vector<uint8_t> data(bytes, 0);
  if (group.my_index == root) {
    for (int64_t k = 0; k < bytes; ++k) data[static_cast<size_t>(k)] = static_cast<uint8_t>(byte_pattern(comm.rank(), k));
  }
  comm.broadcast(data.data(), bytes, root, group).wait();
  return mismatch_find(
      0, bytes, [&](int64_t k) { return int{data[static_cast<size_t>(k)]}; },
      [&](int64_t k) { return byte_pattern(group.members[static_cast<size_t>(root)], k); });
}

std::string all_gather_bytes_check(Communicator& comm, const CommGroup& group) {
  constexpr int64_t record = 41;
  std::vector<uint8_t> in(record);
  for (int64_t k = 0; k < record; ++k) in[static_cast<size_t>(k)] = static_cast<uint8_t>(byte_pattern(comm.rank(), k));
  std::vector<uint8_t> out(static_cast<size_t>(record * group.size()), 0);
  comm.all_gather_bytes(in.data(), out.data(), record, group).wait();
  return mismatch_find(
      0, record * group.size(), [&](int64_t k) { return int{out[static_cast<size_t>(k)]}; },
      [&](int64_t k) { return byte_pattern(group.members[static_cast<size_t>(k / record)], k % record); });
}

// Every member sends to the next member and receives from the previous one.
std::string ring_check(Communicator& comm, const CommGroup& group, int tag) {
  constexpr int64_t bytes = 50001;
  int n = group.size();
  int next = group.members[static_cast<size_t>((group.my_index + 1) % n)];
  int previous = group.members[static_cast<size_t>((group.my_index + n - 1) % n)];
  std::vector<uint8_t> out(bytes);
  std::vector<uint8_t> in(bytes, 0);
  for (int64_t k = 0; k < bytes; ++k) out[static_cast<size_t>(k)] = static_cast<uint8_t>(byte_pattern(comm.rank(), k));
  CommHandle received = comm.recv(in.data(), bytes, previous, tag);
  CommHandle sent = comm.send(out.data(), bytes, next, tag);
  received.wait();
  sent.wait();
  return mismatch_find(
      0, bytes, [&](int64_t k) { return int{in[static_cast<size_t>(k)]}; },
      [&](int64_t k) { return byte_pattern(previous, k); });
}

// Two all-reduces in flight at once, waited on in the opposite order.
std::string two_in_flight_check(Communicator& comm, const CommGroup& group) {
  std::vector<double> a(1000, comm.rank() + 1.0);
  std::vector<double> b(3000, 2.0 * comm.rank());
  CommHandle first = comm.all_reduce(a.data(), 1000, group);
  CommHandle second = comm.all_reduce(b.data(), 3000, group, ReduceOp::ReduceOp_max);
  second.wait();
  first.wait();
  double sum = 0;
  for (int r : group.members) sum += r + 1.0;
  double max = 2.0 * group.members.back();
  std::string problem = mismatch_find(0, 1000, [&](int64_t k) { return a[static_cast<size_t>(k)]; }, [&](int64_t) { return sum; });
  if (!problem.empty()) return "first: " + problem;
  problem = mismatch_find(0, 3000, [&](int64_t k) { return b[static_cast<size_t>(k)]; }, [&](int64_t) { return max; });
  return problem.empty() ? "" : "second: " + problem;
}

}  // namespace

std::string invalid_calls_check(Communicator& comm) {
  struct Case {
    std::string must_name;
    std::function<void()> call;
  };
  uint8_t byte = 0;
  float value = 0;
  int n = comm.world_size();
  std::vector<Case> cases{
      {"tag -5", [&] { comm.send(&byte, 1, 0, -5); }},
      {fmt::format("peer rank {}", n), [&] { comm.recv(&byte, 1, n, 0); }},
      {"rank 0 is in group 0 and in group 1", [&] { comm.split({{0}, {0}}); }},
      {"not a member", [&] { comm.all_reduce(&value, 1, CommGroup{}); }},
      {"given 0 counts", [&] { comm.all_gather(&value, {}, comm.world()); }},
  };
  for (const Case& c : cases) {
    try {
      c.call();
      return fmt::format("a call that should fail naming '{}' was accepted", c.must_name);
    } catch (const Error& e) {
      if (e.message().find(c.must_name) == std::string::npos) {
        return fmt::format("refused with '{}', which does not name '{}'", e.message(), c.must_name);
      }
    }
  }
  return "";
}

void group_checks_run(Communicator& comm, CheckTable& table, const CheckGroup& g, int tag, bool corrupt) {
  const CommGroup& group = g.group;
  int rank = comm.rank();
  check_run(table, g, "all_reduce sum float", rank,
            [&] { return all_reduce_check<float>(comm, group, ReduceOp::ReduceOp_sum, corrupt); });
  check_run(table, g, "all_reduce max float", rank,
            [&] { return all_reduce_check<float>(comm, group, ReduceOp::ReduceOp_max, false); });
  check_run(table, g, "all_reduce sum double", rank,
            [&] { return all_reduce_check<double>(comm, group, ReduceOp::ReduceOp_sum, false); });
  check_run(table, g, "all_reduce max double", rank,
            [&] { return all_reduce_check<double>(comm, group, ReduceOp::ReduceOp_max, false); });
  check_run(table, g, "reduce_scatter uneven", rank, [&] { return reduce_scatter_check(comm, group); });
  check_run(table, g, "reduce_scatter bf16 wire", rank, [&] { return reduce_scatter_bf16_check(comm, group); });
  check_run(table, g, "all_gather uneven", rank, [&] { return all_gather_check(comm, group); });
  check_run(table, g, "broadcast", rank, [&] { return broadcast_check(comm, group); });
  check_run(table, g, "all_gather_bytes", rank, [&] { return all_gather_bytes_check(comm, group); });
  check_run(table, g, "all_to_all uneven", rank, [&] { return comm_check_all_to_all(comm, group); });
  check_run(table, g, "ring send/recv", rank, [&] { return ring_check(comm, group, tag); });
  check_run(table, g, "two all_reduce in flight", rank, [&] { return two_in_flight_check(comm, group); });
}

// Groups to check on, identical on every rank: world, even/odd ranks, and (from 2 ranks) all
// but the last rank, which then checks that a rank outside every group is left alone.
std::vector<CheckGroup> check_groups(Communicator& comm) {
  int n = comm.world_size();
  std::vector<CheckGroup> groups{{"world", comm.world()}};
  std::vector<std::vector<int>> parity(2);
  for (int r = 0; r < n; ++r) parity[static_cast<size_t>(r % 2)].push_back(r);
  if (parity[1].empty()) parity.pop_back();
  groups.push_back({"even/odd", comm.split(parity)});
  if (n >= 2) {
    std::vector<int> first;
    for (int r = 0; r + 1 < n; ++r) first.push_back(r);
    groups.push_back({"first n-1", comm.split({first})});
  }
  return groups;
}

}  // namespace alloy::cli
