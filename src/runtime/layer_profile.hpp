// Measured layer times for `alloy profile`: the embedding, one decoder block and the head of a
// model at the shapes the planner asks about (micro-batch, sequence length, tensor-parallel
// degree, sequence parallelism), forward and backward, on this CPU.
#pragma once

#include <vector>

#include "cost/profile.hpp"
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
// are left out (the communication model adds them).
LayerTiming layer_profile_measure(const ModelSpec& model, const LayerShape& shape, int repeats);

// Seconds per parameter of the optimizer step as the runtime runs it (sum of squared gradients
// for the global norm, then the AdamW update), median of `repeats`.
double profile_optimizer_seconds_per_parameter(int repeats);

// Bytes per second of a streaming read-modify-write over a buffer much larger than the caches.
double profile_memory_bandwidth(int repeats = 3);

}  // namespace alloy
