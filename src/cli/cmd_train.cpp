// `alloy train` (one rank, or every rank of a plan under mpirun) and `alloy tokenize`: train a
// model on token files with progress, JSON-lines logs, validation and checkpoints; turn any
// text into a byte-level token file.
#include <algorithm>
#include <fstream>
#include <optional>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "cli/gpu_commands.hpp"
#include "cost/profile.hpp"
#include "hw/catalog.hpp"
#include "plan/plan.hpp"
#include "runtime/cpu/blas_core.hpp"
#include "runtime/dist/calibration.hpp"
#include "runtime/dist/dist_trainer.hpp"
#include "runtime/io/tokenize.hpp"
#include "runtime/trainer.hpp"
#include "search/transfer_calibration.hpp"
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
  std::string plan;      // distributed: the plan every rank runs
  std::string cluster;   // its cluster (default: the plan's cluster by name)
  std::string trace;
  std::string export_weights;
  std::string profile;             // the profile the plan was made with
  std::string calibrated_profile;  // where to write it corrected by this run's measurements
  std::string device = "cpu";      // cpu, or cuda (one GPU per rank)
  int gpu = -1;                    // -1: the rank's index on its host
  std::string gpu_comm = "auto";
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
  fmt::print("median {:.0f} tokens/s; measured GEMM peak {} ({} kernels); peak arena memory {}\n", rates[rates.size() / 2],
             units_format_flops(r.gemm_peak_flops), blas_core().name, units_format_bytes(static_cast<double>(r.peak_arena_bytes)));
}

// Options that the plan decides (batch, sequence, recomputation) or that only one rank runs.
void check_plan_options(const TrainCommand& c) {
  auto refuse = [](bool given, const char* option, const char* why) {
    if (given) throw Error(fmt::format("{} cannot be combined with --plan: {}", option, why), {"", option}, "drop it, or re-plan");
  };
  refuse(c.options.batch_size > 0, "--batch", "the plan fixes the global batch");
  refuse(c.seq_len > 0, "--seq-len", "the plan fixes the sequence length");
  refuse(c.recompute != "none", "--recompute", "the plan sets recomputation per layer");
  refuse(!c.options.val_data.empty(), "--val-data", "validation runs on one rank only");
  if (!c.calibrated_profile.empty() && c.profile.empty()) {
    throw Error("--calibrated-profile needs the profile the plan was made with", {"", "--profile"},
                "pass --profile PROFILE.json (from alloy profile)");
  }
}

// Names the profile's device types that no rank of the run was: their entries stay as measured.
void print_types_not_run(const Profile& profile, const std::vector<DeviceTypeCalibration>& ratios) {
  for (const auto& [type, entry] : profile.device_types) {
    const bool ran = std::any_of(ratios.begin(), ratios.end(), [&](const DeviceTypeCalibration& r) { return r.device_type == type; });
    if (!ran)
      fmt::print("  {}: no rank of this type ran this plan, so its entries are copied as measured; a plan that uses "
                 "every device type calibrates them all (alloy plan --all-devices)\n",
                 type);
  }
}

// The plan's profile with each device type's layer times scaled per layer kind, and its
// optimizer rate and collectives, by what this run measured against what the plan predicted;
// then the time per stage-boundary transfer that makes it predict this run's step.
void write_calibrated_profile(const TrainCommand& c, const DistTrainResult& result, const Plan& plan, const ModelSpec& model,
                              const ClusterSpec& cluster, const TrainSpec& train) {
  // Without a profile the ratios are still printed, over every layer kind together.
  const Profile profile = c.profile.empty() ? Profile{} : profile_load(c.profile);
  const std::vector<DeviceTypeCalibration> ratios = dist_calibration(result, plan, profile, model);
  for (const DeviceTypeCalibration& r : ratios)
    fmt::print("measured / predicted on {}: {}\n", r.device_type, calibration_describe(r));
  if (c.calibrated_profile.empty()) return;
  Profile calibrated = profile_calibrated(profile, ratios);
  if (const std::optional<TransferCalibration> transfers =
          transfer_calibration_fit(plan, model, cluster, train, calibrated, dist_measured_step_seconds(result))) {
    fmt::print("{}\n", transfer_calibration_describe(*transfers));
    transfer_calibration_apply(&calibrated, *transfers);
  }
  std::ofstream out(c.calibrated_profile);
  if (!out) throw Error("cannot write the calibrated profile", {c.calibrated_profile, "--calibrated-profile"}, "check the folder exists");
  out << profile_to_json(calibrated);
  fmt::print("calibrated profile: {} (use it with alloy plan --profile)\n", c.calibrated_profile);
  print_types_not_run(profile, ratios);
}

