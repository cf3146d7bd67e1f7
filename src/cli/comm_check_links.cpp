// Link survey of `alloy comm-check --cluster` (comm_check_links.hpp).
#include "cli/comm_check_links.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "spec/field_reader.hpp"
#include "spec/text_file.hpp"
#include "spec/topology.hpp"
#include "spec/units.hpp"
#include "util/clock.hpp"

namespace alloy::cli {

namespace {

constexpr int kSurveyTag = 900;
constexpr int kLatencyRounds = 20;
constexpr int kBandwidthTries = 3;

// Two ranks whose link is surveyed, named by their node groups.
struct SurveyPair {
  int from_rank = 0;
  int to_rank = 0;
  std::string from_group;
  std::string to_group;
};

// The first device of every node group's first node against the first of every other group's,
// and against the first device of its own group's second node.
std::vector<SurveyPair> survey_pairs(const ClusterSpec& cluster) {
  std::vector<int> first(cluster.node_groups.size(), -1), second_node(cluster.node_groups.size(), -1);
  for (const Device& d : cluster.devices) {
    const size_t g = static_cast<size_t>(d.node_group);
    if (first[g] < 0) first[g] = d.id;
    else if (second_node[g] < 0 && d.node != cluster.devices[static_cast<size_t>(first[g])].node) second_node[g] = d.id;
  }
  std::vector<SurveyPair> pairs;
  for (size_t g = 0; g < first.size(); ++g) {
    const std::string& name = cluster.node_groups[g].name;
    if (second_node[g] >= 0) pairs.push_back({first[g], second_node[g], name, name});
    for (size_t h = g + 1; h < first.size(); ++h)
      pairs.push_back({first[g], first[h], name, cluster.node_groups[h].name});
  }
  return pairs;
}

// On `from`: {median half round trip of 8 B, best bandwidth of `bytes`} to `to`, which echoes.
// A send's time is its round trip with the 8-byte answer, less the fastest round trip of 8 bytes.
std::array<double, 2> survey_measure(Communicator& comm, const SurveyPair& pair, int64_t bytes) {
  const bool initiator = comm.rank() == pair.from_rank;
  const int peer = initiator ? pair.to_rank : pair.from_rank;
  int64_t word = 0;
  std::vector<double> half_trips;
  for (int round = 0; round < kLatencyRounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    if (initiator) {
      comm.send(&word, sizeof(word), peer, kSurveyTag).wait();
      comm.recv(&word, sizeof(word), peer, kSurveyTag).wait();
    } else {
      comm.recv(&word, sizeof(word), peer, kSurveyTag).wait();
      comm.send(&word, sizeof(word), peer, kSurveyTag).wait();
    }
    half_trips.push_back(seconds_since(start) / 2);
  }
  std::sort(half_trips.begin(), half_trips.end());
  const double half_trip = half_trips[kLatencyRounds / 2];
  // The bulk sends' best try is set against the fastest round trip: a median taken while the
  // host was busy could exceed it.
  const double fastest_half_trip = half_trips.front();
  std::vector<char> data(static_cast<size_t>(bytes), 1);
  double best_seconds = 0;
  for (int attempt = 0; attempt < kBandwidthTries; ++attempt) {
    const auto start = std::chrono::steady_clock::now();
    if (initiator) {
      comm.send(data.data(), bytes, peer, kSurveyTag).wait();
      comm.recv(&word, sizeof(word), peer, kSurveyTag).wait();
    } else {
      comm.recv(data.data(), bytes, peer, kSurveyTag).wait();
      comm.send(&word, sizeof(word), peer, kSurveyTag).wait();
    }
    const double elapsed = seconds_since(start);
    const double seconds = elapsed > 2 * fastest_half_trip ? elapsed - 2 * fastest_half_trip : elapsed;
    best_seconds = attempt == 0 ? seconds : std::min(best_seconds, seconds);
  }
  return {half_trip, static_cast<double>(bytes) / best_seconds};
}

// What the cluster file says of the path between the nodes of two devices: the slower NIC,
// capped by a rack uplink or the WAN on the way, and the latency of the whole path.
std::string survey_stated(const ClusterSpec& cluster, int from_device, int to_device) {
  const HopLinks path = topology_hops(cluster, {{from_device, to_device}}).front();
  const Link link = path.level == TopologyLevel::TopologyLevel_node
                        ? cluster.node_group(cluster.devices[static_cast<size_t>(from_device)]).intra_node
                        : path.nic;
  const double bytes_per_second = std::min(link.bandwidth_bytes_per_second, path.shared_bytes_per_second);
  const std::string via = path.shared_bytes_per_second < link.bandwidth_bytes_per_second ? " (" + path.shared_name + ")" : "";
  return fmt::format("{} {}{}, {}", link.kind, units_format_bandwidth(bytes_per_second), via,
                     units_format_seconds(link.latency_seconds));
}

}  // namespace

std::vector<ProfiledGroupLink> comm_links_survey(Communicator& comm, const ClusterSpec& cluster, int64_t bytes) {
  const std::vector<SurveyPair> pairs = survey_pairs(cluster);
  std::vector<ProfiledGroupLink> links;
  if (comm.rank() == 0) {
    fmt::print("links between node groups ({} sends, the first rank of each side):\n",
               units_format_bytes(static_cast<double>(bytes)));
    fmt::print("  {:<14} {:<14} {:<7} {:>12} {:>10}   {}\n", "from", "to", "ranks", "bandwidth", "latency",
               "cluster file");
  }
  for (const SurveyPair& pair : pairs) {
    std::array<double, 2> measured{0, 0};  // kept by the initiator, gathered by the maximum
    if (comm.rank() == pair.from_rank || comm.rank() == pair.to_rank) {
      const std::array<double, 2> got = survey_measure(comm, pair, bytes);
      if (comm.rank() == pair.from_rank) measured = got;
    }
    comm.all_reduce(measured.data(), 2, comm.world(), ReduceOp::ReduceOp_max).wait();
    links.push_back({pair.from_group, pair.to_group, measured[1], measured[0], static_cast<double>(bytes)});
    if (comm.rank() != 0) continue;
    fmt::print("  {:<14} {:<14} {:<7} {:>12} {:>10}   {}\n", pair.from_group, pair.to_group,
               fmt::format("{}-{}", pair.from_rank, pair.to_rank), units_format_bandwidth(measured[1]),
               units_format_seconds(measured[0]), survey_stated(cluster, pair.from_rank, pair.to_rank));
  }
  // All-reduces over every rank, crossing every link the cluster's ring crosses: the best of three.
  std::vector<float> buffer(static_cast<size_t>(bytes / 4), 1.0f);
  double all_reduce_seconds = 0;
  for (int attempt = 0; attempt < kBandwidthTries; ++attempt) {
    const auto start = std::chrono::steady_clock::now();
    comm.all_reduce(buffer.data(), static_cast<int64_t>(buffer.size()), comm.world()).wait();
    const double seconds = seconds_since(start);
    all_reduce_seconds = attempt == 0 ? seconds : std::min(all_reduce_seconds, seconds);
  }
  if (comm.rank() == 0)
    fmt::print("all_reduce of {} over the {} ranks (best of {}): {}\n", units_format_bytes(static_cast<double>(bytes / 4 * 4)),
               comm.world_size(), kBandwidthTries, units_format_seconds(all_reduce_seconds));
  return links;
}

void comm_links_profile_check(const std::string& path) {
  if (std::filesystem::exists(path)) profile_load(path);
}

void comm_links_profile_write(const std::string& path, const std::vector<ProfiledGroupLink>& links) {
  std::string text;
  if (std::filesystem::exists(path)) {
    text = profile_merge_links(spec_file_text(path), path, links);
  } else {
    Profile profile;
    profile.links = links;
    text = profile_to_json(profile);
  }
  text_file_write(path, text, "profile", "--write-profile");
  fmt::print("wrote {} link{} between node groups to {}; use it with alloy plan --profile {}\n", links.size(),
             links.size() == 1 ? "" : "s", path, path);
}

}  // namespace alloy::cli
