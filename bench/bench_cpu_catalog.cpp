// Measures on one thread of this machine what the catalog's `cpu` entry and the CPU runtime's
// traits stand for (docs/catalog.md, [23]): the runtime's GEMM rate at small-gpt's shapes and
// the curve that fits it, the time of the element-wise kernels around the GEMMs against the
// bytes the cost model counts for them, one core's streaming memory bandwidth, and AdamW's
// seconds per parameter. Times are the process's CPU time over the runtime's kernel timers
// (runtime/profile.hpp), so other load on the machine stretches them less than wall time would;
// each figure is the median of --rounds rounds, the fastest of three runs in each for the
// whole-buffer figures; then the whole model's GEMMs against its layers' (the cold reads of its
// weights), and every figure beside the catalog's entry. The shared-memory link is measured under mpirun
// by `alloy comm-check` and `alloy profile` (docs/catalog.md says how).
//   bench_cpu_catalog [--rounds R]
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cost/layer_cost.hpp"
#include "cost/runtime_traits.hpp"
#include "hw/catalog.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/cpu/optimizer.hpp"
#include "runtime/layer_profile.hpp"
#include "runtime/profile.hpp"
#include "runtime/threads.hpp"
#include "spec/model.hpp"
#include "util/clock.hpp"

namespace {

using alloy::KernelKind;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One layer shape's forward + backward, split as the runtime's kernel timers split it: seconds
// per pass pair.
struct LayerSplit {
  double matmul_seconds = 0;     // the linear layers' GEMMs
  double attention_seconds = 0;  // scores, softmax, context (their GEMMs included)
  double other_seconds = 0;      // norms, activations, residual adds, embedding, loss
};

// Steady CPU seconds of `kind` per pass pair of `measure(pairs)` (a layer or shard measurement of
// that many pass pairs after its warm-up pair), by the kernel timers. The warm-up pair touches
// fresh arena pages for the first time and runs 1.5-3x as long as the others; a training step
// reuses its pages. So it is the difference between 1 + `repeats` pairs and a single pair, over
// `repeats`.
template <typename Measure>
std::array<double, static_cast<size_t>(KernelKind::KernelKind_count)> steady_kernel_seconds(const Measure& measure, int repeats) {
  const auto timed = [&](int pairs) {
    alloy::profile_reset();
    alloy::profile_enable(true);
    measure(pairs);
    alloy::profile_enable(false);
    return alloy::profile_read().cpu_seconds;
  };
  const auto one = timed(1);
  auto steady = timed(1 + repeats);
  for (size_t k = 0; k < steady.size(); ++k) steady[k] = (steady[k] - one[k]) / repeats;
  return steady;
}

double of_kind(const std::array<double, static_cast<size_t>(KernelKind::KernelKind_count)>& seconds, KernelKind kind) {
  return seconds[static_cast<size_t>(kind)];
}

LayerSplit layer_split(const alloy::ModelSpec& model, const alloy::LayerShape& shape, int repeats) {
  const auto steady =
      steady_kernel_seconds([&](int pairs) { alloy::layer_profile_measure(model, shape, pairs); }, repeats);
  LayerSplit s;
  s.matmul_seconds = of_kind(steady, KernelKind::KernelKind_matmul);
  s.attention_seconds = of_kind(steady, KernelKind::KernelKind_attention);
  s.other_seconds = of_kind(steady, KernelKind::KernelKind_norm) + of_kind(steady, KernelKind::KernelKind_elementwise) +
                    of_kind(steady, KernelKind::KernelKind_embedding) + of_kind(steady, KernelKind::KernelKind_loss);
  return s;
}

// Matmul CPU seconds per pass pair of the whole model (embedding, every block, head) at
// micro-batch `b` and tensor-parallel degree `tp`, the warm-up pair left out as in layer_split.
// Back to back, its passes evict each other's weights (small-gpt's 16.8 MB of weights and as
// much of gradients against this machine's 32 MiB L3), as a training step's do.
double whole_model_matmul_seconds(const alloy::ModelSpec& model, int b, int seq, int tp, int repeats) {
  alloy::ModelShard shard;
  shard.has_embedding = true;
  shard.has_head = true;
  shard.block_ranges = {{0, static_cast<int>(model.num_layers)}};
  shard.tp = tp;
  const auto steady =
      steady_kernel_seconds([&](int pairs) { alloy::shard_profile_measure(model, shard, b, seq, pairs); }, repeats);
  return of_kind(steady, KernelKind::KernelKind_matmul);
}

// The bytes a layer's GEMMs read and write of its weights and weight gradients in a pass pair,
// as the cost model counts them: its traffic less the element-wise kernels' (compute_seconds).
double weight_bytes_per_pass_pair(const alloy::LayerWork& w) {
  return (w.forward_bytes - w.forward_elementwise_bytes) + (w.backward_bytes - 2.0 * w.forward_elementwise_bytes);
}

// A measured GEMM rate at the cost model's (rows, cols) of a layer.
struct RatePoint {
  double rows = 0, cols = 0, flops_per_second = 0;
};

// Fits rate = top x rows / (rows + half_rows) x cols / (cols + half_cols) in log space (least
// squares; half sizes on a grid of 1).
void rate_curve_fit(const std::vector<RatePoint>& points, double* top, double* half_rows, double* half_cols) {
  double best = -1;
  for (int hr = 0; hr <= 512; ++hr)
    for (int hc = 0; hc <= 512; hc += 2) {
      double log_top = 0;
      for (const RatePoint& p : points) log_top += std::log(p.flops_per_second * (p.rows + hr) / p.rows * (p.cols + hc) / p.cols);
      log_top /= static_cast<double>(points.size());
      double squares = 0;
      for (const RatePoint& p : points) {
        const double predicted = log_top + std::log(p.rows / (p.rows + hr) * p.cols / (p.cols + hc));
        squares += (std::log(p.flops_per_second) - predicted) * (std::log(p.flops_per_second) - predicted);
      }
      if (best < 0 || squares < best) {
        best = squares;
        *top = std::exp(log_top);
        *half_rows = hr;
        *half_cols = hc;
      }
    }
}

// CPU seconds of `work` on this thread, the fastest of `repeats` after one warm-up run.
template <typename Work>
double fastest_cpu_seconds(int repeats, const Work& work) {
  work();
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const double start = alloy::thread_cpu_seconds();
    work();
    const double seconds = alloy::thread_cpu_seconds() - start;
    best = r == 0 ? seconds : std::min(best, seconds);
  }
  return best;
}

