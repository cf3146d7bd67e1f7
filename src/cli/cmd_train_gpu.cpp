// `alloy train --device cuda`: this rank's GPU as the CUDA backend of the one training loop.
#include "cli/gpu_commands.hpp"

#include "spec/error.hpp"

namespace alloy::cli {

#ifndef ALLOY_WITH_CUDA

std::unique_ptr<GpuTraining> gpu_training_open(Communicator&, int, const std::string&) {
  throw Error("this alloy was built without the CUDA backend", {"", "--device"},
              "rebuild with scripts/build.sh cuda (needs nvcc, cuBLAS and NCCL), or train on CPUs with --device cpu");
}

#endif

}  // namespace alloy::cli
