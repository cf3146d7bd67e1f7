// Layer timing for profiles: a one-block (or embedding-only, or head-only) shard of the model,
// run through the same chunk passes as training.
#include "runtime/layer_profile.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <cblas.h>

#include "runtime/arena.hpp"
#include "runtime/cpu/optimizer.hpp"
#include "runtime/device_speed.hpp"
#include "runtime/model.hpp"
#include "runtime/shard.hpp"
#include "util/clock.hpp"

namespace alloy {

namespace {

// Stands in for the tensor-parallel group when only this rank's compute is timed: sums are left
// out, and a gather copies this rank's piece into the others so every row holds ordinary values.
class ComputeOnlyTensorParallel : public TensorParallelOps {
 public:
  explicit ComputeOnlyTensorParallel(int tp) : tp_(tp) {}
  void all_reduce_sum(float*, int64_t) override {}
  void all_reduce_max(float*, int64_t) override {}
  void all_gather(float* data, int64_t piece) override {
    for (int t = 1; t < tp_; ++t) std::memcpy(data + t * piece, data, static_cast<size_t>(piece) * sizeof(float));
  }
  void reduce_scatter(float*, int64_t) override {}

 private:
  int tp_;
};

void fill_small(float* data, int64_t n) {
  for (int64_t i = 0; i < n; ++i) data[i] = 0.01f * std::sin(0.37f * static_cast<float>(i % 1000));
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Wall seconds of `work` as an emulated device `slowdown` times slower runs it: stretched by
// a ComputeStretch as training stretches each compute operation.
template <typename Work>
double stretched_seconds(double slowdown, const Work& work) {
  const auto start = std::chrono::steady_clock::now();
  ComputeStretch stretch(slowdown);
  work();
  stretch.finish();
  return seconds_since(start);
}

// CPU seconds of a fixed cache-resident GEMM workload (eight 192^3 products), the fastest of
// three: how fast this core computes right now.
double reference_cpu_seconds() {
  constexpr int n = 192;
  static const std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f);
  std::vector<float> c(n * n);
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const double start = thread_cpu_seconds();
    for (int k = 0; k < 8; ++k)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double seconds = thread_cpu_seconds() - start;
    best = trial == 0 ? seconds : std::min(best, seconds);
  }
  return best;
}

}  // namespace

std::vector<LayerShape> layer_profile_shapes(const ModelSpec& model, const TrainSpec& train, int max_tp) {
  model_require_dense(model, "the layer profiler");
  std::vector<int> tps;
  for (int tp = 1; tp <= max_tp; tp *= 2) {
    if (model.num_heads % tp == 0 && model.num_kv_heads % tp == 0 && model.ffn_hidden_size % tp == 0) tps.push_back(tp);
  }
  std::vector<LayerShape> shapes;
  for (const LayerKind kind : {LayerKind::LayerKind_embedding, LayerKind::LayerKind_block, LayerKind::LayerKind_head})
    for (int b = 1; b <= train.global_batch_sequences; ++b) {
      if (train.global_batch_sequences % b != 0) continue;
      for (int tp : tps)
        for (bool sp : {false, true}) {
          if (sp && (tp == 1 || (int64_t{b} * train.seq_len) % tp != 0)) continue;
          shapes.push_back({kind, b, static_cast<int>(train.seq_len), tp, sp});
        }
    }
  return shapes;
}

LayerTiming layer_profile_measure(const ModelSpec& spec, const LayerShape& shape, int repeats, double slowdown) {
  ModelShard shard;
  shard.has_embedding = shape.kind == LayerKind::LayerKind_embedding;
  shard.has_head = shape.kind == LayerKind::LayerKind_head;
  if (shape.kind == LayerKind::LayerKind_block) shard.block_ranges = {{0, 1}};
  shard.tp = shape.tp;
  shard.sequence_parallel = shape.sequence_parallel;
  return shard_profile_measure(spec, shard, shape.micro_batch, shape.seq_len, repeats, slowdown);
}

