// Byte-level and BPE tokenization of any file into llm.c token files (see tokenize.hpp).
#include "runtime/io/tokenize.hpp"

#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "runtime/io/bpe_tokenizer.hpp"
#include "runtime/io/file_io.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

constexpr std::size_t kReadChunkBytes = 1 << 20;
// BPE tokens go to the file, and progress is reported, every this many input bytes.
constexpr std::size_t kBpeStepBytes = 4 << 20;

// Copies the next `count_bytes` bytes of `in` into `writer`.
void stream_bytes(std::ifstream& in, const std::string& in_path, std::int64_t count_bytes, TokenFileWriter& writer) {
  std::vector<unsigned char> chunk(kReadChunkBytes);
  while (count_bytes > 0) {
    auto want =
        static_cast<std::streamsize>(std::min<std::int64_t>(count_bytes, static_cast<std::int64_t>(chunk.size())));
    in.read(reinterpret_cast<char*>(chunk.data()), want);
    if (in.gcount() != want) {
      throw Error("read failed (file changed while tokenizing?)", io_where(in_path),
                  "make sure nothing writes the input while it is tokenized");
    }
    writer.append_bytes({chunk.data(), static_cast<std::size_t>(want)});
    count_bytes -= want;
  }
}

// Size of the input file, after checking the fraction, that the file exists and is neither
// empty nor too large for one token file.
std::int64_t input_bytes_checked(const std::string& in_path, double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    throw Error("validation fraction " + std::to_string(val_fraction) + " is outside [0, 1)",
                io_where({}, "--val-fraction"), "pass a fraction such as 0.1, or 0 for no split");
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(in_path, ec)) {
    throw Error("input file not found", io_where(in_path), "check the path");
  }
  auto total_bytes = static_cast<std::int64_t>(std::filesystem::file_size(in_path, ec));
  if (ec || total_bytes == 0) {
    throw Error("input file is empty: nothing to tokenize", io_where(in_path), "pass a file with text in it");
  }
  if (total_bytes > INT32_MAX) {
    throw Error(
        "input has " + std::to_string(total_bytes) +
            " bytes, more than the 2 GiB - 1 alloy tokenize takes at once "
            "(a byte-level token file counts its tokens in an int32; BPE maps the input and ICU takes int32 lengths)",
        io_where(in_path), "split the input into several files and tokenize each");
  }
  return total_bytes;
}

void val_bytes_check(const std::string& in_path, double val_fraction, std::int64_t val_bytes,
                     std::int64_t total_bytes) {
  if (val_fraction > 0.0 && (val_bytes == 0 || val_bytes == total_bytes)) {
    throw Error("a validation fraction of " + std::to_string(val_fraction) + " of " + std::to_string(total_bytes) +
                    " bytes leaves one split empty",
                io_where(in_path, "--val-fraction"),
                "use a larger input file or a fraction that leaves tokens on both sides");
  }
}

// Encodes the pieces from `begin_byte` (where the encoder stands) that start before
// `stop_byte` into `writer`, reporting progress; returns where the next piece starts.
std::size_t encode_into(BpeTextEncoder& encoder, std::size_t begin_byte, std::size_t stop_byte,
                        std::int64_t total_bytes, TokenFileWriter& writer, const TokenizeProgress& progress) {
  std::vector<std::uint32_t> tokens;
  std::size_t position = begin_byte;
  while (position < stop_byte) {
    position = encoder.encode_until(std::min(position + kBpeStepBytes, stop_byte), tokens);
    writer.append(tokens);
    tokens.clear();
    if (progress) progress(static_cast<std::int64_t>(position), total_bytes);
  }
  return position;
}

}  // namespace

TokenFileVersion token_file_version_for(std::int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenFileVersion::TokenFileVersion_uint16 : TokenFileVersion::TokenFileVersion_uint32;
}

std::string tokenize_split_path(const std::string& out_path, const std::string& split) {
  std::filesystem::path path(out_path);
  std::string stem = path.extension() == ".bin" ? path.stem().string() : path.filename().string();
  return (path.parent_path() / (stem + "_" + split + ".bin")).string();
}

TokenizeResult tokenize_bytes(const std::string& in_path, const std::string& out_path, double val_fraction) {
  std::int64_t total_bytes = input_bytes_checked(in_path, val_fraction);
  std::ifstream in(in_path, std::ios::binary);
  if (!in) throw Error("cannot open input file", io_where(in_path), "check its permissions");

  TokenizeResult result;
  auto val_bytes = static_cast<std::int64_t>(std::llround(val_fraction * total_bytes));
  val_bytes_check(in_path, val_fraction, val_bytes, total_bytes);
  result.train_path = val_fraction > 0.0 ? tokenize_split_path(out_path, "train") : out_path;
  result.train_tokens = total_bytes - val_bytes;
  TokenFileWriter train(result.train_path, TokenFileVersion::TokenFileVersion_uint16);
  stream_bytes(in, in_path, result.train_tokens, train);
  if (val_bytes > 0) {
    result.val_path = tokenize_split_path(out_path, "val");
    result.val_tokens = val_bytes;
    TokenFileWriter val(result.val_path, TokenFileVersion::TokenFileVersion_uint16);
    stream_bytes(in, in_path, val_bytes, val);
    val.finish();
  }
  train.finish();
  return result;
}

TokenizeResult tokenize_bpe(const std::string& in_path, const std::string& out_path, const std::string& tokenizer_path,
                            double val_fraction, const TokenizeProgress& progress) {
  input_bytes_checked(in_path, val_fraction);
  BpeTokenizer tokenizer = bpe_tokenizer_load(tokenizer_path);
  MappedFile input = mapped_file_open(in_path, "input file");
  std::string normalized_storage;
  std::string_view text = bpe_normalized(
      tokenizer, {reinterpret_cast<const char*>(input.bytes().data()), input.size_bytes()}, normalized_storage);
  auto total_bytes = static_cast<std::int64_t>(text.size());
  auto val_bytes = static_cast<std::int64_t>(std::llround(val_fraction * static_cast<double>(total_bytes)));
  val_bytes_check(in_path, val_fraction, val_bytes, total_bytes);

  TokenizeResult result;
  result.vocab_size = tokenizer.vocab_size;
  result.version = token_file_version_for(tokenizer.vocab_size);
  result.train_path = val_fraction > 0.0 ? tokenize_split_path(out_path, "train") : out_path;
  BpeTextEncoder encoder(tokenizer, text);
  TokenFileWriter train(result.train_path, result.version);
  std::size_t split_byte =
      encode_into(encoder, 0, static_cast<std::size_t>(total_bytes - val_bytes), total_bytes, train, progress);
  result.train_tokens = train.token_count();
  std::optional<TokenFileWriter> val;
  if (val_bytes > 0) {
    result.val_path = tokenize_split_path(out_path, "val");
    val.emplace(result.val_path, result.version);
    encode_into(encoder, split_byte, text.size(), total_bytes, *val, progress);
    result.val_tokens = val->token_count();
    if (result.train_tokens == 0 || result.val_tokens == 0) {
      throw Error("a validation fraction of " + std::to_string(val_fraction) + " leaves one split without tokens",
                  io_where(in_path, "--val-fraction"), "use a larger input file or a smaller fraction");
    }
  }
  // The training file first: where it cannot be written (too many tokens for its header), no
  // validation file is left behind without it.
  train.finish();
  if (val) val->finish();
  return result;
}

}  // namespace alloy
