// Reading and writing llm.c token files (see token_file.hpp).
#include "runtime/io/token_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "spec/error.hpp"

namespace alloy {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

constexpr std::size_t kWriteBufferBytes = 1 << 20;
constexpr std::int64_t kScanTokens = 1 << 18;  // tokens per read of the vocabulary check

std::int32_t header_int(const std::byte* header, std::size_t index) {
  std::int32_t value = 0;
  std::memcpy(&value, header + index * 4, 4);
  return value;
}

void tokens_check_vocab(const TokenFile& file, std::int64_t vocab_size) {
  std::vector<std::int32_t> chunk(static_cast<std::size_t>(std::min(kScanTokens, file.token_count())));
  for (std::int64_t begin = 0; begin < file.token_count(); begin += kScanTokens) {
    const std::int64_t count = std::min(kScanTokens, file.token_count() - begin);
    file.tokens_read(begin, {chunk.data(), static_cast<std::size_t>(count)});
    for (std::int64_t k = 0; k < count; ++k) {
      const std::int64_t i = begin + k;
      const auto id = static_cast<std::uint32_t>(chunk[static_cast<std::size_t>(k)]);
      if (id < static_cast<std::uint64_t>(vocab_size)) continue;
      throw Error("token id " + std::to_string(id) + " at position " + std::to_string(i) +
                      " is not below the model's vocabulary size " + std::to_string(vocab_size) +
                      ": the data was tokenized for another vocabulary",
                  io_where(file.path(), "tokens[" + std::to_string(i) + "]"),
                  "tokenize the data with the model's tokenizer, or use a model whose "
                  "vocab_size is at least " +
                      std::to_string(id + 1));
    }
  }
}

// The file's bytes after the header must be whole tokens, at least as many as the header says.
void token_file_check_size(const std::string& path, std::uint64_t size_bytes, TokenFileVersion version,
                           std::int32_t count, const std::string& fix_format) {
  const std::uint64_t width = token_file_token_bytes(version);
  const std::uint64_t token_bytes = size_bytes - kTokenFileHeaderBytes;
  if (token_bytes % width != 0) {
    throw Error(std::to_string(token_bytes) + " bytes follow the header, not a whole number of " + std::to_string(width) +
                    "-byte tokens",
                io_where(path, "tokens"), "the file was cut or written by another program: recreate it; " + fix_format);
  }
  const std::uint64_t expected_bytes = kTokenFileHeaderBytes + static_cast<std::uint64_t>(count) * width;
  if (size_bytes < expected_bytes) {
    throw Error("file truncated: the header promises " + std::to_string(count) + " tokens, which needs " +
                    std::to_string(expected_bytes) + " bytes, but the file has " + std::to_string(size_bytes) +
                    " bytes",
                io_where(path, "header[2] (token count)"),
                "the file was cut short (interrupted copy or download?): recreate it");
  }
}

}  // namespace

std::size_t token_file_token_bytes(TokenFileVersion version) {
  return version == TokenFileVersion::TokenFileVersion_uint16 ? 2 : 4;
}

std::uint32_t TokenFile::token(std::int64_t index) const {
  std::int32_t value = 0;
  tokens_read(index, {&value, 1});
  return static_cast<std::uint32_t>(value);
}

void TokenFile::tokens_read(std::int64_t begin, std::span<std::int32_t> out) const {
  auto count = static_cast<std::int64_t>(out.size());
  if (begin < 0 || begin + count > token_count_) {
    throw Error("window [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                    ") lies outside the file's " + std::to_string(token_count_) + " tokens",
                io_where(path()));
  }
  // One read into `out` itself; uint16 tokens are then widened in place from the back, where
  // each 4-byte slot lies at or after the 2 bytes it takes its token from.
  const std::size_t width = token_file_token_bytes(version_);
  auto* bytes = reinterpret_cast<std::byte*>(out.data());
  file_.read_at(kTokenFileHeaderBytes + static_cast<std::uint64_t>(begin) * width, {bytes, out.size() * width});
  if (width == 4) return;
  for (std::int64_t i = count - 1; i >= 0; --i) {
    std::uint16_t value = 0;
    std::memcpy(&value, bytes + i * 2, 2);
    out[static_cast<std::size_t>(i)] = value;
  }
}

