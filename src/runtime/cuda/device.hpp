// The GPUs of this process: how many the driver shows (zero, with the reason, when there is no
// driver or no GPU), their properties, and the memory of one device as a backing for the arena.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "runtime/arena.hpp"

namespace alloy {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;               // e.g. "NVIDIA H200"
  int compute_major = 0;          // compute capability, e.g. 9.0
  int compute_minor = 0;
  int multiprocessors = 0;
  int64_t memory_bytes = 0;       // total device memory
  int64_t free_memory_bytes = 0;  // free when asked
};

// Number of usable GPUs; 0 when there is none, with the driver's reason in *reason when given.
int cuda_device_count(std::string* reason = nullptr);

// Selects `index` for this thread and describes it. Throws alloy::Error saying plainly that no
// driver or GPU was found (and how to run on CPUs instead) when there is none, and naming the GPU
// when the backend cannot run on it (cuda_capability_refusal).
CudaDeviceInfo cuda_device_open(int index);

// Why the CUDA backend cannot run on a GPU of compute capability major.minor, or "" when it can:
// it computes in bf16 on tensor cores, which start with compute capability 8.0 (a V100, 7.0, or a
// T4, 7.5, has fp16 tensor cores only).
std::string cuda_capability_refusal(int major, int minor);

// Device memory through cudaMalloc / cudaFree, for Arena.
ArenaMemory cuda_arena_memory();

// A non-blocking CUDA stream of the current device, destroyed at scope end.
class CudaStream {
 public:
  CudaStream();
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace alloy
