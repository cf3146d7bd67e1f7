// Emulated links: the times LinkPacing gives transfers and ring collectives, worked by hand, the
// table a cluster file gives, and `alloy comm-check --cluster --emulate-network` measuring on
// real MPI ranks what the cluster file says.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../common/test_util.hpp"
#include "hw/catalog.hpp"
#include "runtime/parallel/link_pacing.hpp"
#include "spec/cluster.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

using testing::CommandResult;
using testing::run_command;

// Two node groups of two one-device nodes, every pair of nodes joined by 20 MB/s and 2 ms.
constexpr const char* kTwoGroupsYaml = R"(name: two-groups
network: {kind: ethernet, bandwidth: 20MB/s, latency: 2ms}
nodes:
  - {name: east, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB}
  - {name: west, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB}
)";

// 4 ranks; every link unpaced but 1 -> 2 (and back) at 10 MB/s and 1 ms, 3 -> 0 at 40 MB/s, 3 ms.
LinkPacing one_slow_hop() {
  std::vector<std::vector<PacedLink>> links(4, std::vector<PacedLink>(4));
  links[1][2] = links[2][1] = {10e6, 1e-3};
  links[3][0] = {40e6, 3e-3};
  return LinkPacing(links);
}

TEST(LinkPacing, TransfersTakeBytesOverBandwidthPlusLatency) {
  const LinkPacing pacing = one_slow_hop();
  EXPECT_DOUBLE_EQ(pacing.occupy_seconds(1, 2, 5'000'000), 0.5);
  EXPECT_DOUBLE_EQ(pacing.transfer_seconds(1, 2, 5'000'000), 0.501);
  EXPECT_DOUBLE_EQ(pacing.transfer_seconds(0, 1, 5'000'000), 0.0);  // one node: not paced
  EXPECT_TRUE(pacing.paces_any());
  EXPECT_FALSE(LinkPacing(std::vector<std::vector<PacedLink>>(3, std::vector<PacedLink>(3))).paces_any());
}

TEST(LinkPacing, AllToAllTakesPairwiseRoundsEachAsLongAsItsSlowestTransfer) {
  const LinkPacing pacing = one_slow_hop();
  const std::vector<int> all = {0, 1, 2, 3};
  // bytes[i][j] from member i to member j. Round 1 (i -> i+1): 1 -> 2 carries 2 MB at 10 MB/s,
  // 0.201 s; 3 -> 0 carries 4 MB at 40 MB/s, 0.103 s: the round takes 0.201 s. Round 2 (i -> i+2)
  // crosses no paced link: 0. Round 3 (i -> i-1): 2 -> 1 carries 1 MB, 0.101 s.
  std::vector<std::vector<int64_t>> bytes(4, std::vector<int64_t>(4, 0));
  bytes[1][2] = 2'000'000;
  bytes[3][0] = 4'000'000;
  bytes[2][1] = 1'000'000;
  bytes[0][2] = 9'000'000;  // round 2, unpaced
  EXPECT_NEAR(pacing.all_to_all_seconds(all, bytes), 0.201 + 0.0 + 0.101, 1e-12);
  // A paced link with nothing to carry still pays its latency in its round.
  bytes[2][1] = 0;
  EXPECT_NEAR(pacing.all_to_all_seconds(all, bytes), 0.201 + 0.001, 1e-12);
  // collective_seconds splits the bytes evenly: 16 MB over 16 pairs, 1 MB each. Round 1: 1 -> 2
  // 0.101 s, 3 -> 0 0.028 s; round 2: nothing paced; round 3: 2 -> 1 0.101 s.
  EXPECT_NEAR(pacing.collective_seconds(PacedCollective::PacedCollective_all_to_all, all, 16'000'000), 0.202, 1e-12);
  EXPECT_EQ(pacing.collective_seconds(PacedCollective::PacedCollective_all_to_all, {0, 1}, 16'000'000), 0.0);
  EXPECT_THROW(pacing.all_to_all_seconds(all, std::vector<std::vector<int64_t>>(3)), Error);
}

