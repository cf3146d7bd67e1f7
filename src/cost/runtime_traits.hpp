// What the runtime that runs a device type does, as the cost model needs it: its efficiency
// curve, its memory habits and its fixed overheads. The cost model and the search ask these
// traits, never whether a device is a CPU, so a new runtime is a new record, not new branches.
#pragma once

#include <string>

#include "cost/comm.hpp"
#include "cost/layer_cost.hpp"
#include "spec/cluster.hpp"
#include "spec/device_type.hpp"

namespace alloy {

// Which arithmetic prices the gradient buffers one block's backward holds (layer_cost.hpp).
enum class BackwardWorkspace {
  BackwardWorkspace_fused,     // block_backward_workspace_bytes: Alloy's GPU runtime
  BackwardWorkspace_mlp_peak,  // cpu_block_backward_workspace_bytes: Alloy's CPU runtime
};

struct RuntimeTraits {
  // A matrix product of M rows by N columns reaches
  // peak(precision) x M/(M + half_rows) x N/(N + half_cols) of the device's peak FLOP/s
  // (the analytic curve; a profile replaces it for measured shapes).
  double matmul_peak_efficiency_by_precision[5] = {};  // indexed by Precision
  double matmul_half_rows = 0;
  double matmul_half_cols = 0;
  // Element-wise work runs as kernels of its own between the matrix products, so its memory
  // traffic adds to their time rather than overlapping it (the roofline's max otherwise).
  bool elementwise_kernels_separate = false;
  // A GEMM reads its weights cold (a whole model's weights and weight gradients do not stay in
  // the caches between its uses) and the read adds to its math instead of overlapping it: the
  // layer's weight traffic as the cost model counts it, at this share of the memory bandwidth,
  // is added to its time, measured or analytic. 0: the traffic overlaps the math.
  double cold_weight_bandwidth_share = 0;
  // Emulated devices run slower by their speed, memory traffic included.
  bool memory_bandwidth_scales_with_speed = false;
  // Collectives copy on the cores that compute, so a prefetched ZeRO-3 gather hides nothing.
  bool collectives_share_compute_cores = false;
  // Collectives run as one flat ring over their members (MPI's non-blocking collectives), never
  // as trees or in levels by node, rack or site (NCCL's).
  bool collectives_flat_ring_only = false;
  // The rate at which a collective's members combine what they receive in an all-reduce or
  // reduce-scatter, on top of the link's time: (members - 1) / members of the buffer at this rate.
  // 0: hidden in the link time (reduction kernels at memory bandwidth).
  double collective_reduction_bytes_per_second = 0;
  // Seconds each collective takes to start beyond its link latencies (the runtime's progress
  // thread taking it up); 0: none worth pricing.
  double collective_startup_seconds = 0;
  // How the element-wise work between the matrix products is counted (layer_cost.hpp).
  ElementwiseKernels elementwise_kernels = ElementwiseKernels::ElementwiseKernels_fused;
  // What selective recomputation keeps and runs again.
  SelectiveRecompute selective_recompute = SelectiveRecompute::SelectiveRecompute_attention_core;
  // When an fp8 run casts the blocks' weights (layer_cost.hpp).
  Fp8WeightCasts fp8_weight_casts = Fp8WeightCasts::Fp8WeightCasts_every_micro_batch;
  // Under fp8 with sequence parallelism the tensor-parallel all-gathers (of the norms' outputs in
  // forward, of the output gradients in backward) move fp8 copies; the reduce-scatters stay 16-bit.
  bool fp8_tensor_parallel_gathers = false;
  // How the loss reads the logits: what the head keeps and its backward holds.
  LossLogits loss_logits = LossLogits::LossLogits_runtime_kernel;
  AttentionMemory attention_memory = AttentionMemory::AttentionMemory_fused;
  BackwardWorkspace backward_workspace = BackwardWorkspace::BackwardWorkspace_fused;
  // Under sequence parallelism the embedding's output, a chunk's received input and its output
  // gathered for the send stay whole (all rows) until the chunk's backward.
  bool sequence_parallel_keeps_whole_hidden_states = false;
  // The host is the device: offloaded blocks update at the device's own optimizer rate.
  bool host_is_device = false;
  // The share of the device's memory bandwidth at which the optimizer step (the gradient norm and
  // AdamW) moves the bytes the cost model counts per parameter.
  double optimizer_bandwidth_share = 1;
  // Every device is a rank on one machine's cores: with more devices than cores, the runtime
  // slows each rank's compute by devices / cores (its time dilation, runtime/device_speed.hpp).
  bool devices_share_host_cores = false;
  // A stage holding the head peaks in the head's backward or in its blocks' backward after it,
  // so the larger of the two counts, not their sum.
  bool head_stage_peak_is_larger_phase = false;
  double library_workspace_bytes = 0;   // besides one block's backward buffers
  double gradient_bucket_bytes = 0;     // data-parallel reduction buffers below ZeRO 3
  double framework_context_bytes = 0;   // e.g. the CUDA context
  double allocator_margin_fraction = 0;  // of activations, workspace and communication buffers
  // A caching allocator's memory held free but too fragmented to serve the peak's requests, as a
  // share of what it reserves: the reserved peak is the allocated peak / (1 - fragmentation).
  double allocator_fragmentation = 0;
  // Under ZeRO 1-2 each replica keeps the fp32 master weights of its shard alone (DeepSpeed,
  // Megatron's distributed optimizer, FSDP). Alloy's GPU runtime keeps them whole, since it makes
  // its bf16 compute copy from them; every runtime shards them under ZeRO 3.
  bool zero_shards_master_weights = true;
  // Under ZeRO 3 with fp32 master weights each replica also keeps its shard in the compute
  // precision, the all-gathers' input (DeepSpeed, Alloy). FSDP keeps the fp32 shard alone and
  // casts it as it gathers.
  bool zero3_keeps_compute_precision_shard = true;
  // Under ZeRO 3 on a pipelined stage the blocks' weights stay gathered from their first gather
  // of a step to the step's end (FSDP2 under PyTorch's pipeline schedules): the stage gathers
  // once a step and holds its weights whole in the compute precision. Alloy's runtimes gather a
  // block for each pass.
  bool zero3_pipelined_keeps_weights_gathered = false;
  // Under sequence parallelism each tp rank sends its rows of the hidden state (1/tp of it) to its
  // peer in the next stage (Megatron Core), where Alloy's runtimes send it whole to every tp rank.
  bool pipeline_sends_sequence_shards = false;

