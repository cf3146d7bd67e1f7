// Pipeline schedules as the cost model prices them: the activations a stage holds at its peak
// and the step time from per-stage times, for equal and unequal interleaved chunks.
#include <algorithm>

#include "cost/cost_model.hpp"

namespace alloy {

double schedule_micro_batches_in_flight(Schedule schedule, int stages, int stage, int micro_batches, int v) {
  switch (schedule) {
    case Schedule::Schedule_gpipe: return micro_batches;
    case Schedule::Schedule_1f1b: return std::min(micro_batches, stages - stage);
    case Schedule::Schedule_interleaved: {
      // The warm-up's chunk forwards, plus the one the steady state runs before its first
      // backward (none when the warm-up is every chunk); each chunk holds 1/v of the stage's
      // activations.
      const int chunks = std::min(micro_batches * v, interleaved_warmup_chunks(stages, stage, micro_batches, v) + 1);
      return static_cast<double>(chunks) / v;
    }
  }
  return micro_batches;
}

std::vector<int> stage_chunk_blocks(int blocks, int v) {
  std::vector<int> out;
  for (int c = 0; c < v; ++c) out.push_back(chunk_blocks(blocks, v, c));
  return out;
}

double schedule_micro_batches_in_flight(Schedule schedule, int stages, int stage, int micro_batches,
                                        const std::vector<int>& sizes) {
  const int v = static_cast<int>(sizes.size());
  if (std::all_of(sizes.begin(), sizes.end(), [&](int n) { return n == sizes.front(); }))
    return schedule_micro_batches_in_flight(schedule, stages, stage, micro_batches, v);
  // Walk the stage's compute order: warm-up forwards, then one forward and one backward in turn
  // (backwards run the chunks in reverse); the peak follows a forward.
  const int total = micro_batches * v;
  const int warmup = interleaved_warmup_chunks(stages, stage, micro_batches, v);
  const auto chunk = [&](int k) { return interleaved_forward_chunk(k, stages, micro_batches, v); };
  int64_t held = 0;
  for (int k = 0; k < warmup; ++k) held += sizes[chunk(k)];
  int64_t peak = held;
  for (int k = 0; k < total - warmup; ++k) {
    held += sizes[chunk(warmup + k)];
    peak = std::max(peak, held);
    held -= sizes[v - 1 - chunk(k)];
  }
  int64_t blocks = 0;
  for (int n : sizes) blocks += n;
  return static_cast<double>(peak) / static_cast<double>(blocks);
}

double stage_fill_fraction(int blocks, int v) {
  return v <= 1 ? 1.0 : static_cast<double>(chunk_blocks(blocks, v, 0)) / blocks;
}

double pipeline_step_seconds(const std::vector<double>& t, const std::vector<double>& overhead, int m, int v) {
  double sum = 0;
  double steady = 0;
  for (size_t s = 0; s < t.size(); ++s) {
    sum += t[s];
    steady = std::max(steady, (m - 1.0 / v) * t[s] + overhead[s]);
  }
  return sum / v + steady;
}

double pipeline_step_seconds(const std::vector<double>& t, const std::vector<double>& fill, const std::vector<double>& overhead,
                             int m) {
  double sum = 0;
  double steady = 0;
  for (size_t s = 0; s < t.size(); ++s) {
    sum += fill[s] * t[s];
    steady = std::max(steady, (m - fill[s]) * t[s] + overhead[s]);
  }
  return sum + steady;
}

}  // namespace alloy
