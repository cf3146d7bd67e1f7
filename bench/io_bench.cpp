// Throughput of runtime I/O on this machine: token-file vocabulary scan, batch sampling, BPE
// tokenization, and checkpoint save/load (write, fsync, rename; map, checksum, copy) against a
// plain sequential write and read of the same bytes. Run: ./build/io_bench [dir]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/io/batch_loader.hpp"
#include "runtime/io/bpe_tokenizer.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/io/token_file.hpp"

namespace {

double seconds_of(const std::function<void()>& body) {
  auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The floats of `parts` (each `count`) written one after another with write(2) in 8 MiB pieces,
// then fsync: what the disk takes for the same bytes without a format around them.
void plain_write(const std::string& path, const std::vector<const float*>& parts, std::int64_t count) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) std::exit(1);
  for (const float* part : parts) {
    const char* bytes = reinterpret_cast<const char*>(part);
    for (std::int64_t at = 0, total = count * 4; at < total;) {
      const ssize_t n = ::write(fd, bytes + at, static_cast<size_t>(std::min<std::int64_t>(8 << 20, total - at)));
      if (n <= 0) std::exit(1);
      at += n;
    }
  }
  ::fsync(fd);
  ::close(fd);
}

// Reads them back with read(2) in 8 MiB pieces.
void plain_read(const std::string& path, const std::vector<float*>& parts, std::int64_t count) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) std::exit(1);
  for (float* part : parts) {
    char* bytes = reinterpret_cast<char*>(part);
    for (std::int64_t at = 0, total = count * 4; at < total;) {
      const ssize_t n = ::read(fd, bytes + at, static_cast<size_t>(std::min<std::int64_t>(8 << 20, total - at)));
      if (n <= 0) std::exit(1);
      at += n;
    }
  }
  ::close(fd);
}

// BPE encoding on one core with the Llama 3 style test fixture: the example text repeated to
// 32 MB (most pre-tokens are cached after the first pass) and 8 MB of random letter strings
// (none repeat, so each is merged afresh).
void bpe_bench() {
  alloy::BpeTokenizer tokenizer =
      alloy::bpe_tokenizer_load(std::string(ALLOY_SOURCE_DIR) + "/tests/io/bpe/llama3_tokenizer.json");
  std::ifstream in(std::string(ALLOY_SOURCE_DIR) + "/examples/data/fsf_licenses.txt", std::ios::binary);
  const std::string example{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::string prose;
  while (prose.size() < (32u << 20)) prose += example;
  std::string words;
  std::uint64_t state = 1;
  while (words.size() < (8u << 20)) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    words += ' ';
    const std::uint64_t letters = 2 + (state >> 60) % 10;
    for (std::uint64_t k = 0; k < letters; ++k) words += static_cast<char>('a' + (state >> (k * 5)) % 26);
  }
  for (const auto& [name, text] : {std::pair<const char*, const std::string&>{"repeated prose", prose},
                                   std::pair<const char*, const std::string&>{"random words", words}}) {
    std::size_t token_count = 0;
    const double encode_s = seconds_of([&] { token_count = alloy::bpe_encode(tokenizer, text).size(); });
    std::printf("bpe          %-15s %5.1f MB -> %zu tokens: %.1f MB/s\n", name, text.size() / 1e6, token_count,
                text.size() / encode_s / 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(argc > 1 ? argv[1] : fs::temp_directory_path().string()) / "alloy_io_bench";
  fs::remove_all(dir);
  fs::create_directories(dir);

  constexpr std::int64_t kTokens = 50'000'000;
  std::vector<std::uint32_t> tokens(kTokens);
  for (std::int64_t i = 0; i < kTokens; ++i) tokens[i] = static_cast<std::uint32_t>((i * 2654435761u) % 50257);
  std::string token_path = (dir / "tokens.bin").string();
  double write_s = seconds_of(
      [&] { alloy::token_file_write(token_path, tokens, alloy::TokenFileVersion::TokenFileVersion_uint16); });
  double scan_s = seconds_of([&] { alloy::token_file_open(token_path, 50257); });
  std::printf("token file   %lld uint16 tokens: write %.3f s (%.0f Mtok/s), open+vocab check %.3f s (%.0f Mtok/s)\n",
              static_cast<long long>(kTokens), write_s, kTokens / write_s / 1e6, scan_s, kTokens / scan_s / 1e6);

  alloy::BatchLoaderOptions options;
  options.batch_size = 8;
  options.seq_len = 1024;
  options.seed = 1;
  alloy::BatchLoader loader = alloy::batch_loader_create(alloy::token_file_open(token_path, 0), options);
  std::vector<std::int32_t> inputs(8 * 1024), targets(8 * 1024);
  constexpr int kBatches = 2000;
  double batch_s = seconds_of([&] {
    for (int i = 0; i < kBatches; ++i) alloy::batch_loader_next(loader, inputs.data(), targets.data());
  });
  std::printf("batches      8 x 1024 shuffled: %.1f us per batch\n", batch_s / kBatches * 1e6);
  bpe_bench();

  constexpr std::int64_t kParams = 32'000'000;
  std::vector<float> params(kParams), m(kParams), v(kParams);
  std::iota(params.begin(), params.end(), 0.0f);
  std::vector<alloy::TensorRef> model, optimizer;
  constexpr std::int64_t kTensorCount = 64;
  constexpr std::int64_t kPerTensor = kParams / kTensorCount;
  for (std::int64_t t = 0; t < kTensorCount; ++t) {
    std::string name = "layer." + std::to_string(t) + ".weight";
    model.push_back({name, {kPerTensor}, params.data() + t * kPerTensor});
    optimizer.push_back({"opt.m." + name, {kPerTensor}, m.data() + t * kPerTensor});
    optimizer.push_back({"opt.v." + name, {kPerTensor}, v.data() + t * kPerTensor});
  }
  alloy::CheckpointState state;
  state.fingerprint = "bench";
  std::string ckpt = (dir / "ckpt").string();
  const std::string plain = (dir / "plain.bin").string();
  // Rounds alternate the checkpoint and a plain sequential write (then read) of the same bytes to
  // the same disk, so drift in the machine's speed hits both alike; medians of each.
  constexpr int kRounds = 5;
  std::vector<double> save_s, load_s, plain_write_s, plain_read_s;
  for (int round = 0; round < kRounds; ++round) {
    plain_write_s.push_back(seconds_of([&] { plain_write(plain, {params.data(), m.data(), v.data()}, kParams); }));
    save_s.push_back(seconds_of([&] { alloy::checkpoint_save(ckpt, model, optimizer, state); }));
    plain_read_s.push_back(seconds_of([&] { plain_read(plain, {params.data(), m.data(), v.data()}, kParams); }));
    load_s.push_back(seconds_of([&] { alloy::checkpoint_load(ckpt, "bench", model, optimizer); }));
  }
  const double gb = 3.0 * kParams * 4 / 1e9;
  const double save = median(save_s), load = median(load_s), write = median(plain_write_s), read = median(plain_read_s);
  std::printf("checkpoint   %.2f GB (32M params + AdamW m, v) on one rank, medians of %d alternating rounds:\n", gb, kRounds);
  std::printf("  write  checkpoint %.2f GB/s, plain sequential write + fsync %.2f GB/s: %.2fx (target >= 0.7x)\n",
              gb / save, gb / write, write / save);
  std::printf("  read   checkpoint %.2f GB/s (checksums and copies included), plain sequential read %.2f GB/s: %.2fx\n",
              gb / load, gb / read, read / load);
  fs::remove_all(dir);
  return 0;
}
