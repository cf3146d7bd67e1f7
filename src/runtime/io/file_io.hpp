// Low-level file plumbing for runtime I/O: read-only memory maps, files read at offsets, atomic file and directory
// writes (temporary file, fsync, rename) with optional fault injection, and CRC-32 checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "spec/error.hpp"

namespace alloy {

// Where an I/O error happened: the file and, optionally, the field inside it.
inline ErrorWhere io_where(std::string file, std::string field = {}) {
  ErrorWhere where;
  where.file = std::move(file);
  where.field = std::move(field);
  return where;
}

// A read-only memory map of a whole file; move-only. An empty file maps to an empty span.
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  ~MappedFile();

  const std::string& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {data_, size_bytes_}; }
  std::size_t size_bytes() const { return size_bytes_; }

 private:
  friend MappedFile mapped_file_open(const std::string& path, const std::string& what);
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_bytes_ = 0;
};

// Maps `path`; `what` names the file's role in errors ("token file", "checkpoint").
// Throws alloy::Error when the file is missing, is a directory or cannot be read.
MappedFile mapped_file_open(const std::string& path, const std::string& what);

// A file read at offsets with pread; move-only. Unlike a memory map, a file that shrinks while
// it is open (truncated by another program) makes read_at throw an alloy::Error naming it,
// where a map would kill the process with SIGBUS.
class ReadFile {
 public:
  ReadFile() = default;
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  ReadFile(ReadFile&& other) noexcept;
  ReadFile& operator=(ReadFile&& other) noexcept;
  ~ReadFile();

  const std::string& path() const { return path_; }
  std::uint64_t size_bytes() const { return size_bytes_; }  // when opened
  // Fills `out` with the bytes at [offset_bytes, offset_bytes + out.size()).
  void read_at(std::uint64_t offset_bytes, std::span<std::byte> out) const;

 private:
  friend ReadFile read_file_open(const std::string& path, const std::string& what);
  std::string path_;
  std::string what_;
  int fd_ = -1;
  std::uint64_t size_bytes_ = 0;
};

// Opens `path` for read_at; the same errors as mapped_file_open.
ReadFile read_file_open(const std::string& path, const std::string& what);

// Sequential writer to one file that keeps a running CRC-32 and byte count.
// `fault_after_bytes` >= 0 simulates a failed write (as from a full disk) once that many bytes
// have gone out; tests use it to prove that a failed write leaves earlier files intact.
class FileWriter {
 public:
  FileWriter(const std::string& path, std::int64_t fault_after_bytes = -1);
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  ~FileWriter();

  void write(const void* data, std::size_t count_bytes);
  // Overwrites bytes already written at `offset_bytes` (for headers whose counts come last).
  // Does not update the checksum: only for writers that do not report one.
  void patch(std::size_t offset_bytes, const void* data, std::size_t count_bytes);
  // Flushes to disk (fsync) and closes; throws on failure.
  void close_synced();

  std::uint32_t checksum_crc32() const { return checksum_; }
  std::uint64_t written_bytes() const { return written_bytes_; }
  const std::string& path() const { return path_; }

 private:
  void fail(const std::string& what, int errno_value);
  std::string path_;
  int fd_ = -1;
  std::int64_t fault_after_bytes_;
  std::uint64_t written_bytes_ = 0;
  std::uint32_t checksum_ = 0;
};

// Throws when `path` exists but is not a regular file (a device such as /dev/full, a folder, a
// link, a pipe), which a rename of a temporary file over it would replace.
void file_replace_check(const std::string& path);

// Writes `path` atomically: `write_body` fills a temporary file beside it, which is synced and
// renamed over `path` only when the body returns. On any exception the temporary is removed and
// an existing `path` is untouched; `path` must be new or a regular file (file_replace_check).
void file_write_atomic(const std::string& path, const std::function<void(FileWriter&)>& write_body);

// fsyncs a directory so that renames inside it survive a power cut.
void directory_sync(const std::string& path);

// CRC-32 (IEEE 802.3, as zlib.crc32 and `gzip` compute it) of `bytes`, continuing from `crc`
// (start with 0). Slicing by 8 bytes: a few GB/s, so checksums stay cheap next to disk writes.
std::uint32_t crc32_update(std::uint32_t crc, std::span<const std::byte> bytes);
// The CRC-32 of A followed by B from crc_a (of A) and crc_b (of B alone, started at 0) and B's
// length: lets halves of a buffer be checksummed at once.
std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b);
// crc32_update over `bytes`, its two halves on two threads when it is large.
std::uint32_t crc32_update_parallel(std::uint32_t crc, std::span<const std::byte> bytes);
// 8 lower-case hex digits.
std::string checksum_hex(std::uint32_t checksum);

}  // namespace alloy
