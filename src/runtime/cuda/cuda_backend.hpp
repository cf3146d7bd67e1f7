// The CUDA backend of the executor: a rank's pipeline stage on one GPU (bf16 compute, fp32 master
// weights and gradients in the GPU arena), its passes and flat-buffer arithmetic queued on one
// stream. It runs what stage_backend_supports("cuda", ...) accepts: whole layers (tp 1).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "runtime/stage_backend.hpp"

namespace alloy {

// Builds the shard's layout and initial weights in host memory, copies them to GPU `device`
// (already selected with cuda_device_open) into an arena capped at request.memory_cap_bytes,
// and queues all of its work on `stream`, which must outlive the backend. Throws alloy::Error
// for a shard split by tensor parallelism, or when the GPU's memory does not hold it.
std::unique_ptr<StageBackend> stage_backend_cuda(const StageRequest& request, int device, cudaStream_t stream);

}  // namespace alloy
