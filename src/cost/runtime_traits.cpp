// The runtime traits of Alloy's CPU and GPU runtimes, which runtime runs a device type, and the
// precision a device runs when it lacks the one asked for.
#include "cost/runtime_traits.hpp"

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

static_assert(static_cast<int>(Precision::Precision_fp32) == 0 && static_cast<int>(Precision::Precision_fp8) == 4,
              "the efficiency tables below list fp32, tf32, bf16, fp16, fp8");

// Alloy's GPU runtime (docs/runtime-gpu.md).
constexpr RuntimeTraits kGpuRuntime = {
    .matmul_peak_efficiency_by_precision = {0.80, 0.65, 0.70, 0.70, 0.55},
    .matmul_half_rows = 128.0,
    .matmul_half_cols = 128.0,
    .elementwise_kernels_separate = true,
    .memory_bandwidth_scales_with_speed = false,
    .collectives_share_compute_cores = false,
    // NCCL picks rings, trees or levels by node.
    .collectives_flat_ring_only = false,
    .collective_reduction_bytes_per_second = 0,
    // It fuses attention, keeping a log-sum-exp per query row.
    .attention_memory = AttentionMemory::AttentionMemory_fused,
    .backward_workspace = BackwardWorkspace::BackwardWorkspace_fused,
    .sequence_parallel_keeps_whole_hidden_states = false,
    .host_is_device = false,
    // Fused kernels stream the optimizer's arrays at the memory's rate.
    .optimizer_bandwidth_share = 1,
    .devices_share_host_cores = false,
    // Its head stage's peak is not measured yet, so it keeps the sum.
    .head_stage_peak_is_larger_phase = false,
    .library_workspace_bytes = 32.0 * kMiB,
    // GPU runtimes reduce gradients through bucket buffers.
    .gradient_bucket_bytes = 2.0 * 64.0 * kMiB,
    .framework_context_bytes = 1.0 * kGiB,
    .allocator_margin_fraction = 0.05,
    // The whole fp32 master weights under ZeRO 1-2 (small-gpt, dp 2, ZeRO 1 on an H200: 32.4 MiB
    // of optimizer state and master weights measured, 24.3 MiB when priced as sharded).
    .zero_shards_master_weights = false,
};

// Alloy's CPU runtime: ranks on this machine, slowed by their speed to emulate devices.
constexpr RuntimeTraits kCpuRuntime = {
    // The runtime's GEMMs at small-gpt's layer shapes on one thread, fitted to the curve
    // (docs/catalog.md, [23]).
    .matmul_peak_efficiency_by_precision = {0.98, 0.98, 0.98, 0.98, 0.98},
    .matmul_half_rows = 5.0,
    .matmul_half_cols = 2.0,
    // Norms, activations and residual adds run as loops of their own between the GEMMs on the
    // same core, so their time adds to the GEMMs'.
    .elementwise_kernels_separate = true,
    // small-gpt's GEMMs inside the whole model take 0.1-5.5 ms more per forward and backward than
    // the same layers alone: its weight bytes at 0.36-0.71 of one core's streaming bandwidth from
    // run to run, median 0.60 over five (docs/catalog.md, [23]).
    .cold_weight_bandwidth_share = 0.6,
    .memory_bandwidth_scales_with_speed = true,
    // A prefetched ZeRO-3 gather copies on the same cores and adds its whole time
    // (docs/profile-format.md, Calibration).
    .collectives_share_compute_cores = true,
    // MPI's non-blocking collectives, one ring over the members in rank order (as the emulated
    // links price them, docs/runtime-distributed.md).
    .collectives_flat_ring_only = true,
    // MPI's reductions as the runtime's progress thread drives them: the 2-rank all-reduce of
    // 16 MiB less the ring's time over the shm link (docs/catalog.md, [23]).
    .collective_reduction_bytes_per_second = 1.75e9,
    // Each collective starts 35 us later than its ring's link latencies say: a 2-rank all-reduce
    // of 16 KiB and of 256 KiB took 109 and 196 us against 74 and 164 us priced
    // (docs/catalog.md, [23]).
    .collective_startup_seconds = 35e-6,
    // It stores the softmax scores.
    .attention_memory = AttentionMemory::AttentionMemory_scores,
    .backward_workspace = BackwardWorkspace::BackwardWorkspace_mlp_peak,
    // It keeps the embedding's output whole under sequence parallelism (the first block takes its
    // rows from it), and a chunk's received input and gathered output too.
    .sequence_parallel_keeps_whole_hidden_states = true,
    // A CPU device's host is the device itself.
    .host_is_device = true,
    // The norm and AdamW over arrays the passes have pushed out of the caches: 28 bytes per
    // parameter in 2.25 ns, 12.4 GB/s against one core's 61 GB/s streaming (docs/catalog.md, [23]).
    .optimizer_bandwidth_share = 0.20,
    .devices_share_host_cores = true,
    // Measured on small-gpt (CostModel::stage_memory).
    .head_stage_peak_is_larger_phase = true,
    .library_workspace_bytes = 0,
    // It reduces gradients in place, in the gradient arena (executor.cpp), so it needs none.
    .gradient_bucket_bytes = 0,
    .framework_context_bytes = 16.0 * kMiB,
    .allocator_margin_fraction = 0,
};

