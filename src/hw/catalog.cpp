// The built-in device catalog: one entry per accelerator with its dense datasheet peaks.
// Conventions (dense vs sparse, per-direction links, GiB vs GB) and sources: docs/catalog.md.
#include "hw/catalog.hpp"
#include "spec/units.hpp"

#include <utility>

namespace alloy {

namespace {

constexpr double kTflops = 1e12;                  // vendors quote FLOP/s in decimal units
constexpr double kGigabytesPerSecond = 1e9;       // and bandwidth in decimal GB/s

// Per-direction bandwidth of the links, from the vendors' bidirectional totals.
constexpr double kPcie3x16 = 16 * kGigabytesPerSecond;   // "PCIe Gen3 x16: 32 GB/s"
constexpr double kPcie4x16 = 32 * kGigabytesPerSecond;   // "PCIe Gen4 x16: 64 GB/s"
constexpr double kPcie5x16 = 64 * kGigabytesPerSecond;   // "PCIe Gen5 x16: 128 GB/s"
constexpr double kNvlink2 = 150 * kGigabytesPerSecond;   // V100: 300 GB/s total
constexpr double kNvlink3 = 300 * kGigabytesPerSecond;   // A100: 600 GB/s total
constexpr double kNvlink4 = 450 * kGigabytesPerSecond;   // H100/H200: 900 GB/s total

// Shares of the bf16/fp16 peak that training's matrix products reach, fitted against published
// runs by `bench_published --fit` (docs/catalog.md, Calibration [27]). H100 and H200 share one
// value: the same GH100 compute; the H200's wider memory is in its bandwidth, not here.
constexpr double kA100MatmulEfficiency = 0.73;
constexpr double kHopperMatmulEfficiency = 0.56;
// The share of the fp8 peak, fitted on the fp8 rows of the same table (docs/catalog.md).
constexpr double kHopperMatmulEfficiencyFp8 = 0.66;
// The 96 GB HBM2e H100 SXM at its 500 W limit runs its dense products at lower clocks than a
// 700 W H100 SXM; no datasheet says by how much, so its shares are fitted on runs of it [27].
constexpr double kHopper500WMatmulEfficiency = 0.52;
constexpr double kHopper500WMatmulEfficiencyFp8 = 0.38;
// The highest published training MFU at 16 bits (bench/published/throughputs.yaml): A100s 65.3%
// (MegaScale, 175B on 256 GPUs), H100s 47% (the Megatron-LM README, 96 GPUs) [27].
constexpr double kA100BestPublishedMfu = 0.653;
constexpr double kHopperBestPublishedMfu = 0.47;

// A100 compute is the same in all four variants: [1] lists it once for SXM and PCIe.
DeviceType a100_make(std::string name, std::vector<std::string> aliases, std::string description,
                     double memory_bytes, double bandwidth, std::string link, double link_bandwidth) {
  return DeviceType{.name = std::move(name),
                    .aliases = std::move(aliases),
                    .vendor = "nvidia",
                    .description = std::move(description),
                    .peak_flops_fp32 = 19.5 * kTflops,
                    .peak_flops_tf32 = 156 * kTflops,
                    .peak_flops_bf16 = 312 * kTflops,
                    .peak_flops_fp16 = 312 * kTflops,
                    .memory_bytes = memory_bytes,
                    .memory_bandwidth_bytes_per_second = bandwidth,
                    .intra_node_link = std::move(link),
                    .intra_node_link_bytes_per_second = link_bandwidth,
                    .source = "[1] [2] [27]",
                    .matmul_efficiency = kA100MatmulEfficiency,
                    .best_published_mfu = kA100BestPublishedMfu};
}

// What differs between the parts with the H100 SXM's compute (H100 SXM, H200, the 500 W H100):
// its dense peaks are the whitepaper's [4] for all of them.
struct HopperSxmPart {
  std::string name;
  std::vector<std::string> aliases;
  std::string description;
  double memory_bytes = 0;
  double bandwidth = 0;
  std::string source;
  double matmul_efficiency = kHopperMatmulEfficiency;
  double matmul_efficiency_fp8 = kHopperMatmulEfficiencyFp8;
};

DeviceType hopper_sxm_make(HopperSxmPart part) {
  return DeviceType{.name = std::move(part.name),
                    .aliases = std::move(part.aliases),
                    .vendor = "nvidia",
                    .description = std::move(part.description),
                    .peak_flops_fp32 = 67 * kTflops,
                    .peak_flops_tf32 = 494.7 * kTflops,
                    .peak_flops_bf16 = 989.4 * kTflops,
                    .peak_flops_fp16 = 989.4 * kTflops,
                    .peak_flops_fp8 = 1978.9 * kTflops,
                    .memory_bytes = part.memory_bytes,
                    .memory_bandwidth_bytes_per_second = part.bandwidth,
                    .intra_node_link = "NVLink 4",
                    .intra_node_link_bytes_per_second = kNvlink4,
                    .source = std::move(part.source),
                    .matmul_efficiency = part.matmul_efficiency,
                    .matmul_efficiency_fp8 = part.matmul_efficiency_fp8,
                    .best_published_mfu = kHopperBestPublishedMfu};
}

void catalog_add_nvidia_datacenter(DeviceCatalog& c) {
  c.add(a100_make("a100-40gb-sxm", {"a100-40", "a100-40gb", "a100-40g", "a100-sxm4-40gb"},
                  "NVIDIA A100 40GB SXM4 (HBM2)", 40 * kGiB, 1555 * kGigabytesPerSecond,
                  "NVLink 3", kNvlink3));
  c.add(a100_make("a100-80gb-sxm", {"a100", "a100-80", "a100-80gb", "a100-80g", "a100-sxm4-80gb"},
                  "NVIDIA A100 80GB SXM4 (HBM2e)", 80 * kGiB, 2039 * kGigabytesPerSecond,
                  "NVLink 3", kNvlink3));
  c.add(a100_make("a100-40gb-pcie", {"a100-40-pcie", "a100-pcie-40gb"},
                  "NVIDIA A100 40GB PCIe (HBM2)", 40 * kGiB, 1555 * kGigabytesPerSecond,
                  "PCIe 4.0 x16", kPcie4x16));
  c.add(a100_make("a100-80gb-pcie", {"a100-pcie", "a100-80-pcie", "a100-pcie-80gb"},
                  "NVIDIA A100 80GB PCIe (HBM2e)", 80 * kGiB, 1935 * kGigabytesPerSecond,
                  "PCIe 4.0 x16", kPcie4x16));

  // H100/H200: [3] prints sparse tensor figures only; dense values are from the whitepaper [4].
  c.add(hopper_sxm_make({.name = "h100-sxm",
                         .aliases = {"h100", "h100-sxm5", "h100-80gb", "h100-sxm-80gb"},
                         .description = "NVIDIA H100 80GB SXM5 (HBM3)",
                         .memory_bytes = 80 * kGiB,
                         .bandwidth = 3350 * kGigabytesPerSecond,
                         .source = "[3] [4] [27]"}));
  // Meta's Grand Teton H100 [28]: 96 GB HBM2e at 2.4 TB/s, 500 W; peaks taken as the SXM's.
  c.add(hopper_sxm_make({.name = "h100-96gb-hbm2e-500w",
                         .aliases = {"h100-500w", "h100-96gb-500w"},
                         .description = "NVIDIA H100 96GB SXM (HBM2e) at a 500 W power limit",
                         .memory_bytes = 96 * kGiB,
                         .bandwidth = 2400 * kGigabytesPerSecond,
                         .source = "[3] [4] [27] [28]",
                         .matmul_efficiency = kHopper500WMatmulEfficiency,
                         .matmul_efficiency_fp8 = kHopper500WMatmulEfficiencyFp8}));
  c.add(DeviceType{.name = "h100-pcie",
                   .aliases = {"h100-pcie-80gb"},
                   .vendor = "nvidia",
                   .description = "NVIDIA H100 80GB PCIe (HBM2e)",
                   .peak_flops_fp32 = 51 * kTflops,
                   .peak_flops_tf32 = 378 * kTflops,
                   .peak_flops_bf16 = 756 * kTflops,
                   .peak_flops_fp16 = 756 * kTflops,
                   .peak_flops_fp8 = 1513 * kTflops,
                   .memory_bytes = 80 * kGiB,
                   .memory_bandwidth_bytes_per_second = 2000 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 5.0 x16",
                   .intra_node_link_bytes_per_second = kPcie5x16,
                   .source = "[3] [4] [27]",
                   .matmul_efficiency = kHopperMatmulEfficiency,
                   .matmul_efficiency_fp8 = kHopperMatmulEfficiencyFp8,
                   .best_published_mfu = kHopperBestPublishedMfu});
  c.add(hopper_sxm_make({.name = "h200-sxm",
                         .aliases = {"h200", "h200-141gb"},
                         .description = "NVIDIA H200 141GB SXM (HBM3e); H100 SXM compute",
                         .memory_bytes = 141 * kGiB,
                         .bandwidth = 4800 * kGigabytesPerSecond,
                         .source = "[5] [4] [27]"}));

  // V100 has no bf16 or tf32; fp16 is the tensor-core rate ("Tensor Performance" in [6]).
  for (int gib : {16, 32}) {
    const std::string size = std::to_string(gib);
    c.add(DeviceType{.name = "v100-" + size + "gb",
                     .aliases = {"v100-" + size, "v100-" + size + "g", "v100-sxm2-" + size + "gb"},
                     .vendor = "nvidia",
                     .description = "NVIDIA V100 " + size + "GB SXM2 (HBM2)",
                     .peak_flops_fp32 = 15.7 * kTflops,
                     .peak_flops_fp16 = 125 * kTflops,
                     .memory_bytes = gib * kGiB,
                     .memory_bandwidth_bytes_per_second = 900 * kGigabytesPerSecond,
                     .intra_node_link = "NVLink 2",
                     .intra_node_link_bytes_per_second = kNvlink2,
                     .source = "[6]"});
  }
}

// PCIe cards: the default link is PCIe even where an optional bridge exists (docs/catalog.md).
void catalog_add_nvidia_pcie(DeviceCatalog& c) {
  c.add(DeviceType{.name = "a10",
                   .aliases = {"nvidia-a10", "a10-24gb"},
                   .vendor = "nvidia",
                   .description = "NVIDIA A10 24GB PCIe (GDDR6)",
                   .peak_flops_fp32 = 31.2 * kTflops,
                   .peak_flops_tf32 = 62.5 * kTflops,
                   .peak_flops_bf16 = 125 * kTflops,
                   .peak_flops_fp16 = 125 * kTflops,
                   .memory_bytes = 24 * kGiB,
                   .memory_bandwidth_bytes_per_second = 600 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 4.0 x16",
                   .intra_node_link_bytes_per_second = kPcie4x16,
                   .source = "[7]"});
  c.add(DeviceType{.name = "a40",
                   .aliases = {"nvidia-a40", "a40-48gb"},
                   .vendor = "nvidia",
                   .description = "NVIDIA A40 48GB PCIe (GDDR6)",
                   .peak_flops_fp32 = 37.4 * kTflops,
                   .peak_flops_tf32 = 74.8 * kTflops,
                   .peak_flops_bf16 = 149.7 * kTflops,
                   .peak_flops_fp16 = 149.7 * kTflops,
                   .memory_bytes = 48 * kGiB,
                   .memory_bandwidth_bytes_per_second = 696 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 4.0 x16",
                   .intra_node_link_bytes_per_second = kPcie4x16,
                   .source = "[8] [12]"});
  // L4 and L40S datasheets print sparse tensor figures only: halved here.
  c.add(DeviceType{.name = "l4",
                   .aliases = {"nvidia-l4", "l4-24gb"},
                   .vendor = "nvidia",
                   .description = "NVIDIA L4 24GB PCIe (GDDR6)",
                   .peak_flops_fp32 = 30.3 * kTflops,
                   .peak_flops_tf32 = 60 * kTflops,
                   .peak_flops_bf16 = 121 * kTflops,
                   .peak_flops_fp16 = 121 * kTflops,
                   .peak_flops_fp8 = 242.5 * kTflops,
                   .memory_bytes = 24 * kGiB,
                   .memory_bandwidth_bytes_per_second = 300 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 4.0 x16",
                   .intra_node_link_bytes_per_second = kPcie4x16,
                   .source = "[9]"});
  c.add(DeviceType{.name = "l40s",
                   .aliases = {"nvidia-l40s", "l40s-48gb"},
                   .vendor = "nvidia",
                   .description = "NVIDIA L40S 48GB PCIe (GDDR6)",
                   .peak_flops_fp32 = 91.6 * kTflops,
                   .peak_flops_tf32 = 183 * kTflops,
                   .peak_flops_bf16 = 366.5 * kTflops,
                   .peak_flops_fp16 = 366.5 * kTflops,
                   .peak_flops_fp8 = 733 * kTflops,
                   .memory_bytes = 48 * kGiB,
                   .memory_bandwidth_bytes_per_second = 864 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 4.0 x16",
                   .intra_node_link_bytes_per_second = kPcie4x16,
                   .source = "[10]"});
  // T4 has no bf16 or tf32; fp16 is the "mixed precision (FP16/FP32)" tensor rate.
  c.add(DeviceType{.name = "t4",
                   .aliases = {"nvidia-t4", "tesla-t4", "t4-16gb"},
                   .vendor = "nvidia",
                   .description = "NVIDIA T4 16GB PCIe (GDDR6)",
                   .peak_flops_fp32 = 8.1 * kTflops,
                   .peak_flops_fp16 = 65 * kTflops,
                   .memory_bytes = 16 * kGiB,
                   .memory_bandwidth_bytes_per_second = 320 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 3.0 x16",
                   .intra_node_link_bytes_per_second = kPcie3x16,
                   .source = "[11]"});
  // GeForce tensor rates are those with fp32 accumulation (what training uses), which
  // the consumer parts run at half the fp16-accumulate rate.
  c.add(DeviceType{.name = "rtx-3090",
                   .aliases = {"3090", "rtx3090", "geforce-rtx-3090"},
                   .vendor = "nvidia",
                   .description = "NVIDIA GeForce RTX 3090 24GB (GDDR6X)",
                   .peak_flops_fp32 = 35.6 * kTflops,
                   .peak_flops_tf32 = 35.6 * kTflops,
                   .peak_flops_bf16 = 71 * kTflops,
                   .peak_flops_fp16 = 71 * kTflops,
                   .memory_bytes = 24 * kGiB,
                   .memory_bandwidth_bytes_per_second = 936 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 4.0 x16",
                   .intra_node_link_bytes_per_second = kPcie4x16,
                   .source = "[12]"});
  c.add(DeviceType{.name = "rtx-4090",
                   .aliases = {"4090", "rtx4090", "geforce-rtx-4090"},
                   .vendor = "nvidia",
                   .description = "NVIDIA GeForce RTX 4090 24GB (GDDR6X)",
                   .peak_flops_fp32 = 82.6 * kTflops,
                   .peak_flops_tf32 = 82.6 * kTflops,
                   .peak_flops_bf16 = 165.2 * kTflops,
                   .peak_flops_fp16 = 165.2 * kTflops,
                   .peak_flops_fp8 = 330.3 * kTflops,
                   .memory_bytes = 24 * kGiB,
                   .memory_bandwidth_bytes_per_second = 1008 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 4.0 x16",
                   .intra_node_link_bytes_per_second = kPcie4x16,
                   .source = "[13]"});
}

// AMD fp32 is the matrix-core rate (what an fp32 GEMM can reach), twice the vector rate.
void catalog_add_amd(DeviceCatalog& c) {
  c.add(DeviceType{.name = "mi210",
                   .aliases = {"amd-mi210", "instinct-mi210"},
                   .vendor = "amd",
                   .description = "AMD Instinct MI210 64GB PCIe (HBM2e)",
                   .peak_flops_fp32 = 45.3 * kTflops,
                   .peak_flops_bf16 = 181 * kTflops,
                   .peak_flops_fp16 = 181 * kTflops,
                   .memory_bytes = 64 * kGiB,
                   .memory_bandwidth_bytes_per_second = 1600 * kGigabytesPerSecond,
                   .intra_node_link = "PCIe 4.0 x16",
                   .intra_node_link_bytes_per_second = kPcie4x16,
                   .source = "[14] [25]"});
  // One OAM package (two GCDs, which ROCm shows as two GPUs) is the device, as AMD quotes it.
  c.add(DeviceType{.name = "mi250x",
                   .aliases = {"amd-mi250x", "instinct-mi250x"},
                   .vendor = "amd",
                   .description = "AMD Instinct MI250X 128GB OAM, both GCDs (HBM2e)",
                   .peak_flops_fp32 = 95.7 * kTflops,
                   .peak_flops_bf16 = 383 * kTflops,
                   .peak_flops_fp16 = 383 * kTflops,
                   .memory_bytes = 128 * kGiB,
                   .memory_bandwidth_bytes_per_second = 3200 * kGigabytesPerSecond,
                   .intra_node_link = "Infinity Fabric (8 links)",
                   .intra_node_link_bytes_per_second = 400 * kGigabytesPerSecond,
                   .source = "[15] [17]"});
  c.add(DeviceType{.name = "mi300x",
                   .aliases = {"amd-mi300x", "instinct-mi300x"},
                   .vendor = "amd",
                   .description = "AMD Instinct MI300X 192GB OAM (HBM3)",
                   .peak_flops_fp32 = 163.4 * kTflops,
                   .peak_flops_tf32 = 653.7 * kTflops,
                   .peak_flops_bf16 = 1307.4 * kTflops,
                   .peak_flops_fp16 = 1307.4 * kTflops,
                   .peak_flops_fp8 = 2614.9 * kTflops,
                   .memory_bytes = 192 * kGiB,
                   .memory_bandwidth_bytes_per_second = 5300 * kGigabytesPerSecond,
                   .intra_node_link = "Infinity Fabric (7 links)",
                   .intra_node_link_bytes_per_second = 448 * kGigabytesPerSecond,
                   .source = "[16]"});
}

// Neither Huawei nor Intel publishes an fp32 peak for these parts: fp32 is an estimate,
// one eighth of the bf16 peak (see docs/catalog.md), to be replaced by `alloy profile`.
void catalog_add_other(DeviceCatalog& c) {
  c.add(DeviceType{.name = "ascend-910b",
                   .aliases = {"910b", "ascend910b", "huawei-910b"},
                   .vendor = "huawei",
                   .description = "Huawei Ascend 910B 64GB (HBM2e), Atlas 800T A2 module",
                   .peak_flops_fp32 = 35 * kTflops,
                   .peak_flops_bf16 = 280 * kTflops,
                   .peak_flops_fp16 = 280 * kTflops,
                   .memory_bytes = 64 * kGiB,
                   .memory_bandwidth_bytes_per_second = 1600 * kGigabytesPerSecond,
                   .intra_node_link = "HCCS (7 links, full mesh of 8)",
                   .intra_node_link_bytes_per_second = 196 * kGigabytesPerSecond,
                   .source = "[21] [22]"});
  c.add(DeviceType{.name = "gaudi2",
                   .aliases = {"gaudi-2", "intel-gaudi2", "habana-gaudi2", "hl-225h"},
                   .vendor = "intel",
                   .description = "Intel Gaudi 2 96GB OAM (HBM2e)",
                   .peak_flops_fp32 = 54 * kTflops,
                   .peak_flops_bf16 = 432 * kTflops,
                   .peak_flops_fp16 = 432 * kTflops,
                   .peak_flops_fp8 = 865 * kTflops,
                   .memory_bytes = 96 * kGiB,
                   .memory_bandwidth_bytes_per_second = 2450 * kGigabytesPerSecond,
                   .intra_node_link = "RoCE 21x100GbE (all-to-all of 8)",
                   .intra_node_link_bytes_per_second = 262.5 * kGigabytesPerSecond,
                   .source = "[18] [19] [20]"});
}

// One rank on one core of this machine, every figure measured on it ([23], docs/catalog.md says
// how): fp32 as the runtime's sgemm reaches it on one thread, one core's streaming bandwidth, and
// MPI's shared-memory point-to-point bandwidth under mpirun (its latency: spec/cluster.cpp).
void catalog_add_cpu(DeviceCatalog& c) {
  c.add(DeviceType{.name = "cpu",
                   .aliases = {"cpu-core", "host-cpu"},
                   .vendor = "cpu",
                   .description = "one core of this machine (emulated device; cap memory per rank)",
                   .peak_flops_fp32 = 130e9,
                   .memory_bytes = 4 * kGiB,
                   .memory_bandwidth_bytes_per_second = 61 * kGigabytesPerSecond,
                   .intra_node_link = "shm",
                   .intra_node_link_bytes_per_second = 17.6 * kGigabytesPerSecond,
                   .source = "[23]",
                   .is_cpu = true});
}

DeviceCatalog catalog_build() {
  DeviceCatalog catalog;
  catalog_add_nvidia_datacenter(catalog);
  catalog_add_nvidia_pcie(catalog);
  catalog_add_amd(catalog);
  catalog_add_other(catalog);
  catalog_add_cpu(catalog);
  return catalog;
}

}  // namespace

const DeviceCatalog& catalog_builtin() {
  static const DeviceCatalog catalog = catalog_build();
  return catalog;
}

}  // namespace alloy
