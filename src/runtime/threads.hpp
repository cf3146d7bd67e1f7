// Thread counts of the CPU runtime. One pool: OpenMP runs the parallel loops and splits every
// GEMM into per-thread slices, each a single-threaded OpenBLAS call; so several MPI ranks on one
// machine share its cores without oversubscription, and no idle pool spins against another.
#pragma once

namespace alloy {

// The most threads one rank may ask for: 4 x the hardware threads, at least 8. More only
// slows a run down, and tens of thousands exhaust the process's stacks.
int runtime_threads_limit();

// ALLOY_THREADS when set, else cores / OMPI_COMM_WORLD_LOCAL_SIZE (ranks on this node), min 1.
int runtime_default_threads();

// ALLOY_THREADS when set, else cores / ranks_on_host, min 1: the share of one of that many ranks.
int runtime_threads_for_ranks(int ranks_on_host);

// Sets the OpenMP thread count to n (n < 1: runtime_default_threads(); above
// runtime_threads_limit() an alloy::Error naming --threads) and OpenBLAS to one
// thread per caller, since the kernels parallelise GEMMs themselves; the first call also picks
// OpenBLAS's kernel family (runtime/cpu/blas_core.hpp).
void runtime_set_threads(int n);

// The count last set (runtime_default_threads() before any call).
int runtime_threads();

}  // namespace alloy