// FLOP/s of the runtime's matmul_forward on (n, n) x (n, n)^T.
double square_gemm_flops(int n) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  const double seconds = fastest_cpu_seconds(3, [&] { alloy::matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n); });
  return 2.0 * n * static_cast<double>(n) * n / seconds;
}

// Bytes per second of a[i] = 0.5 a[i] + b[i] over two 128 MiB buffers (two reads, one write).
double stream_bytes_per_second() {
  const size_t n = size_t{1} << 25;
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  const double seconds = fastest_cpu_seconds(3, [&] {
    for (size_t i = 0; i < n; ++i) a[i] = a[i] * 0.5f + b[i];
  });
  return 3.0 * static_cast<double>(n) * sizeof(float) / seconds;
}

// Seconds per parameter of the runtime's optimizer step over 4M parameters: the gradient norm,
// then AdamW.
double adamw_seconds_per_parameter() {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> params(static_cast<size_t>(n), 0.01f), grads(params.size(), 0.001f), m(params.size(), 0.0f),
      v(params.size(), 0.0f);
  int64_t step = 0;
  const double seconds = fastest_cpu_seconds(3, [&] {
    alloy::AdamWHyper hyper;
    hyper.grad_scale = static_cast<float>(1.0 / (1.0 + alloy::grad_norm(grads.data(), n)));
    alloy::adamw_update(params.data(), m.data(), v.data(), grads.data(), n, hyper, ++step);
  });
  return seconds / static_cast<double>(n);
}

// What the layer table measures: the fitted GEMM curve, the element-wise rate, and each
// layer's matmul seconds for the whole-model comparison.
struct LayerFigures {
  double top = 0, half_rows = 0, half_cols = 0;  // the GEMM curve
  double other_bytes_per_second = 0;             // a block's element-wise kernels (median)
  std::map<std::tuple<bool, int, int>, double> matmul_seconds;  // (block, b, tp): per pass pair
};

constexpr int kSeqLen = 64;
constexpr int kRepeats = 5;
constexpr alloy::Precision kFp32 = alloy::Precision::Precision_fp32;

