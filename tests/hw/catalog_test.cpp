// Tests of the built-in device catalog: completeness of every entry, unique names, spot
// checks against datasheet figures, and agreement with the table in docs/catalog.md.
#include "hw/catalog.hpp"
#include "spec/units.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace alloy {
namespace {


const DeviceType& device_get(const std::string& name) {
  const DeviceType* type = catalog_builtin().find(name);
  if (type == nullptr) throw std::runtime_error("catalog has no device " + name);
  return *type;
}

bool text_is_lower(const std::string& text) {
  for (unsigned char c : text)
    if (std::tolower(c) != c) return false;
  return true;
}

TEST(Catalog, CoversTheRequiredDevices) {
  for (const char* name : {"a100-40gb-sxm", "a100-80gb-sxm", "a100-40gb-pcie", "a100-80gb-pcie",
                           "h100-sxm", "h100-pcie", "h200-sxm", "v100-16gb", "v100-32gb", "a10",
                           "a40", "l4", "l40s", "t4", "rtx-3090", "rtx-4090", "mi210", "mi250x",
                           "mi300x", "ascend-910b", "gaudi2", "cpu"}) {
    const DeviceType* type = catalog_builtin().find(name);
    ASSERT_NE(type, nullptr) << name;
    EXPECT_EQ(type->name, name) << "canonical name must be found as itself";
  }
}

// The 500 W H100 has the SXM's peaks, its own memory, and lower fitted shares of the peaks.
TEST(Catalog, PowerLimitedH100SharesThePeaksNotTheEfficiency) {
  const DeviceType& full = *catalog_builtin().find("h100-sxm");
  const DeviceType& capped = *catalog_builtin().find("h100-500w");
  EXPECT_EQ(capped.name, "h100-96gb-hbm2e-500w");
  EXPECT_LT(capped.memory_bandwidth_bytes_per_second, full.memory_bandwidth_bytes_per_second);
  EXPECT_GT(capped.memory_bytes, full.memory_bytes);
  EXPECT_DOUBLE_EQ(capped.peak_flops_bf16, full.peak_flops_bf16);
  EXPECT_DOUBLE_EQ(capped.peak_flops_fp8, full.peak_flops_fp8);
  EXPECT_LT(capped.matmul_efficiency, full.matmul_efficiency);
  EXPECT_LT(capped.matmul_efficiency_fp8, full.matmul_efficiency_fp8);
}

TEST(Catalog, EveryTypeIsComplete) {
  for (const DeviceType& t : catalog_builtin().types()) {
    SCOPED_TRACE(t.name);
    EXPECT_TRUE(text_is_lower(t.name));
    EXPECT_FALSE(t.vendor.empty());
    EXPECT_FALSE(t.description.empty());
    EXPECT_FALSE(t.source.empty());
    EXPECT_NE(t.source.find('['), std::string::npos) << "source must cite keys like [1]";
    EXPECT_FALSE(t.intra_node_link.empty());
    EXPECT_GT(t.peak_flops_fp32, 0);
    if (!t.is_cpu) {
      EXPECT_GT(std::max(t.peak_flops_bf16, t.peak_flops_fp16), 0) << "needs a 16-bit rate";
    }
    EXPECT_GT(t.memory_bytes, 0);
    EXPECT_GT(t.memory_bandwidth_bytes_per_second, 0);
    EXPECT_GT(t.intra_node_link_bytes_per_second, 0);
    EXPECT_DOUBLE_EQ(t.speed, 1.0);
    EXPECT_EQ(t.is_cpu, t.vendor == "cpu");
    // Plausibility: catches a unit slip (GB vs bytes, TFLOP/s vs FLOP/s).
    EXPECT_GE(t.memory_bytes, 1 * kGiB);
    EXPECT_LE(t.memory_bytes, 512 * kGiB);
    EXPECT_LT(t.intra_node_link_bytes_per_second, t.memory_bandwidth_bytes_per_second);
    EXPECT_LT(t.peak_flops(Precision::Precision_fp8), 1e16);
    for (Precision p : {Precision::Precision_fp32, Precision::Precision_tf32,
                        Precision::Precision_bf16, Precision::Precision_fp16,
                        Precision::Precision_fp8}) {
      EXPECT_GT(t.peak_flops(p), 0) << precision_name(p);
    }
  }
}

// Dense tensor rates double from tf32 to 16-bit to fp8 on every part that has them. A
// sparse figure copied for one precision but not the next breaks this ratio.
TEST(Catalog, DenseRatesAreConsistentAcrossPrecisions) {
  for (const DeviceType& t : catalog_builtin().types()) {
    SCOPED_TRACE(t.name);
    const double half = std::max(t.peak_flops_bf16, t.peak_flops_fp16);
    if (t.peak_flops_bf16 > 0 && t.peak_flops_fp16 > 0) {
      EXPECT_DOUBLE_EQ(t.peak_flops_bf16, t.peak_flops_fp16);
    }
    if (t.peak_flops_tf32 > 0) {
      EXPECT_NEAR(half / t.peak_flops_tf32, 2.0, 0.06);
    }
    if (t.peak_flops_fp8 > 0) {
      EXPECT_NEAR(t.peak_flops_fp8 / half, 2.0, 0.06);
    }
    if (!t.is_cpu) {
      EXPECT_GT(half, t.peak_flops_fp32);
    }
  }
}

TEST(Catalog, NamesAndAliasesAreUnique) {
  std::map<std::string, std::string> owner;  // lower-case name or alias -> canonical name
  for (const DeviceType& t : catalog_builtin().types()) {
    std::vector<std::string> keys = t.aliases;
    keys.push_back(t.name);
    for (const std::string& key : keys) {
      EXPECT_TRUE(text_is_lower(key)) << key;
      auto [it, inserted] = owner.emplace(key, t.name);
      EXPECT_TRUE(inserted) << key << " is used by " << it->second << " and " << t.name;
      const DeviceType* found = catalog_builtin().find(key);
      ASSERT_NE(found, nullptr) << key;
      EXPECT_EQ(found->name, t.name) << key;
    }
  }
}

TEST(Catalog, FindIsCaseInsensitive) {
  const DeviceCatalog& catalog = catalog_builtin();
  EXPECT_EQ(catalog.find("A100-80"), catalog.find("a100-80gb-sxm"));
  EXPECT_EQ(catalog.find("A100"), catalog.find("a100-80gb-sxm"));
  EXPECT_EQ(catalog.find("H100"), catalog.find("h100-sxm"));
  EXPECT_EQ(catalog.find("V100-32"), catalog.find("v100-32gb"));
  EXPECT_EQ(catalog.find("V100-16"), catalog.find("v100-16gb"));
  EXPECT_EQ(catalog.find("MI250X"), catalog.find("mi250x"));
  EXPECT_EQ(catalog.find("Ascend-910B"), catalog.find("ascend-910b"));
  EXPECT_EQ(catalog.find("4090"), catalog.find("rtx-4090"));
  EXPECT_EQ(catalog.find("CPU"), catalog.find("cpu"));
  EXPECT_EQ(catalog.find("a100-80gb-sx"), nullptr);
  EXPECT_EQ(catalog.find(""), nullptr);
}

TEST(Catalog, NearestNamesSuggestsTheIntendedDevice) {
  const std::vector<std::string> near = catalog_builtin().nearest_names("a100-80gb-sx");
  ASSERT_FALSE(near.empty());
  EXPECT_EQ(near.front(), "a100-80gb-sxm");
  EXPECT_EQ(catalog_builtin().nearest_names("H200-SMX").front(), "h200-sxm");
}

// Literals below are read off the datasheets and whitepapers listed in docs/catalog.md.
TEST(Catalog, SpotChecksAgainstDatasheets) {
  const double tflops = 1e12;
  const double gbps = 1e9;
  // [1] A100: BF16 tensor 312 TFLOPS dense (624 with sparsity), TF32 156 dense.
  EXPECT_DOUBLE_EQ(device_get("a100-80gb-sxm").peak_flops_bf16, 312 * tflops);
  EXPECT_DOUBLE_EQ(device_get("a100-40gb-pcie").peak_flops_tf32, 156 * tflops);
  // [1] A100 80GB SXM: 2,039 GB/s; 80GB PCIe: 1,935 GB/s; NVLink 600 GB/s total.
  EXPECT_DOUBLE_EQ(device_get("a100-80gb-sxm").memory_bandwidth_bytes_per_second, 2039 * gbps);
  EXPECT_DOUBLE_EQ(device_get("a100-80gb-pcie").memory_bandwidth_bytes_per_second, 1935 * gbps);
  EXPECT_DOUBLE_EQ(device_get("a100-40gb-sxm").intra_node_link_bytes_per_second * 2, 600 * gbps);
  // [3] H100 SXM: BF16 1,979 TFLOPS with sparsity, so ~989 dense; 3.35 TB/s; NVLink 900 GB/s.
  EXPECT_NEAR(device_get("h100-sxm").peak_flops_bf16, 1979 * tflops / 2, 1 * tflops);
  EXPECT_NEAR(device_get("h100-sxm").peak_flops_fp8, 3958 * tflops / 2, 1 * tflops);
  EXPECT_DOUBLE_EQ(device_get("h100-sxm").memory_bandwidth_bytes_per_second, 3350 * gbps);
  EXPECT_DOUBLE_EQ(device_get("h100-sxm").intra_node_link_bytes_per_second * 2, 900 * gbps);
  EXPECT_DOUBLE_EQ(device_get("h100-sxm").memory_bytes, 80 * kGiB);
  // [3] H100 PCIe: BF16 1,513 TFLOPS with sparsity; PCIe Gen5 128 GB/s total.
  EXPECT_NEAR(device_get("h100-pcie").peak_flops_bf16, 1513 * tflops / 2, 1 * tflops);
  EXPECT_DOUBLE_EQ(device_get("h100-pcie").intra_node_link_bytes_per_second * 2, 128 * gbps);
  // [5] H200: 4.8 TB/s.
  EXPECT_DOUBLE_EQ(device_get("h200").memory_bandwidth_bytes_per_second, 4800 * gbps);
  // [6] V100 SXM2: tensor 125 TFLOPS, fp32 15.7, 900 GB/s, NVLink 300 GB/s total; no bf16.
  EXPECT_DOUBLE_EQ(device_get("v100-32").peak_flops_fp16, 125 * tflops);
  EXPECT_DOUBLE_EQ(device_get("v100-16").peak_flops_fp32, 15.7 * tflops);
  EXPECT_DOUBLE_EQ(device_get("v100-16").peak_flops_bf16, 0);
  EXPECT_DOUBLE_EQ(device_get("v100-32").intra_node_link_bytes_per_second * 2, 300 * gbps);
  EXPECT_DOUBLE_EQ(device_get("v100-32").memory_bytes, 2 * device_get("v100-16").memory_bytes);
  // [10] L40S: FP8 1,466 TFLOPS with sparsity; [9] L4: FP8 485 with sparsity.
  EXPECT_NEAR(device_get("l40s").peak_flops_fp8, 1466 * tflops / 2, 1 * tflops);
  EXPECT_NEAR(device_get("l4").peak_flops_fp8, 485 * tflops / 2, 1 * tflops);
  // [11] T4: 65 TFLOPS mixed precision, 8.1 fp32.
  EXPECT_DOUBLE_EQ(device_get("t4").peak_flops_fp16, 65 * tflops);
  // [15] MI250X: 383 TFLOPS fp16/bf16, 128 GB, 3.2 TB/s; [16] MI300X: 1,307.4 bf16 dense.
  EXPECT_DOUBLE_EQ(device_get("mi250x").peak_flops_bf16, 383 * tflops);
  EXPECT_DOUBLE_EQ(device_get("mi250x").memory_bytes, 128 * kGiB);
  EXPECT_DOUBLE_EQ(device_get("mi300x").peak_flops_bf16, 1307.4 * tflops);
  EXPECT_DOUBLE_EQ(device_get("mi300x").memory_bytes, 192 * kGiB);
  // [19] Gaudi 2: 432 TFLOPS bf16, 96 GB.
  EXPECT_DOUBLE_EQ(device_get("gaudi2").peak_flops_bf16, 432 * tflops);
  EXPECT_DOUBLE_EQ(device_get("gaudi2").memory_bytes, 96 * kGiB);
}

std::string text_trim(const std::string& text) {
  const size_t first = text.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(' ') - first + 1);
}

