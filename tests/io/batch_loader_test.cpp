// Batches: windows are contiguous and shifted by one, sampling is seeded and covers every window
// once per epoch, resumed loaders repeat the same batches, and rank shares tile the global batch.
#include "runtime/io/batch_loader.hpp"

#include <numeric>
#include <set>

#include "io_test_util.hpp"

namespace alloy {
namespace {

using test::error_of;

// A token file whose token i is i, so every window reveals where it starts.
TokenFile counting_file(const test::ScratchDir& dir, std::int64_t count) {
  std::vector<std::uint32_t> tokens(static_cast<std::size_t>(count));
  std::iota(tokens.begin(), tokens.end(), 0u);
  std::string path = dir.file("count.bin");
  token_file_write(path, tokens, TokenFileVersion::TokenFileVersion_uint32);
  return token_file_open(path, 0);
}

struct Batch {
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
  bool operator==(const Batch&) const = default;
};

Batch batch_next(BatchLoader& loader) {
  std::size_t n = static_cast<std::size_t>(loader.local_batch_size() * loader.options().seq_len);
  Batch batch{std::vector<std::int32_t>(n), std::vector<std::int32_t>(n)};
  batch_loader_next(loader, batch.inputs.data(), batch.targets.data());
  return batch;
}

BatchLoaderOptions options_of(std::int64_t batch, std::int64_t seq, std::uint64_t seed) {
  BatchLoaderOptions options;
  options.batch_size = batch;
  options.seq_len = seq;
  options.seed = seed;
  return options;
}

TEST(BatchLoader, WindowsAreContiguousAndTargetsShiftedByOne) {
  test::ScratchDir dir;
  BatchLoader loader = batch_loader_create(counting_file(dir, 1000), options_of(4, 16, 1));
  for (int step = 0; step < 20; ++step) {
    Batch batch = batch_next(loader);
    for (int b = 0; b < 4; ++b) {
      for (int t = 0; t < 16; ++t) {
        std::int32_t input = batch.inputs[b * 16 + t];
        EXPECT_EQ(batch.targets[b * 16 + t], input + 1);
        EXPECT_EQ(input, batch.inputs[b * 16] + t);
      }
      EXPECT_LE(batch.targets[b * 16 + 15], 999);
    }
  }
  EXPECT_EQ(loader.step(), 20u);
}

TEST(BatchLoader, SameSeedSameBatchesOtherSeedOthers) {
  test::ScratchDir dir;
  BatchLoader a = batch_loader_create(counting_file(dir, 5000), options_of(8, 32, 42));
  BatchLoader b = batch_loader_create(counting_file(dir, 5000), options_of(8, 32, 42));
  BatchLoader c = batch_loader_create(counting_file(dir, 5000), options_of(8, 32, 43));
  int differing = 0;
  for (int step = 0; step < 10; ++step) {
    Batch batch_a = batch_next(a);
    EXPECT_EQ(batch_a, batch_next(b));
    differing += !(batch_a == batch_next(c));
  }
  EXPECT_EQ(differing, 10);
}

TEST(BatchLoader, EachEpochVisitsEveryWindowOnce) {
  test::ScratchDir dir;
  // 1000 tokens, T = 16: 62 windows of 17 tokens and 7 tokens of slack for the grid's shift.
  BatchLoader loader = batch_loader_create(counting_file(dir, 1000), options_of(2, 16, 9));
  ASSERT_EQ(loader.window_count(), 62);
  std::set<std::int64_t> shifts;
  for (std::uint64_t epoch = 0; epoch < 4; ++epoch) {
    std::set<std::int64_t> windows;
    std::int64_t shift = -1;
    for (std::int64_t g = 0; g < 62; ++g) {
      std::int64_t global = static_cast<std::int64_t>(epoch) * 62 + g;
      std::int64_t begin = batch_loader_window_begin(loader, global / 2, global % 2);
      if (shift < 0) shift = begin % 16;
      EXPECT_EQ(begin % 16, shift) << "windows of one epoch share one grid";
      EXPECT_LE(begin + 17, 1000);
      windows.insert(begin / 16);
    }
    EXPECT_EQ(windows.size(), 62u) << "epoch " << epoch;
    shifts.insert(shift);
  }
  EXPECT_GT(shifts.size(), 1u) << "the grid shift should vary between epochs";
}

TEST(BatchLoader, IndexPermuteIsABijection) {
  for (std::uint64_t count : {1u, 2u, 3u, 5u, 16u, 17u, 100u, 257u, 1000u}) {
    for (std::uint64_t key : {0ull, 1ull, 0xdeadbeefull}) {
      std::set<std::uint64_t> seen;
      for (std::uint64_t i = 0; i < count; ++i) {
        std::uint64_t j = index_permute(i, count, key);
        EXPECT_LT(j, count);
        seen.insert(j);
      }
      EXPECT_EQ(seen.size(), count) << "count " << count << " key " << key;
    }
  }
  std::uint64_t fixed_points = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) fixed_points += index_permute(i, 1000, 5) == i;
  EXPECT_LT(fixed_points, 20u) << "the permutation should actually shuffle";
}

TEST(BatchLoader, RestoredStateRepeatsTheSameBatches) {
  test::ScratchDir dir;
  BatchLoader original = batch_loader_create(counting_file(dir, 3000), options_of(4, 8, 77));
  for (int step = 0; step < 7; ++step) batch_next(original);
  std::vector<std::uint64_t> saved = batch_loader_state_save(original);
  // The resumed run was configured with another seed; the saved state wins.
  BatchLoader resumed = batch_loader_create(counting_file(dir, 3000), options_of(4, 8, 1));
  batch_loader_state_restore(resumed, saved);
  EXPECT_EQ(resumed.step(), 7u);
  for (int step = 0; step < 200; ++step) ASSERT_EQ(batch_next(original), batch_next(resumed));
}

TEST(BatchLoader, RestoreRejectsOtherBatchShapeOrMalformedState) {
  test::ScratchDir dir;
  BatchLoader a = batch_loader_create(counting_file(dir, 3000), options_of(4, 8, 77));
  std::vector<std::uint64_t> saved = batch_loader_state_save(a);
  BatchLoader b = batch_loader_create(counting_file(dir, 3000), options_of(4, 16, 77));
  Error e = error_of([&] { batch_loader_state_restore(b, saved); });
  EXPECT_EQ(e.where().field, "data loader state");
  EXPECT_ERROR_SAYS(e, "4 x 8");
  EXPECT_ERROR_SAYS(e, "4 x 16");
  saved.pop_back();
  EXPECT_EQ(error_of([&] { batch_loader_state_restore(a, saved); }).where().field, "data loader state");
}

TEST(BatchLoader, RankSharesTileTheGlobalBatch) {
  test::ScratchDir dir;
  for (int world : {1, 2, 3, 8}) {
    BatchLoader global = batch_loader_create(counting_file(dir, 4000), options_of(8, 12, 5));
    std::vector<BatchLoader> ranks;
    std::int64_t covered = 0;
    for (int rank = 0; rank < world; ++rank) {
      auto [begin, end] = batch_shard_range(8, rank, world);
      EXPECT_EQ(begin, covered);
      EXPECT_LE(end - begin, (8 + world - 1) / world);
      covered = end;
      BatchLoaderOptions options = options_of(8, 12, 5);
      options.sample_begin = begin;
      options.sample_end = end;
      ranks.push_back(batch_loader_create(counting_file(dir, 4000), options));
    }
    EXPECT_EQ(covered, 8);
    for (int step = 0; step < 5; ++step) {
      Batch joined;
      for (auto& rank : ranks) {
        Batch part = batch_next(rank);
        joined.inputs.insert(joined.inputs.end(), part.inputs.begin(), part.inputs.end());
        joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
      }
      EXPECT_EQ(joined, batch_next(global)) << "world " << world << " step " << step;
    }
  }
}

TEST(BatchLoader, SequentialValidationBatchesAreFixedWindows) {
  test::ScratchDir dir;
  BatchLoaderOptions options = options_of(3, 10, 123);
  options.sampling = BatchSampling::BatchSampling_sequential;
  BatchLoader val = batch_loader_create(counting_file(dir, 100), options);
  EXPECT_EQ(val.window_count(), 9);
  EXPECT_EQ(val.batches_per_epoch(), 3);
  std::vector<std::int32_t> inputs(30), targets(30), again(30);
  for (std::uint64_t k = 0; k < 3; ++k) {
    batch_loader_read(val, k, inputs.data(), targets.data());
    for (int b = 0; b < 3; ++b) EXPECT_EQ(inputs[b * 10], static_cast<std::int32_t>((k * 3 + b) * 10));
    batch_loader_read(val, k, again.data(), targets.data());
    EXPECT_EQ(inputs, again);
  }
}

TEST(BatchLoader, FileSmallerThanOneBatch) {
  test::ScratchDir dir;
  Error e = error_of([&] { batch_loader_create(counting_file(dir, 128), options_of(4, 32, 0)); });
  EXPECT_EQ(e.where().file, dir.file("count.bin"));
  EXPECT_ERROR_SAYS(e, "128 tokens");
  EXPECT_ERROR_SAYS(e, "need 129");
  EXPECT_NO_THROW(batch_loader_create(counting_file(dir, 129), options_of(4, 32, 0)));
}

TEST(BatchLoader, BadOptions) {
  test::ScratchDir dir;
  EXPECT_EQ(error_of([&] { batch_loader_create(counting_file(dir, 500), options_of(0, 8, 0)); }).where().field,
            "batch_size, seq_len");
  BatchLoaderOptions options = options_of(4, 8, 0);
  options.sample_begin = 2;
  options.sample_end = 6;
  Error e = error_of([&] { batch_loader_create(counting_file(dir, 500), options); });
  EXPECT_ERROR_SAYS(e, "[2, 6)");
}

}  // namespace
}  // namespace alloy
