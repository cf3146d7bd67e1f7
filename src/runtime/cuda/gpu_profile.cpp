// Per-layer GPU timing: a two-block copy of the model runs real training passes with phase
// events; a block's time is the mean of its two blocks, so the profile costs seconds even for
// models whose full size would not fit.
#include "runtime/cuda/gpu_profile.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/cuda/gpu_model.hpp"
#include "runtime/cuda/kernels.hpp"
#include "runtime/layer_profile.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double elapsed_seconds(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, from, to), "reading a phase event");
  return 1e-3 * ms;
}

// Owns the events of GpuPhaseEvents for L blocks.
struct PhaseEvents {
  explicit PhaseEvents(size_t blocks) {
    for (auto* list : {&events.forward, &events.backward}) {
      list->resize(blocks + 3);
      for (cudaEvent_t& e : *list) cuda_check(cudaEventCreate(&e), "creating a phase event");
    }
  }
  ~PhaseEvents() {
    for (auto* list : {&events.forward, &events.backward})
      for (cudaEvent_t e : *list) cudaEventDestroy(e);
  }
  GpuPhaseEvents events;
};

// Times of the embedding, one block and the head at micro-batch B (one warm-up, then medians).
std::vector<ProfiledLayer> measure_micro_batch(GpuModel& model, int B, int T, int repeats) {
  const size_t L = static_cast<size_t>(model.host->spec.num_layers);
  const int64_t N = int64_t{B} * T;
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % model.host->spec.vocab_size);
  PhaseEvents phases(L);
  model.phases = &phases.events;
  const auto& f = phases.events.forward;
  const auto& b = phases.events.backward;
  // [kind][forward, backward] samples
  std::vector<double> samples[3][2];
  for (int r = 0; r <= repeats; ++r) {
    GpuActivations pass;
    try {
      gpu_activations_begin(model, pass, tokens.data(), tokens.data(), B, T);
      gpu_model_forward(model, pass);
      gpu_model_backward(model, pass, 0, static_cast<int>(L), 1.0f);
    } catch (const Error&) {  // out of memory: what the pass took goes back before the caller goes on
      model.phases = nullptr;
      gpu_activations_release(model, pass);
      throw;
    }
    gpu_activations_release(model, pass);
    cuda_check(cudaStreamSynchronize(model.stream), "profiling a step");
    if (r == 0) continue;
    samples[0][0].push_back(elapsed_seconds(f[0], f[1]));
    samples[1][0].push_back(elapsed_seconds(f[1], f[L + 1]) / static_cast<double>(L));
    samples[2][0].push_back(elapsed_seconds(f[L + 1], f[L + 2]));
    samples[2][1].push_back(elapsed_seconds(b[0], b[1]));
    samples[1][1].push_back(elapsed_seconds(b[1], b[L + 1]) / static_cast<double>(L));
    samples[0][1].push_back(elapsed_seconds(b[L + 1], b[L + 2]));
  }
  model.phases = nullptr;
  std::vector<ProfiledLayer> layers;
  const LayerKind kinds[3] = {LayerKind::LayerKind_embedding, LayerKind::LayerKind_block, LayerKind::LayerKind_head};
  for (int k = 0; k < 3; ++k) layers.push_back({kinds[k], B, T, 1, false, median(samples[k][0]), median(samples[k][1])});
  return layers;
}

// Seconds per parameter of the optimizer step (sum of squares, then AdamW) over the model's
// parameters, median of `repeats`.
double measure_optimizer(GpuModel& model, int repeats) {
  const int64_t n = model.num_parameters;
  float* m = model.arena->allocate_floats(n, "adamw.m (profile)");
  float* v = model.arena->allocate_floats(n, "adamw.v (profile)");
  float* sum = model.arena->allocate_floats(1, "norm (profile)");
  cuda_check(cudaMemsetAsync(m, 0, static_cast<size_t>(n) * sizeof(float), model.stream), "profile buffers");
  cuda_check(cudaMemsetAsync(v, 0, static_cast<size_t>(n) * sizeof(float), model.stream), "profile buffers");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "event");
  cuda_check(cudaEventCreate(&stop), "event");
  std::vector<double> samples;
  for (int r = 0; r <= repeats; ++r) {
    cuda_check(cudaEventRecord(start, model.stream), "event");
    cuda_check(cudaMemsetAsync(sum, 0, sizeof(float), model.stream), "profile buffers");
    cuda_sum_squares(sum, model.grads, n, model.stream);
    cuda_adamw_update(model.params, model.weights, model.grads, m, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, r + 1,
                      model.stream);
    cuda_check(cudaEventRecord(stop, model.stream), "event");
    cuda_check(cudaEventSynchronize(stop), "profiling the optimizer");
    if (r > 0) samples.push_back(elapsed_seconds(start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  model.arena->release(sum);
  model.arena->release(v);
  model.arena->release(m);
  return median(samples) / static_cast<double>(n);
}

}  // namespace

GpuProfile gpu_profile_measure(const ModelSpec& spec, const TrainSpec& train, int device, int repeats,
                               const std::function<void(const std::string&)>& progress) {
  model_require_dense(spec, "the GPU profiler");
  GpuProfile out;
  out.device = cuda_device_open(device);
  ModelSpec two_blocks = spec;
  two_blocks.num_layers = std::min<int64_t>(spec.num_layers, 2);
  Arena host_arena(int64_t{1} << 40, "host");
  Model host(two_blocks, host_arena);
  model_init_weights(host, train.seed);
  Arena arena(out.device.free_memory_bytes - (int64_t{1} << 30), out.device.name, cuda_arena_memory());
  const CudaStream compute_stream;
  cudaStream_t stream = compute_stream.get();
  {
    GpuModel model(host, arena, stream);
    out.gemm_peak_flops = cuda_matmul_peak_flops(model.matmul);
    std::vector<int> micro_batches;
    for (const LayerShape& s : layer_profile_shapes(spec, train, 1))
      if (s.kind == LayerKind::LayerKind_block) micro_batches.push_back(s.micro_batch);
    const int T = static_cast<int>(train.seq_len);
    for (int B : micro_batches) {
      if (!out.skipped_micro_batches.empty()) {  // a smaller one did not fit
        out.skipped_micro_batches.push_back(B);
        continue;
      }
      progress(fmt::format("profile micro-batch {} x {} tokens", B, T));
      try {
        for (const ProfiledLayer& l : measure_micro_batch(model, B, T, repeats)) out.layers.push_back(l);
      } catch (const Error& e) {
        const std::string message = e.what();
        if (message.find("out of device memory") == std::string::npos && message.find("could not back") == std::string::npos) {
          throw;
        }
        out.skipped_micro_batches.push_back(B);
      }
    }
    out.optimizer_seconds_per_parameter = measure_optimizer(model, repeats);
  }
  return out;
}

}  // namespace alloy
