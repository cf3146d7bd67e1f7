// The host-staged communicator: the Communicator interface over GPU memory for links where GPUs
// cannot talk directly (HETHUB's case), by copying through pinned host buffers around MPI.
//
// Selecting it per stage boundary: a runtime holds one communicator per kind and, for every pair
// of adjacent pipeline stages, picks the one its two devices share a path for:
//   - both stages on NVIDIA GPUs that NCCL can connect (NVLink, PCIe peer access, or a network
//     with GPUDirect) -> the NCCL communicator (communicator_nccl.hpp);
//   - GPUs of different vendors (an NVIDIA stage next to an AMD or Ascend one), or no GPU-to-GPU
//     path -> this one, which every vendor can feed because it only needs device<->host copies.
// Collectives inside a stage (tensor and data parallel groups) stay on one vendor's GPUs and use
// that vendor's library; only the activations and gradients crossing the boundary are staged.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "runtime/parallel/communicator.hpp"

namespace alloy {

// Data pointers are device memory on `device` (all_gather_bytes: host memory, straight to `mpi`).
// Each call orders a copy stream after `producer` (default: the legacy default stream), copies
// the operation's input into a pinned host buffer (cudaMallocHost, pooled and reused) and waits
// for that copy, posts the MPI operation on the buffer and returns. The copy back to the device
// is queued once the MPI operation is seen finished (by done() or wait()); wait() returns when
// it has landed. So the caller blocks for the device-to-host copy, not for the transfer.
// Groups, rank, world_size, local_size, host_name, take_busy_seconds and abort are `mpi`'s;
// `mpi` must outlive the communicator, and handles must be waited on (or dropped, which waits
// for the transfer) before it is destroyed.
std::unique_ptr<Communicator> communicator_host_staged_create(Communicator& mpi, int device,
                                                              cudaStream_t producer = cudaStreamLegacy);

}  // namespace alloy