// Times the block and the head alone at micro-batch 1-8 and tp 1-2, prints a row each, and fits
// the GEMM curve to them.
LayerFigures layer_table(const alloy::ModelSpec& model, int rounds) {
  std::printf("one thread; medians of %d rounds; CPU seconds per forward + backward\n", rounds);
  std::printf("%-22s %10s %10s %10s %12s %12s %12s\n", "layer", "matmul", "attention", "other", "GEMM rate", "other bytes",
              "other rate");
  // Discarded: OpenBLAS's idle worker thread spins for about 0.1 s after the library loads, and
  // the kernel timers read the process's CPU time, so the first measurement would count it.
  layer_split(model, {alloy::LayerKind::LayerKind_block, 1, kSeqLen, 1, false}, kRepeats);
  LayerFigures f;
  std::vector<RatePoint> points;
  std::vector<double> other_rates;
  for (const alloy::LayerKind kind : {alloy::LayerKind::LayerKind_block, alloy::LayerKind::LayerKind_head})
    for (int b : {1, 2, 4, 8})
      for (int tp : {1, 2}) {
        std::vector<double> matmul, attention, other;
        for (int r = 0; r < rounds; ++r) {
          const LayerSplit s = layer_split(model, {kind, b, kSeqLen, tp, false}, kRepeats);
          matmul.push_back(s.matmul_seconds);
          attention.push_back(s.attention_seconds);
          other.push_back(s.other_seconds);
        }
        const bool block = kind == alloy::LayerKind::LayerKind_block;
        const alloy::LayerWork w =
            block ? alloy::block_work(model, b, kSeqLen, tp, false, kFp32) : alloy::head_work(model, b, kSeqLen, tp, kFp32);
        // The linear layers' FLOPs: a block's less its attention products; the head's all.
        const double linear_flops = 3.0 * (block ? w.forward_flops - w.selective_flops : w.forward_flops);
        // Element-wise bytes the cost model counts in a pass pair, less the score matrix's (the
        // attention kernel's).
        const double other_bytes = 3.0 * (w.forward_elementwise_bytes - w.forward_score_bytes);
        const double rate = linear_flops / median(matmul);
        f.matmul_seconds[{block, b, tp}] = median(matmul);
        points.push_back({w.matmul_rows, w.matmul_cols, rate});
        if (block) other_rates.push_back(other_bytes / median(other));
        std::printf("%-5s mb %d tp %d %8s %8.3f ms %7.3f ms %7.3f ms %7.1f GF/s %9.2f MB %7.2f GB/s\n", block ? "block" : "head", b, tp,
                    "", 1e3 * median(matmul), 1e3 * median(attention), 1e3 * median(other), rate / 1e9, other_bytes / 1e6,
                    other_bytes / median(other) / 1e9);
      }
  rate_curve_fit(points, &f.top, &f.half_rows, &f.half_cols);
  f.other_bytes_per_second = median(other_rates);
  return f;
}

// The same GEMMs inside the whole model: what they take beyond the layers alone, against the
// weight bytes the cost model counts, is the rate at which they read their weights cold. Prints
// a row per shape; returns the median rate.
double cold_weight_table(const alloy::ModelSpec& model, const LayerFigures& layers, int rounds) {
  std::printf("\nthe whole model (embedding, %d blocks, head) against its layers alone: matmul seconds per forward + backward\n",
              static_cast<int>(model.num_layers));
  std::printf("%-12s %10s %10s %10s %12s %14s\n", "shape", "whole", "layers", "extra", "weight bytes", "cold rate");
  std::vector<double> cold_rates;
  const double blocks = static_cast<double>(model.num_layers);
  for (int b : {1, 2, 4, 8})
    for (int tp : {1, 2}) {
      std::vector<double> whole;
      for (int r = 0; r < rounds; ++r) whole.push_back(whole_model_matmul_seconds(model, b, kSeqLen, tp, kRepeats));
      const double alone = blocks * layers.matmul_seconds.at({true, b, tp}) + layers.matmul_seconds.at({false, b, tp});
      const double bytes = blocks * weight_bytes_per_pass_pair(alloy::block_work(model, b, kSeqLen, tp, false, kFp32)) +
                           weight_bytes_per_pass_pair(alloy::head_work(model, b, kSeqLen, tp, kFp32));
      const double extra = median(whole) - alone;
      cold_rates.push_back(bytes / extra);
      std::printf("mb %d tp %d %10.3f ms %7.3f ms %7.3f ms %9.2f MB %9.2f GB/s\n", b, tp, 1e3 * median(whole), 1e3 * alone,
                  1e3 * extra, bytes / 1e6, bytes / extra / 1e9);
    }
  return median(cold_rates);
}

