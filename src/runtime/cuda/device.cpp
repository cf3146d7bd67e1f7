// GPU discovery and error reporting for the CUDA backend.
#include "runtime/cuda/device.hpp"

#include <fmt/format.h>

#include "runtime/cuda/cuda_check.hpp"
#include "spec/error.hpp"

namespace alloy {

void cuda_check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw Error(fmt::format("{}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status)), {},
              "check the GPU with nvidia-smi; an out-of-memory error needs a smaller batch or recomputation");
}

void cublas_check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(fmt::format("{}: cuBLAS status {}", what, static_cast<int>(status)), {},
              "check that the cuBLAS library matches the driver (nvidia-smi shows the CUDA version it supports)");
}

void cuda_check_launch(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

int cuda_device_count(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason != nullptr) *reason = cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky status so later CPU-only work is unaffected
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "the driver reports no GPU";
  return count;
}

CudaDeviceInfo cuda_device_open(int index) {
  std::string reason;
  const int count = cuda_device_count(&reason);
  if (count == 0) {
    throw Error(fmt::format("no CUDA GPU is usable here: {}", reason), {"", "--device"},
                "install the NVIDIA driver (nvidia-smi must list the GPU), or train on CPUs with --device cpu");
  }
  if (index < 0 || index >= count) {
    throw Error(fmt::format("GPU {} does not exist: this machine shows {} GPU(s)", index, count), {"", "--gpu"},
                fmt::format("pick a GPU index from 0 to {}", count - 1));
  }
  cuda_check(cudaSetDevice(index), "selecting the GPU");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, index), "reading the GPU's properties");
  CudaDeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  const std::string refusal = cuda_capability_refusal(info.compute_major, info.compute_minor);
  if (!refusal.empty()) {
    throw Error(fmt::format("GPU {} ({}): {}", index, info.name, refusal), {"", "--device"},
                "train on CPU ranks (--device cpu); alloy plan prices this GPU's type in fp16");
  }
  size_t free_bytes = 0, total_bytes = 0;
  cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "reading the GPU's memory");
  info.memory_bytes = static_cast<int64_t>(total_bytes);
  info.free_memory_bytes = static_cast<int64_t>(free_bytes);
  return info;
}

std::string cuda_capability_refusal(int major, int minor) {
  if (major >= 8) return "";
  return fmt::format("compute capability {}.{} has no bf16 tensor cores, on which the cuda backend computes "
                     "(compute capability 8.0 or newer: A100, L4, H100, H200)",
                     major, minor);
}

namespace {

void* cuda_memory_allocate(int64_t bytes) {
  void* pointer = nullptr;
  if (cudaMalloc(&pointer, static_cast<size_t>(bytes)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return pointer;
}

void cuda_memory_free(void* pointer) { cudaFree(pointer); }

}  // namespace

ArenaMemory cuda_arena_memory() { return {cuda_memory_allocate, cuda_memory_free, "GPU"}; }

CudaStream::CudaStream() {
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a CUDA stream");
}

CudaStream::~CudaStream() { cudaStreamDestroy(stream_); }

}  // namespace alloy
