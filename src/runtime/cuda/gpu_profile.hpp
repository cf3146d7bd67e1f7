// Layer times on one GPU for `alloy profile --device cuda`: the embedding, one block and the head
// of a model, forward and backward, at every micro-batch that divides the global batch, timed
// with CUDA events inside the real training passes; and the optimizer step's cost per parameter.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "runtime/cuda/device.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

struct GpuProfile {
  CudaDeviceInfo device;
  std::vector<ProfiledLayer> layers;            // tp 1, at train.seq_len
  std::vector<int> skipped_micro_batches;       // did not fit in the GPU's memory
  double optimizer_seconds_per_parameter = 0;   // gradient norm and AdamW
  double gemm_peak_flops = 0;                   // measured bf16 cuBLASLt rate
};

// Medians of `repeats` timed steps after one warm-up. `progress` sees one line per shape.
GpuProfile gpu_profile_measure(const ModelSpec& model, const TrainSpec& train, int device, int repeats,
                               const std::function<void(const std::string&)>& progress);

}  // namespace alloy