  double matmul_peak_efficiency(Precision p) const {
    return matmul_peak_efficiency_by_precision[static_cast<int>(p)];
  }
};

// The traits of the runtime that runs a device type: the one place that maps a type to it.
// A type priced as another framework runs (DeviceType::framework) gets that framework's record.
const RuntimeTraits& runtime_traits(const DeviceType& type);

// The record of a training framework other than Alloy by name ("torchtitan-eager",
// "torchtitan-compile"), or nullptr when there is none by that name.
const RuntimeTraits* framework_runtime_traits(const std::string& framework);
// The names framework_runtime_traits knows, comma-separated, for error messages.
std::string framework_names();

// How many times slower than on a free core the devices of a runtime that shares the host's
// cores compute when `devices` of them run on `cores` cores: devices / cores, at least 1 (the
// CPU runtime's time dilation at its default of one thread per rank once ranks outnumber cores).
double shared_cores_dilation(int devices, int cores);

// The devices of `cluster` whose runtime shares this machine's cores, its cores, and the time
// dilation the runtime gives them: shared_cores_dilation, or ALLOY_TIME_DILATION where it is set
// (the runtime refuses a malformed one; it slows every CPU rank by it then).
struct SharedCores {
  int devices = 0;
  int cores = 1;
  double dilation = 1;
};
SharedCores shared_cores_of(const ClusterSpec& cluster);

// How many times slower than on cores of their own the collectives of `runtime`'s devices move and
// combine bytes when `shared` describes the host: its time dilation where the runtime's devices
// share the host's cores and its collectives copy and combine on the cores that compute (the
// progress threads get the share of a core the compute gets); 1 otherwise. It stretches a
// collective's bandwidth and reduction terms, not its latency.
double shared_cores_collective_dilation(const RuntimeTraits& runtime, const SharedCores& shared);

// Seconds a collective of `ranks` members over `bytes` spends combining what its members receive,
// beyond the link's time: (ranks - 1) / ranks of the buffer at the runtime's reduction rate for
// an all-reduce or reduce-scatter; 0 for a gather, or where the runtime hides it.
double collective_reduction_seconds(const RuntimeTraits& runtime, CollectiveOp op, double bytes, int ranks);
// What the runtime adds to a collective's link time: its reduction (above) and its start-up.
double collective_runtime_seconds(const RuntimeTraits& runtime, CollectiveOp op, double bytes, int ranks);

// The share of its peak at `precision` that a device's large matrix products reach: its own
// calibrated matmul_efficiency at 16 bits (matmul_efficiency_fp8 at fp8) where it has one, else
// its runtime's.
double matmul_peak_share(const DeviceType& type, Precision precision);

// The precision a device's matrix products run at when `requested` is asked for: one it has no
// peak for runs as the nearest it has (tf32 as fp32; bf16 and fp16 as each other, else fp32;
// fp8 as bf16, fp16 or fp32), and is priced at that precision's peak and efficiency.
Precision precision_run_on(const DeviceType& type, Precision requested);

// "t4 has no tf32: priced at fp32 (8.1 TFLOP/s, its efficiency)", or "" when it runs `requested`.
std::string precision_fallback_note(const DeviceType& type, Precision requested);

}  // namespace alloy
