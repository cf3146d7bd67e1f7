// Tokenizing a file into token files, optionally split into training and validation files:
// byte-level (tokens are the byte values, vocabulary 256) or with a Hugging Face byte-level BPE
// tokenizer.json (GPT-2, Llama 3, Qwen2 families).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/io/token_file.hpp"

namespace alloy {

inline constexpr std::int64_t kByteVocabSize = 256;

struct TokenizeResult {
  std::string train_path;  // all tokens when val_fraction is 0
  std::string val_path;    // empty when val_fraction is 0
  std::int64_t train_tokens = 0;
  std::int64_t val_tokens = 0;
  std::int64_t vocab_size = kByteVocabSize;
  TokenFileVersion version = TokenFileVersion::TokenFileVersion_uint16;
};

// uint16 tokens (version 1) while every id fits, i.e. up to 65536 ids; uint32 (version 2) above.
TokenFileVersion token_file_version_for(std::int64_t vocab_size);

// Called now and then with the input bytes tokenized so far and the total.
using TokenizeProgress = std::function<void(std::int64_t done_bytes, std::int64_t total_bytes)>;

// Names of the split outputs for `out_path`: "data/x.bin" -> "data/x_train.bin", "data/x_val.bin".
std::string tokenize_split_path(const std::string& out_path, const std::string& split);

// Streams `in_path` into token files. With `val_fraction` in (0, 1), the last `val_fraction` of
// the bytes go to tokenize_split_path(out, "val") and the rest to tokenize_split_path(out,
// "train"); with 0 everything goes to `out_path`. Errors: missing or empty input, a fraction
// outside [0, 1), or a split that would leave either side empty.
TokenizeResult tokenize_bytes(const std::string& in_path, const std::string& out_path, double val_fraction);

// As tokenize_bytes, with the BPE tokenizer of `tokenizer_path` (bpe_tokenizer_load's errors).
// The input (at most 2 GiB) is memory-mapped; with an NFC normalizer (Qwen2) a copy is
// normalized in memory unless it is in NFC already. The validation split starts at the first
// piece (pre-token or added token) that starts at or after the byte where the last
// `val_fraction` of the (normalized) text begins, so it falls on a token boundary.
TokenizeResult tokenize_bpe(const std::string& in_path, const std::string& out_path, const std::string& tokenizer_path,
                            double val_fraction, const TokenizeProgress& progress = {});

}  // namespace alloy
