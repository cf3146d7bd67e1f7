// The GPU sides of `alloy train` and `alloy profile` (--device cuda). Built with the CUDA backend
// (-DALLOY_CUDA=ON); without it each says how to get it.
#pragma once

#include <string>

#include "runtime/trainer.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy::cli {

struct GpuTrainRequest {
  TrainerOptions options;  // data, batch, validation, checkpoints, log, recomputation, memory cap
  std::string plan_path;   // a plan whose batch, micro-batches and recomputation to run
  std::string cluster;     // the plan's cluster (default: the plan's cluster name)
  int gpu = -1;            // CUDA device index; -1: the rank's index on its host
  std::string gradient_path = "auto";  // data parallel: auto, nccl or host
};

// Trains and prints the summary (with the plan's predictions against the measurements when a
// plan is given). Under mpirun every rank is a data-parallel replica on its own GPU. Throws
// alloy::Error for bad input or when this build has no CUDA backend.
void train_on_gpu(const ModelSpec& model, TrainSpec train, const GpuTrainRequest& request);

// Measures the model's layer times and optimizer rate on GPU `gpu` and writes them to `output`
// as the profile of the device type of the cluster's first device (a GPU type).
void profile_on_gpu(const ModelSpec& model, const std::string& cluster_name, const TrainSpec& train, int repeats,
                    int gpu, const std::string& output);

}  // namespace alloy::cli