LayerTiming shard_profile_measure(const ModelSpec& spec, const ModelShard& shard, int micro_batch, int seq_len, int repeats,
                                  double slowdown) {
  Arena arena(int64_t{1} << 40);
  Model model(spec, arena, shard);
  model_init_weights(model, 1);
  ComputeOnlyTensorParallel ops(shard.tp);
  model.tp_ops = &ops;
  const int B = micro_batch, T = seq_len;
  const int64_t N = int64_t{B} * T;
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7919) % spec.vocab_size);
  int blocks = 0;
  for (const auto& [begin, end] : shard.block_ranges) blocks += end - begin;
  std::vector<double> forward, backward;
  for (int r = 0; r <= repeats; ++r) {  // the first run warms caches and the arena
    ChunkPass pass;
    chunk_begin(model, pass, 0, blocks, shard.has_embedding, shard.has_head, tokens.data(), tokens.data(), B, T);
    if (!shard.has_embedding) fill_small(pass.input, N * spec.hidden_size);
    const double f = stretched_seconds(slowdown, [&] { chunk_forward(model, pass); });
    if (!shard.has_head) fill_small(chunk_output_gradient(model, pass), N * spec.hidden_size);
    const double b = stretched_seconds(slowdown, [&] { chunk_backward(model, pass, 0, blocks, 1.0f); });
    chunk_release(model, pass);
    if (r == 0) continue;
    forward.push_back(f);
    backward.push_back(b);
  }
  return {median(forward), median(backward)};
}

double profile_optimizer_seconds_per_parameter(int repeats, double slowdown) {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> params(static_cast<size_t>(n), 0.01f), grads(params.size(), 0.001f), m(params.size(), 0.0f),
      v(params.size(), 0.0f);
  const AdamWHyper hyper;
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {
    double squares = 0;
    const double seconds = stretched_seconds(slowdown, [&] {
      squares = square_sum(grads.data(), n);  // as the CPU backend sums them for the norm
      adamw_update(params.data(), m.data(), v.data(), grads.data(), n, hyper, r + 1);
    });
    if (r > 0 && squares > 0) times.push_back(seconds / static_cast<double>(n));
  }
  return median(times);
}

double profile_memory_bandwidth(int repeats) {
  const size_t n = size_t{1} << 25;  // 128 MiB per buffer
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel for
    for (size_t i = 0; i < n; ++i) a[i] = a[i] * 0.5f + b[i];
    const double seconds = seconds_since(start);
    best = std::max(best, 3.0 * static_cast<double>(n) * sizeof(float) / seconds);  // two reads, one write
  }
  return best;
}

LayerSweep layer_profile_sweep(const ModelSpec& model, const std::vector<LayerShape>& shapes,
                               const LayerSweepOptions& options, const std::function<void(int, size_t)>& progress) {
  // [shape][round] and [round]: raw measurements with the reference run right after each.
  std::vector<std::vector<LayerTiming>> layers(shapes.size());
  std::vector<std::vector<double>> layer_references(shapes.size());
  std::vector<double> optimizer, optimizer_references, references;
  for (int round = 0; round < options.rounds; ++round) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (progress) progress(round, i);
      layers[i].push_back(layer_profile_measure(model, shapes[i], options.repeats, options.slowdown));
      layer_references[i].push_back(reference_cpu_seconds());
      references.push_back(layer_references[i].back());
    }
    optimizer.push_back(profile_optimizer_seconds_per_parameter(options.repeats, options.slowdown));
    optimizer_references.push_back(reference_cpu_seconds());
    references.push_back(optimizer_references.back());
  }
  const double typical = median(references);
  LayerSweep sweep;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<double> forward, backward;
    for (size_t r = 0; r < layers[i].size(); ++r) {
      forward.push_back(layers[i][r].forward_seconds * typical / layer_references[i][r]);
      backward.push_back(layers[i][r].backward_seconds * typical / layer_references[i][r]);
    }
    sweep.layers.push_back({median(forward), median(backward)});
  }
  for (size_t r = 0; r < optimizer.size(); ++r) optimizer[r] *= typical / optimizer_references[r];
  sweep.optimizer_seconds_per_parameter = median(optimizer);
  std::sort(references.begin(), references.end());
  sweep.reference_spread = references[references.size() * 9 / 10] / references[references.size() / 10];
  return sweep;
}

}  // namespace alloy
