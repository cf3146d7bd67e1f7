// `alloy comm-check`: runs every collective of the Communicator on the world and on split
// groups with data each rank can verify on its own (comm_check_collectives.hpp), then measures
// all-reduce bandwidth, small-message latency and compute/communication overlap. Rank 0 prints
// the table. With --cluster it then surveys the links between the cluster's node groups
// (comm_check_links.hpp), and with --write-profile records them in a profile for the planner.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include <fmt/core.h>

#include "cli/comm_check_collectives.hpp"
#include "cli/comm_check_links.hpp"
#include "cli/commands.hpp"
#include "cli/option_checks.hpp"
#include "hw/catalog.hpp"
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
  std::string write_profile;    // record the survey's links in this profile (merged when it exists)
};

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
    if (!o.write_profile.empty()) comm_links_profile_check(o.write_profile);  // before minutes of checks
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
    const bool any_failed = std::any_of(outcomes_by_rank.begin(), outcomes_by_rank.end(), [](uint8_t outcome) {
      return outcome == static_cast<uint8_t>(CheckOutcome::CheckOutcome_fail);
    });
    if (cluster) {
      if (o.emulate_network) {
        std::vector<int> device_of_rank(static_cast<size_t>(comm->world_size()));
        for (int r = 0; r < comm->world_size(); ++r) device_of_rank[static_cast<size_t>(r)] = r;
        auto pacing = std::make_shared<const LinkPacing>(link_pacing_for_cluster(*cluster, device_of_rank));
        comm->links_pace(pacing);
        if (rank == 0) fmt::print("network emulated between ranks: {}\n", pacing->describe());
      }
      const std::vector<ProfiledGroupLink> links = comm_links_survey(*comm, *cluster, bytes);
      if (rank == 0 && !o.write_profile.empty()) {
        if (any_failed)  // a communicator that gets collectives wrong may time sends wrongly too
          fmt::print("comm-check: {} left as it was: a check failed\n", o.write_profile);
        else
          comm_links_profile_write(o.write_profile, links);
      }
    }
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
  cmd->add_option("--write-profile", options->write_profile,
                  "Record those links in this profile for alloy plan --profile (added to it when it exists)")
      ->needs(cluster);
  cmd->callback([options, exit_code]() { *exit_code = comm_check_run(*options); });
}

}  // namespace alloy::cli