// torchtitan's Llama trainer in eager PyTorch as its December 2024 benchmarks ran it
// (docs/catalog.md, "Frameworks of published rows", for each value's source): Alloy's GPU
// runtime but where torchtitan's code differs.
constexpr RuntimeTraits torchtitan_traits(ElementwiseKernels kernels) {
  RuntimeTraits t = kGpuRuntime;
  // Every RMSNorm step, rotary embedding, SiLU, product and residual add is a kernel of its own
  // (fused: torch.compile of each block).
  t.elementwise_kernels = kernels;
  // Op-level selective checkpointing keeps every other matrix product's output and the
  // attention kernel's.
  t.selective_recompute = SelectiveRecompute::SelectiveRecompute_alternate_matmuls;
  // The logits are cast to fp32 before PyTorch's cross-entropy, outside the compiled blocks.
  t.loss_logits = LossLogits::LossLogits_fp32_copy;
  // FSDP shards the fp32 parameters themselves, and its mixed-precision policy casts a shard to
  // bf16 as it gathers it, keeping no bf16 shard.
  t.zero_shards_master_weights = true;
  t.zero3_keeps_compute_precision_shard = false;
  // With pipelining it shards blocks without resharding after forward (parallelize_llama.py:
  // "for PP, do not reshard after forward"), and PyTorch's pipeline stage turns off resharding
  // after backward and the gradients' reduction until the step's last backward.
  t.zero3_pipelined_keeps_weights_gathered = true;
  // Its float8 tensor parallelism casts a column-parallel layer's input to fp8 before the
  // all-gather (torchao's Float8ColwiseParallel, "all-gather in float8"), and a row-parallel
  // layer's output gradient before its backward's all-gather (Float8RowwiseParallel).
  t.fp8_tensor_parallel_gathers = true;
  // PyTorch's caching allocator: its published rows state reserved memory, on average 15% free
  // but fragmented in LLM training with recomputation and sharding (GMLake, ASPLOS 2024).
  t.allocator_margin_fraction = 0;
  t.allocator_fragmentation = 0.15;
  return t;
}
constexpr RuntimeTraits kTorchtitanEager = torchtitan_traits(ElementwiseKernels::ElementwiseKernels_eager);
constexpr RuntimeTraits kTorchtitanCompile = torchtitan_traits(ElementwiseKernels::ElementwiseKernels_fused);

// Megatron-LM (Megatron Core, as NeMo and Megatron-Bridge run it): Alloy's GPU runtime but that
// its distributed optimizer shards the fp32 master weights with the optimizer state, under
// sequence parallelism a stage sends each tp rank's rows alone, and its Transformer Engine layers
// cast the weights to fp8 on a step's first micro-batch only.
constexpr RuntimeTraits megatron_traits() {
  RuntimeTraits t = kGpuRuntime;
  t.zero_shards_master_weights = true;
  t.pipeline_sends_sequence_shards = true;
  t.fp8_weight_casts = Fp8WeightCasts::Fp8WeightCasts_once_per_step;
  return t;
}
constexpr RuntimeTraits kMegatron = megatron_traits();

struct NamedFramework {
  const char* name;
  const RuntimeTraits* traits;
};
constexpr NamedFramework kFrameworks[] = {
    {"torchtitan-eager", &kTorchtitanEager},
    {"torchtitan-compile", &kTorchtitanCompile},
    {"megatron-lm", &kMegatron},
};

}  // namespace

const RuntimeTraits* framework_runtime_traits(const std::string& framework) {
  for (const NamedFramework& f : kFrameworks)
    if (framework == f.name) return f.traits;
  return nullptr;
}

