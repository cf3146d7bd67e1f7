// Cluster specs: presets expand into devices on the right nodes; inline types; train setups.
#include <gtest/gtest.h>

#include <set>

#include "../common/test_util.hpp"
#include "hw/catalog.hpp"
#include "spec/cluster.hpp"
#include "spec/error.hpp"
#include "spec/train.hpp"

namespace alloy {
namespace {

TEST(ClusterSpec, EveryPresetLoads) {
  std::vector<std::string> names = cluster_preset_names();
  ASSERT_GE(names.size(), 8u);
  for (const auto& name : names) {
    ClusterSpec c = cluster_load(name, catalog_builtin());
    EXPECT_FALSE(c.devices.empty()) << name;
    EXPECT_GT(c.num_nodes, 0) << name;
  }
}

TEST(ClusterSpec, DevicesExpandInNodeOrder) {
  ClusterSpec c = cluster_load("a100-v100", catalog_builtin());
  ASSERT_EQ(c.devices.size(), 32u);
  EXPECT_EQ(c.num_nodes, 4);
  EXPECT_EQ(c.device_types.size(), 2u);
  for (size_t i = 0; i < c.devices.size(); ++i) {
    const Device& d = c.devices[i];
    EXPECT_EQ(d.id, static_cast<int>(i));
    EXPECT_EQ(d.node, static_cast<int>(i / 8));
    EXPECT_EQ(d.local_index, static_cast<int>(i % 8));
    EXPECT_EQ(c.device_type(d).name, i < 16 ? c.device_types[0].name : c.device_types[1].name);
  }
  EXPECT_DOUBLE_EQ(c.network.bandwidth_bytes_per_second, 100e9);  // 800 Gb/s per node
  EXPECT_DOUBLE_EQ(c.node_groups[1].price_per_device_hour, 0.80);
}

TEST(ClusterSpec, ThousandDevicesOfThreeTypes) {
  ClusterSpec c = cluster_load("hetero-1024", catalog_builtin());
  EXPECT_EQ(c.devices.size(), 1024u);
  EXPECT_EQ(c.device_types.size(), 3u);
}

TEST(ClusterSpec, InlineCpuTypesCarrySpeedAndMemory) {
  ClusterSpec c = cluster_load("local-cpu-4", catalog_builtin());
  ASSERT_EQ(c.devices.size(), 4u);
  const DeviceType& fast = c.device_type(c.devices[0]);
  const DeviceType& slow = c.device_type(c.devices[3]);
  EXPECT_TRUE(fast.is_cpu && slow.is_cpu);
  EXPECT_DOUBLE_EQ(slow.speed, 0.5);
  EXPECT_DOUBLE_EQ(slow.memory_bytes, 1.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(slow.peak_flops(Precision::Precision_fp32), 0.5 * fast.peak_flops(Precision::Precision_fp32));
  EXPECT_EQ(c.network.kind, "shm");
}

// An inline type may start from another inline type, whichever comes first in the file.
TEST(ClusterSpec, InlineTypeBuildsOnAnotherInlineType) {
  testing::TempDir dir;
  const std::string path = dir.write("c.yaml",
                                     "device_types:\n"
                                     "  cpu-quarter: {base: cpu-half, speed: 0.25}\n"
                                     "  cpu-half: {base: cpu, speed: 0.5, memory: 1GiB}\n"
                                     "nodes:\n"
                                     "  - {count: 1, device: cpu-quarter, devices_per_node: 1, host_memory: 4GiB}\n");
  ClusterSpec c = cluster_load(path, catalog_builtin());
  const DeviceType& quarter = c.device_type(c.devices.at(0));
  EXPECT_EQ(quarter.name, "cpu-quarter");
  EXPECT_TRUE(quarter.is_cpu);
  EXPECT_DOUBLE_EQ(quarter.speed, 0.25);
  EXPECT_DOUBLE_EQ(quarter.memory_bytes, 1.0 * (1ull << 30));  // from cpu-half
}

// A type's calibrated share of its 16-bit peak carries over from its base unless the file sets
// its own; a share outside (0, 1] names the field.
TEST(ClusterSpec, InlineTypeSetsItsMatmulEfficiency) {
  testing::TempDir dir;
  const std::string path = dir.write("c.yaml",
                                     "device_types:\n"
                                     "  tuned: {base: h100-sxm, matmul_efficiency: 0.8}\n"
                                     "  plain: {base: h100-sxm}\n"
                                     "network: {kind: infiniband, bandwidth: 400Gb/s, latency: 5us}\n"
                                     "nodes:\n"
                                     "  - {count: 1, device: tuned, devices_per_node: 1}\n"
                                     "  - {count: 1, device: plain, devices_per_node: 1}\n");
  ClusterSpec c = cluster_load(path, catalog_builtin());
  EXPECT_DOUBLE_EQ(c.device_type(c.devices.at(0)).matmul_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(c.device_type(c.devices.at(1)).matmul_efficiency, catalog_builtin().find("h100-sxm")->matmul_efficiency);
  // Still an H100 (only its efficiency set): it keeps the H100's best published MFU.
  EXPECT_DOUBLE_EQ(c.device_type(c.devices.at(0)).best_published_mfu, catalog_builtin().find("h100-sxm")->best_published_mfu);
  // One node of a type based on the H100 with `field: value` set.
  const auto tuned = [&](const std::string& field, const std::string& value) {
    return dir.write(field + "-" + value + ".yaml", "device_types:\n  tuned: {base: h100-sxm, " + field + ": " + value +
                                                        "}\nnodes:\n  - {count: 1, device: tuned, devices_per_node: 1}\n");
  };
  // The share of the fp8 peak is set the same way.
  EXPECT_DOUBLE_EQ(cluster_load(tuned("matmul_efficiency_fp8", "0.6"), catalog_builtin()).device_types.at(0).matmul_efficiency_fp8,
                   0.6);
  for (const std::string field : {"matmul_efficiency", "matmul_efficiency_fp8"}) {
    try {
      cluster_load(tuned(field, "70"), catalog_builtin());
      ADD_FAILURE() << field << ": a share of 70 was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.where().field, "device_types.tuned." + field) << e.format();
      EXPECT_NE(e.format().find(field + ": 0.75"), std::string::npos) << e.format();
    }
    EXPECT_THROW(cluster_load(tuned(field, "0"), catalog_builtin()), Error) << field << ": 0 would silently mean the default";
  }
}

// A type with peaks of its own is another device: the published MFU of its base is not its own.
TEST(ClusterSpec, InlineTypeWithItsOwnPeaksDropsThePublishedMfu) {
  testing::TempDir dir;
  const std::string path = dir.write("c.yaml",
                                     "device_types:\n"
                                     "  faster: {base: h100-sxm, bf16: 1500TFLOPS}\n"
                                     "nodes:\n"
                                     "  - {count: 1, device: faster, devices_per_node: 1}\n");
  ClusterSpec c = cluster_load(path, catalog_builtin());
  EXPECT_GT(catalog_builtin().find("h100-sxm")->best_published_mfu, 0);
  EXPECT_EQ(c.device_type(c.devices.at(0)).best_published_mfu, 0);
}

TEST(ClusterSpec, InlineTypeBaseCycleNamesTheField) {
  testing::TempDir dir;
  const std::string path = dir.write("c.yaml",
                                     "device_types:\n"
                                     "  a: {base: b, speed: 0.5}\n"
                                     "  b: {base: a, speed: 0.5}\n"
                                     "nodes:\n"
                                     "  - {count: 1, device: a, devices_per_node: 1, host_memory: 4GiB}\n");
  try {
    cluster_load(path, catalog_builtin());
    FAIL() << "a cycle of bases was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cycle"), std::string::npos) << e.format();
    EXPECT_NE(e.where().field.find(".base"), std::string::npos) << e.format();
  }
}

// The hint of an unknown device type points to the page that documents inline types.
TEST(ClusterSpec, UnknownTypeHintNamesAnExistingDoc) {
  testing::TempDir dir;
  const std::string path = dir.write("c.yaml", "nodes:\n  - {count: 1, device: cpuu, devices_per_node: 1}\n");
  try {
    cluster_load(path, catalog_builtin());
    FAIL() << "an unknown device type was accepted";
  } catch (const Error& e) {
    const size_t at = e.hint().find("docs/");
    ASSERT_NE(at, std::string::npos) << e.format();
    const std::string doc = e.hint().substr(at, e.hint().find(".md", at) + 3 - at);
    EXPECT_TRUE(std::filesystem::exists(std::string(ALLOY_SOURCE_DIR) + "/" + doc)) << doc;
  }
}

TEST(TrainSpec, GradientCommunicationIsFp32OrBf16) {
  testing::TempDir dir;
  EXPECT_EQ(train_load(dir.write("default.yaml", "seq_len: 64\n")).gradient_communication, Precision::Precision_fp32);
  const TrainSpec bf16 = train_load(dir.write("bf16.yaml", "seq_len: 64\ngradient_communication: bf16\n"));
  EXPECT_EQ(bf16.gradient_communication, Precision::Precision_bf16);
  EXPECT_EQ(train_load_text(train_to_yaml(bf16), "again.yaml").gradient_communication, Precision::Precision_bf16);
  for (const char* value : {"fp16", "int8"}) {
    try {
      train_load(dir.write("bad.yaml", std::string("seq_len: 64\ngradient_communication: ") + value + "\n"));
      ADD_FAILURE() << value << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.where().field, "gradient_communication") << e.format();
      EXPECT_NE(e.format().find("bf16"), std::string::npos) << e.format();
    }
  }
}

TEST(TrainSpec, TokensBecomeSequences) {
  TrainSpec t = train_load(std::string(ALLOY_SOURCE_DIR) + "/examples/train/llama-pretrain.yaml");
  EXPECT_EQ(t.seq_len, 2048);
  EXPECT_EQ(t.global_batch_sequences, 2048);
  EXPECT_EQ(t.precision, Precision::Precision_bf16);
  EXPECT_EQ(train_optimizer_states(t), 2);
}

}  // namespace
}  // namespace alloy
