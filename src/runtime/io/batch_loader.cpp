// Reproducible batch sampling from token files (see batch_loader.hpp).
#include "runtime/io/batch_loader.hpp"

#include <bit>
#include <string>

#include "spec/error.hpp"

namespace alloy {

namespace {

constexpr std::uint64_t kStateFormat = 1;
constexpr std::size_t kStateWords = 6;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* sampling_name(BatchSampling sampling) {
  return sampling == BatchSampling::BatchSampling_shuffled ? "shuffled" : "sequential";
}

}  // namespace

std::uint64_t index_permute(std::uint64_t index, std::uint64_t count, std::uint64_t key) {
  if (count <= 1) return 0;
  // Balanced Feistel network on the smallest even number of bits covering count; values that
  // land outside [0, count) are permuted again (cycle walking), which keeps it a bijection.
  int half_bits = (std::bit_width(count - 1) + 1) / 2;
  std::uint64_t mask = (std::uint64_t{1} << half_bits) - 1;
  std::uint64_t x = index;
  do {
    std::uint64_t left = x >> half_bits;
    std::uint64_t right = x & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      std::uint64_t mixed = left ^ (splitmix64(key ^ splitmix64(right + (round << 56))) & mask);
      left = right;
      right = mixed;
    }
    x = (left << half_bits) | right;
  } while (x >= count);
  return x;
}

BatchLoader batch_loader_create(TokenFile file, const BatchLoaderOptions& options) {
  BatchLoaderOptions opts = options;
  if (opts.sample_end < 0) opts.sample_end = opts.batch_size;
  const std::string& path = file.path();
  if (opts.batch_size < 1 || opts.seq_len < 1) {
    throw Error("batch size " + std::to_string(opts.batch_size) + " and sequence length " +
                    std::to_string(opts.seq_len) + " must both be at least 1",
                io_where(path, "batch_size, seq_len"), "check the training config");
  }
  if (opts.sample_begin < 0 || opts.sample_end > opts.batch_size || opts.sample_begin >= opts.sample_end) {
    throw Error("sample range [" + std::to_string(opts.sample_begin) + ", " + std::to_string(opts.sample_end) +
                    ") is empty or outside the global batch of " + std::to_string(opts.batch_size),
                io_where(path, "sample_begin, sample_end"),
                "give every data-parallel rank at least one sample (batch size >= ranks)");
  }
  std::int64_t needed = opts.batch_size * opts.seq_len + 1;
  if (file.token_count() < needed) {
    throw Error("the file has " + std::to_string(file.token_count()) +
                    " tokens, fewer than one batch needs: " + std::to_string(opts.batch_size) + " sequences of " +
                    std::to_string(opts.seq_len) + " tokens need " + std::to_string(needed),
                io_where(path, "header[2] (token count)"), "use more data, or a smaller batch size or sequence length");
  }
  BatchLoader loader;
  loader.window_count_ = (file.token_count() - 1) / opts.seq_len;
  loader.file_ = std::move(file);
  loader.options_ = opts;
  return loader;
}

std::int64_t batch_loader_window_begin(const BatchLoader& loader, std::uint64_t step, std::int64_t sample) {
  const BatchLoaderOptions& opts = loader.options();
  auto windows = static_cast<std::uint64_t>(loader.window_count());
  std::uint64_t global = step * static_cast<std::uint64_t>(opts.batch_size) + static_cast<std::uint64_t>(sample);
  auto seq_len = static_cast<std::uint64_t>(opts.seq_len);
  if (opts.sampling == BatchSampling::BatchSampling_sequential) {
    return static_cast<std::int64_t>((global % windows) * seq_len);
  }
  std::uint64_t epoch = global / windows;
  std::uint64_t key = splitmix64(opts.seed ^ splitmix64(epoch));
  // Tokens left over after the last whole window let the grid shift a little each epoch.
  std::uint64_t slack = static_cast<std::uint64_t>(loader.file().token_count() - 1) - windows * seq_len;
  std::uint64_t shift = splitmix64(key + 1) % (slack + 1);
  return static_cast<std::int64_t>(shift + index_permute(global % windows, windows, key) * seq_len);
}

void batch_loader_read(const BatchLoader& loader, std::uint64_t step, std::int32_t* inputs, std::int32_t* targets) {
  const BatchLoaderOptions& opts = loader.options();
  auto seq_len = static_cast<std::size_t>(opts.seq_len);
  for (std::int64_t sample = opts.sample_begin; sample < opts.sample_end; ++sample) {
    std::int64_t begin = batch_loader_window_begin(loader, step, sample);
    std::size_t row = static_cast<std::size_t>(sample - opts.sample_begin) * seq_len;
    loader.file().tokens_read(begin, {inputs + row, seq_len});
    loader.file().tokens_read(begin + 1, {targets + row, seq_len});
  }
}

void batch_loader_next(BatchLoader& loader, std::int32_t* inputs, std::int32_t* targets) {
  batch_loader_read(loader, loader.step_, inputs, targets);
  ++loader.step_;
}

std::vector<std::uint64_t> batch_loader_state_save(const BatchLoader& loader) {
  const BatchLoaderOptions& opts = loader.options();
  return {kStateFormat,
          opts.seed,
          loader.step(),
          static_cast<std::uint64_t>(opts.batch_size),
          static_cast<std::uint64_t>(opts.seq_len),
          static_cast<std::uint64_t>(opts.sampling)};
}

void batch_loader_state_restore(BatchLoader& loader, std::span<const std::uint64_t> words) {
  const std::string& path = loader.file().path();
  if (words.size() != kStateWords || words[0] != kStateFormat) {
    throw Error("data loader state has " + std::to_string(words.size()) + " words or an unknown format; expected " +
                    std::to_string(kStateWords) + " words of format " + std::to_string(kStateFormat),
                io_where(path, "data loader state"), "resume from a checkpoint written by this version of Alloy");
  }
  const BatchLoaderOptions& opts = loader.options();
  auto saved_batch = static_cast<std::int64_t>(words[3]);
  auto saved_seq = static_cast<std::int64_t>(words[4]);
  if (saved_batch != opts.batch_size || saved_seq != opts.seq_len ||
      words[5] != static_cast<std::uint64_t>(opts.sampling)) {
    throw Error("the saved data loader state is for batches of " + std::to_string(saved_batch) + " x " +
                    std::to_string(saved_seq) + " tokens, this run uses " + std::to_string(opts.batch_size) + " x " +
                    std::to_string(opts.seq_len) + " (" + sampling_name(opts.sampling) + ")",
                io_where(path, "data loader state"), "resume with the batch size and sequence length of the saved run");
  }
  loader.options_.seed = words[1];
  loader.step_ = words[2];
}

std::pair<std::int64_t, std::int64_t> batch_shard_range(std::int64_t batch_size, int rank, int world) {
  std::int64_t base = batch_size / world;
  std::int64_t extra = batch_size % world;
  std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
  std::int64_t end = begin + base + (rank < extra ? 1 : 0);
  return {begin, end};
}

}  // namespace alloy