// This machine's figures beside the catalog's cpu entry and the CPU runtime's traits, as
// measured / entry: how far an un-profiled plan's prices are from this host.
void entry_comparison(const LayerFigures& layers, double sgemm, double bandwidth, double cold_rate, double optimizer_seconds) {
  const alloy::DeviceType& cpu = *alloy::catalog_builtin().find("cpu");
  const alloy::RuntimeTraits& runtime = alloy::runtime_traits(cpu);
  const double entry_top = cpu.peak_flops_fp32 * runtime.matmul_peak_efficiency(kFp32);
  const double entry_optimizer = 28.0 / (runtime.optimizer_bandwidth_share * cpu.memory_bandwidth_bytes_per_second);
  std::printf("\n%-36s %14s %14s %10s\n", "against the catalog's cpu entry", "this machine", "entry", "ratio");
  const auto row = [](const char* what, double measured, double entry, const char* unit, double scale) {
    std::printf("%-36s %10.2f %-3s %10.2f %-3s %9.2fx\n", what, measured * scale, unit, entry * scale, unit, measured / entry);
  };
  row("fp32 peak (sgemm 1024^3)", sgemm, cpu.peak_flops_fp32, "GF", 1e-9);
  row("GEMM curve top", layers.top, entry_top, "GF", 1e-9);
  std::printf("%-36s %10.0f, %-3.0f %10.0f, %-3.0f %10s\n", "GEMM curve half rows, half cols", layers.half_rows, layers.half_cols,
              runtime.matmul_half_rows, runtime.matmul_half_cols, "-");
  row("streaming bandwidth", bandwidth, cpu.memory_bandwidth_bytes_per_second, "GB", 1e-9);
  row("weights read cold", cold_rate, runtime.cold_weight_bandwidth_share * cpu.memory_bandwidth_bytes_per_second, "GB", 1e-9);
  row("optimizer, ns per parameter (warm)", optimizer_seconds, entry_optimizer, "ns", 1e9);
  std::printf("(the entry's optimizer figure is the evicted one on every rank at once: bench_cpu_contention --optimizer)\n");
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  alloy::runtime_set_threads(1);
  const alloy::ModelSpec model = alloy::model_load("small-gpt");
  const LayerFigures layers = layer_table(model, rounds);
  std::vector<double> gemm_peaks, bandwidths, optimizer;
  for (int r = 0; r < rounds; ++r) {
    gemm_peaks.push_back(square_gemm_flops(1024));
    bandwidths.push_back(stream_bytes_per_second());
    optimizer.push_back(adamw_seconds_per_parameter());
  }
  std::printf("GEMM curve fitted to the %zu layers: %.1f GFLOP/s x rows / (rows + %.0f) x cols / (cols + %.0f)\n",
              layers.matmul_seconds.size(), layers.top / 1e9, layers.half_rows, layers.half_cols);
  std::printf("sgemm 1024^3 (the runtime's matmul_forward): %.1f GFLOP/s, so the curve's top is %.2f of it\n",
              median(gemm_peaks) / 1e9, layers.top / median(gemm_peaks));
  std::printf("element-wise kernels of a block: %.2f GB/s of the bytes the cost model counts (median over the shapes)\n",
              layers.other_bytes_per_second / 1e9);
  std::printf("one core streaming a[i] = 0.5 a[i] + b[i] over 128 MiB: %.2f GB/s\n", median(bandwidths) / 1e9);
  std::printf("the optimizer step (gradient norm, AdamW): %.2f ns per parameter\n", median(optimizer) * 1e9);
  const double cold_rate = cold_weight_table(model, layers, rounds);
  std::printf("weights read cold: %.2f GB/s (median over the shapes), %.2f of one core's streaming bandwidth\n", cold_rate / 1e9,
              cold_rate / median(bandwidths));
  entry_comparison(layers, median(gemm_peaks), median(bandwidths), cold_rate, median(optimizer));
  return 0;
}
