// Runtime traits: the CPU and GPU runtimes' documented values (docs/planner.md), and the cost
// model's compute time following the curve of the device's runtime.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"
#include "cost/runtime_traits.hpp"
#include "hw/catalog.hpp"
#include "spec/units.hpp"

namespace alloy {
namespace {

TEST(RuntimeTraits, CpuAndGpuDifferWhereTheRuntimesDo) {
  const RuntimeTraits& cpu = runtime_traits(*catalog_builtin().find("cpu"));
  const RuntimeTraits& gpu = runtime_traits(*catalog_builtin().find("h100-sxm"));

  EXPECT_DOUBLE_EQ(cpu.matmul_peak_efficiency(Precision::Precision_fp32), 0.98);
  EXPECT_DOUBLE_EQ(cpu.matmul_peak_efficiency(Precision::Precision_bf16), 0.98);
  EXPECT_DOUBLE_EQ(cpu.matmul_half_rows, 5.0);
  EXPECT_DOUBLE_EQ(cpu.matmul_half_cols, 2.0);
  EXPECT_DOUBLE_EQ(cpu.cold_weight_bandwidth_share, 0.6);
  EXPECT_DOUBLE_EQ(gpu.cold_weight_bandwidth_share, 0);
  EXPECT_DOUBLE_EQ(gpu.matmul_peak_efficiency(Precision::Precision_fp32), 0.80);
  EXPECT_DOUBLE_EQ(gpu.matmul_peak_efficiency(Precision::Precision_tf32), 0.65);
  EXPECT_DOUBLE_EQ(gpu.matmul_peak_efficiency(Precision::Precision_bf16), 0.70);
  EXPECT_DOUBLE_EQ(gpu.matmul_peak_efficiency(Precision::Precision_fp16), 0.70);
  EXPECT_DOUBLE_EQ(gpu.matmul_peak_efficiency(Precision::Precision_fp8), 0.55);
  EXPECT_DOUBLE_EQ(gpu.matmul_half_rows, 128.0);
  EXPECT_DOUBLE_EQ(gpu.matmul_half_cols, 128.0);

  EXPECT_TRUE(cpu.memory_bandwidth_scales_with_speed && !gpu.memory_bandwidth_scales_with_speed);
  EXPECT_TRUE(cpu.collectives_share_compute_cores && !gpu.collectives_share_compute_cores);
  EXPECT_EQ(cpu.attention_memory, AttentionMemory::AttentionMemory_scores);
  EXPECT_EQ(gpu.attention_memory, AttentionMemory::AttentionMemory_fused);
  EXPECT_EQ(cpu.backward_workspace, BackwardWorkspace::BackwardWorkspace_mlp_peak);
  EXPECT_EQ(gpu.backward_workspace, BackwardWorkspace::BackwardWorkspace_fused);
  EXPECT_TRUE(cpu.sequence_parallel_keeps_whole_hidden_states && !gpu.sequence_parallel_keeps_whole_hidden_states);
  EXPECT_TRUE(cpu.host_is_device && !gpu.host_is_device);
  EXPECT_TRUE(cpu.devices_share_host_cores && !gpu.devices_share_host_cores);
  EXPECT_GT(cpu.collective_reduction_bytes_per_second, 0);
  EXPECT_DOUBLE_EQ(gpu.collective_reduction_bytes_per_second, 0);
  EXPECT_TRUE(cpu.head_stage_peak_is_larger_phase && !gpu.head_stage_peak_is_larger_phase);

  EXPECT_DOUBLE_EQ(cpu.library_workspace_bytes, 0);
  EXPECT_DOUBLE_EQ(gpu.library_workspace_bytes, 32 * kMiB);
  EXPECT_DOUBLE_EQ(cpu.gradient_bucket_bytes, 0);
  EXPECT_DOUBLE_EQ(gpu.gradient_bucket_bytes, 128 * kMiB);
  EXPECT_DOUBLE_EQ(cpu.framework_context_bytes, 16 * kMiB);
  EXPECT_DOUBLE_EQ(gpu.framework_context_bytes, 1 * kGiB);
  EXPECT_DOUBLE_EQ(cpu.allocator_margin_fraction, 0);
  EXPECT_DOUBLE_EQ(gpu.allocator_margin_fraction, 0.05);
}

TEST(RuntimeTraits, ComputeTimeFollowsTheRuntimesCurve) {
  const DeviceType& h100 = *catalog_builtin().find("h100-sxm");
  DeviceType cpu = *catalog_builtin().find("cpu");
  LayerWork work;
  work.forward_flops = 1e12;
  work.matmul_rows = 256;
  work.matmul_cols = 512;
  const Precision bf16 = Precision::Precision_bf16;
  // The H100's calibrated share of its 16-bit peak, not the GPU runtime's default.
  ASSERT_GT(h100.matmul_efficiency, 0);
  EXPECT_DOUBLE_EQ(compute_seconds(h100, bf16, work, false),
                   1e12 / (h100.peak_flops(bf16) * h100.matmul_efficiency * (256.0 / 384.0) * (512.0 / 640.0)));
  DeviceType uncalibrated = h100;
  uncalibrated.matmul_efficiency = 0;
  EXPECT_DOUBLE_EQ(compute_seconds(uncalibrated, bf16, work, false),
                   1e12 / (h100.peak_flops(bf16) * 0.70 * (256.0 / 384.0) * (512.0 / 640.0)));
  EXPECT_DOUBLE_EQ(compute_seconds(cpu, bf16, work, false),
                   1e12 / (cpu.peak_flops(bf16) * 0.98 * (256.0 / 261.0) * (512.0 / 514.0)));

  // Memory-bound work: an emulated device at half speed moves its bytes at half the bandwidth;
  // a real device's speed does not touch its memory.
  LayerWork copy;
  copy.forward_bytes = 1e9;
  copy.forward_elementwise_bytes = 1e9;  // a loop of its own on the CPU; a GPU's roofline reads it alike
  cpu.speed = 0.5;
  EXPECT_DOUBLE_EQ(compute_seconds(cpu, bf16, copy, false), 1e9 / (cpu.memory_bandwidth_bytes_per_second * 0.5));
  DeviceType slow_h100 = h100;
  slow_h100.speed = 0.5;
  EXPECT_DOUBLE_EQ(compute_seconds(slow_h100, bf16, copy, false), 1e9 / h100.memory_bandwidth_bytes_per_second);
}

// On a GPU the element-wise kernels run between the matrix products, so their traffic adds to
// the products' time; a fused attention never writes the score matrix, so its traffic is not
// counted. A CPU rank runs them as loops of its own too, and writes the scores; it reads the
// weights cold, so their bytes add to the math as well, at its share of the bandwidth.
TEST(RuntimeTraits, ElementwiseTrafficAddsToMatrixProducts) {
  const DeviceType& h100 = *catalog_builtin().find("h100-sxm");
  const DeviceType& cpu = *catalog_builtin().find("cpu");
  LayerWork work;
  work.forward_flops = 1e12;
  work.matmul_rows = 4096;
  work.matmul_cols = 4096;
  work.forward_score_bytes = 2e9;
  work.forward_elementwise_bytes = 3e9 + work.forward_score_bytes;
  work.forward_bytes = 1e9 + work.forward_elementwise_bytes;  // 1 GB of weights and inputs
  work.backward_flops = 2 * work.forward_flops;
  work.backward_bytes = 2 * work.forward_bytes;
  const Precision bf16 = Precision::Precision_bf16;
  const double math = 1e12 / (h100.peak_flops(bf16) * compute_efficiency(h100, bf16, 4096, 4096));
  const double bandwidth = h100.memory_bandwidth_bytes_per_second;
  EXPECT_DOUBLE_EQ(compute_seconds(h100, bf16, work, false), std::max(math, 1e9 / bandwidth) + 3e9 / bandwidth);
  EXPECT_DOUBLE_EQ(compute_seconds(h100, bf16, work, true), std::max(2 * math, 2e9 / bandwidth) + 6e9 / bandwidth);
  const double cpu_math = 1e12 / (cpu.peak_flops(bf16) * compute_efficiency(cpu, bf16, 4096, 4096));
  const double cpu_bandwidth = cpu.memory_bandwidth_bytes_per_second;
  const double cold = 1e9 / (0.6 * cpu_bandwidth);
  EXPECT_DOUBLE_EQ(cold_weight_seconds(cpu, work, false), cold);
  EXPECT_DOUBLE_EQ(cold_weight_seconds(cpu, work, true), 2 * cold);
  EXPECT_DOUBLE_EQ(cold_weight_seconds(h100, work, true), 0);
  EXPECT_DOUBLE_EQ(compute_seconds(cpu, bf16, work, false), cpu_math + cold + 5e9 / cpu_bandwidth);
  EXPECT_DOUBLE_EQ(compute_seconds(cpu, bf16, work, true), 2 * cpu_math + 2 * cold + 10e9 / cpu_bandwidth);
}

// A precision the device has no peak for is priced as what it runs instead: on a T4 (Turing, no
// TF32) tf32 is fp32 at fp32's efficiency, not fp32's peak at TF32's efficiency; a note says so.
TEST(RuntimeTraits, PrecisionTheDeviceLacksIsPricedAsTheOneItRuns) {
  const DeviceType& t4 = *catalog_builtin().find("t4");
  const DeviceType& a100 = *catalog_builtin().find("a100-80gb-sxm");
  const DeviceType& v100 = *catalog_builtin().find("v100-32gb");
  const Precision tf32 = Precision::Precision_tf32;
  const Precision fp32 = Precision::Precision_fp32;
  EXPECT_EQ(precision_run_on(t4, tf32), fp32);
  EXPECT_EQ(precision_run_on(a100, tf32), tf32);
  EXPECT_EQ(precision_run_on(v100, Precision::Precision_bf16), Precision::Precision_fp16);
  EXPECT_EQ(precision_run_on(v100, Precision::Precision_fp8), Precision::Precision_fp16);
  LayerWork work;
  work.forward_flops = 1e12;
  work.matmul_rows = 4096;
  work.matmul_cols = 4096;
  EXPECT_DOUBLE_EQ(compute_seconds(t4, tf32, work, false), compute_seconds(t4, fp32, work, false));
  const double shape = (4096.0 / (4096 + 128)) * (4096.0 / (4096 + 128));
  EXPECT_DOUBLE_EQ(compute_seconds(t4, tf32, work, false), 1e12 / (t4.peak_flops_fp32 * 0.80 * shape));
  EXPECT_DOUBLE_EQ(compute_seconds(a100, tf32, work, false), 1e12 / (a100.peak_flops_tf32 * 0.65 * shape));

  EXPECT_EQ(precision_fallback_note(a100, tf32), "");
  const std::string note = precision_fallback_note(t4, tf32);
  EXPECT_NE(note.find("t4 has no tf32: priced at fp32"), std::string::npos) << note;

  // The note reaches the cost model's notes, which `alloy plan` and `alloy explain` print.
  ModelSpec model = testing::llama("m", 2, 256, 4, 4, 512, 1000);
  const ClusterSpec cluster = testing::cluster("t4x2", {t4}, {{0, 1, 2}});
  CostModel with_tf32(model, cluster, testing::train(128, 4, tf32));
  const std::vector<std::string> notes = with_tf32.fallback_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes.front(), note);
  EXPECT_TRUE(CostModel(model, cluster, testing::train(128, 4, fp32)).fallback_notes().empty());
}

// Priced without a profile, CPU devices take the catalog's cpu entry, measured on one host: the
// plan's notes say so once, naming them; with their layers measured, nothing is said.
TEST(RuntimeTraits, UnprofiledCpuDevicesAreNotedAsTheEntrysHost) {
  DeviceType half = *catalog_builtin().find("cpu");
  half.name = "cpu-half";
  half.speed = 0.5;
  const ClusterSpec cluster =
      testing::cluster("cpus", {*catalog_builtin().find("cpu"), half}, {{0, 1, 1, 0}, {1, 1, 1, 0}});
  const ModelSpec model = testing::llama("m", 2, 256, 4, 4, 512, 1000);
  const TrainSpec train = testing::train(64, 4, Precision::Precision_fp32);
  const std::vector<std::string> notes = CostModel(model, cluster, train).fallback_notes();
  const auto named = std::count_if(notes.begin(), notes.end(), [](const std::string& n) {
    return n.find("cpu, cpu-half: priced from the catalog's cpu entry") != std::string::npos;
  });
  EXPECT_EQ(named, 1) << (notes.empty() ? "no notes" : notes.front());
  Profile profile;
  profile.model_name = "m";
  profile.device_types["cpu"].layers.push_back({});
  const std::vector<std::string> profiled = CostModel(model, cluster, train, &profile).fallback_notes();
  for (const std::string& n : profiled) EXPECT_EQ(n.find("cpu entry"), std::string::npos) << n;
}

// CPU ranks share this machine's cores: once they outnumber the cores, the runtime slows each by
// devices / cores, and the cost model prices their compute so; up to one rank per core, not.
TEST(RuntimeTraits, CpuDevicesBeyondTheCoresArePricedSlowerByTheirShare) {
  EXPECT_DOUBLE_EQ(shared_cores_dilation(2, 2), 1.0);
  EXPECT_DOUBLE_EQ(shared_cores_dilation(1, 4), 1.0);
  EXPECT_DOUBLE_EQ(shared_cores_dilation(4, 2), 2.0);
  EXPECT_DOUBLE_EQ(shared_cores_dilation(3, 2), 1.5);

  if (std::getenv("ALLOY_TIME_DILATION") != nullptr) GTEST_SKIP() << "ALLOY_TIME_DILATION sets the dilation instead";
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const DeviceType& cpu = *catalog_builtin().find("cpu");
  const ModelSpec model = testing::gpt2("m", 2, 256, 4, 1000, 64);
  const TrainSpec train = testing::train(64, 8, Precision::Precision_fp32);
  const auto block_forward = [&](int devices) {
    const CostModel cost(model, testing::cluster("cpus", {cpu}, {{0, 1, devices, 0}}), train);
    return cost.unit_costs(cost.stage_shape({0}, 1, 1, 1), false).block.forward_seconds;
  };
  EXPECT_DOUBLE_EQ(block_forward(cores), block_forward(1));
  EXPECT_NEAR(block_forward(2 * cores) / block_forward(1), 2.0, 1e-9);
}

// MPI's reductions on CPU ranks add their time to an all-reduce or reduce-scatter; a gather
// reduces nothing, and a GPU runtime's reduction hides in the link time.
TEST(RuntimeTraits, CpuCollectivesAddTheirReduction) {
  const RuntimeTraits& cpu = runtime_traits(*catalog_builtin().find("cpu"));
  const RuntimeTraits& gpu = runtime_traits(*catalog_builtin().find("h100-sxm"));
  const double bytes = 16e6;
  EXPECT_DOUBLE_EQ(collective_reduction_seconds(cpu, CollectiveOp::CollectiveOp_all_reduce, bytes, 4),
                   0.75 * bytes / cpu.collective_reduction_bytes_per_second);
  EXPECT_DOUBLE_EQ(collective_reduction_seconds(cpu, CollectiveOp::CollectiveOp_reduce_scatter, bytes, 2),
                   0.5 * bytes / cpu.collective_reduction_bytes_per_second);
  EXPECT_DOUBLE_EQ(collective_reduction_seconds(cpu, CollectiveOp::CollectiveOp_all_gather, bytes, 4), 0);
  EXPECT_DOUBLE_EQ(collective_reduction_seconds(cpu, CollectiveOp::CollectiveOp_all_reduce, bytes, 1), 0);
  EXPECT_DOUBLE_EQ(collective_reduction_seconds(gpu, CollectiveOp::CollectiveOp_all_reduce, bytes, 4), 0);
}

// Every CPU collective over several ranks also pays its start-up, a gather included; a GPU
// runtime's and a one-rank group's nothing.
TEST(RuntimeTraits, CpuCollectivesAddTheirStartUp) {
  const RuntimeTraits& cpu = runtime_traits(*catalog_builtin().find("cpu"));
  const RuntimeTraits& gpu = runtime_traits(*catalog_builtin().find("h100-sxm"));
  ASSERT_GT(cpu.collective_startup_seconds, 0);
  EXPECT_DOUBLE_EQ(gpu.collective_startup_seconds, 0);
  const double bytes = 16e3;
  EXPECT_DOUBLE_EQ(collective_runtime_seconds(cpu, CollectiveOp::CollectiveOp_all_reduce, bytes, 2),
                   collective_reduction_seconds(cpu, CollectiveOp::CollectiveOp_all_reduce, bytes, 2) +
                       cpu.collective_startup_seconds);
  EXPECT_DOUBLE_EQ(collective_runtime_seconds(cpu, CollectiveOp::CollectiveOp_all_gather, bytes, 2),
                   cpu.collective_startup_seconds);
  EXPECT_DOUBLE_EQ(collective_runtime_seconds(cpu, CollectiveOp::CollectiveOp_all_reduce, bytes, 1), 0);
  EXPECT_DOUBLE_EQ(collective_runtime_seconds(gpu, CollectiveOp::CollectiveOp_all_reduce, bytes, 4), 0);
}

// The progress threads of CPU ranks copy and combine on the cores the ranks share: with more
// devices than cores a collective's bytes move and combine slower by the time dilation (two
// data-parallel pairs' reduce-scatters at once took 2.2-2.6x one pair's on 4 ranks over 2 cores);
// a GPU's do not.
TEST(RuntimeTraits, CpuCollectivesBeyondTheCoresTakeTheDilation) {
  const RuntimeTraits& cpu = runtime_traits(*catalog_builtin().find("cpu"));
  const RuntimeTraits& gpu = runtime_traits(*catalog_builtin().find("h100-sxm"));
  const SharedCores doubled{4, 2, 2.0};
  EXPECT_DOUBLE_EQ(shared_cores_collective_dilation(cpu, doubled), 2.0);
  EXPECT_DOUBLE_EQ(shared_cores_collective_dilation(gpu, doubled), 1.0);
  EXPECT_DOUBLE_EQ(shared_cores_collective_dilation(cpu, SharedCores{2, 2, 1.0}), 1.0);

  if (std::getenv("ALLOY_TIME_DILATION") != nullptr) GTEST_SKIP() << "ALLOY_TIME_DILATION sets the dilation instead";
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const DeviceType& type = *catalog_builtin().find("cpu");
  const ModelSpec model = testing::gpt2("m", 2, 256, 4, 1000, 64);
  const TrainSpec train = testing::train(64, 8, Precision::Precision_fp32);
  // A pair of data-parallel replicas among `devices` CPU devices: its gradient reduce-scatter and
  // re-gather per step.
  const auto pair_sync = [&](int devices) {
    const CostModel cost(model, testing::cluster("cpus", {type}, {{0, 1, devices, 0}}), train);
    const StageShape shape = cost.stage_shape({0, 1}, 1, 2, 1);
    StageChoice c;
    c.blocks = 2;
    c.zero = 2;
    return cost.stage_gradient_sync_seconds(shape, cost.unit_costs(shape, false), c);
  };
  EXPECT_GT(pair_sync(cores), 0);
  EXPECT_DOUBLE_EQ(pair_sync(std::max(2, cores)), pair_sync(2));
  // Megabytes of gradients: the bytes' terms double, the two ring steps' latencies do not.
  EXPECT_GT(pair_sync(2 * cores) / pair_sync(cores), 1.9);
  EXPECT_LT(pair_sync(2 * cores) / pair_sync(cores), 2.0);

  GroupPlacement pair;
  pair.ranks = 2;
  pair.intra_node = {"shm", 12e9, 30e-6};
  const double bytes = 8e6;
  const auto ring = [&](const GroupPlacement& g) {
    return collective_seconds_with(CollectiveOp::CollectiveOp_reduce_scatter, bytes, g, CollectiveAlgorithm::CollectiveAlgorithm_ring);
  };
  EXPECT_NEAR(ring(group_bandwidth_divided(pair, 2)) - 30e-6, 2 * (ring(pair) - 30e-6), 1e-12);
}

// The CPU runtime's optimizer step moves the optimizer's bytes per parameter at its measured share
// of the memory bandwidth; a GPU's at the whole bandwidth.
TEST(RuntimeTraits, OptimizerStepRunsAtTheRuntimesShareOfTheBandwidth) {
  const RuntimeTraits& cpu = runtime_traits(*catalog_builtin().find("cpu"));
  EXPECT_GT(cpu.optimizer_bandwidth_share, 0);
  EXPECT_LT(cpu.optimizer_bandwidth_share, 1);
  EXPECT_DOUBLE_EQ(runtime_traits(*catalog_builtin().find("h100-sxm")).optimizer_bandwidth_share, 1);
  if (std::getenv("ALLOY_TIME_DILATION") != nullptr) GTEST_SKIP() << "ALLOY_TIME_DILATION sets the dilation instead";
  const DeviceType& type = *catalog_builtin().find("cpu");
  const ModelSpec model = testing::gpt2("m", 2, 256, 4, 1000, 64);
  const CostModel cost(model, testing::cluster("cpus", {type}, {{0, 1, 1, 0}}), testing::train(64, 8, Precision::Precision_fp32));
  const StageShape shape = cost.stage_shape({0}, 1, 1, 1);
  const StageUnitCosts unit = cost.unit_costs(shape, false);
  StageChoice c;
  c.blocks = 2;
  c.has_embedding = true;
  c.has_head = true;
  const double parameters = 2 * unit.block_parameters + unit.embedding_parameters + unit.head_parameters;
  // fp32 AdamW: the weight read and written, the gradient read, two moments read and written.
  const double bytes_per_parameter = 8.0 * 2 + 4 + 2 * 4;
  EXPECT_NEAR(cost.stage_timing(shape, unit, c, 0, 0).optimizer_seconds,
              parameters * bytes_per_parameter / (type.memory_bandwidth_bytes_per_second * cpu.optimizer_bandwidth_share),
              1e-12);
}

}  // namespace
}  // namespace alloy
