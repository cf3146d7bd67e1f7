// `alloy train` (one rank, or every rank of a plan under mpirun): train a model on token files
// with progress, JSON-lines logs, validation and checkpoints.
#include <algorithm>
#include <optional>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "cli/gpu_commands.hpp"
#include "cli/option_checks.hpp"
#include "cost/profile.hpp"
#include "hw/catalog.hpp"
#include "plan/plan.hpp"
#include "plan/plan_inputs.hpp"
#include "runtime/cpu/blas_core.hpp"
#include "runtime/parallel/calibration.hpp"
#include "runtime/parallel/agree.hpp"
#include "runtime/parallel/dist_report.hpp"
#include "runtime/stage_backend.hpp"
#include "runtime/threads.hpp"
#include "runtime/trainer.hpp"
#include "search/transfer_calibration.hpp"
#include "spec/error.hpp"
#include "spec/moe.hpp"
#include "spec/text_file.hpp"
#include "spec/units.hpp"

namespace alloy::cli {

namespace {

constexpr double kTrainMostLearningRate = 10.0;
constexpr int64_t kTrainMostGpus = 1024;
constexpr double kTrainMostMemoryCapBytes = 1125899906842624.0;  // 1 PiB

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
  std::string cluster;   // its cluster (default: the one the plan carries)
  std::string trace;
  std::string export_weights;
  std::string profile;             // the profile the plan was made with
  std::string calibrated_profile;  // where to write it corrected by this run's measurements
  std::string device = "cpu";      // cpu, or cuda (one GPU per rank)
  int gpu = -1;                    // -1: the rank's index on its host
  std::string gpu_comm = "auto";
};

// The run's training setup: with a plan, the plan's own (or the --train file, which must agree
// with it); without, the --train file or the defaults. Options given override either.
TrainSpec train_spec_from(const TrainCommand& c, const ModelSpec& model, const Plan* plan) {
  TrainSpec t;
  if (plan != nullptr) {
    t = plan_train(*plan, c.train_file, c.plan);
  } else if (!c.train_file.empty()) {
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
  // The CPU backend computes in fp32, the CUDA backend in bf16 with fp32 master weights.
  t.precision = c.device == "cuda" ? Precision::Precision_bf16 : Precision::Precision_fp32;
  train_validate(t);
  return t;
}

// Options that need another option or a configuration to mean anything are refused without it.
void train_check_applicable(const CLI::App& cmd, const TrainCommand& c) {
  const bool with_plan = !c.plan.empty();
  option_refuse_unless(cmd, "--cluster", with_plan, "--plan (a run without a plan is one stage on this machine)");
  option_refuse_unless(cmd, "--profile", with_plan, "--plan");
  option_refuse_unless(cmd, "--calibrated-profile", with_plan, "--plan");
  option_refuse_unless(cmd, "--val-every", !c.options.val_data.empty(), "--val-data");
  option_refuse_unless(cmd, "--val-batches", !c.options.val_data.empty(), "--val-data");
  option_refuse_unless(cmd, "--checkpoint-every", !c.options.checkpoint_dir.empty(), "--checkpoint DIR");
  option_refuse_unless(cmd, "--keep-checkpoints", !c.options.checkpoint_dir.empty(), "--checkpoint DIR");
  option_refuse_unless(cmd, "--gpu", c.device == "cuda", "--device cuda");
  option_refuse_unless(cmd, "--gpu-comm", c.device == "cuda", "--device cuda");
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
void write_calibrated_profile(const TrainCommand& c, const TrainerResult& result, const Plan& plan, const ModelSpec& model,
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
  text_file_write(c.calibrated_profile, profile_to_json(calibrated), "calibrated profile", "--calibrated-profile");
  fmt::print("calibrated profile: {} (use it with alloy plan --profile)\n", c.calibrated_profile);
  print_types_not_run(profile, ratios);
}

void parse_single_run_options(TrainCommand& c) {
  if (!recompute_parse(c.recompute, &c.options.recompute)) {
    throw Error("unknown recomputation level '" + c.recompute + "'", {"", "--recompute"}, "use none, selective or full");
  }
  if (!c.memory_cap.empty()) {
    std::optional<double> cap = units_parse_bytes(c.memory_cap);
    if (!cap || *cap <= 0 || *cap > kTrainMostMemoryCapBytes)
      throw Error("cannot read '" + c.memory_cap + "' as a memory size from 1 byte to 1PiB", {"", "--memory-cap"},
                  "write e.g. 2GiB");
    c.options.memory_cap_bytes = *cap;
  }
}

TrainerOptions run_options(const TrainCommand& c) {
  TrainerOptions o = c.options;
  o.plan_path = c.plan;
  o.trace_path = c.trace;
  o.export_path = c.export_weights;
  return o;
}

// What people read at the end: the loss, the speed against the devices' measured peak, memory,
// and with a plan (or several ranks) each rank's time and memory against the plan's.
void print_run_summary(const ModelSpec& model, const Plan& plan, const TrainerResult& r, const TrainCommand& c,
                       const std::string& devices) {
  if (r.steps.empty()) {
    fmt::print("nothing to do: the checkpoint is already at step {}\n", r.first_step);
    return;
  }
  const int ranks = plan.num_used_devices();
  fmt::print("\ntrained {} on {} for steps {}..{}: loss {:.4f} -> {:.4f}\n", model.name, devices, r.first_step + 1,
             r.steps.back().step, r.steps.front().loss, r.steps.back().loss);
  if (r.initial_val_loss && r.final_val_loss) {
    fmt::print("validation loss {:.4f} -> {:.4f}\n", *r.initial_val_loss, *r.final_val_loss);
  } else if (r.final_val_loss) {
    fmt::print("validation loss {:.4f}\n", *r.final_val_loss);
  }
  const double step_seconds = dist_measured_step_seconds(r);
  const double tokens_per_second = static_cast<double>(plan.global_batch_sequences * plan.seq_len) / step_seconds;
  const double mfu = tokens_per_second * model_flops_per_token(model, plan.seq_len).training / r.gemm_peak_flops;
  fmt::print("median step {} over {} rank(s) x {} micro-batch(es): {:.0f} tokens/s; model FLOPs utilisation {:.1f}% of "
             "the measured matrix-product peak ({}{}); peak arena memory {}\n",
             units_format_seconds(step_seconds), ranks, plan.num_micro_batches, tokens_per_second, 100.0 * mfu,
             units_format_flops(r.gemm_peak_flops), c.device == "cpu" ? fmt::format(", {} kernels", blas_core().name) : "",
             units_format_bytes(static_cast<double>(r.peak_arena_bytes)));
  if (r.peak_host_arena_bytes > 0)
    fmt::print("peak host arena memory (offloaded blocks and parked activations) {}\n",
               units_format_bytes(static_cast<double>(r.peak_host_arena_bytes)));
  if (!c.plan.empty() || ranks > 1) fmt::print("{}", dist_render_summary(r, plan));
  if (!c.trace.empty()) fmt::print("trace of the last step: {} (open in https://ui.perfetto.dev)\n", c.trace);
  if (!c.export_weights.empty()) fmt::print("full weights: {}\n", c.export_weights);
}

// The plan every rank runs: the given one, checked against the backend before anything is
// opened or allocated, or without one a single stage of the whole model on each rank's device,
// data parallel over the ranks (the GPU, when the backend is cuda, is opened first: its type
// and memory make the stage).
struct RunSetup {
  Plan plan;
  ClusterSpec cluster;
  TrainSpec train;
  std::unique_ptr<GpuTraining> gpu;
};

RunSetup run_setup(const TrainCommand& c, const ModelSpec& model, const Plan* plan, Communicator& comm) {
  RunSetup r;
  dist_agree_on(comm, [&] {
    r.train = train_spec_from(c, model, plan);
    if (plan == nullptr) return;
    // Without a plan the setup's precision is the backend's own (train_spec_from).
    const std::string note = stage_backend_precision_note(c.device, plan->precision, c.plan);
    if (!note.empty() && comm.rank() == 0) fmt::print(stderr, "{}\n", note);
    r.plan = *plan;
    r.cluster = plan_cluster(r.plan, c.cluster, catalog_builtin(), c.plan);
    stage_backend_check_plan(c.device, r.plan, c.plan);
  });
  if (c.device == "cuda") dist_agree_on(comm, [&] { r.gpu = gpu_training_open(comm, c.gpu, c.gpu_comm); });
  if (c.plan.empty()) {
    dist_agree_on(comm, [&] {
      OneStage one = trainer_one_stage(model, r.train, c.options, r.gpu ? &r.gpu->device : nullptr, comm.world_size());
      r.plan = std::move(one.plan);
      r.cluster = std::move(one.cluster);
    });
  }
  return r;
}

// Every rank runs this. Errors all ranks agreed on are printed by each and end it with exit 2;
// an error on one rank alone ends the whole job through the communicator. A run of one rank
// throws, and the error is printed with its file and field. A run stopped on NaN or Inf (by
// every rank at the same step) is reported once, by rank 0, and ends with exit 3.
void run_training(TrainCommand& c, const ModelSpec& model, const Plan* plan, int* exit_code) {
  if (!c.plan.empty()) check_plan_options(c);
  parse_single_run_options(c);
  std::unique_ptr<Communicator> comm = communicator_launched_by_mpi() ? communicator_mpi() : communicator_local();
  const bool alone = comm->world_size() == 1;
  try {
    const RunSetup r = run_setup(c, model, plan, *comm);
    const TrainerResult result =
        train_run(model, r.train, r.plan, r.cluster, *comm, run_options(c), r.gpu ? r.gpu->backend : TrainBackend{});
    if (comm->rank() == 0) {
      const std::string devices = r.gpu ? fmt::format("{} x {}", r.plan.num_used_devices(), r.gpu->description)
                                        : fmt::format("{} CPU rank(s)", r.plan.num_used_devices());
      print_run_summary(model, r.plan, result, c, devices);
      if (!c.plan.empty() && !result.steps.empty()) write_calibrated_profile(c, result, r.plan, model, r.cluster, r.train);
    }
    *exit_code = result.stop_signal != 0 ? 128 + result.stop_signal : 0;
  } catch (const NonFiniteError& e) {
    if (comm->rank() == 0) fmt::print(stderr, "alloy: error: {}\n", e.format());
    *exit_code = kExitNonFinite;
  } catch (const AgreedError& e) {
    if (alone) throw;
    fmt::print(stderr, "alloy: error: {}\n", e.format());
    *exit_code = kExitBadInput;
  } catch (const Error& e) {
    if (alone) throw;
    comm->abort(e.format(), kExitBadInput);
  } catch (const std::exception& e) {
    if (alone) throw;
    comm->abort(fmt::format("internal error: {}", e.what()), 1);
  }
}

void run_train(TrainCommand& c, int* exit_code) {
  // A plan carries its model: --model is then only checked against it.
  std::optional<Plan> plan;
  if (!c.plan.empty()) plan = plan_load(c.plan);
  if (c.model.empty() && !plan)
    throw Error("no model given", {"", "--model"}, "pass --model tiny-gpt (or a config path), or --plan with a plan file");
  const ModelSpec model = plan ? plan_model(*plan, c.model, c.plan) : model_load(c.model);
  if (c.device != "cpu" && c.device != "cuda") {
    throw Error("unknown device '" + c.device + "'", {"", "--device"}, "use cpu, or cuda for one GPU per rank");
  }
  if (c.plan.empty() && c.seq_len > model.max_seq_len) {
    throw Error(fmt::format("sequence length {} is longer than model {} allows ({})", c.seq_len, model.name,
                            model.max_seq_len),
                {"", "--seq-len"}, fmt::format("use --seq-len {} or less", model.max_seq_len));
  }
  run_training(c, model, plan ? &*plan : nullptr, exit_code);
}

}  // namespace

void add_train(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<TrainCommand>();
  CLI::App* cmd = app.add_subcommand("train",
                                     "Train a model from llm.c token files: on one CPU rank (fp32), on every rank "
                                     "of a plan under mpirun (--plan), or on one GPU (--device cuda, bf16)");
  cmd->add_option("--model,-m", c->model, "Model preset or config path (e.g. tiny-gpt); with --plan, the plan's own");
  cmd->add_option("--data,-d", c->options.train_data, "Training token file (llm.c format; see `alloy tokenize`)")->required();
  cmd->add_option("--val-data", c->options.val_data, "Validation token file");
  cmd->add_option("--train,-t", c->train_file, "Training setup .yaml (steps, batch, learning rate, ...); with --plan, the plan's own");
  cmd->add_option("--steps", c->steps, "Optimizer steps (overrides the setup)")->check(option_whole_in(1, kOptionMostSteps));
  cmd->add_option("--batch", c->options.batch_size, "Sequences per step (overrides the setup)")
      ->check(option_whole_in(1, kOptionMostSequences));
  cmd->add_option("--seq-len", c->seq_len, "Tokens per sequence (overrides the setup)")
      ->check(option_whole_in(1, kOptionMostSequences));
  cmd->add_option("--lr", c->learning_rate, "Peak learning rate (overrides the setup)")
      ->check(option_number_in(0, kTrainMostLearningRate, true));
  cmd->add_option("--val-every", c->options.val_every, "With --val-data: validation loss every N steps (and always at the end)")
      ->check(option_whole_in(1, kOptionMostSteps));
  cmd->add_option("--val-batches", c->options.val_batches, "With --val-data: batches per validation pass")
      ->capture_default_str()
      ->check(option_whole_in(1, kOptionMostSteps));
  cmd->add_option("--max-bad-steps", c->options.max_bad_steps,
                  "Stop (exit 3) after this many steps in a row with NaN or Inf in the loss or a gradient; fewer are "
                  "skipped, the weights kept")
      ->capture_default_str()
      ->check(option_whole_in(1, kOptionMostSteps));
  cmd->add_option("--checkpoint", c->options.checkpoint_dir,
                  "Checkpoint folder: every rank's state, committed together at the end, on a stop signal and with "
                  "--checkpoint-every");
  cmd->add_option("--checkpoint-every", c->options.checkpoint_every, "With --checkpoint: also checkpoint every N steps")
      ->check(option_whole_in(1, kOptionMostSteps));
  cmd->add_option("--keep-checkpoints", c->options.keep_checkpoints, "With --checkpoint: committed checkpoints kept in the folder")
      ->capture_default_str()
      ->check(option_whole_in(1, kOptionMostSteps));
  cmd->add_flag("--resume", c->options.resume, "Continue from --checkpoint with identical batches");
  cmd->add_option("--log", c->options.log_path, "Append one JSON line per step to this file");
  cmd->add_option("--threads", c->options.threads, "Threads (default: cores / ranks on this node; with --plan on one host, cores / the cluster's CPU devices; or ALLOY_THREADS)")
      ->check(option_whole_in(1, runtime_threads_limit()));
  cmd->add_option("--recompute", c->recompute, "Activation recomputation for every block: none, selective, full")
      ->capture_default_str();
  cmd->add_option("--memory-cap", c->memory_cap, "Arena capacity, e.g. 2GiB (training fails clearly above it)");
  cmd->add_flag("--progress,!--no-progress", c->options.progress, "Per-step line on stderr (--no-progress: none)");
  cmd->add_flag("--emulate-network", c->options.emulate_network,
                "Pace traffic between ranks the cluster puts on different nodes to its network (ranks on one host)");
  cmd->add_option("--device", c->device,
                  "cpu, or cuda: train in bf16 on one GPU, or on one GPU per rank under mpirun (data parallel, --plan or not)")
      ->capture_default_str();
  cmd->add_option("--gpu", c->gpu, "With --device cuda: the GPU's index (default: the rank's index on its host)")
      ->check(option_whole_in(0, kTrainMostGpus - 1));
  cmd->add_option("--gpu-comm", c->gpu_comm,
                  "With --device cuda under mpirun: how replicas sum gradients: auto, nccl, or host (through host memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "nccl", "host"}));
  cmd->add_option("--plan,-p", c->plan, "Run this plan: mpirun -np <devices the plan uses> alloy train --plan plan.json ...");
  cmd->add_option("--cluster,-c", c->cluster, "The plan's cluster (preset or path; default: the one the plan carries)");
  cmd->add_option("--trace", c->trace, "Chrome trace of the last step of every rank");
  cmd->add_option("--export", c->export_weights, "Write the full trained weights (safetensors)");
  cmd->add_option("--profile", c->profile, "With --plan: the profile the plan was made with (for --calibrated-profile)");
  cmd->add_option("--calibrated-profile", c->calibrated_profile,
                  "With --plan: write --profile corrected by this run's measured forward, backward and optimizer times");
  cmd->callback([c, exit_code, cmd]() {
    train_check_applicable(*cmd, *c);
    run_train(*c, exit_code);
  });
}

}  // namespace alloy::cli
