// `alloy comm-check`: runs every collective of the Communicator on the world and on split
// groups with data each rank can verify on its own, then measures all-reduce bandwidth,
// small-message latency and compute/communication overlap. Rank 0 prints the table. With
// --cluster it then surveys the links between the cluster's node groups (comm_check_links.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include <fmt/core.h>

#include "cli/comm_check_all_to_all.hpp"
#include "cli/commands.hpp"
#include "cli/comm_check_links.hpp"
#include "hw/catalog.hpp"
#include "cli/option_checks.hpp"
#include "runtime/bf16.hpp"
#include "runtime/parallel/communicator.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"
#include "util/clock.hpp"

namespace alloy::cli {

namespace {
using Clock = std::chrono::steady_clock;

struct CommCheckOptions {
  std::string bytes_text = "16MiB";
  double timeout_seconds = 0;
  int fault_rank = -1;         // testing aid: the rank that misbehaves
  std::string fault = "stall";  // stall: never joins the first collective; corrupt: wrong input
  std::string cluster;          // survey the links between its node groups (rank r = device r)
  bool emulate_network = false;  // pace the survey's links to the cluster's network
};

enum class CheckOutcome : uint8_t { CheckOutcome_pass, CheckOutcome_fail, CheckOutcome_not_member };

// One entry per check, in the same order on every rank, so outcomes can be gathered by index.
struct CheckTable {
  std::vector<std::string> names;
  std::vector<std::string> groups;
  std::vector<uint8_t> outcomes;
  std::vector<std::string> notes;  // shown by rank 0 next to the result
};

// A group to check on, with the label the table shows.
struct CheckGroup {
  std::string label;
  CommGroup group;
};

// Runs `check` (returns "" when right, else what is wrong) when this rank is in the group.
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

// The first k in [begin, end) where got(k) != expected(k), described; "" when none.
template <typename Got, typename Expected>
std::string mismatch_find(int64_t begin, int64_t end, Got got, Expected expected) {
  for (int64_t k = begin; k < end; ++k) {
    if (got(k) != expected(k)) return fmt::format("element {} is {}, expected {}", k, got(k), expected(k));
  }
  return "";
}

// Values are small integers, so sums are exact in float whatever order MPI adds them in.
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

// Calls the communicator must refuse, before any MPI call, with an alloy::Error naming the
// bad value; every rank makes the same calls, so a refused split leaves no rank waiting.
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

struct Measurements {
  double all_reduce_seconds = 0;
  double all_reduce_latency_seconds = 0;
  double ping_pong_seconds = -1;  // half round trip; -1 with one rank
};

// Slowest rank's figure, so every rank reports the same.
double max_over_ranks(Communicator& comm, double value) {
  comm.all_reduce(&value, 1, comm.world(), ReduceOp::ReduceOp_max).wait();
  return value;
}

Measurements measure(Communicator& comm, std::vector<float>& buffer) {
  Measurements m;
  const CommGroup& world = comm.world();
  auto count = static_cast<int64_t>(buffer.size());
  comm.all_reduce(buffer.data(), count, world).wait();  // warm-up
  constexpr int kBandwidthRuns = 5;
  max_over_ranks(comm, 0);
  Clock::time_point start = Clock::now();
  for (int i = 0; i < kBandwidthRuns; ++i) comm.all_reduce(buffer.data(), count, world).wait();
  m.all_reduce_seconds = max_over_ranks(comm, seconds_since(start) / kBandwidthRuns);

  constexpr int kLatencyRuns = 100;
  float one = 1;
  start = Clock::now();
  for (int i = 0; i < kLatencyRuns; ++i) comm.all_reduce(&one, 1, world).wait();
  m.all_reduce_latency_seconds = max_over_ranks(comm, seconds_since(start) / kLatencyRuns);

  if (comm.world_size() >= 2 && comm.rank() <= 1) {
    int peer = 1 - comm.rank();
    uint64_t word = 0;
    start = Clock::now();
    for (int i = 0; i < kLatencyRuns; ++i) {
      if (comm.rank() == 0) {
        comm.send(&word, sizeof word, peer, 7).wait();
        comm.recv(&word, sizeof word, peer, 7).wait();
      } else {
        comm.recv(&word, sizeof word, peer, 7).wait();
        comm.send(&word, sizeof word, peer, 7).wait();
      }
    }
    m.ping_pong_seconds = seconds_since(start) / (2.0 * kLatencyRuns);
  }
  double ping_pong = comm.rank() == 0 ? m.ping_pong_seconds : -1;
  m.ping_pong_seconds = max_over_ranks(comm, ping_pong);
  return m;
}

// Posts a large all-reduce, computes on this thread meanwhile, and reports whether it finished
// without the caller touching it again (the progress thread drove it).
std::string overlap_check(Communicator& comm, std::vector<float>& buffer, double all_reduce_seconds, std::string& note) {
  std::fill(buffer.begin(), buffer.end(), static_cast<float>(comm.rank() + 1));
  comm.take_busy_seconds();
  CommHandle handle = comm.all_reduce(buffer.data(), static_cast<int64_t>(buffer.size()), comm.world());
  double limit_seconds = std::max(2.0, 50 * all_reduce_seconds);
  Clock::time_point start = Clock::now();
  volatile double sink = 0;  // keeps the compute from being optimised away
  bool finished = false;
  while (!(finished = handle.done()) && seconds_since(start) < limit_seconds) {
    for (int i = 1; i < 20000; ++i) sink = sink + std::sqrt(static_cast<double>(i));
  }
  double compute_seconds = seconds_since(start);
  handle.wait();
  double busy_seconds = comm.take_busy_seconds();
  int n = comm.world_size();
  float expected = static_cast<float>(n * (n + 1) / 2);
  std::string problem = mismatch_find(
      0, static_cast<int64_t>(buffer.size()), [&](int64_t k) { return buffer[static_cast<size_t>(k)]; },
      [&](int64_t) { return expected; });
  note = fmt::format("finished during {} of compute (in flight {})", units_format_seconds(compute_seconds),
                     units_format_seconds(busy_seconds));
  if (!problem.empty()) return problem;
  if (!finished) return fmt::format("not finished after {} of compute on the caller thread", units_format_seconds(compute_seconds));
  return "";
}

// The timings of what `calls` posts while timing is on (and nothing posted after it is off).
std::vector<CollectiveTiming> timed(Communicator& comm, const std::function<void()>& calls) {
  comm.take_collective_timings();
  comm.collective_timing(true);
  calls();
  comm.collective_timing(false);
  float one = 1;
  comm.all_reduce(&one, 1, comm.world()).wait();  // not timed: timing is off
  return comm.take_collective_timings();
}

// Times an all_reduce, an all_gather and a reduce_scatter on the world (and a broadcast, which
// is not timed), then checks the timings this rank hands over: one per timed call, in order,
// with its kind, its whole buffer's bytes and a time, numbered as every other rank numbered it.
// Then that a 4 MiB all_reduce waited for at once counts as waited for from its call (in one of
// three tries: a caller preempted between the call and the wait on busy cores does not), and a
// 16 MiB one first waited for 100 ms after its call does not.
std::string timing_check(Communicator& comm) {
  const int n = comm.world_size();
  std::vector<float> buffer(static_cast<size_t>(n) * 256, 1.0f);
  const std::vector<int64_t> pieces(static_cast<size_t>(n), 256);
  const int64_t bytes = static_cast<int64_t>(buffer.size() * sizeof(float));
  const std::vector<CollectiveTiming> timings = timed(comm, [&] {
    comm.all_reduce(buffer.data(), static_cast<int64_t>(buffer.size()), comm.world()).wait();
    comm.all_gather(buffer.data(), pieces, comm.world()).wait();
    comm.broadcast(buffer.data(), bytes, 0, comm.world()).wait();
    comm.reduce_scatter(buffer.data(), pieces, comm.world()).wait();
  });
  const CollectiveOp expected[] = {CollectiveOp::CollectiveOp_all_reduce, CollectiveOp::CollectiveOp_all_gather,
                                   CollectiveOp::CollectiveOp_reduce_scatter};
  std::string problem;
  if (timings.size() != 3) problem = fmt::format("{} timings handed over, 3 expected", timings.size());
  for (size_t i = 0; problem.empty() && i < timings.size(); ++i) {
    const CollectiveTiming& t = timings[i];
    if (t.op != expected[i] || t.bytes != bytes || !(t.seconds > 0) || t.group_id != comm.world().id)
      problem =
          fmt::format("timing {} is {} of {} B on group {} in {} s; {} of {} B on the world expected", i,
                      collective_op_name(t.op), t.bytes, t.group_id, t.seconds, collective_op_name(expected[i]), bytes);
  }
  // The broadcast between the all_gather and the reduce_scatter takes a number too.
  if (problem.empty() &&
      (timings[1].sequence != timings[0].sequence + 1 || timings[2].sequence != timings[1].sequence + 2))
    problem = fmt::format("numbered {}, {}, {}: one apart, then two, expected", timings[0].sequence,
                          timings[1].sequence, timings[2].sequence);
  int64_t first = problem.empty() ? timings[0].sequence : -1;
  std::vector<int64_t> all(static_cast<size_t>(n));
  comm.all_gather_bytes(&first, all.data(), sizeof(first), comm.world()).wait();
  if (problem.empty() && std::any_of(all.begin(), all.end(), [&](int64_t s) { return s != first && s >= 0; }))
    problem = fmt::format("this rank numbered the all_reduce {}, another rank otherwise", first);

  std::vector<float> large(size_t{1} << 22, 1.0f);  // 16 MiB
  bool waited = false;
  for (int attempt = 0; attempt < 3; ++attempt) {  // every rank tries until none misses
    const std::vector<CollectiveTiming> t =
        timed(comm, [&] { comm.all_reduce(large.data(), int64_t{1} << 20, comm.world()).wait(); });
    waited = t.size() == 1 && t[0].blocked;
    double missed = waited ? 0 : 1;
    comm.all_reduce(&missed, 1, comm.world(), ReduceOp::ReduceOp_max).wait();
    if (missed == 0) break;
  }
  if (problem.empty() && !waited) problem = "a 4 MiB all_reduce waited for at once never counted as waited for";
  const std::vector<CollectiveTiming> late = timed(comm, [&] {
    const CommHandle handle = comm.all_reduce(large.data(), static_cast<int64_t>(large.size()), comm.world());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    handle.wait();
  });
  if (problem.empty() && n > 1 && (late.size() != 1 || late[0].blocked))
    problem = "a 16 MiB all_reduce first waited for 100 ms after its call counted as waited for from its call";
  return problem;
}

// Host name of every rank, by world rank.
std::vector<std::string> host_names_gather(Communicator& comm) {
  constexpr int64_t kRecordBytes = 64;
  std::vector<char> mine(kRecordBytes, '\0');
  std::string host = comm.host_name().substr(0, kRecordBytes - 1);
  std::memcpy(mine.data(), host.data(), host.size());
  std::vector<char> all(static_cast<size_t>(kRecordBytes * comm.world_size()));
  comm.all_gather_bytes(mine.data(), all.data(), kRecordBytes, comm.world()).wait();
  std::vector<std::string> names;
  for (int r = 0; r < comm.world_size(); ++r) names.emplace_back(all.data() + r * kRecordBytes);
  return names;
}

void table_print(Communicator& comm, const CheckTable& table, const std::vector<uint8_t>& outcomes_by_rank,
                 const std::vector<std::string>& hosts, const Measurements& m, int64_t bytes) {
  std::map<std::string, int> ranks_by_host;
  for (const std::string& host : hosts) ++ranks_by_host[host];
  std::string host_list;
  for (const auto& [host, count] : ranks_by_host) host_list += fmt::format("{}{}: {}", host_list.empty() ? "" : ", ", host, count);
  int n = comm.world_size();
  fmt::print("comm-check: world size {}, {} host{} (ranks per host: {})\n", n,
             ranks_by_host.size(), ranks_by_host.size() == 1 ? "" : "s", host_list);
  fmt::print("  {:<28} {:<10} {}\n", "check", "group", "result");
  size_t checks = table.names.size();
  int failed = 0;
  for (size_t c = 0; c < checks; ++c) {
    std::string failing_ranks;
    bool ran = false;
    for (int r = 0; r < n; ++r) {
      auto outcome = static_cast<CheckOutcome>(outcomes_by_rank[static_cast<size_t>(r) * checks + c]);
      if (outcome != CheckOutcome::CheckOutcome_not_member) ran = true;
      if (outcome == CheckOutcome::CheckOutcome_fail) failing_ranks += fmt::format("{}{}", failing_ranks.empty() ? "" : ",", r);
    }
    std::string result = !failing_ranks.empty() ? "FAIL on rank " + failing_ranks : ran ? "pass" : "not run";
    if (!failing_ranks.empty()) ++failed;
    fmt::print("  {:<28} {:<10} {}{}{}\n", table.names[c], table.groups[c], result, table.notes[c].empty() ? "" : "  ",
               table.notes[c]);
  }
  // Bus bandwidth: what each rank's link carries in a ring all-reduce, 2 (n - 1) / n of the data.
  std::string bus = n > 1 ? fmt::format("{:.2f} GB/s", 2.0 * (n - 1) / n * bytes / m.all_reduce_seconds / 1e9)
                          : "n/a (one rank)";
  fmt::print("all_reduce of {} float over {} rank{}: {} each, bus bandwidth {}, algorithm bandwidth {:.2f} GB/s\n",
             units_format_bytes(static_cast<double>(bytes)), n, n == 1 ? "" : "s",
             units_format_seconds(m.all_reduce_seconds), bus, bytes / m.all_reduce_seconds / 1e9);
  std::string ping_pong = m.ping_pong_seconds >= 0 ? fmt::format("{:.1f} us", m.ping_pong_seconds * 1e6) : "n/a (one rank)";
  fmt::print("latency: all_reduce of 4 B {:.1f} us, send/recv of 8 B between ranks 0 and 1 (half round trip) {}\n",
             m.all_reduce_latency_seconds * 1e6, ping_pong);
  if (failed == 0) {
    fmt::print("comm-check: all {} checks passed\n", checks);
  } else {
    fmt::print("comm-check: {} of {} checks FAILED (details on each failing rank's stderr)\n", failed, checks);
  }
}

// The cluster whose links --cluster surveys: one device per rank.
ClusterSpec comm_check_cluster(const CommCheckOptions& o, int world_size) {
  ClusterSpec cluster = cluster_load(o.cluster, catalog_builtin());
  if (static_cast<int>(cluster.devices.size()) != world_size)
    throw Error(fmt::format("cluster {} has {} devices but {} ranks were started", cluster.name,
                            cluster.devices.size(), world_size),
                {o.cluster, "nodes"}, fmt::format("launch with mpirun -np {}", cluster.devices.size()));
  return cluster;
}

// The largest all-reduce timed: each rank holds a few buffers of this size.
constexpr double kCommCheckMostBytes = 16.0 * (1LL << 30);

int comm_check_run(const CommCheckOptions& o) {
  std::optional<double> bytes_value = units_parse_bytes(o.bytes_text);
  if (!bytes_value || *bytes_value < 4 || *bytes_value > kCommCheckMostBytes) {
    throw Error(fmt::format("--bytes '{}' is not a size from 4 bytes to 16GiB", o.bytes_text), {"", "--bytes"},
                "write e.g. 16MiB or 1048576");
  }
  auto bytes = static_cast<int64_t>(*bytes_value) / 4 * 4;
  std::unique_ptr<Communicator> comm = communicator_mpi(o.timeout_seconds);
  try {
    int rank = comm->rank();
    if (o.fault_rank >= 0 && comm->world_size() < 2) {
      throw Error("--fault-rank needs at least 2 ranks: the others detect the fault", {"", "--fault-rank"},
                  "run under mpirun -np 2 or more");
    }
    if (o.fault_rank == rank && o.fault == "stall") {
      std::this_thread::sleep_for(std::chrono::hours(1));  // the others' timeout ends the job
    }
    std::optional<ClusterSpec> cluster;
    if (!o.cluster.empty()) cluster = comm_check_cluster(o, comm->world_size());
    std::vector<std::string> hosts = host_names_gather(*comm);
    CheckTable table;
    std::vector<CheckGroup> groups = check_groups(*comm);
    for (size_t g = 0; g < groups.size(); ++g) {
      group_checks_run(*comm, table, groups[g], 100 + static_cast<int>(g), o.fault_rank == rank && o.fault == "corrupt");
    }
    check_run(table, groups[0], "invalid calls refused", rank, [&] { return invalid_calls_check(*comm); });
    check_run(table, groups[0], "collective timing", rank, [&] { return timing_check(*comm); });
    std::vector<float> buffer(static_cast<size_t>(bytes / 4), 1.0f);
    Measurements m = measure(*comm, buffer);
    std::string note;
    check_run(table, groups[0], "overlap all_reduce+compute", rank,
              [&] { return overlap_check(*comm, buffer, m.all_reduce_seconds, note); });
    table.notes.back() = note;

    std::vector<uint8_t> outcomes_by_rank(table.outcomes.size() * static_cast<size_t>(comm->world_size()));
    comm->all_gather_bytes(table.outcomes.data(), outcomes_by_rank.data(), static_cast<int64_t>(table.outcomes.size()),
                           comm->world())
        .wait();
    if (rank == 0) table_print(*comm, table, outcomes_by_rank, hosts, m, bytes);
    if (cluster) {
      if (o.emulate_network) {
        std::vector<int> device_of_rank(static_cast<size_t>(comm->world_size()));
        for (int r = 0; r < comm->world_size(); ++r) device_of_rank[static_cast<size_t>(r)] = r;
        auto pacing = std::make_shared<const LinkPacing>(link_pacing_for_cluster(*cluster, device_of_rank));
        comm->links_pace(pacing);
        if (rank == 0) fmt::print("network emulated between ranks: {}\n", pacing->describe());
      }
      comm_links_survey(*comm, *cluster, bytes);
    }
    bool any_failed = std::any_of(outcomes_by_rank.begin(), outcomes_by_rank.end(), [](uint8_t outcome) {
      return outcome == static_cast<uint8_t>(CheckOutcome::CheckOutcome_fail);
    });
    return any_failed ? 1 : 0;
  } catch (const Error& e) {
    // One rank's bad input must stop the others, which may be waiting in a collective.
    if (comm->world_size() > 1) comm->abort(e.format(), kExitBadInput);
    throw;
  }
}
}  // namespace

void add_comm_check(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<CommCheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "comm-check", "Check MPI across hosts: run every collective, verify results, measure bandwidth and latency "
                    "(run under mpirun -np N)");
  cmd->add_option("--bytes", options->bytes_text, "All-reduce size for the bandwidth and overlap figures")
      ->capture_default_str();
  cmd->add_option("--timeout", options->timeout_seconds,
                  "Seconds an operation may take before the job is aborted (0: ALLOY_COMM_TIMEOUT, else 300)")
      ->check(option_number_in(0, 7 * 24 * 3600, false));
  cmd->add_option("--fault-rank", options->fault_rank, "Testing aid: this rank misbehaves (see --fault)")
      ->check(option_whole_in(0, 1 << 20))
      ->group("");
  cmd->add_option("--fault", options->fault, "Testing aid: stall (never joins) or corrupt (wrong input)")
      ->check(CLI::IsMember({"stall", "corrupt"}))
      ->group("");
  CLI::Option* cluster = cmd->add_option(
      "--cluster", options->cluster,
      "Also measure the links between this cluster's node groups (preset or YAML; rank r is device r)");
  cmd->add_flag("--emulate-network", options->emulate_network,
                "Pace those links to the cluster's network first (ranks on one host emulating several nodes)")
      ->needs(cluster);
  cmd->callback([options, exit_code]() { *exit_code = comm_check_run(*options); });
}

}  // namespace alloy::cli