DistTrainOptions dist_options_from(const TrainCommand& c) {
  DistTrainOptions o;
  o.plan_path = c.plan;
  o.train_data = c.options.train_data;
  o.checkpoint_dir = c.options.checkpoint_dir;
  o.checkpoint_every = c.options.checkpoint_every;
  o.resume = c.options.resume;
  o.log_path = c.options.log_path;
  o.trace_path = c.trace;
  o.export_path = c.export_weights;
  o.threads = c.options.threads;
  o.memory_cap_bytes = c.options.memory_cap_bytes;
  o.progress = c.options.progress;
  return o;
}

void print_dist_summary(const ModelSpec& model, const Plan& plan, const DistTrainResult& r, const DistTrainOptions& o) {
  if (r.steps.empty()) {
    fmt::print("nothing to do: the checkpoints are already at step {}\n", r.first_step);
    return;
  }
  fmt::print("\ntrained {} on {} ranks ({} stages) for steps {}..{}: loss {:.4f} -> {:.4f}\n", model.name,
             plan.num_used_devices(), plan.stages.size(), r.first_step + 1, r.steps.back().step, r.steps.front().loss,
             r.steps.back().loss);
  fmt::print("{}", dist_render_summary(r, plan));
  if (!o.trace_path.empty()) fmt::print("trace of the last step: {} (open in https://ui.perfetto.dev)\n", o.trace_path);
  if (!o.export_path.empty()) fmt::print("full weights: {}\n", o.export_path);
}

// Every rank runs this. Errors all ranks agreed on are printed by each and end it with exit 2;
// an error on one rank alone ends the whole job through the communicator.
void run_distributed(TrainCommand& c, const ModelSpec& model, int* exit_code) {
  check_plan_options(c);
  std::unique_ptr<Communicator> comm = communicator_mpi();
  try {
    Plan plan;
    ClusterSpec cluster;
    TrainSpec train;
    dist_agree_on(*comm, [&] {
      plan = plan_load(c.plan);
      cluster = cluster_load(c.cluster.empty() ? plan.cluster_name : c.cluster, catalog_builtin());
      train = train_spec_from(c, model);
    });
    const DistTrainOptions options = dist_options_from(c);
    DistTrainResult result = dist_train_run(model, train, plan, cluster, *comm, options);
    if (comm->rank() == 0) {
      print_dist_summary(model, plan, result, options);
      if (!result.steps.empty()) write_calibrated_profile(c, result, plan, model, cluster, train);
    }
    *exit_code = 0;
  } catch (const AgreedError& e) {
    fmt::print(stderr, "alloy: error: {}\n", e.format());
    *exit_code = kExitBadInput;
  } catch (const Error& e) {
    comm->abort(e.format(), kExitBadInput);
  } catch (const std::exception& e) {
    comm->abort(fmt::format("internal error: {}", e.what()), 1);
  }
}

void parse_single_run_options(TrainCommand& c) {
  if (!recompute_parse(c.recompute, &c.options.recompute)) {
    throw Error("unknown recomputation level '" + c.recompute + "'", {"", "--recompute"}, "use none, selective or full");
  }
  if (!c.memory_cap.empty()) {
    std::optional<double> cap = units_parse_bytes(c.memory_cap);
    if (!cap || *cap <= 0) throw Error("cannot read '" + c.memory_cap + "' as a memory size", {"", "--memory-cap"}, "write e.g. 2GiB");
    c.options.memory_cap_bytes = *cap;
  }
}

