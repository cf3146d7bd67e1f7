// File plumbing: CRC-32 against the standard check value and a bit-by-bit reference, atomic
// writes that leave the old file on failure, and maps of missing or empty files.
#include "runtime/io/file_io.hpp"

#include <sys/stat.h>

#include <random>

#include "io_test_util.hpp"
#include "runtime/io/token_file.hpp"

namespace alloy {
namespace {

using test::error_of;

// The textbook one-bit-at-a-time CRC-32, as an independent reference.
std::uint32_t crc32_bitwise(const std::string& bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::span<const std::byte> as_bytes(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

TEST(FileIo, Crc32MatchesCheckValueAndReference) {
  EXPECT_EQ(crc32_update(0, as_bytes("123456789")), 0xCBF43926u);
  EXPECT_EQ(checksum_hex(0xCBF43926u), "cbf43926");
  EXPECT_EQ(crc32_update(0, {}), 0u);
  std::mt19937 rng(11);
  std::string bytes(5000, '\0');
  for (auto& b : bytes) b = static_cast<char>(rng());
  // Lengths on both sides of the carry-less path's 64-byte minimum and 16-byte steps.
  for (std::size_t length : {1u, 7u, 8u, 9u, 63u, 64u, 65u, 79u, 80u, 127u, 128u, 129u, 1000u, 4103u, 5000u}) {
    std::string part = bytes.substr(0, length);
    EXPECT_EQ(crc32_update(0, as_bytes(part)), crc32_bitwise(part)) << "length " << length;
  }
  // Streaming in uneven pieces gives the same checksum as one call.
  std::uint32_t streamed = 0;
  for (std::size_t begin = 0; begin < bytes.size(); begin += 13) {
    streamed = crc32_update(streamed, as_bytes(bytes.substr(begin, 13)));
  }
  EXPECT_EQ(streamed, crc32_bitwise(bytes));
}

TEST(FileIo, Crc32OfHalvesCombinesIntoTheWhole) {
  std::mt19937 rng(5);
  std::string bytes(3u << 20, '\0');  // over the size checksummed on two threads
  for (auto& b : bytes) b = static_cast<char>(rng());
  const std::uint32_t whole = crc32_update(0, as_bytes(bytes));
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, bytes.size() / 2, bytes.size() - 3, bytes.size()}) {
    const std::string a = bytes.substr(0, cut), b = bytes.substr(cut);
    EXPECT_EQ(crc32_combine(crc32_update(0, as_bytes(a)), crc32_update(0, as_bytes(b)), b.size()), whole) << "cut " << cut;
  }
  EXPECT_EQ(crc32_update_parallel(0, as_bytes(bytes)), whole);
  // Continuing from an earlier checksum, as a writer does.
  const std::uint32_t head = crc32_update(0, as_bytes("header"));
  EXPECT_EQ(crc32_update_parallel(head, as_bytes(bytes)), crc32_update(head, as_bytes(bytes)));
  // A large write through the writer (checksummed beside its write calls) matches too.
  test::ScratchDir dir;
  FileWriter writer(dir.file("large.dat"));
  writer.write("header", 6);
  writer.write(bytes.data(), bytes.size());
  writer.close_synced();
  EXPECT_EQ(writer.checksum_crc32(), crc32_update(head, as_bytes(bytes)));
}

TEST(FileIo, WriterChecksumsWhatItWrites) {
  test::ScratchDir dir;
  FileWriter writer(dir.file("w.dat"));
  writer.write("hello ", 6);
  writer.write("world", 5);
  writer.close_synced();
  EXPECT_EQ(writer.written_bytes(), 11u);
  EXPECT_EQ(writer.checksum_crc32(), crc32_bitwise("hello world"));
  EXPECT_EQ(test::bytes_read(dir.file("w.dat")), "hello world");
}

TEST(FileIo, AtomicWriteKeepsOldFileWhenTheBodyFails) {
  test::ScratchDir dir;
  std::string path = dir.file("a.dat");
  file_write_atomic(path, [](FileWriter& out) { out.write("old", 3); });
  EXPECT_THROW(file_write_atomic(path,
                                 [](FileWriter& out) {
                                   out.write("new but", 7);
                                   throw Error("simulated failure");
                                 }),
               Error);
  EXPECT_EQ(test::bytes_read(path), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()),
                          std::filesystem::directory_iterator{}),
            1);
}

TEST(FileIo, InjectedFaultFailsLikeAFullDisk) {
  test::ScratchDir dir;
  FileWriter writer(dir.file("f.dat"), 5);
  Error e = error_of([&] { writer.write("0123456789", 10); });
  EXPECT_EQ(e.where().file, dir.file("f.dat"));
  EXPECT_ERROR_SAYS(e, "write failed");
  EXPECT_EQ(writer.written_bytes(), 5u);
}

// A temporary file renamed over a device (alloy tokenize -o /dev/full as root) or a pipe would
// replace it: such targets are refused and left as they are.
TEST(FileIo, AtomicWriteRefusesToReplaceWhatIsNotARegularFile) {
  test::ScratchDir dir;
  const std::string pipe = dir.file("pipe");
  ASSERT_EQ(mkfifo(pipe.c_str(), 0600), 0);
  Error e = error_of([&] { file_write_atomic(pipe, [](FileWriter& w) { w.write("x", 1); }); });
  EXPECT_EQ(e.where().file, pipe);
  EXPECT_ERROR_SAYS(e, "not a regular file");
  EXPECT_TRUE(std::filesystem::is_fifo(pipe));
  Error tokens = error_of([&] { token_file_write(pipe, {}, TokenFileVersion::TokenFileVersion_uint16); });
  EXPECT_ERROR_SAYS(tokens, "not a regular file");
  EXPECT_TRUE(std::filesystem::is_fifo(pipe));
}

TEST(FileIo, MapsEmptyFilesAndRejectsMissingOnesAndDirectories) {
  test::ScratchDir dir;
  test::bytes_write(dir.file("empty"), "");
  EXPECT_EQ(mapped_file_open(dir.file("empty"), "test file").size_bytes(), 0u);
  Error missing = error_of([&] { mapped_file_open(dir.file("none"), "test file"); });
  EXPECT_EQ(missing.where().file, dir.file("none"));
  EXPECT_ERROR_SAYS(missing, "test file not found");
  std::filesystem::create_directories(dir.file("sub"));
  EXPECT_ERROR_SAYS(error_of([&] { mapped_file_open(dir.file("sub"), "test file"); }), "is a directory");
}

}  // namespace
}  // namespace alloy