std::string framework_names() {
  std::string names;
  for (const NamedFramework& f : kFrameworks) names += std::string(names.empty() ? "" : ", ") + f.name;
  return names;
}

const RuntimeTraits& runtime_traits(const DeviceType& type) {
  if (!type.framework.empty()) {
    const RuntimeTraits* framework = framework_runtime_traits(type.framework);
    if (framework == nullptr)
      throw Error(fmt::format("device type {}: no runtime traits for framework \"{}\"", type.name, type.framework),
                  ErrorWhere{}, fmt::format("name one of: {}", framework_names()));
    return *framework;
  }
  return type.is_cpu ? kCpuRuntime : kGpuRuntime;
}

SharedCores shared_cores_of(const ClusterSpec& cluster) {
  SharedCores shared;
  for (const Device& d : cluster.devices) shared.devices += runtime_traits(cluster.device_type(d)).devices_share_host_cores ? 1 : 0;
  shared.cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const char* forced = std::getenv("ALLOY_TIME_DILATION");
  const double forced_dilation = forced != nullptr ? std::atof(forced) : 0.0;
  shared.dilation = shared.devices > 0 && forced_dilation >= 1 ? forced_dilation : shared_cores_dilation(shared.devices, shared.cores);
  return shared;
}

double shared_cores_collective_dilation(const RuntimeTraits& runtime, const SharedCores& shared) {
  return runtime.devices_share_host_cores && runtime.collectives_share_compute_cores ? shared.dilation : 1.0;
}

double collective_reduction_seconds(const RuntimeTraits& runtime, CollectiveOp op, double bytes, int ranks) {
  const bool reduces = op == CollectiveOp::CollectiveOp_all_reduce || op == CollectiveOp::CollectiveOp_reduce_scatter;
  if (!reduces || ranks <= 1 || runtime.collective_reduction_bytes_per_second <= 0) return 0;
  return (ranks - 1.0) / ranks * bytes / runtime.collective_reduction_bytes_per_second;
}

double collective_runtime_seconds(const RuntimeTraits& runtime, CollectiveOp op, double bytes, int ranks) {
  if (ranks <= 1) return 0;
  return collective_reduction_seconds(runtime, op, bytes, ranks) + runtime.collective_startup_seconds;
}

double shared_cores_dilation(int devices, int cores) {
  return std::max(1.0, static_cast<double>(devices) / std::max(1, cores));
}

double matmul_peak_share(const DeviceType& type, Precision precision) {
  const bool sixteen_bit = precision == Precision::Precision_bf16 || precision == Precision::Precision_fp16;
  if (sixteen_bit && type.matmul_efficiency > 0) return type.matmul_efficiency;
  if (precision == Precision::Precision_fp8 && type.matmul_efficiency_fp8 > 0) return type.matmul_efficiency_fp8;
  return runtime_traits(type).matmul_peak_efficiency(precision);
}

Precision precision_run_on(const DeviceType& type, Precision requested) {
  const auto has = [&](Precision p) {
    switch (p) {
      case Precision::Precision_fp8: return type.peak_flops_fp8 > 0;
      case Precision::Precision_bf16: return type.peak_flops_bf16 > 0;
      case Precision::Precision_fp16: return type.peak_flops_fp16 > 0;
      case Precision::Precision_tf32: return type.peak_flops_tf32 > 0;
      case Precision::Precision_fp32: return true;
    }
    return true;
  };
  // Nearest first: a narrower format never stands in for a wider one.
  std::vector<Precision> order = {requested};
  if (requested == Precision::Precision_fp8) order = {requested, Precision::Precision_bf16, Precision::Precision_fp16};
  if (requested == Precision::Precision_bf16) order = {requested, Precision::Precision_fp16};
  if (requested == Precision::Precision_fp16) order = {requested, Precision::Precision_bf16};
  for (Precision p : order)
    if (has(p)) return p;
  return Precision::Precision_fp32;
}

std::string precision_fallback_note(const DeviceType& type, Precision requested) {
  const Precision run = precision_run_on(type, requested);
  if (run == requested) return "";
  return fmt::format("{} has no {}: priced at {} ({:.1f} TFLOP/s at {:.0f}% efficiency), which it runs instead", type.name,
                     precision_name(requested), precision_name(run), type.peak_flops(run) / 1e12,
                     100 * matmul_peak_share(type, run));
}

}  // namespace alloy
