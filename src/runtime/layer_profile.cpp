// Layer timing for profiles: a one-block (or embedding-only, or head-only) shard of the model,
// run through the same chunk passes as training.
#include "runtime/layer_profile.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "runtime/arena.hpp"
#include "runtime/cpu/optimizer.hpp"
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

}  // namespace

std::vector<LayerShape> layer_profile_shapes(const ModelSpec& model, const TrainSpec& train, int max_tp) {
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

LayerTiming layer_profile_measure(const ModelSpec& spec, const LayerShape& shape, int repeats) {
  ModelShard shard;
  shard.has_embedding = shape.kind == LayerKind::LayerKind_embedding;
  shard.has_head = shape.kind == LayerKind::LayerKind_head;
  if (shape.kind == LayerKind::LayerKind_block) shard.block_ranges = {{0, 1}};
  shard.tp = shape.tp;
  shard.sequence_parallel = shape.sequence_parallel;
  Arena arena(int64_t{1} << 40);
  Model model(spec, arena, shard);
  model_init_weights(model, 1);
  ComputeOnlyTensorParallel ops(shape.tp);
  model.tp_ops = &ops;
  const int B = shape.micro_batch, T = shape.seq_len;
  const int64_t N = int64_t{B} * T;
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7919) % spec.vocab_size);
  const int blocks = shape.kind == LayerKind::LayerKind_block ? 1 : 0;
  std::vector<double> forward, backward;
  for (int r = 0; r <= repeats; ++r) {  // the first run warms caches and the arena
    ChunkPass pass;
    chunk_begin(model, pass, 0, blocks, shard.has_embedding, shard.has_head, tokens.data(), tokens.data(), B, T);
    if (!shard.has_embedding) fill_small(pass.input, N * spec.hidden_size);
    auto start = std::chrono::steady_clock::now();
    chunk_forward(model, pass);
    const double f = seconds_since(start);
    if (!shard.has_head) fill_small(chunk_output_gradient(model, pass), N * spec.hidden_size);
    start = std::chrono::steady_clock::now();
    chunk_backward(model, pass, 0, blocks, 1.0f);
    const double b = seconds_since(start);
    chunk_release(model, pass);
    if (r == 0) continue;
    forward.push_back(f);
    backward.push_back(b);
  }
  return {median(forward), median(backward)};
}

double profile_optimizer_seconds_per_parameter(int repeats) {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> params(static_cast<size_t>(n), 0.01f), grads(params.size(), 0.001f), m(params.size(), 0.0f),
      v(params.size(), 0.0f);
  const AdamWHyper hyper;
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    double squares = 0;
#pragma omp parallel for reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) squares += static_cast<double>(grads[i]) * grads[i];
    adamw_update(params.data(), m.data(), v.data(), grads.data(), n, hyper, r + 1);
    const double seconds = seconds_since(start);
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

}  // namespace alloy
