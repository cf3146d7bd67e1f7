// Throughput of the fused causal attention kernels (forward and backward) on the GPU at two
// training shapes, in TFLOP/s counting only the causal half of the score matrix, against the
// H200's dense bf16 datasheet peak. Exits 0 with a message where no GPU is present.
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/cuda/attention.hpp"
#include "runtime/cuda/device.hpp"

namespace {

constexpr double kPeakTflops = 989.0;  // H200 SXM, dense bf16

struct BenchShape {
  int B, T, H, D;
};

// Mean seconds per call of `launch` over `repeats` calls after two warm-up calls.
template <typename Launch>
double time_seconds(Launch launch, int repeats) {
  for (int i = 0; i < 2; ++i) launch();
  cudaEvent_t start, stop;
  alloy::cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  alloy::cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  alloy::cuda_check(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < repeats; ++i) launch();
  alloy::cuda_check(cudaEventRecord(stop), "cudaEventRecord");
  alloy::cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float elapsed_ms = 0.0f;
  alloy::cuda_check(cudaEventElapsedTime(&elapsed_ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return elapsed_ms * 1e-3 / repeats;
}

void bench_shape(const BenchShape& s) {
  const int64_t R = 3LL * s.H * s.D;
  const int64_t rows = static_cast<int64_t>(s.B) * s.T;
  // Inputs of small random-looking values: timing does not depend on them, only their finiteness.
  std::vector<alloy::bf16> host(static_cast<size_t>(rows * R));
  for (size_t i = 0; i < host.size(); ++i) {
    host[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
  }
  alloy::bf16 *qkv, *out, *dout, *dqkv;
  float* lse;
  void* workspace;
  const int64_t workspace_bytes = alloy::cuda_attention_backward_workspace_bytes(s.B, s.T, s.H, s.H, s.D);
  alloy::cuda_check(cudaMalloc(&qkv, host.size() * sizeof(alloy::bf16)), "cudaMalloc");
  alloy::cuda_check(cudaMalloc(&dqkv, host.size() * sizeof(alloy::bf16)), "cudaMalloc");
  alloy::cuda_check(cudaMalloc(&out, rows * s.H * s.D * sizeof(alloy::bf16)), "cudaMalloc");
  alloy::cuda_check(cudaMalloc(&dout, rows * s.H * s.D * sizeof(alloy::bf16)), "cudaMalloc");
  alloy::cuda_check(cudaMalloc(&lse, rows * s.H * sizeof(float)), "cudaMalloc");
  alloy::cuda_check(cudaMalloc(&workspace, static_cast<size_t>(workspace_bytes)), "cudaMalloc");
  alloy::cuda_check(cudaMemcpy(qkv, host.data(), host.size() * sizeof(alloy::bf16), cudaMemcpyHostToDevice), "copy");
  alloy::cuda_check(cudaMemcpy(dout, host.data(), rows * s.H * s.D * sizeof(alloy::bf16), cudaMemcpyHostToDevice),
                    "copy");

  const double forward_flops = 2.0 * 2.0 * s.B * s.H * static_cast<double>(s.T) * s.T * s.D / 2.0;
  const double backward_flops = 2.5 * forward_flops;
  const double forward_seconds =
      time_seconds([&] { alloy::cuda_attention_forward(out, lse, qkv, s.B, s.T, s.H, s.H, s.D, nullptr); }, 20);
  const double backward_seconds = time_seconds(
      [&] { alloy::cuda_attention_backward(dqkv, workspace, dout, qkv, out, lse, s.B, s.T, s.H, s.H, s.D, nullptr); },
      20);
  const std::string shape = "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
                            " D=" + std::to_string(s.D);
  const double fwd_tflops = forward_flops / forward_seconds * 1e-12;
  const double bwd_tflops = backward_flops / backward_seconds * 1e-12;
  const double total_tflops = (forward_flops + backward_flops) / (forward_seconds + backward_seconds) * 1e-12;
  std::printf("%-28s %-9s %10.3f %10.1f %8.1f%%\n", shape.c_str(), "forward", forward_seconds * 1e3, fwd_tflops,
              100.0 * fwd_tflops / kPeakTflops);
  std::printf("%-28s %-9s %10.3f %10.1f %8.1f%%\n", shape.c_str(), "backward", backward_seconds * 1e3, bwd_tflops,
              100.0 * bwd_tflops / kPeakTflops);
  std::printf("%-28s %-9s %10.3f %10.1f %8.1f%%\n", shape.c_str(), "fwd+bwd",
              (forward_seconds + backward_seconds) * 1e3, total_tflops, 100.0 * total_tflops / kPeakTflops);
  cudaFree(qkv);
  cudaFree(dqkv);
  cudaFree(out);
  cudaFree(dout);
  cudaFree(lse);
  cudaFree(workspace);
}

}  // namespace

int main() {
  std::string reason;
  if (alloy::cuda_device_count(&reason) == 0) {
    std::printf("bench_attention: no GPU here (%s); nothing measured\n", reason.c_str());
    return 0;
  }
  const alloy::CudaDeviceInfo device = alloy::cuda_device_open(0);
  std::printf("fused causal attention on %s (peak %.0f TFLOP/s dense bf16; causal FLOPs)\n", device.name.c_str(),
              kPeakTflops);
  std::printf("%-28s %-9s %10s %10s %9s\n", "shape", "pass", "ms", "TFLOP/s", "of peak");
  for (const BenchShape& s : {BenchShape{16, 1024, 12, 64}, BenchShape{4, 2048, 32, 128}}) bench_shape(s);
  return 0;
}
