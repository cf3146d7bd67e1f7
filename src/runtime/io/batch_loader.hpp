// Seeded, reproducible (B, T) input/target batches from a token file. A batch is a pure
// function of (seed, step), so saving those two numbers is enough to resume exactly; ranks of a
// data-parallel group each take a contiguous share [begin, end) of the same global batch.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "runtime/io/token_file.hpp"

namespace alloy {

enum class BatchSampling {
  // Training: windows of T+1 tokens in a fresh pseudo-random order each epoch (every window once
  // per epoch) with a pseudo-random per-epoch shift of the window grid.
  BatchSampling_shuffled,
  // Validation: the fixed windows 0, 1, 2, ... in file order; batch k is always the same.
  BatchSampling_sequential,
};

struct BatchLoaderOptions {
  std::int64_t batch_size = 0;  // B: sequences in the global batch (all ranks together)
  std::int64_t seq_len = 0;     // T: tokens per sequence
  std::uint64_t seed = 0;
  BatchSampling sampling = BatchSampling::BatchSampling_shuffled;
  std::int64_t sample_begin = 0;  // this rank's samples of the global batch: [begin, end)
  std::int64_t sample_end = -1;   // -1 means batch_size (the whole batch)
};

class BatchLoader {
 public:
  const TokenFile& file() const { return file_; }
  const BatchLoaderOptions& options() const { return options_; }
  // Sequences this rank receives per batch: sample_end - sample_begin.
  std::int64_t local_batch_size() const { return options_.sample_end - options_.sample_begin; }
  // Number of distinct windows of T+1 tokens: floor((tokens - 1) / T).
  std::int64_t window_count() const { return window_count_; }
  // Full batches before windows repeat: window_count / B (the size of a validation pass).
  std::int64_t batches_per_epoch() const { return window_count_ / options_.batch_size; }
  // Steps consumed by batch_loader_next so far.
  std::uint64_t step() const { return step_; }

 private:
  friend BatchLoader batch_loader_create(TokenFile file, const BatchLoaderOptions& options);
  friend void batch_loader_next(BatchLoader& loader, std::int32_t* inputs, std::int32_t* targets);
  friend void batch_loader_state_restore(BatchLoader& loader, std::span<const std::uint64_t> words);
  TokenFile file_;
  BatchLoaderOptions options_;
  std::int64_t window_count_ = 0;
  std::uint64_t step_ = 0;
};

// Takes ownership of `file`. Errors: B or T below 1, a sample range outside [0, B) or empty,
// and a file with fewer than B*T+1 tokens (less than one batch of distinct data).
BatchLoader batch_loader_create(TokenFile file, const BatchLoaderOptions& options);

// inputs, targets: (local_batch_size, T), row-major; targets[b][t] is the token after inputs[b][t].
// Batch number `step`, independent of the loader's own step counter.
void batch_loader_read(const BatchLoader& loader, std::uint64_t step, std::int32_t* inputs, std::int32_t* targets);
// Batch number step(), then advances the counter.
void batch_loader_next(BatchLoader& loader, std::int32_t* inputs, std::int32_t* targets);

// Start offset (in tokens) of global sample `sample` of batch `step`; the window is T+1 tokens.
std::int64_t batch_loader_window_begin(const BatchLoader& loader, std::uint64_t step, std::int64_t sample);

// State for checkpoints as plain words: {format version, seed, step, B, T, sampling}.
std::vector<std::uint64_t> batch_loader_state_save(const BatchLoader& loader);
// Restores seed and step. Errors when the words are malformed or were saved with another
// batch size, sequence length or sampling mode (the batches would differ from the saved run).
void batch_loader_state_restore(BatchLoader& loader, std::span<const std::uint64_t> words);

// The contiguous share [begin, end) of a global batch of `batch_size` that `rank` of `world`
// takes; shares differ by at most one sample and together cover the batch exactly.
std::pair<std::int64_t, std::int64_t> batch_shard_range(std::int64_t batch_size, int rank, int world);

// A pseudo-random bijection of [0, count) chosen by `key` (Feistel network, cycle walking).
std::uint64_t index_permute(std::uint64_t index, std::uint64_t count, std::uint64_t key);

}  // namespace alloy
