// `alloy tokenize`: turn any file into token files, byte-level or with a Hugging Face
// byte-level BPE tokenizer.json, with a progress line and the throughput at the end.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "runtime/io/tokenize.hpp"
#include "util/clock.hpp"

namespace alloy::cli {

namespace {

using Clock = std::chrono::steady_clock;

std::string version_name(TokenFileVersion version) {
  return version == TokenFileVersion::TokenFileVersion_uint32 ? "uint32 tokens, version 2" : "uint16 tokens, version 1";
}

// A line rewritten in place on a terminal, at most every half second; nothing on a file or pipe.
TokenizeProgress progress_printer(Clock::time_point start) {
  if (!isatty(STDERR_FILENO)) return {};
  auto last_print = std::make_shared<Clock::time_point>(start);
  return [start, last_print](std::int64_t done_bytes, std::int64_t total_bytes) {
    if (seconds_since(*last_print) < 0.5) return;
    *last_print = Clock::now();
    double megabytes = static_cast<double>(done_bytes) / 1e6;
    std::fprintf(stderr, "\r\033[Ktokenizing: %.0f of %.0f MB (%.0f%%), %.1f MB/s", megabytes,
                 static_cast<double>(total_bytes) / 1e6,
                 100.0 * static_cast<double>(done_bytes) / static_cast<double>(total_bytes),
                 megabytes / seconds_since(start));
    std::fflush(stderr);
  };
}

}  // namespace

void add_tokenize(CLI::App& app, int* exit_code) {
  struct Options {
    std::string input;
    std::string output;
    std::string tokenizer;
    double val_fraction = 0;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Turn any file into a token file: byte-level (vocabulary 256) or with a byte-level BPE tokenizer.json");
  cmd->add_option("input", o->input, "Text (or any) file")->required();
  cmd->add_option("--output,-o", o->output, "Token file to write, e.g. data.bin")->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2 families); without it, bytes "
                  "are the tokens");
  cmd->add_option("--val-fraction", o->val_fraction,
                  "Put the last fraction of the input into OUT_val.bin and the rest into OUT_train.bin (with "
                  "--tokenizer: from the first token that starts there)");
  cmd->callback([o, exit_code]() {
    Clock::time_point start = Clock::now();
    TokenizeResult r = o->tokenizer.empty()
                           ? tokenize_bytes(o->input, o->output, o->val_fraction)
                           : tokenize_bpe(o->input, o->output, o->tokenizer, o->val_fraction, progress_printer(start));
    double seconds = seconds_since(start);
    if (isatty(STDERR_FILENO) && !o->tokenizer.empty()) std::fprintf(stderr, "\r\033[K");
    std::string written = r.val_path.empty() ? fmt::format("{} ({} tokens)", r.train_path, r.train_tokens)
                                             : fmt::format("{} ({} tokens) and {} ({} tokens)", r.train_path,
                                                           r.train_tokens, r.val_path, r.val_tokens);
    fmt::print("wrote {}, vocabulary {}, {}\n", written, r.vocab_size, version_name(r.version));
    if (!o->tokenizer.empty()) {
      auto input_bytes = static_cast<double>(std::filesystem::file_size(o->input));
      std::string amount =
          input_bytes < 1e6 ? fmt::format("{} bytes", input_bytes) : fmt::format("{:.1f} MB", input_bytes / 1e6);
      fmt::print("tokenized {} in {:.2f} s with loading the tokenizer: {:.1f} MB/s\n", amount, seconds,
                 input_bytes / 1e6 / std::max(seconds, 1e-9));
    }
    *exit_code = 0;
  });
}

}  // namespace alloy::cli