TEST(LinkPacing, RingCollectivesRunAtTheSlowestHopAndTheLongestLatency) {
  const LinkPacing pacing = one_slow_hop();
  // Ring 0 -> 1 -> 2 -> 3 -> 0: slowest hop 10 MB/s, longest latency 3 ms; 8 MB in all, 4 members:
  // each step moves 2 MB across every hop (0.2 s) and pays 3 ms.
  const std::vector<int> all = {0, 1, 2, 3};
  EXPECT_NEAR(pacing.collective_seconds(PacedCollective::PacedCollective_all_reduce, all, 8'000'000), 6 * 0.203, 1e-12);
  EXPECT_NEAR(pacing.collective_seconds(PacedCollective::PacedCollective_reduce_scatter, all, 8'000'000), 3 * 0.203,
              1e-12);
  EXPECT_NEAR(pacing.collective_seconds(PacedCollective::PacedCollective_all_gather, all, 8'000'000), 3 * 0.203, 1e-12);
  EXPECT_NEAR(pacing.collective_seconds(PacedCollective::PacedCollective_broadcast, all, 8'000'000), 0.8 + 3 * 0.003,
              1e-12);
  // A group that stays on unpaced hops is not held; one of a member alone neither.
  EXPECT_EQ(pacing.collective_seconds(PacedCollective::PacedCollective_all_reduce, {0, 1}, 8'000'000), 0.0);
  EXPECT_EQ(pacing.collective_seconds(PacedCollective::PacedCollective_all_reduce, {2}, 8'000'000), 0.0);
  // Two members cross 1 -> 2 and 2 -> 1: one step each way, 4 MB at 10 MB/s.
  EXPECT_NEAR(pacing.collective_seconds(PacedCollective::PacedCollective_all_reduce, {1, 2}, 8'000'000), 2 * 0.401,
              1e-12);
}

TEST(LinkPacing, MalformedTablesAreRefused) {
  std::vector<std::vector<PacedLink>> ragged(2, std::vector<PacedLink>(2));
  ragged[1].pop_back();
  EXPECT_THROW(LinkPacing{ragged}, Error);
  std::vector<std::vector<PacedLink>> negative(2, std::vector<PacedLink>(2));
  negative[0][1] = {-1.0, 0.0};
  EXPECT_THROW(LinkPacing{negative}, Error);
}

TEST(LinkPacing, AClusterPacesRanksOnDifferentNodesOnly) {
  const ClusterSpec cluster = cluster_load_text(R"(name: pairs
network: {kind: infiniband, bandwidth: 25GB/s, latency: 5us}
nodes:
  - {name: big, count: 1, device: cpu, devices_per_node: 2, host_memory: 8GiB}
  - {name: small, count: 1, device: cpu, devices_per_node: 1, host_memory: 8GiB}
)",
                                                "pairs.yaml", "", catalog_builtin());
  // Ranks in a different order than the devices: rank 0 is device 2 (node "small").
  const LinkPacing pacing = link_pacing_for_cluster(cluster, {2, 0, 1});
  EXPECT_FALSE(pacing.link(1, 2).paced());  // devices 0 and 1 share a node
  EXPECT_DOUBLE_EQ(pacing.link(0, 1).bytes_per_second, 25e9);
  EXPECT_DOUBLE_EQ(pacing.link(2, 0).latency_seconds, 5e-6);
  EXPECT_EQ(pacing.describe(), "0 <-> 1-2 at 25 GB/s, 5 us");
}

