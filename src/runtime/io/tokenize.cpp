// Byte-level tokenization of any file into llm.c token files (see tokenize.hpp).
#include "runtime/io/tokenize.hpp"

#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "runtime/io/token_file.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

constexpr std::size_t kReadChunkBytes = 1 << 20;

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

}  // namespace

std::string tokenize_split_path(const std::string& out_path, const std::string& split) {
  std::filesystem::path path(out_path);
  std::string stem = path.extension() == ".bin" ? path.stem().string() : path.filename().string();
  return (path.parent_path() / (stem + "_" + split + ".bin")).string();
}

TokenizeResult tokenize_bytes(const std::string& in_path, const std::string& out_path, double val_fraction) {
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
        "input has " + std::to_string(total_bytes) + " bytes, more than one token file holds (its count is an int32)",
        io_where(in_path), "split the input into several files and tokenize each");
  }
  std::ifstream in(in_path, std::ios::binary);
  if (!in) throw Error("cannot open input file", io_where(in_path), "check its permissions");

  TokenizeResult result;
  auto val_bytes = static_cast<std::int64_t>(std::llround(val_fraction * total_bytes));
  if (val_fraction > 0.0 && (val_bytes == 0 || val_bytes == total_bytes)) {
    throw Error("a validation fraction of " + std::to_string(val_fraction) + " of " + std::to_string(total_bytes) +
                    " bytes leaves one split empty",
                io_where(in_path, "--val-fraction"),
                "use a larger input file or a fraction that leaves tokens on both sides");
  }
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

}  // namespace alloy