// Cells of a markdown table row "| a | b |" -> {"a", "b"}.
std::vector<std::string> row_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream stream(line.substr(1));
  std::string cell;
  while (std::getline(stream, cell, '|')) cells.push_back(text_trim(cell));
  return cells;
}

// docs/catalog.md must show the numbers the code has, and cite only keys it lists.
TEST(Catalog, DocumentationTableMatchesTheCode) {
  std::ifstream doc(std::string(ALLOY_SOURCE_DIR) + "/docs/catalog.md");
  ASSERT_TRUE(doc.good()) << "docs/catalog.md is missing";
  std::map<std::string, std::vector<std::string>> rows;
  std::set<std::string> keys;
  bool in_sources = false;
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("## ", 0) == 0) in_sources = line == "## Sources";
    if (in_sources && !line.empty() && std::isdigit(static_cast<unsigned char>(line[0])))
      keys.insert("[" + line.substr(0, line.find('.')) + "]");
    if (line.rfind("| ", 0) != 0) continue;
    std::vector<std::string> cells = row_cells(line);
    if (cells.size() == 12 && catalog_builtin().find(cells[0]) != nullptr) rows[cells[0]] = cells;
  }
  const auto number = [](const std::string& cell) { return std::strtod(cell.c_str(), nullptr); };
  for (const DeviceType& t : catalog_builtin().types()) {
    SCOPED_TRACE(t.name);
    ASSERT_EQ(rows.count(t.name), 1u) << "no row in the devices table";
    const std::vector<std::string>& row = rows[t.name];
    EXPECT_EQ(row[1], t.vendor);
    EXPECT_NEAR(number(row[2]) * 1e12, t.peak_flops_fp32, 1e6);
    EXPECT_NEAR(number(row[3]) * 1e12, t.peak_flops_tf32, 1e6);
    EXPECT_NEAR(number(row[4]) * 1e12, t.peak_flops_bf16, 1e6);
    EXPECT_NEAR(number(row[5]) * 1e12, t.peak_flops_fp16, 1e6);
    EXPECT_NEAR(number(row[6]) * 1e12, t.peak_flops_fp8, 1e6);
    EXPECT_NEAR(number(row[7]) * kGiB, t.memory_bytes, 1);
    EXPECT_NEAR(number(row[8]) * 1e9, t.memory_bandwidth_bytes_per_second, 1);
    EXPECT_EQ(row[9], t.intra_node_link);
    EXPECT_NEAR(number(row[10]) * 1e9, t.intra_node_link_bytes_per_second, 1);
    EXPECT_EQ(row[11], t.source);
    std::stringstream cited(t.source);
    for (std::string key; cited >> key;) EXPECT_EQ(keys.count(key), 1u) << key << " not in Sources";
  }
}