TEST(LinkPacing, EachPairIsPacedToThePathBetweenItsNodes) {
  // Group "fast" on 100 MB/s NICs, group "slow" on 10 MB/s ones; sites joined by a 5 MB/s WAN.
  const ClusterSpec cluster = cluster_load_text(R"(name: paths
network: {kind: ethernet, bandwidth: 100MB/s, latency: 1ms}
sites:
  - {name: here}
  - {name: there}
wan: {kind: ethernet, bandwidth: 5MB/s, latency: 20ms}
nodes:
  - {name: fast, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB, site: here}
  - {name: slow, count: 1, device: cpu, devices_per_node: 1, host_memory: 8GiB, site: here,
     network: {kind: ethernet, bandwidth: 10MB/s, latency: 2ms}}
  - {name: far, count: 1, device: cpu, devices_per_node: 1, host_memory: 8GiB, site: there}
)",
                                                "paths.yaml", "", catalog_builtin());
  const LinkPacing pacing = link_pacing_for_cluster(cluster, {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(pacing.link(0, 1).bytes_per_second, 100e6);  // fast <-> fast
  EXPECT_DOUBLE_EQ(pacing.link(0, 2).bytes_per_second, 10e6);   // the slower NIC
  EXPECT_DOUBLE_EQ(pacing.link(2, 0).latency_seconds, 2e-3);
  EXPECT_DOUBLE_EQ(pacing.link(1, 3).bytes_per_second, 5e6);    // the WAN
  EXPECT_DOUBLE_EQ(pacing.link(1, 3).latency_seconds, 21e-3);   // NIC, then the WAN
}

// The survey's bandwidth (MB/s) of the line "  FROM  TO  RANKS  X MB/s ..."; -1 when absent.
double survey_megabytes_per_second(const std::string& output, const std::string& ranks) {
  const size_t at = output.find(" " + ranks + " ");
  if (at == std::string::npos) return -1;
  const size_t unit = output.find("B/s", at);
  const size_t begin = output.find_first_not_of(' ', at + ranks.size() + 2);
  const double value = std::atof(output.substr(begin, unit - begin).c_str());
  return output[unit - 1] == 'G' ? value * 1000 : output[unit - 1] == 'M' ? value : -1;
}

TEST(LinkPacingMpi, EmulatedLinksMeasureAsTheClusterFileSays) {
  testing::mpi_test_environment_set();
  testing::TempDir dir;
  const std::string cluster = dir.write("two-groups.yaml", kTwoGroupsYaml);
  const std::string command = std::string("mpirun -np 4 ") + ALLOY_BINARY + " comm-check --bytes 1MiB --cluster " + cluster;
  const CommandResult paced = run_command(command + " --emulate-network", 120);
  ASSERT_EQ(paced.exit_code, 0) << paced.output;
  EXPECT_NE(paced.output.find("network emulated between ranks: 0 <-> 1-3, 1 <-> 2-3, 2 <-> 3 at 20 MB/s, 2 ms"),
            std::string::npos)
      << paced.output;
  for (const char* ranks : {"0-1", "0-2", "2-3"}) {
    const double measured = survey_megabytes_per_second(paced.output, ranks);
    EXPECT_GT(measured, 20 * 0.85) << ranks << "\n" << paced.output;
    EXPECT_LT(measured, 20 * 1.1) << ranks << "\n" << paced.output;
  }
  // A ring all-reduce of 1 MiB over 4 ranks: 6 steps of 256 KiB at 20 MB/s plus 2 ms each, 90.6 ms.
  const std::string all_reduce_line = "all_reduce of 1 MiB over the 4 ranks (best of 3): ";
  const size_t at = paced.output.find(all_reduce_line);
  ASSERT_NE(at, std::string::npos) << paced.output;
  const double all_reduce_ms = std::atof(paced.output.c_str() + at + all_reduce_line.size());
  EXPECT_GT(all_reduce_ms, 90.6 * 0.95) << paced.output;
  EXPECT_LT(all_reduce_ms, 90.6 * 2) << paced.output;  // a second hold would double it

  const CommandResult free = run_command(command, 120);
  ASSERT_EQ(free.exit_code, 0) << free.output;
  EXPECT_EQ(free.output.find("network emulated"), std::string::npos) << free.output;
  // Unpaced, the host moves it faster than the emulated link would (by far, unless heavily loaded).
  EXPECT_GT(survey_megabytes_per_second(free.output, "0-2"), 40.0) << free.output;
}

TEST(LinkPacingMpi, ClusterOfOtherSizeOrEmulationWithoutClusterIsRefused) {
  testing::mpi_test_environment_set();
  testing::TempDir dir;
  const std::string cluster = dir.write("two-groups.yaml", kTwoGroupsYaml);
  const CommandResult wrong =
      run_command(std::string("mpirun -np 2 ") + ALLOY_BINARY + " comm-check --bytes 1MiB --cluster " + cluster, 60);
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_NE(wrong.output.find("cluster two-groups has 4 devices but 2 ranks were started"), std::string::npos)
      << wrong.output;
  EXPECT_NE(wrong.output.find("mpirun -np 4"), std::string::npos) << wrong.output;
  const CommandResult alone = run_command(std::string(ALLOY_BINARY) + " comm-check --emulate-network", 60);
  EXPECT_NE(alone.exit_code, 0) << alone.output;
  EXPECT_NE(alone.output.find("--cluster"), std::string::npos) << alone.output;
}

// The median step a training run prints ("median step 212 ms over ..."), in seconds; -1 if absent.
double median_step_seconds(const std::string& output) {
  const size_t at = output.find("median step ");
  if (at == std::string::npos) return -1;
  const double value = std::atof(output.c_str() + at + 12);
  const size_t unit = output.find_first_not_of("0123456789. ", at + 12);
  return output.compare(unit, 2, "ms") == 0 ? value / 1e3 : output.compare(unit, 2, "us") == 0 ? value / 1e6 : value;
}

TEST(LinkPacingMpi, TrainingAcrossAnEmulatedSlowLinkWaitsForIt) {
  testing::mpi_test_environment_set();
  testing::TempDir dir;
  const std::string model = dir.write("gpt.yaml", R"(name: pace-gpt
family: gpt2
layers: 2
hidden_size: 64
heads: 4
vocab_size: 256
max_seq_len: 64
)");
  // Data parallelism over two one-device nodes joined by 4 MB/s: the step's all-reduce of about
  // 0.5 MB of fp32 gradients takes 2 x 0.25 MB / 4 MB/s = 0.13 s on the emulated link.
  const std::string cluster = dir.write("two-nodes.yaml", R"(name: two-nodes
network: {kind: ethernet, bandwidth: 4MB/s, latency: 1ms}
nodes:
  - {name: here, count: 2, device: cpu, devices_per_node: 1, host_memory: 8GiB}
)");
  const std::string train = dir.write("train.yaml", "seq_len: 32\nglobal_batch: 4\nprecision: fp32\nsteps: 5\n");
  const std::string plan = dir.path() + "/plan.json";
  const std::string data = dir.path() + "/data.bin";
  const std::string alloy = ALLOY_BINARY;
  ASSERT_EQ(run_command(alloy + " plan --model " + model + " --cluster " + cluster + " --train " + train +
                        " --dp 2 --no-simulate -o " + plan)
                .exit_code,
            0);
  ASSERT_EQ(run_command(alloy + " tokenize " + ALLOY_SOURCE_DIR + "/examples/data/fsf_licenses.txt -o " + data).exit_code,
            0);
  const std::string command = "mpirun -np 2 " + alloy + " train --no-progress --plan " + plan + " --data " + data;
  const CommandResult paced = run_command(command + " --emulate-network", 120);
  ASSERT_EQ(paced.exit_code, 0) << paced.output;
  EXPECT_NE(paced.output.find("network emulated between ranks: 0 <-> 1 at 4 MB/s, 1 ms"), std::string::npos)
      << paced.output;
  const CommandResult free = run_command(command, 120);
  ASSERT_EQ(free.exit_code, 0) << free.output;
  EXPECT_GT(median_step_seconds(paced.output), 0.12) << paced.output;
  EXPECT_LT(median_step_seconds(free.output), median_step_seconds(paced.output) / 2) << free.output;
}

}  // namespace
}  // namespace alloy
