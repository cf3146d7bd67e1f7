// `alloy train` (one rank) and `alloy tokenize`: train a model on token files with progress,
// JSON-lines logs, validation and checkpoints; turn any text into a byte-level token file.
#include <algorithm>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "runtime/io/tokenize.hpp"
#include "runtime/trainer.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy::cli {

namespace {

struct TrainCommand {
  std::string model;
  std::string train_file;
  int64_t steps = 0;
  int64_t seq_len = 0;
  double learning_rate = 0;
  std::string recompute = "none";
  std::string memory_cap;
  TrainerOptions options;
};

TrainSpec train_spec_from(const TrainCommand& c, const ModelSpec& model) {
  TrainSpec t;
  if (!c.train_file.empty()) {
    t = train_load(c.train_file);
  } else {
    t.seq_len = std::min(t.seq_len, model.max_seq_len);  // the default fits the model
  }
  if (c.steps > 0) t.steps = c.steps;
  if (c.seq_len > 0) t.seq_len = c.seq_len;
  if (c.learning_rate > 0) {
    t.learning_rate = c.learning_rate;
    t.min_learning_rate = std::min(t.min_learning_rate, c.learning_rate);
  }
  if (c.options.batch_size > 0) t.global_batch_sequences = c.options.batch_size;
  t.precision = Precision::Precision_fp32;  // the CPU runtime computes in fp32
  train_validate(t);
  return t;
}

void print_summary(const ModelSpec& model, const TrainSpec& train, const TrainerResult& r) {
  if (r.steps.empty()) {
    fmt::print("nothing to do: the checkpoint is already at step {} of {}\n", r.first_step, train.steps);
    return;
  }
  std::vector<double> rates;
  for (const auto& s : r.steps) rates.push_back(s.tokens_per_second);
  std::sort(rates.begin(), rates.end());
  fmt::print("\ntrained {} for steps {}..{}: loss {:.4f} -> {:.4f}\n", model.name, r.first_step + 1,
             r.steps.back().step, r.steps.front().loss, r.steps.back().loss);
  if (r.initial_val_loss && r.final_val_loss) {
    fmt::print("validation loss {:.4f} -> {:.4f}\n", *r.initial_val_loss, *r.final_val_loss);
  } else if (r.final_val_loss) {
    fmt::print("validation loss {:.4f}\n", *r.final_val_loss);
  }
  fmt::print("median {:.0f} tokens/s; measured GEMM peak {}; peak arena memory {}\n", rates[rates.size() / 2],
             units_format_flops(r.gemm_peak_flops), units_format_bytes(static_cast<double>(r.peak_arena_bytes)));
}

void run_train(TrainCommand& c) {
  if (c.model.empty()) throw Error("no model given", {"", "--model"}, "pass --model tiny-gpt (or a config path)");
  ModelSpec model = model_load(c.model);
  if (c.seq_len > model.max_seq_len) {
    throw Error(fmt::format("sequence length {} is longer than model {} allows ({})", c.seq_len, model.name,
                            model.max_seq_len),
                {"", "--seq-len"}, fmt::format("use --seq-len {} or less", model.max_seq_len));
  }
  TrainSpec train = train_spec_from(c, model);
  if (!recompute_parse(c.recompute, &c.options.recompute)) {
    throw Error("unknown recomputation level '" + c.recompute + "'", {"", "--recompute"}, "use none, selective or full");
  }
  if (!c.memory_cap.empty()) {
    std::optional<double> cap = units_parse_bytes(c.memory_cap);
    if (!cap || *cap <= 0) throw Error("cannot read '" + c.memory_cap + "' as a memory size", {"", "--memory-cap"}, "write e.g. 2GiB");
    c.options.memory_cap_bytes = *cap;
  }
  TrainerResult result = trainer_run(model, train, c.options);
  print_summary(model, train, result);
}

}  // namespace

void add_train(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<TrainCommand>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model on one rank (CPU, fp32) from llm.c token files");
  cmd->add_option("--model,-m", c->model, "Model preset or config path (e.g. tiny-gpt)")->required();
  cmd->add_option("--data,-d", c->options.train_data, "Training token file (llm.c format; see `alloy tokenize`)")->required();
  cmd->add_option("--val-data", c->options.val_data, "Validation token file");
  cmd->add_option("--train,-t", c->train_file, "Training setup .yaml (steps, batch, learning rate, ...)");
  cmd->add_option("--steps", c->steps, "Optimizer steps (overrides the setup)");
  cmd->add_option("--batch", c->options.batch_size, "Sequences per step (overrides the setup)");
  cmd->add_option("--seq-len", c->seq_len, "Tokens per sequence (overrides the setup)");
  cmd->add_option("--lr", c->learning_rate, "Peak learning rate (overrides the setup)");
  cmd->add_option("--val-every", c->options.val_every, "Validation loss every N steps (and always at the end)");
  cmd->add_option("--val-batches", c->options.val_batches, "Batches per validation pass")->capture_default_str();
  cmd->add_option("--checkpoint", c->options.checkpoint_dir, "Checkpoint folder (written atomically at the end)");
  cmd->add_option("--checkpoint-every", c->options.checkpoint_every, "Also checkpoint every N steps");
  cmd->add_flag("--resume", c->options.resume, "Continue from --checkpoint with identical batches");
  cmd->add_option("--log", c->options.log_path, "Append one JSON line per step to this file");
  cmd->add_option("--threads", c->options.threads, "Threads (default: cores / ranks on this node, or ALLOY_THREADS)");
  cmd->add_option("--recompute", c->recompute, "Activation recomputation for every block: none, selective, full")
      ->capture_default_str();
  cmd->add_option("--memory-cap", c->memory_cap, "Arena capacity, e.g. 2GiB (training fails clearly above it)");
  cmd->add_flag("!--progress", c->options.progress, "--no-progress: no per-step line on stderr");
  cmd->callback([c, exit_code]() {
    run_train(*c);
    *exit_code = 0;
  });
}

void add_tokenize(CLI::App& app, int* exit_code) {
  struct Options {
    std::string input;
    std::string output;
    double val_fraction = 0;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Turn any file into a byte-level token file (vocabulary 256)");
  cmd->add_option("input", o->input, "Text (or any) file")->required();
  cmd->add_option("--output,-o", o->output, "Token file to write, e.g. data.bin")->required();
  cmd->add_option("--val-fraction", o->val_fraction,
                  "Put the last fraction of the bytes into OUT_val.bin and the rest into OUT_train.bin");
  cmd->callback([o, exit_code]() {
    TokenizeResult r = tokenize_bytes(o->input, o->output, o->val_fraction);
    if (r.val_path.empty()) {
      fmt::print("wrote {} ({} tokens, vocabulary 256)\n", r.train_path, r.train_tokens);
    } else {
      fmt::print("wrote {} ({} tokens) and {} ({} tokens), vocabulary 256\n", r.train_path, r.train_tokens, r.val_path,
                 r.val_tokens);
    }
    *exit_code = 0;
  });
}

}  // namespace alloy::cli
