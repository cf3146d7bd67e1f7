// `alloy train --device cuda`: the single-device training loop on one GPU, with bf16 compute and
// fp32 master weights, gradient accumulation over micro-batches (a plan's micro-batch size and
// count), per-layer recomputation, validation, and checkpoints in the CPU trainer's format (a run
// can resume on either backend).
#pragma once

#include <functional>
#include <vector>

#include "runtime/cuda/device.hpp"
#include "runtime/trainer.hpp"

namespace alloy {

struct GpuTrainerOptions {
  TrainerOptions common;                 // data, batch, validation, checkpoints, log, memory cap
  int device = 0;                        // CUDA device index
  int64_t micro_batch_sequences = 0;     // sequences per forward/backward; 0: the whole batch
  std::vector<Recompute> layer_recompute;  // one per block; empty: common.recompute everywhere
};

struct GpuTrainerResult {
  TrainerResult run;                  // steps as on the CPU; run.gemm_peak_flops is measured here
  CudaDeviceInfo device;
  double datasheet_peak_flops = 0;    // dense bf16 of the GPU in Alloy's catalog; 0 when unknown
  int64_t micro_batches = 1;          // per optimizer step
  double median_step_seconds = 0;     // over the steps after the first (warm-up)
};

GpuTrainerResult gpu_trainer_run(const ModelSpec& model, const TrainSpec& train, const GpuTrainerOptions& options,
                                 const std::function<void(const StepReport&)>& on_step = {});

}  // namespace alloy
