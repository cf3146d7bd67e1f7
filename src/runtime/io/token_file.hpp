// Token files in llm.c's format: a header of 256 little-endian int32 (magic 20240520, version,
// token count) followed by uint16 (version 1) or uint32 (version 2) tokens. Windows are read
// with pread, so a file truncated during a run is an error naming it, not a SIGBUS.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "runtime/io/file_io.hpp"

namespace alloy {

inline constexpr std::int32_t kTokenFileMagic = 20240520;
inline constexpr std::size_t kTokenFileHeaderInts = 256;
inline constexpr std::size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

enum class TokenFileVersion : std::int32_t {
  TokenFileVersion_uint16 = 1,
  TokenFileVersion_uint32 = 2,
};

std::size_t token_file_token_bytes(TokenFileVersion version);

// An open, validated token file (move-only; the tokens stay on disk).
class TokenFile {
 public:
  const std::string& path() const { return file_.path(); }
  TokenFileVersion version() const { return version_; }
  std::int64_t token_count() const { return token_count_; }
  // Token at `index` in [0, token_count()).
  std::uint32_t token(std::int64_t index) const;
  // Copies tokens [begin, begin + out.size()) into `out`; the range must lie inside the file,
  // and a file that has shrunk since it was opened is an error.
  void tokens_read(std::int64_t begin, std::span<std::int32_t> out) const;

 private:
  friend TokenFile token_file_open(const std::string& path, std::int64_t vocab_size);
  ReadFile file_;
  TokenFileVersion version_ = TokenFileVersion::TokenFileVersion_uint16;
  std::int64_t token_count_ = 0;
};

// Opens and validates `path`: missing file, short header, bad magic, unknown version, a file
// shorter than its token count and token bytes that are not a whole number of tokens are errors. When `vocab_size` > 0 every token is checked to be
// below it (one pass over the file); the first offending position and id are reported.
TokenFile token_file_open(const std::string& path, std::int64_t vocab_size);

// Streams tokens into a new token file; the file appears at `path` (atomically) on finish().
// Destroying the writer without finish() leaves no file behind.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, TokenFileVersion version);
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  ~TokenFileWriter();

  // Appends tokens; a token that does not fit the version's width is an error.
  void append(std::span<const std::uint32_t> tokens);
  void append_bytes(std::span<const unsigned char> bytes);
  // Writes the token count into the header, syncs and renames into place.
  void finish();
  std::int64_t token_count() const { return token_count_; }

 private:
  void flush_buffer();
  std::string path_;
  std::string temp_path_;
  TokenFileVersion version_;
  std::int64_t token_count_ = 0;
  std::string buffer_;
  std::unique_ptr<FileWriter> writer_;
};

// Writes a whole token file at once.
void token_file_write(const std::string& path, std::span<const std::uint32_t> tokens, TokenFileVersion version);

}  // namespace alloy
