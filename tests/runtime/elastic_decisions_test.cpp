// The elastic supervisor's decisions, without a job: the rank OpenMPI's launcher names as lost,
// and the cluster file without a device (a node loses one; a group of nodes splits that one off).
#include <gtest/gtest.h>

#include "hw/catalog.hpp"
#include "runtime/elastic.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

TEST(ElasticDecisions, TheLauncherNamesTheLostRank) {
  EXPECT_EQ(elastic_lost_rank("...\nmpirun noticed that process rank 3 with PID 0 on node vm exited on signal 9 (Killed).\n"), 3);
  EXPECT_EQ(elastic_lost_rank("mpirun noticed that process rank 12 with PID 77 on node a exited on signal 6"), 12);
  EXPECT_EQ(elastic_lost_rank("alloy: error: the data file is too short\n"), -1);
  EXPECT_EQ(elastic_lost_rank("noticed that process rank x"), -1);
}

TEST(ElasticDecisions, ADeviceLeavesItsNodeAndASplitNodeKeepsItsSettings) {
  const ClusterSpec two_nodes = cluster_load_text(R"(name: pair-of-nodes
device_types:
  cpu-fast: {base: cpu, memory: 2GiB}
nodes:
  - {name: big, count: 2, device: cpu-fast, devices_per_node: 4, host_memory: 16GiB, host_link: 8GB/s}
  - {name: small, count: 1, device: cpu-fast, devices_per_node: 1, host_memory: 4GiB}
)",
                                                  "pair.yaml", "", catalog_builtin());
  ASSERT_EQ(two_nodes.devices.size(), 9u);
  // Device 5 is on the second "big" node: that node splits off with 3 devices.
  const ClusterSpec less = cluster_load_text(elastic_cluster_without(two_nodes, 5), "less.yaml", "", catalog_builtin());
  ASSERT_EQ(less.devices.size(), 8u);
  ASSERT_EQ(less.node_groups.size(), 3u);
  EXPECT_EQ(less.node_groups[0].count, 1);
  EXPECT_EQ(less.node_groups[0].devices_per_node, 4);
  EXPECT_EQ(less.node_groups[1].devices_per_node, 3);
  EXPECT_DOUBLE_EQ(less.node_groups[1].host_link_bytes_per_second, two_nodes.node_groups[0].host_link_bytes_per_second);
  EXPECT_EQ(less.node_groups[1].name, "big-less-one");
  // The single device of "small" goes with its node.
  const ClusterSpec without_small = cluster_load_text(elastic_cluster_without(two_nodes, 8), "nosmall.yaml", "", catalog_builtin());
  EXPECT_EQ(without_small.devices.size(), 8u);
  EXPECT_EQ(without_small.node_groups.size(), 1u);
  // A cluster of one device has nothing left.
  const ClusterSpec one = cluster_load_text("name: one\ndevice_types:\n  cpu-fast: {base: cpu, memory: 2GiB}\nnodes:\n"
                                            "  - {name: solo, device: cpu-fast, devices_per_node: 1, host_memory: 4GiB}\n",
                                            "one.yaml", "", catalog_builtin());
  EXPECT_THROW(elastic_cluster_without(one, 0), Error);
}

}  // namespace
}  // namespace alloy
