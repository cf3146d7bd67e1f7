// `alloy train --device cuda`: the training loop on one GPU, with bf16 compute and fp32 master
// weights, gradient accumulation over micro-batches (a plan's micro-batch size and count),
// per-layer recomputation, validation, and checkpoints in the CPU trainer's format (a run can
// resume on either backend); and data parallelism over GPUs under mpirun, each rank a replica
// whose gradients are summed over NCCL (or through host memory) block by block while the
// backward of the blocks below still runs.
#pragma once

#include <functional>
#include <vector>

#include "runtime/cuda/device.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/trainer.hpp"

namespace alloy {

// How data-parallel replicas sum gradients: NCCL (a GPU per rank) or MPI through pinned host
// buffers (ranks sharing a GPU, or GPUs NCCL cannot connect).
enum class GpuGradientPath { GpuGradientPath_nccl, GpuGradientPath_host_staged };

struct GpuTrainerOptions {
  TrainerOptions common;                 // data, batch, validation, checkpoints, log, memory cap
  int device = 0;                        // CUDA device index
  int64_t micro_batch_sequences = 0;     // sequences per forward/backward; 0: the whole batch
  std::vector<Recompute> layer_recompute;  // one per block; empty: common.recompute everywhere
  // Data parallelism: every rank of `mpi` is a replica reading its share of each batch
  // (micro_batch_sequences is per replica). nullptr: one GPU.
  Communicator* mpi = nullptr;
  GpuGradientPath gradient_path = GpuGradientPath::GpuGradientPath_nccl;
};

struct GpuTrainerResult {
  TrainerResult run;                  // steps as on the CPU; run.gemm_peak_flops is measured here
  CudaDeviceInfo device;
  double datasheet_peak_flops = 0;    // dense bf16 of the GPU in Alloy's catalog; 0 when unknown
  int64_t micro_batches = 1;          // per optimizer step and replica
  int replicas = 1;                   // data-parallel ranks
  double median_step_seconds = 0;     // over the steps after the first (warm-up)
};

GpuTrainerResult gpu_trainer_run(const ModelSpec& model, const TrainSpec& train, const GpuTrainerOptions& options,
                                 const std::function<void(const StepReport&)>& on_step = {});

}  // namespace alloy