// GPUs: one alone or with a one-GPU plan, or under mpirun one data-parallel replica per GPU.
void run_gpu(TrainCommand& c, const ModelSpec& model, int* exit_code) {
  if (!c.plan.empty()) check_plan_options(c);
  for (const auto& [given, option] : {std::pair{!c.trace.empty(), "--trace"}, std::pair{!c.export_weights.empty(), "--export"},
                                      std::pair{!c.calibrated_profile.empty(), "--calibrated-profile"}}) {
    if (given) throw Error(fmt::format("{} is not run on the GPU yet", option), {"", option}, "drop it, or train on CPU ranks");
  }
  parse_single_run_options(c);
  TrainSpec train = train_spec_from(c, model);
  GpuTrainRequest request{c.options, c.plan, c.cluster, c.gpu, c.gpu_comm};
  train_on_gpu(model, train, request);
  *exit_code = 0;
}

void run_train(TrainCommand& c, int* exit_code) {
  if (c.model.empty()) throw Error("no model given", {"", "--model"}, "pass --model tiny-gpt (or a config path)");
  ModelSpec model = model_load(c.model);
  if (c.device != "cpu" && c.device != "cuda") {
    throw Error("unknown device '" + c.device + "'", {"", "--device"}, "use cpu, or cuda for one GPU");
  }
  if (c.device == "cuda") {
    run_gpu(c, model, exit_code);
    return;
  }
  if (!c.plan.empty()) {
    run_distributed(c, model, exit_code);
    return;
  }
  if (c.seq_len > model.max_seq_len) {
    throw Error(fmt::format("sequence length {} is longer than model {} allows ({})", c.seq_len, model.name,
                            model.max_seq_len),
                {"", "--seq-len"}, fmt::format("use --seq-len {} or less", model.max_seq_len));
  }
  TrainSpec train = train_spec_from(c, model);
  parse_single_run_options(c);
  TrainerResult result = trainer_run(model, train, c.options);
  print_summary(model, train, result);
  *exit_code = 0;
}

}  // namespace

void add_train(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<TrainCommand>();
  CLI::App* cmd = app.add_subcommand("train",
                                     "Train a model from llm.c token files: on one CPU rank (fp32), on every rank "
                                     "of a plan under mpirun (--plan), or on one GPU (--device cuda, bf16)");
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
  cmd->add_option("--threads", c->options.threads, "Threads (default: cores / ranks on this node; with --plan on one host, cores / the cluster's CPU devices; or ALLOY_THREADS)");
  cmd->add_option("--recompute", c->recompute, "Activation recomputation for every block: none, selective, full")
      ->capture_default_str();
  cmd->add_option("--memory-cap", c->memory_cap, "Arena capacity, e.g. 2GiB (training fails clearly above it)");
  cmd->add_flag("--progress,!--no-progress", c->options.progress, "Per-step line on stderr (--no-progress: none)");
  cmd->add_option("--device", c->device,
                  "cpu, or cuda: train in bf16 on one GPU, or on one GPU per rank under mpirun (data parallel, --plan or not)")
      ->capture_default_str();
  cmd->add_option("--gpu", c->gpu, "With --device cuda: the GPU's index (default: the rank's index on its host)");
  cmd->add_option("--gpu-comm", c->gpu_comm,
                  "With --device cuda under mpirun: how replicas sum gradients: auto, nccl, or host (through host memory)")
      ->capture_default_str();
  cmd->add_option("--plan,-p", c->plan, "Run this plan: mpirun -np <devices the plan uses> alloy train --plan plan.json ...");
  cmd->add_option("--cluster,-c", c->cluster, "The plan's cluster (preset or path; default: the plan's cluster name)");
  cmd->add_option("--trace", c->trace, "With --plan: Chrome trace of the last step of every rank");
  cmd->add_option("--export", c->export_weights, "With --plan: write the full trained weights (safetensors)");
  cmd->add_option("--profile", c->profile, "With --plan: the profile the plan was made with (for --calibrated-profile)");
  cmd->add_option("--calibrated-profile", c->calibrated_profile,
                  "With --plan: write --profile corrected by this run's measured forward, backward and optimizer times");
  cmd->callback([c, exit_code]() { run_train(*c, exit_code); });
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
