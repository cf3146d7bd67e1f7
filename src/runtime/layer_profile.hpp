// Measured layer times for `alloy profile`: the embedding, one decoder block and the head of a
// model at the shapes the planner asks about (micro-batch, sequence length, tensor-parallel
// degree, sequence parallelism), forward and backward, on this CPU.
#pragma once

#include <functional>
#include <vector>

#include "cost/profile.hpp"
#include "runtime/shard.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

struct LayerShape {
  LayerKind kind = LayerKind::LayerKind_block;
  int micro_batch = 1;  // sequences per replica
  int seq_len = 1;
  int tp = 1;
  bool sequence_parallel = false;
};

// Every layer kind at every micro-batch that divides the global batch, at the training sequence
// length, for each tensor-parallel degree up to `max_tp` that divides the model (with and
// without sequence parallelism above 1).
std::vector<LayerShape> layer_profile_shapes(const ModelSpec& model, const TrainSpec& train, int max_tp);

struct LayerTiming {
  double forward_seconds = 0;
  double backward_seconds = 0;
};

// Median of `repeats` timed forward and backward passes after one warm-up, for tp rank 0 of
// the shape. Compute only, as the profile format defines it: the tensor-parallel collectives
// are left out (the communication model adds them). An emulated device `slowdown` times slower
// stretches each pass as training does (device_stretch), so the times are that device's.
LayerTiming layer_profile_measure(const ModelSpec& model, const LayerShape& shape, int repeats, double slowdown = 1.0);

// The same for any shard of the model (several blocks, the embedding and the head together):
// `micro_batch` sequences of `seq_len` tokens through every layer the shard holds.
LayerTiming shard_profile_measure(const ModelSpec& model, const ModelShard& shard, int micro_batch, int seq_len, int repeats,
                                  double slowdown = 1.0);

// Seconds per parameter of the optimizer step as the runtime runs it (sum of squared gradients
// for the global norm, then the AdamW update), median of `repeats`, stretched as above.
double profile_optimizer_seconds_per_parameter(int repeats, double slowdown = 1.0);

struct LayerSweepOptions {
  int repeats = 5;        // timed runs per shape and round (their median)
  int rounds = 3;         // sweeps over all the shapes (the median per shape)
  double slowdown = 1.0;  // the emulated device's, as in layer_profile_measure
};

struct LayerSweep {
  std::vector<LayerTiming> layers;  // per shape
  double optimizer_seconds_per_parameter = 0;
  double reference_spread = 1;      // 90th over 10th percentile of the reference runs: how much this
                                    // core's speed moved during the sweep
};

// Every shape `rounds` times, and the optimizer step once per round, each measurement followed
// by a short reference GEMM timed on this thread's CPU clock. A measurement is scaled by the
// median reference of the whole sweep over its own: on a shared machine a core has slow spells
// (other tenants) that would otherwise hit some shapes and not others and skew them against
// each other. `progress(round, shape)` is called before each shape.
LayerSweep layer_profile_sweep(const ModelSpec& model, const std::vector<LayerShape>& shapes,
                               const LayerSweepOptions& options,
                               const std::function<void(int, size_t)>& progress = nullptr);

// Bytes per second of a streaming read-modify-write over a buffer much larger than the caches.
double profile_memory_bandwidth(int repeats = 3);

}  // namespace alloy
