// Byte-level tokenizer: any file becomes a token file whose tokens are its byte values
// (vocabulary 256, uint16 tokens), optionally split into training and validation files.
#pragma once

#include <cstdint>
#include <string>

namespace alloy {

inline constexpr std::int64_t kByteVocabSize = 256;

struct TokenizeResult {
  std::string train_path;  // all tokens when val_fraction is 0
  std::string val_path;    // empty when val_fraction is 0
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
};

// Names of the split outputs for `out_path`: "data/x.bin" -> "data/x_train.bin", "data/x_val.bin".
std::string tokenize_split_path(const std::string& out_path, const std::string& split);

// Streams `in_path` into token files. With `val_fraction` in (0, 1), the last `val_fraction` of
// the bytes go to tokenize_split_path(out, "val") and the rest to tokenize_split_path(out,
// "train"); with 0 everything goes to `out_path`. Errors: missing or empty input, a fraction
// outside [0, 1), or a split that would leave either side empty.
TokenizeResult tokenize_bytes(const std::string& in_path, const std::string& out_path, double val_fraction);

}  // namespace alloy