TEST(Catalog, CpuTypeMatchesMeasuredNumbers) {
  const DeviceType& cpu = device_get("cpu");
  EXPECT_TRUE(cpu.is_cpu);
  EXPECT_EQ(cpu.vendor, "cpu");
  // docs/catalog.md, "The cpu entry, measured": the runtime's sgemm on one thread, one core's
  // streaming bandwidth and OpenMPI's shm point-to-point, this machine idle.
  EXPECT_DOUBLE_EQ(cpu.peak_flops_fp32, 130e9);
  EXPECT_DOUBLE_EQ(cpu.memory_bandwidth_bytes_per_second, 61e9);
  EXPECT_DOUBLE_EQ(cpu.intra_node_link_bytes_per_second, 17.6e9);
  EXPECT_EQ(cpu.intra_node_link, "shm");
  EXPECT_DOUBLE_EQ(cpu.memory_bytes, 4 * kGiB);
  EXPECT_DOUBLE_EQ(cpu.peak_flops_bf16, 0);
  EXPECT_DOUBLE_EQ(cpu.peak_flops(Precision::Precision_bf16), 130e9) << "falls back to fp32";
}

TEST(Catalog, GenerationsAreOrdered) {
  const Precision bf16 = Precision::Precision_bf16;
  EXPECT_GT(device_get("h100-sxm").peak_flops(bf16), device_get("a100-80gb-sxm").peak_flops(bf16));
  EXPECT_GT(device_get("a100-80gb-sxm").peak_flops(bf16), device_get("v100-32gb").peak_flops(bf16));
  EXPECT_GT(device_get("mi300x").peak_flops(bf16), device_get("mi250x").peak_flops(bf16));
  EXPECT_GT(device_get("h200-sxm").memory_bytes, device_get("h100-sxm").memory_bytes);
  EXPECT_GT(device_get("a100-80gb-sxm").memory_bandwidth_bytes_per_second,
            device_get("a100-80gb-pcie").memory_bandwidth_bytes_per_second);
  EXPECT_GT(device_get("a100-80gb-sxm").intra_node_link_bytes_per_second,
            device_get("a100-80gb-pcie").intra_node_link_bytes_per_second);
  EXPECT_GT(device_get("a100-80gb").peak_flops(bf16), 1000 * device_get("cpu").peak_flops(bf16));
}

}  // namespace
}  // namespace alloy
