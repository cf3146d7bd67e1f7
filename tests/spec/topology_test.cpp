// Networks per node group, racks and sites: read from cluster files, refused with one clear
// error each when wrong, and answered as paths and rings by the topology model.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "hw/catalog.hpp"
#include "plan/plan.hpp"
#include "spec/cluster.hpp"
#include "spec/error.hpp"
#include "spec/topology.hpp"

namespace alloy {
namespace {

const char* kTieredCluster = R"(name: tiered
network: {kind: infiniband, bandwidth: 80Gb/s, latency: 5us}
sites:
  - {name: east}
  - {name: west}
wan: {kind: ethernet, bandwidth: 8Gb/s, latency: 10ms}
racks:
  - {name: r1, site: east, oversubscription: 2, latency: 1ms}
  - {name: r2, site: west, uplink: 16Gb/s}
nodes:
  - {name: fast, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB, rack: r1}
  - {name: slow, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB, rack: r2,
     network: {kind: ethernet, bandwidth: 8Gb/s, latency: 50us}}
)";

ClusterSpec tiered_load(const std::string& text) { return cluster_load_text(text, "tiered.yaml", "tiered", catalog_builtin()); }

Error tiered_error(const std::string& text) {
  try {
    tiered_load(text);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected alloy::Error for:\n" << text;
  return Error("none");
}

std::string tiered_replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(Topology, ReadsRacksSitesAndGroupNetworks) {
  const ClusterSpec c = tiered_load(kTieredCluster);
  ASSERT_EQ(c.racks.size(), 2u);
  ASSERT_EQ(c.sites.size(), 2u);
  EXPECT_EQ(c.node_groups[0].rack, 0);
  EXPECT_EQ(c.node_groups[1].site, 1);
  EXPECT_DOUBLE_EQ(c.wan.bandwidth_bytes_per_second, 1e9);
  EXPECT_DOUBLE_EQ(topology_group_network(c, 0).bandwidth_bytes_per_second, 10e9);  // the cluster's
  EXPECT_DOUBLE_EQ(topology_group_network(c, 1).bandwidth_bytes_per_second, 1e9);   // its own
  // r1: 2 nodes x 10 GB/s at 2:1 -> 10 GB/s uplink, 5 GB/s a node when both leave at once.
  EXPECT_DOUBLE_EQ(topology_rack_uplink_bytes_per_second(c, 0), 10e9);
  EXPECT_DOUBLE_EQ(topology_rack_per_node_bytes_per_second(c, 0), 5e9);
  EXPECT_DOUBLE_EQ(topology_rack_uplink_bytes_per_second(c, 1), 2e9);
  EXPECT_FALSE(topology_is_flat(c));
}

TEST(Topology, ShippedClustersWithoutTiersStayFlat) {
  for (const std::string& name : cluster_preset_names()) {
    const ClusterSpec c = cluster_load(name, catalog_builtin());
    const bool tiered = name == "a100-two-networks" || name == "racks-two-sites";
    EXPECT_EQ(topology_is_flat(c), !tiered) << name;
  }
}

TEST(Topology, PathAddsTheLatencyOfEveryHopAndKeepsTheNarrowestLink) {
  const ClusterSpec c = tiered_load(kTieredCluster);
  const std::vector<HopLinks> same_rack = topology_hops(c, {{0, 1}});
  EXPECT_EQ(same_rack[0].level, TopologyLevel::TopologyLevel_network);
  EXPECT_DOUBLE_EQ(same_rack[0].nic.latency_seconds, 5e-6);
  EXPECT_EQ(same_rack[0].shared_bytes_per_second, kUnlimitedBytesPerSecond);
  // fast -> slow: the slower NIC (1 GB/s, 50 us), r1's 1 ms to leave, the WAN's 10 ms.
  const std::vector<HopLinks> across = topology_hops(c, {{0, 2}});
  EXPECT_EQ(across[0].level, TopologyLevel::TopologyLevel_site);
  EXPECT_DOUBLE_EQ(across[0].nic.bandwidth_bytes_per_second, 1e9);
  EXPECT_DOUBLE_EQ(across[0].nic.latency_seconds, 50e-6 + 1e-3 + 10e-3);
  EXPECT_DOUBLE_EQ(across[0].shared_bytes_per_second, 1e9);  // the WAN, alone on it
  // Two hops leaving east at once halve the WAN port.
  const std::vector<HopLinks> two = topology_hops(c, {{0, 2}, {1, 3}});
  EXPECT_DOUBLE_EQ(two[0].shared_bytes_per_second, 0.5e9);
  EXPECT_EQ(two[0].shared_hops, 2);
}

TEST(Topology, RingIsLimitedByItsSlowestHop) {
  const ClusterSpec c = tiered_load(kTieredCluster);
  const RingLinks ring = topology_rings(c, {{0, 1, 2, 3}});
  EXPECT_EQ(ring.level, TopologyLevel::TopologyLevel_site);
  EXPECT_DOUBLE_EQ(ring.nic.bandwidth_bytes_per_second, 1e9);
  EXPECT_DOUBLE_EQ(ring.shared_bytes_per_second, 1e9);  // one hop each way across the WAN
  EXPECT_EQ(ring.rings_on_shared, 1);
  const RingLinks inside = topology_rings(c, {{0, 1}});
  EXPECT_DOUBLE_EQ(inside.nic.bandwidth_bytes_per_second, 10e9);
}

TEST(Topology, MeasuredLinkReplacesThePathsFiguresEachWayAsMeasured) {
  ClusterSpec c = tiered_load(kTieredCluster);
  // fast -> slow measured at 200 MB/s and 30 ms, the way back at 300 MB/s and 20 ms; slow -> slow
  // only one way, which holds for both.
  c.measured_links = {MeasuredLink{0, 1, 200e6, 30e-3}, MeasuredLink{1, 0, 300e6, 20e-3}, MeasuredLink{1, 1, 500e6, 1e-4}};
  const HopLinks there = topology_hops(c, {{0, 2}}).front();
  EXPECT_TRUE(there.measured);
  EXPECT_DOUBLE_EQ(there.nic.bandwidth_bytes_per_second, 200e6);
  EXPECT_DOUBLE_EQ(there.nic.latency_seconds, 30e-3);  // the whole path's, no rack or WAN added
  EXPECT_EQ(there.level, TopologyLevel::TopologyLevel_site);
  const HopLinks back = topology_hops(c, {{3, 1}}).front();
  EXPECT_DOUBLE_EQ(back.nic.bandwidth_bytes_per_second, 300e6);
  EXPECT_DOUBLE_EQ(back.nic.latency_seconds, 20e-3);
  EXPECT_DOUBLE_EQ(topology_hops(c, {{3, 2}}).front().nic.bandwidth_bytes_per_second, 500e6);
  // fast -> fast was not measured: the file's NIC.
  EXPECT_FALSE(topology_hops(c, {{0, 1}}).front().measured);
  // The WAN still divides among hops crossing it at once (1 GB/s: two hops get half each).
  EXPECT_DOUBLE_EQ(topology_hops(c, {{0, 2}, {1, 3}}).front().shared_bytes_per_second, 0.5e9);
  // A ring's slowest hop is the measured 200 MB/s one, and it says so.
  const RingLinks ring = topology_rings(c, {{0, 1, 2, 3}});
  EXPECT_TRUE(ring.measured);
  EXPECT_DOUBLE_EQ(ring.nic.bandwidth_bytes_per_second, 200e6);
  EXPECT_FALSE(topology_is_flat(c));
}

TEST(Topology, SharedLinksAreTheLimitingUplinksAndTheWanPortsEachWay) {
  const ClusterSpec c = tiered_load(kTieredCluster);
  const TopologySharedLinks shared = topology_shared_links(c);
  std::vector<std::string> names;
  for (const SharedLink& l : shared.links) names.push_back(l.name);
  EXPECT_EQ(names, (std::vector<std::string>{"rack r1 uplink out", "rack r1 uplink in", "rack r2 uplink out",
                                             "rack r2 uplink in", "wan east out", "wan east in", "wan west out",
                                             "wan west in"}));
  EXPECT_DOUBLE_EQ(shared.links[0].bytes_per_second, 10e9);  // r1: 2 x 10 GB/s at 2:1
  EXPECT_DOUBLE_EQ(shared.links[2].bytes_per_second, 2e9);   // r2: as given
  EXPECT_DOUBLE_EQ(shared.links[4].bytes_per_second, 1e9);   // the WAN, per site
  // fast (r1, east) -> slow (r2, west): out of r1 and east, into r2 and west; inside r1: none.
  EXPECT_EQ(topology_hop_shared_links(c, shared, 0, 2), (std::vector<int>{0, 3, 4, 7}));
  EXPECT_EQ(topology_hop_shared_links(c, shared, 2, 0), (std::vector<int>{2, 1, 6, 5}));
  EXPECT_TRUE(topology_hop_shared_links(c, shared, 0, 1).empty());
  // A rack that is not oversubscribed limits nothing.
  const ClusterSpec open = tiered_load(tiered_replace(kTieredCluster, "oversubscription: 2, ", ""));
  const TopologySharedLinks open_shared = topology_shared_links(open);
  EXPECT_EQ(open_shared.links.size(), 6u);
  EXPECT_EQ(open_shared.rack_links[0], (std::array<int, 2>{-1, -1}));
  EXPECT_EQ(topology_hop_shared_links(open, open_shared, 0, 2), (std::vector<int>{1, 2, 5}));
}

TEST(Topology, CheckPrintsTheTreeWithEachLevelsBottleneck) {
  const std::string tree = topology_describe(tiered_load(kTieredCluster));
  EXPECT_NE(tree.find("site east"), std::string::npos) << tree;
  EXPECT_NE(tree.find("rack r1: uplink 80 Gb/s, 2:1 oversubscribed -> 40 Gb/s per node"), std::string::npos) << tree;
  EXPECT_NE(tree.find("slow: 2 nodes x 1 cpu; NIC ethernet 8 Gb/s per node"), std::string::npos) << tree;
  EXPECT_NE(tree.find("wan between sites: ethernet 8 Gb/s per site, latency 10 ms"), std::string::npos) << tree;
}

TEST(Topology, FingerprintCoversTheTiers) {
  const std::string base = cluster_fingerprint(tiered_load(kTieredCluster));
  EXPECT_NE(base, cluster_fingerprint(tiered_load(tiered_replace(kTieredCluster, "oversubscription: 2", "oversubscription: 4"))));
  EXPECT_NE(base, cluster_fingerprint(tiered_load(tiered_replace(kTieredCluster, "bandwidth: 8Gb/s, latency: 10ms", "bandwidth: 9Gb/s, latency: 10ms"))));
  EXPECT_NE(base, cluster_fingerprint(tiered_load(tiered_replace(kTieredCluster, "bandwidth: 8Gb/s, latency: 50us", "bandwidth: 9Gb/s, latency: 50us"))));
}

struct BadTier {
  const char* from;
  const char* to;
  const char* field;    // in the error's field path
  const char* message;  // part of the message
};

TEST(Topology, BadTiersNameTheFieldAndTheFix) {
  const BadTier cases[] = {
      {"rack: r2,", "rack: r9,", "nodes[1].rack", "unknown rack 'r9'"},
      {"site: west, uplink", "site: north, uplink", "racks[1].site", "unknown site 'north'"},
      {"bandwidth: 8Gb/s, latency: 50us", "bandwidth: 0.5Mb/s, latency: 50us", "nodes[1].network.bandwidth", "slower than 1 Mb/s"},
      {"latency: 10ms", "latency: 11s", "wan.latency", "above 10 s"},
      {"oversubscription: 2", "oversubscription: 0.5", "racks[0].oversubscription", "[1, 1000]"},
      {"oversubscription: 2", "oversubscription: 2, uplink: 10Gb/s", "racks[0].oversubscription", "both"},
      {"uplink: 16Gb/s", "uplink: 0.1Mb/s", "racks[1].uplink", "slower than 1 Mb/s"},
      {"wan: {kind: ethernet, bandwidth: 8Gb/s, latency: 10ms}\n", "", "wan", "no `wan`"},
      {", rack: r1}", "}", "nodes[0].rack", "names no rack"},
      {"  - {name: west}\n", "  - {name: west}\n  - {name: north}\n", "sites[2]", "holds no node group"},
      {"  - {name: r2, site: west, uplink: 16Gb/s}\n", "  - {name: r2, site: west, uplink: 16Gb/s}\n  - {name: r2, site: west}\n",
       "racks[2].name", "two racks"},
  };
  for (const BadTier& bad : cases) {
    const Error e = tiered_error(tiered_replace(kTieredCluster, bad.from, bad.to));
    EXPECT_NE(e.where().field.find(bad.field), std::string::npos) << bad.to << ": " << e.format();
    EXPECT_NE(e.message().find(bad.message), std::string::npos) << bad.to << ": " << e.format();
    EXPECT_GT(e.where().line, 0) << bad.to << ": " << e.format();
    EXPECT_FALSE(e.hint().empty()) << bad.to;
  }
}

}  // namespace
}  // namespace alloy
