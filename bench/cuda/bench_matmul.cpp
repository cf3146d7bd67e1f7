// cuBLASLt linear layers at GPT-2-small training shapes (16 x 1024 tokens): forward, input
// gradient and weight gradient of each layer, in TFLOP/s against the square-GEMM rate measured
// in the same run and against the H200's datasheet bf16 peak. Exits 0 with a message when no
// GPU is present.
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/cuda/device.hpp"
#include "runtime/cuda/matmul.hpp"

using namespace alloy;

namespace {

constexpr double kDatasheetBf16Flops = 989.4e12;  // H100/H200 SXM dense bf16 (catalog: h200-sxm)

struct Layer {
  const char* name;
  int K, M, ldo;
};

template <typename T>
T* device_alloc(int64_t count) {
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, static_cast<size_t>(count) * sizeof(T)), "bench buffers");
  cuda_check(cudaMemset(p, 0, static_cast<size_t>(count) * sizeof(T)), "bench buffers");
  return static_cast<T*>(p);
}

// Mean seconds of `repeats` runs of fn after two warm-ups.
template <typename Fn>
double time_seconds(Fn fn, int repeats) {
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "event");
  cuda_check(cudaEventCreate(&stop), "event");
  fn();
  fn();
  cuda_check(cudaEventRecord(start, nullptr), "event");
  for (int r = 0; r < repeats; ++r) fn();
  cuda_check(cudaEventRecord(stop, nullptr), "event");
  cuda_check(cudaEventSynchronize(stop), "bench");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, start, stop), "event");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1e-3 / repeats;
}

}  // namespace

int main() {
  std::string reason;
  if (cuda_device_count(&reason) == 0) {
    std::printf("bench_matmul: no GPU here (%s); nothing measured\n", reason.c_str());
    return 0;
  }
  const CudaDeviceInfo info = cuda_device_open(0);
  CudaMatmul matmul;
  const double square = cuda_matmul_peak_flops(matmul, 8192, 10);
  std::printf("%s: 8192^3 bf16 GEMM %.1f TFLOP/s (%.1f%% of the datasheet's %.0f)\n\n", info.name.c_str(),
              square / 1e12, 100.0 * square / kDatasheetBf16Flops, kDatasheetBf16Flops / 1e12);
  const int N = 16 * 1024;
  const std::vector<Layer> layers = {{"attn.qkv 768->2304", 768, 2304, 2304},
                                     {"attn.out 768->768", 768, 768, 768},
                                     {"mlp.up 768->3072", 768, 3072, 3072},
                                     {"mlp.down 3072->768", 3072, 768, 768},
                                     {"lm_head 768->50257", 768, 50257, 50304}};
  std::printf("%-22s %-9s %10s %12s %10s %10s\n", "layer", "product", "ms", "TFLOP/s", "% square", "% sheet");
  for (const Layer& l : layers) {
    bf16* inp = device_alloc<bf16>(int64_t{N} * l.K);
    bf16* w = device_alloc<bf16>(int64_t{l.M} * l.K);
    bf16* out = device_alloc<bf16>(int64_t{N} * l.ldo);
    float* dw = device_alloc<float>(int64_t{l.M} * l.K);
    const double flops = 2.0 * N * static_cast<double>(l.K) * l.M;
    const std::pair<const char*, double> runs[] = {
        {"forward", time_seconds([&] { matmul.forward(out, inp, w, nullptr, nullptr, N, l.K, l.M, l.ldo, nullptr); }, 20)},
        {"d input", time_seconds([&] { matmul.backward_input(inp, out, w, N, l.K, l.M, l.ldo, false, nullptr); }, 20)},
        {"d weight", time_seconds([&] { matmul.backward_weight(dw, out, inp, N, l.K, l.M, l.ldo, nullptr); }, 20)}};
    for (const auto& [what, seconds] : runs) {
      std::printf("%-22s %-9s %10.3f %12.1f %10.1f %10.1f\n", l.name, what, seconds * 1e3, flops / seconds / 1e12,
                  100.0 * flops / seconds / square, 100.0 * flops / seconds / kDatasheetBf16Flops);
    }
    cudaFree(inp);
    cudaFree(w);
    cudaFree(out);
    cudaFree(dw);
  }
  return 0;
}