TokenFile token_file_open(const std::string& path, std::int64_t vocab_size) {
  TokenFile file;
  file.file_ = read_file_open(path, "token file");
  const std::uint64_t size_bytes = file.file_.size_bytes();
  const std::string fix_format =
      "token files use llm.c's format (256 int32 header, magic 20240520); create one with "
      "`alloy tokenize`";
  if (size_bytes < kTokenFileHeaderBytes) {
    throw Error("header too short: the file has " + std::to_string(size_bytes) + " bytes, the header alone needs " +
                    std::to_string(kTokenFileHeaderBytes),
                io_where(path, "header"), fix_format);
  }
  std::byte header[kTokenFileHeaderBytes];
  file.file_.read_at(0, header);
  std::int32_t magic = header_int(header, 0);
  if (magic != kTokenFileMagic) {
    throw Error("bad magic number " + std::to_string(magic) + ", expected " + std::to_string(kTokenFileMagic) +
                    ": not a token file",
                io_where(path, "header[0] (magic)"), fix_format);
  }
  std::int32_t version = header_int(header, 1);
  if (version != 1 && version != 2) {
    throw Error("unknown version " + std::to_string(version) + " (1 means uint16 tokens, 2 means uint32 tokens)",
                io_where(path, "header[1] (version)"), fix_format);
  }
  file.version_ = static_cast<TokenFileVersion>(version);
  std::int32_t count = header_int(header, 2);
  if (count < 0) {
    throw Error("negative token count " + std::to_string(count), io_where(path, "header[2] (token count)"), fix_format);
  }
  token_file_check_size(path, size_bytes, file.version_, count, fix_format);
  file.token_count_ = count;
  if (vocab_size > 0) tokens_check_vocab(file, vocab_size);
  return file;
}

TokenFileWriter::TokenFileWriter(const std::string& path, TokenFileVersion version)
    : path_(path), temp_path_(path + ".tmp-" + std::to_string(getpid())), version_(version) {
  file_replace_check(path);
  writer_ = std::make_unique<FileWriter>(temp_path_);
  std::int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = static_cast<std::int32_t>(version);
  try {
    writer_->write(header, sizeof(header));
  } catch (...) {
    writer_.reset();
    std::error_code ec;
    std::filesystem::remove(temp_path_, ec);
    throw;
  }
  buffer_.reserve(kWriteBufferBytes);
}

TokenFileWriter::~TokenFileWriter() {
  if (writer_ != nullptr) {
    writer_.reset();
    std::error_code ec;
    std::filesystem::remove(temp_path_, ec);
  }
}

void TokenFileWriter::flush_buffer() {
  writer_->write(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void TokenFileWriter::append(std::span<const std::uint32_t> tokens) {
  bool narrow = version_ == TokenFileVersion::TokenFileVersion_uint16;
  for (std::uint32_t id : tokens) {
    if (narrow) {
      if (id > 0xffff) {
        throw Error("token id " + std::to_string(id) + " does not fit in uint16",
                    io_where(path_, "tokens[" + std::to_string(token_count_) + "]"),
                    "write version 2 (uint32 tokens) for vocabularies above 65536");
      }
      auto value = static_cast<std::uint16_t>(id);
      buffer_.append(reinterpret_cast<const char*>(&value), 2);
    } else {
      buffer_.append(reinterpret_cast<const char*>(&id), 4);
    }
    ++token_count_;
    if (buffer_.size() >= kWriteBufferBytes) flush_buffer();
  }
}

void TokenFileWriter::append_bytes(std::span<const unsigned char> bytes) {
  std::size_t width = token_file_token_bytes(version_);
  for (unsigned char b : bytes) {
    const char token[4] = {static_cast<char>(b), 0, 0, 0};
    buffer_.append(token, width);
    if (buffer_.size() >= kWriteBufferBytes) flush_buffer();
  }
  token_count_ += static_cast<std::int64_t>(bytes.size());
}

void TokenFileWriter::finish() {
  if (token_count_ > INT32_MAX) {
    throw Error("too many tokens for one file: " + std::to_string(token_count_) + " (the header's count is an int32)",
                io_where(path_), "split the data into several shards");
  }
  flush_buffer();
  auto count = static_cast<std::int32_t>(token_count_);
  writer_->patch(8, &count, 4);
  writer_->close_synced();
  writer_.reset();
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    std::error_code ec;
    std::filesystem::remove(temp_path_, ec);
    throw Error("cannot rename " + temp_path_ + " into place", io_where(path_));
  }
  directory_sync(std::filesystem::path(path_).parent_path().string());
}

void token_file_write(const std::string& path, std::span<const std::uint32_t> tokens, TokenFileVersion version) {
  TokenFileWriter writer(path, version);
  writer.append(tokens);
  writer.finish();
}

}  // namespace alloy
