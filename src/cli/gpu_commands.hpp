// The GPU sides of `alloy train` and `alloy profile` (--device cuda). Built with the CUDA backend
// (-DALLOY_CUDA=ON); without it each says how to get it.
#pragma once

#include <memory>
#include <string>

#include "runtime/parallel/communicator.hpp"
#include "runtime/trainer.hpp"
#include "spec/device_type.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy::cli {

// This rank's GPU for `alloy train --device cuda`: the CUDA stage backend, the communicator that
// moves GPU memory between ranks (NCCL, or through host memory), and the GPU as a device type.
// It owns what it opened (stream, communicators) until the run ends.
class GpuTraining {
 public:
  virtual ~GpuTraining() = default;
  TrainBackend backend;     // name "cuda"
  DeviceType device;        // the catalog's entry for this GPU (or the driver's figures); memory: what is free
  std::string description;  // e.g. "NVIDIA H200 (139.8 GiB)"
};

// Opens GPU `gpu` (-1: the rank's index on its host) for this rank of `comm`; under mpirun,
// `gradient_path` says how replicas reach each other: auto, nccl or host. Collective over
// `comm`. Throws alloy::Error when this build has no CUDA backend, there is no GPU, or the
// path cannot be used (NCCL needs a GPU per rank).
std::unique_ptr<GpuTraining> gpu_training_open(Communicator& comm, int gpu, const std::string& gradient_path);

// Measures the model's layer times and optimizer rate on GPU `gpu` and writes them to `output`
// as the profile of the device type of the cluster's first device (a GPU type).
void profile_on_gpu(const ModelSpec& model, const std::string& cluster_name, const TrainSpec& train, int repeats,
                    int gpu, const std::string& output);

}  // namespace alloy::cli
