// The NCCL communicator: the Communicator interface over GPU memory, with NCCL collectives and
// point-to-point transfers queued on dedicated communication streams, so they overlap compute.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "runtime/parallel/communicator.hpp"

namespace alloy {

// Collective over `mpi`'s world: every rank calls it with its own GPU `device` (one rank per
// GPU: NCCL refuses two ranks on one GPU). World rank 0 makes the ncclUniqueId and broadcasts it
// over `mpi` (host memory); split() derives sub-communicators with ncclCommSplit.
//
// Data pointers are device memory on `device`, except all_gather_bytes, which takes host memory
// and goes through `mpi` (it carries small metadata such as step statistics). Each operation is
// queued after the work already queued on `producer` (default: the legacy default stream, which
// covers every blocking stream too) and returns at once; its handle's wait() blocks the host
// until the result is in device memory, done() asks without blocking.
//   - sends and receives match per pair of ranks in posting order; tags are range-checked, not
//     matched; a rank cannot send to itself.
//   - reduce_scatter / all_gather with equal counts are one NCCL call; with unequal counts they
//     are one grouped NCCL reduce (broadcast) per member.
// rank, world_size, local_size and host_name delegate to `mpi`; take_busy_seconds too, so it
// counts only all_gather_bytes (GPU transfers have no progress thread to time them); abort
// aborts the NCCL communicators, then the job through `mpi`. `mpi` must outlive the communicator.
std::unique_ptr<Communicator> communicator_nccl_create(Communicator& mpi, int device,
                                                       cudaStream_t producer = cudaStreamLegacy);

}  // namespace alloy
