// Times every kernel of runtime/cuda/kernels.hpp at GPT-2-small training sizes (16 x 1024 tokens,
// C = 768, F = 3072, V = 50257 padded to 50304, 124M parameters) and prints the bytes each must
// move at least, the achieved GB/s and their fraction of the H200's 4.8 TB/s. The L2 cache is
// flushed before every timed launch, as activations of a training step are not cached either.
// Exits 0 with a message where no GPU is present.
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/cuda/device.hpp"
#include "runtime/cuda/kernels.hpp"

namespace {

using namespace alloy;

constexpr double kPeakBytesPerSecond = 4.8e12;  // H200 HBM3e datasheet
constexpr int kIterations = 20;
constexpr int64_t kFlushBytes = int64_t{256} << 20;  // several times the H200's 50 MiB L2

// Device buffers of the benchmark, freed together at exit.
class DeviceBuffers {
 public:
  ~DeviceBuffers() {
    for (void* p : pointers_) cudaFree(p);
  }
  template <typename T>
  T* allocate(int64_t n) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)), "bench cudaMalloc");
    pointers_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  std::vector<void*> pointers_;
};

constexpr int64_t kFillChunk = int64_t{1} << 20;

std::vector<float> random_chunk(float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> chunk(static_cast<size_t>(kFillChunk));
  for (float& x : chunk) x = normal(rng);
  return chunk;
}

// Fills p: (n) with one random chunk repeated (the values only need to be realistic, not distinct).
void fill_floats(float* p, int64_t n, float scale, uint64_t seed) {
  const std::vector<float> chunk = random_chunk(scale, seed);
  for (int64_t i = 0; i < n; i += kFillChunk) {
    const int64_t count = n - i < kFillChunk ? n - i : kFillChunk;
    cuda_check(cudaMemcpy(p + i, chunk.data(), static_cast<size_t>(count) * sizeof(float), cudaMemcpyHostToDevice),
               "bench fill");
  }
}

void fill_bf16(DeviceBuffers& buffers, bf16* p, int64_t n, float scale, uint64_t seed) {
  float* staging = buffers.allocate<float>(kFillChunk);
  fill_floats(staging, kFillChunk, scale, seed);
  for (int64_t i = 0; i < n; i += kFillChunk) {
    cuda_float_to_bf16(p + i, staging, n - i < kFillChunk ? n - i : kFillChunk, nullptr);
  }
}

std::vector<int32_t> random_ids(int64_t n, int32_t below, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, below - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  return ids;
}

// Mean milliseconds of one launch over kIterations, the L2 flushed before each (not timed).
double time_ms(const std::function<void()>& launch, void* flush) {
  launch();  // warm-up: first-launch costs and lazy module loading
  std::vector<cudaEvent_t> events(2 * kIterations);
  for (cudaEvent_t& e : events) cuda_check(cudaEventCreate(&e), "bench cudaEventCreate");
  for (int i = 0; i < kIterations; ++i) {
    cuda_check(cudaMemsetAsync(flush, i & 0xff, static_cast<size_t>(kFlushBytes), nullptr), "bench L2 flush");
    cuda_check(cudaEventRecord(events[2 * i], nullptr), "bench cudaEventRecord");
    launch();
    cuda_check(cudaEventRecord(events[2 * i + 1], nullptr), "bench cudaEventRecord");
  }
  cuda_check(cudaEventSynchronize(events.back()), "bench kernels");
  double total_ms = 0.0;
  for (int i = 0; i < kIterations; ++i) {
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]), "bench cudaEventElapsedTime");
    total_ms += ms;
  }
  for (cudaEvent_t& e : events) cudaEventDestroy(e);
  return total_ms / kIterations;
}

void report(const char* kernel, const std::string& shape, double bytes, double ms) {
  const double gbps = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-22s %-30s %9.1f %10.1f %8.1f %7.1f%%\n", kernel, shape.c_str(), ms * 1e3, bytes / 1e6, gbps,
              100.0 * gbps * 1e9 / kPeakBytesPerSecond);
}

}  // namespace

int main() {
  std::string reason;
  if (cuda_device_count(&reason) == 0) {
    std::printf("bench_kernels: no GPU here (%s); nothing to time.\n", reason.c_str());
    return 0;
  }
  const CudaDeviceInfo device = cuda_device_open(0);
  std::printf("bench_kernels on %s (%d SMs); mean of %d launches, L2 flushed before each\n", device.name.c_str(),
              device.multiprocessors, kIterations);
  std::printf("%-22s %-30s %9s %10s %8s %8s\n", "kernel", "shape", "us", "MB moved", "GB/s", "of peak");

  const int B = 16, T = 1024, C = 768, F = 3072, V = 50257, ld = 50304, H = 12, D = 64;
  const int N = B * T;
  const int64_t NC = int64_t{N} * C;
  const int64_t NF = int64_t{N} * F;
  const int64_t n_params = 124439808;  // GPT-2 small with tied embeddings
  const double NCd = static_cast<double>(NC);
  const double NFd = static_cast<double>(NF);

  DeviceBuffers buffers;
  void* flush = buffers.allocate<char>(kFlushBytes);
  bf16* x = buffers.allocate<bf16>(NF * 2);  // (N, 2F): fits every activation below
  bf16* y = buffers.allocate<bf16>(NF * 2);
  bf16* g = buffers.allocate<bf16>(NF * 2);
  bf16* wte = buffers.allocate<bf16>(int64_t{V} * C);
  bf16* wpe = buffers.allocate<bf16>(int64_t{T} * C);
  bf16* w = buffers.allocate<bf16>(C);
  bf16* b = buffers.allocate<bf16>(C);
  float* dwte = buffers.allocate<float>(int64_t{V} * C);
  float* dwpe = buffers.allocate<float>(int64_t{T} * C);
  float* dw = buffers.allocate<float>(F);
  float* db = buffers.allocate<float>(F);
  float* mean = buffers.allocate<float>(N);
  float* rstd = buffers.allocate<float>(N);
  float* losses = buffers.allocate<float>(N);
  bf16* logits = buffers.allocate<bf16>(int64_t{N} * ld);
  int32_t* tokens = buffers.allocate<int32_t>(N);
  int32_t* targets = buffers.allocate<int32_t>(N);
  float* params = buffers.allocate<float>(n_params);
  float* grads = buffers.allocate<float>(n_params);
  float* m = buffers.allocate<float>(n_params);
  float* v = buffers.allocate<float>(n_params);
  bf16* params_bf16 = buffers.allocate<bf16>(n_params);
  float* sum = buffers.allocate<float>(1);

  fill_bf16(buffers, x, NF * 2, 1.0f, 1);
  fill_bf16(buffers, y, NF * 2, 1.0f, 2);
  fill_bf16(buffers, g, NF * 2, 1.0f, 3);
  fill_bf16(buffers, wte, int64_t{V} * C, 0.02f, 4);
  fill_bf16(buffers, wpe, int64_t{T} * C, 0.02f, 5);
  fill_bf16(buffers, w, C, 1.0f, 6);
  fill_bf16(buffers, b, C, 0.1f, 7);
  fill_bf16(buffers, logits, int64_t{N} * ld, 2.0f, 8);
  fill_floats(params, n_params, 0.02f, 9);
  fill_floats(grads, n_params, 0.01f, 10);
  cuda_check(cudaMemset(m, 0, static_cast<size_t>(n_params) * sizeof(float)), "bench memset");
  cuda_check(cudaMemset(v, 0, static_cast<size_t>(n_params) * sizeof(float)), "bench memset");
  cuda_check(cudaMemset(dwte, 0, static_cast<size_t>(V) * C * sizeof(float)), "bench memset");
  cuda_check(cudaMemset(dwpe, 0, static_cast<size_t>(T) * C * sizeof(float)), "bench memset");
  cuda_check(cudaMemset(dw, 0, static_cast<size_t>(F) * sizeof(float)), "bench memset");
  cuda_check(cudaMemset(db, 0, static_cast<size_t>(F) * sizeof(float)), "bench memset");
  cuda_check(cudaMemset(sum, 0, sizeof(float)), "bench memset");
  const std::vector<int32_t> token_ids = random_ids(N, V, 11);
  const std::vector<int32_t> target_ids = random_ids(N, V, 12);
  cuda_check(cudaMemcpy(tokens, token_ids.data(), token_ids.size() * 4, cudaMemcpyHostToDevice), "bench upload");
  cuda_check(cudaMemcpy(targets, target_ids.data(), target_ids.size() * 4, cudaMemcpyHostToDevice), "bench upload");
  cuda_layernorm_forward(y, mean, rstd, x, w, b, N, C, 1e-5f, nullptr);  // statistics for the backward
  cuda_check(cudaDeviceSynchronize(), "bench setup");

  const std::string rows_c = "(" + std::to_string(N) + ", " + std::to_string(C) + ")";
  const std::string rows_f = "(" + std::to_string(N) + ", " + std::to_string(F) + ")";
  const double embedding_table_bytes = static_cast<double>(T) * C * 2;

  report("embedding_forward", rows_c, NCd * 2 * 2 + embedding_table_bytes + N * 4.0,
         time_ms([&] { cuda_embedding_forward(y, tokens, wte, wpe, B, T, C, nullptr); }, flush));
  report("embedding_backward", rows_c + " atomics", NCd * 2 + NCd * 4 * 2 + embedding_table_bytes * 4 + N * 4.0,
         time_ms([&] { cuda_embedding_backward(dwte, dwpe, g, tokens, B, T, C, nullptr); }, flush));
  report("layernorm_forward", rows_c, NCd * 2 * 2 + N * 8.0,
         time_ms([&] { cuda_layernorm_forward(y, mean, rstd, x, w, b, N, C, 1e-5f, nullptr); }, flush));
  report("layernorm_backward", rows_c, NCd * 2 * 4 + N * 8.0,
         time_ms([&] { cuda_layernorm_backward(y, dw, db, g, x, w, mean, rstd, N, C, nullptr); }, flush));
  report("rmsnorm_forward", rows_c, NCd * 2 * 2 + N * 4.0,
         time_ms([&] { cuda_rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f, nullptr); }, flush));
  report("rmsnorm_backward", rows_c, NCd * 2 * 4 + N * 4.0,
         time_ms([&] { cuda_rmsnorm_backward(y, dw, g, x, w, rstd, N, C, nullptr); }, flush));
  report("gelu_forward", rows_f, NFd * 2 * 2, time_ms([&] { cuda_gelu_forward(y, x, NF, nullptr); }, flush));
  report("gelu_backward", rows_f, NFd * 2 * 3, time_ms([&] { cuda_gelu_backward(y, x, g, NF, nullptr); }, flush));
  report("swiglu_forward", rows_f + " from 2F", NFd * 2 * 3,
         time_ms([&] { cuda_swiglu_forward(y, x, N, F, nullptr); }, flush));
  report("swiglu_backward", rows_f + " to 2F", NFd * 2 * 5,
         time_ms([&] { cuda_swiglu_backward(y, x, g, N, F, nullptr); }, flush));
  report("residual_forward", rows_c, NCd * 2 * 3, time_ms([&] { cuda_residual_forward(y, x, g, NC, nullptr); }, flush));
  const std::string rope_shape = "B16 T1024 H12+12 D64";
  const double rope_bytes = static_cast<double>(N) * 2 * H * D * 2 * 2;
  report("rope_forward", rope_shape, rope_bytes,
         time_ms([&] { cuda_rope_forward(x, B, T, H, H, D, 10000.0f, nullptr); }, flush));
  report("rope_backward", rope_shape, rope_bytes,
         time_ms([&] { cuda_rope_backward(x, B, T, H, H, D, 10000.0f, nullptr); }, flush));
  for (const int M : {C, 3 * C, F}) {
    report("bias_backward", "(" + std::to_string(N) + ", " + std::to_string(M) + ")", static_cast<double>(N) * M * 2,
           time_ms([&] { cuda_bias_backward(db, g, N, M, nullptr); }, flush));
  }
  const std::string logits_shape = "(" + std::to_string(N) + ", " + std::to_string(V) + "/" + std::to_string(ld) + ")";
  const double logits_bytes = static_cast<double>(N) * ld * 2;
  report("crossentropy", logits_shape + " fwd", logits_bytes,
         time_ms([&] { cuda_crossentropy(logits, losses, targets, N, V, ld, 1.0f / N, false, nullptr); }, flush));
  report("crossentropy", logits_shape + " fwd+bwd", logits_bytes * 2,
         time_ms([&] { cuda_crossentropy(logits, losses, targets, N, V, ld, 1.0f / N, true, nullptr); }, flush));
  const std::string params_shape = "n = " + std::to_string(n_params);
  const double n_paramsd = static_cast<double>(n_params);
  int64_t step = 0;
  report("adamw_update", params_shape, n_paramsd * (4 * 2 + 4 + 4 * 2 + 4 * 2 + 2),
         time_ms(
             [&] {
               cuda_adamw_update(params, params_bf16, grads, m, v, n_params, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f,
                                 ++step, nullptr);
             },
             flush));
  report("sum_squares", params_shape, n_paramsd * 4,
         time_ms([&] { cuda_sum_squares(sum, grads, n_params, nullptr); }, flush));
  report("float_to_bf16", params_shape, n_paramsd * 6,
         time_ms([&] { cuda_float_to_bf16(params_bf16, params, n_params, nullptr); }, flush));
  report("bf16_to_float", params_shape, n_paramsd * 6,
         time_ms([&] { cuda_bf16_to_float(grads, params_bf16, n_params, nullptr); }, flush));
  return 0;
}
