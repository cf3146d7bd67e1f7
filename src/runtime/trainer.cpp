// The one training loop: checks agreed by every rank, data for the stages that read tokens, the
// executor's steps, validation, checkpoints with exact resume, the JSON-lines log and progress
// from rank 0, and at the end the per-rank summaries, timed collectives, trace and weights.
#include "runtime/trainer.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>

#include "runtime/device_speed.hpp"
#include "runtime/io/batch_loader.hpp"
#include "plan/plan_inputs.hpp"
#include "runtime/io/checkpoint_commit.hpp"
#include "runtime/io/token_file.hpp"
#include "runtime/parallel/agree.hpp"
#include "runtime/parallel/collective_join.hpp"
#include "runtime/parallel/dist_report.hpp"
#include "runtime/stop_signals.hpp"
#include "runtime/threads.hpp"
#include "runtime/trainer_common.hpp"
#include "runtime/trainer_setup.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// What one rank needs from before training: its device's resources and the readers of tokens.
struct RankSetup {
  RankResources resources;
  double slowdown = 1.0;
  std::optional<BatchLoader> loader;  // the stages with the embedding or head
  std::optional<BatchLoader> val;     // with options.val_data
};

class RankTrainer {
 public:
  RankTrainer(const ModelSpec& model, const TrainSpec& train, const Plan& plan, const ClusterSpec& cluster,
              Communicator& comm, const TrainerOptions& o, const TrainBackend& backend, RankSetup& setup)
      : model_(model),
        train_(train),
        plan_(plan),
        cluster_(cluster),
        comm_(comm),
        o_(o),
        setup_(setup),
        runtime_(plan, model, train, backend.data != nullptr ? *backend.data : comm, setup.resources, &comm),
        run_fingerprint_(fmt::format("{}|plan {}", trainer_model_fingerprint(model), plan_layout_fingerprint(plan))),
        fingerprint_(fmt::format("{}|rank {}", run_fingerprint_, comm.rank())),
        inputs_(static_cast<size_t>(plan.global_batch_sequences * plan.seq_len)),
        targets_(inputs_.size()) {}

  TrainerResult run(const std::function<void(const StepReport&)>& on_step);

 private:
  int64_t resume();
  void save(int64_t step);
  void stop(int64_t step, const std::vector<RankStepStats>& all, bool saved, TrainerResult& result);
  double validate();
  StepReport report_of(int64_t step, const RankStepStats& stats, std::vector<RankStepStats>& all);
  void finish(TrainerResult& result, const std::vector<RankStepStats>& history);
  void bad_step(int64_t step, bool loss_finite, int64_t in_row);

  const ModelSpec& model_;
  const TrainSpec& train_;
  const Plan& plan_;
  const ClusterSpec& cluster_;
  Communicator& comm_;
  const TrainerOptions& o_;
  RankSetup& setup_;
  RankRuntime runtime_;
  const std::string run_fingerprint_;  // the model and the plan's layout: the whole checkpoint's
  const std::string fingerprint_;      // one rank's files'
  std::optional<CheckpointLock> lock_;  // rank 0, with a checkpoint folder
  StopSignals stop_signals_;
  std::vector<int32_t> inputs_, targets_;  // (global batch, T)
  double flops_per_token_ = 0;
  double matmul_peak_flops_ = 0;  // every rank's, summed
  int64_t saved_step_ = -1;       // the step of the last checkpoint saved or resumed from
};

// Every rank checks the committed manifest and its own files against it, then loads them. A
// checkpoint of the same model written under another layout (plan, rank count) is resharded:
// every rank reads the slices of the full tensors it holds from the writers that hold them,
// checking each of those writers' files against the manifest first.
int64_t RankTrainer::resume() {
  int64_t step = 0;
  dist_agree_on(comm_, [&] {
    const CheckpointManifest manifest = checkpoint_manifest_read(o_.checkpoint_dir);
    // Under any layout the run goes on with the loss scale it had reached (where it scales).
    runtime_.loss_scaler_restore(manifest.loss_scale, manifest.loss_scale_good_steps);
    const std::string model_part = trainer_model_fingerprint(model_) + "|plan ";
    const bool same_layout = manifest.fingerprint == run_fingerprint_ && manifest.ranks == comm_.world_size();
    if (!same_layout && manifest.fingerprint.rfind(model_part, 0) == 0) {
      std::vector<std::string> writers;
      for (int r = 0; r < manifest.ranks; ++r) writers.push_back(checkpoint_rank_dir(o_.checkpoint_dir, manifest.step, r));
      runtime_.checkpoint_reshard_from(
          writers, [&](int r) { checkpoint_manifest_check_files(manifest, o_.checkpoint_dir, r); }, manifest.step);
      if (comm_.rank() == 0)
        std::fprintf(stderr, "alloy: resharded checkpoint step %lld, written by %d rank(s) under another layout, onto %d\n",
                     static_cast<long long>(manifest.step), manifest.ranks, comm_.world_size());
      step = manifest.step;
      return;
    }
    if (!same_layout && manifest.fingerprint.rfind(model_part, 0) != 0)
      throw Error(fmt::format("the checkpoint is of another model: \"{}\", and this run trains \"{}\"",
                              manifest.fingerprint.substr(0, manifest.fingerprint.find("|plan ")),
                              trainer_model_fingerprint(model_)),
                  {o_.checkpoint_dir + "/" + kCheckpointLatest, "fingerprint"},
                  "resume with the model config the checkpoint was written for (under any plan), or start afresh "
                  "without --resume");
    checkpoint_manifest_check(manifest, o_.checkpoint_dir, run_fingerprint_, comm_.world_size(), comm_.rank());
    const std::string dir = checkpoint_rank_dir(o_.checkpoint_dir, manifest.step, comm_.rank());
    const int64_t loaded = runtime_.checkpoint_load_from(dir, fingerprint_).step;
    if (loaded != manifest.step)
      throw Error(fmt::format("this rank's files are of step {}, and latest.json commits step {}", loaded, manifest.step),
                  {dir + "/" + kCheckpointManifest, "step"}, "restore the checkpoint folder from a copy, or start afresh");
    step = manifest.step;
  });
  return step;
}

// Every rank writes its folder of `step`; only when all have (a failure on any rank fails the
// save on every rank, and the previous checkpoint stays) does rank 0 commit the manifest.
void RankTrainer::save(int64_t step) {
  CheckpointState state;
  state.step = step;
  state.fingerprint = fingerprint_;
  CheckpointSaveOptions options;
  options.on_model_written = [&] { trainer_inject_save_fault(comm_.rank(), step); };
  CheckpointFileRecords mine{};
  dist_agree_on(comm_, [&] {
    mine = runtime_.checkpoint_save_to(checkpoint_rank_dir(o_.checkpoint_dir, step, comm_.rank()), state, options);
  });
  std::vector<CheckpointFileRecords> all(static_cast<size_t>(comm_.world_size()));
  comm_.all_gather_bytes(&mine, all.data(), sizeof(CheckpointFileRecords), comm_.world()).wait();
  dist_agree_on(comm_, [&] {
    if (comm_.rank() != 0) return;
    Plan recorded = plan_;  // with what it trains: `alloy replan` plans the same model and setup anew
    plan_set_inputs(&recorded, model_, cluster_, train_);
    plan_save(recorded, o_.checkpoint_dir + "/plan.json");
    const LossScaler& scaler = runtime_.loss_scaler();
    checkpoint_commit(o_.checkpoint_dir, step, run_fingerprint_, all, o_.keep_checkpoints,
                      scaler.dynamic ? scaler.scale : 0, scaler.good_steps);
  });
  saved_step_ = step;
}

// After a stop signal on any rank: every rank has finished `step` (and saved it when a folder
// was given); rank 0 says so, and the run ends with 128 + the signal.
void RankTrainer::stop(int64_t step, const std::vector<RankStepStats>& all, bool saved, TrainerResult& result) {
  size_t from = 0;
  while (all[from].stop_signal == 0) ++from;
  result.stop_signal = all[from].stop_signal;
  if (comm_.rank() != 0) return;
  const std::string what = saved ? fmt::format("saved checkpoint step {} to {}; resume with --resume", step, o_.checkpoint_dir)
                                 : "nothing was saved (no --checkpoint)";
  std::fprintf(stderr, "alloy: received %s on rank %zu at step %lld; %s\n", stop_signal_name(result.stop_signal), from,
               static_cast<long long>(step), what.c_str());
  std::fflush(stderr);
}

// Mean over the validation batches of each batch's mean token loss; each replica takes its
// share of every batch, as in training (every rank holds the whole model: one stage, tp 1).
double RankTrainer::validate() {
  BatchLoader& val = *setup_.val;
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(o_.val_batches, val.batches_per_epoch()));
  const double tokens = static_cast<double>(plan_.global_batch_sequences * plan_.seq_len);
  double sum = 0;
  for (int64_t k = 0; k < count; ++k) {
    batch_loader_read(val, static_cast<uint64_t>(k), inputs_.data(), targets_.data());
    double losses = runtime_.loss_sum(inputs_.data(), targets_.data());
    comm_.all_reduce(&losses, 1, comm_.world()).wait();
    sum += losses / tokens;
  }
  return sum / static_cast<double>(count);
}

// Every rank's figures for this step, on every rank: the loss from the head stage's ranks, the
// step time of the slowest, the largest arena.
StepReport RankTrainer::report_of(int64_t step, const RankStepStats& stats, std::vector<RankStepStats>& all) {
  all.assign(static_cast<size_t>(comm_.world_size()), RankStepStats{});
  comm_.all_gather_bytes(&stats, all.data(), sizeof(RankStepStats), comm_.world()).wait();
  StepReport report;
  report.step = step;
  report.learning_rate = stats.learning_rate;
  report.grad_norm = stats.grad_norm;
  report.loss_scale = stats.loss_scale;
  report.loss_scale_overflow = stats.loss_scale_overflow;
  double loss_sum = 0, aux_loss_sum = 0, loss_tokens = 0;
  for (const RankStepStats& r : all) {
    loss_sum += r.loss_sum;
    aux_loss_sum += r.aux_loss_sum;
    loss_tokens += r.loss_tokens;
    report.step_seconds = std::max(report.step_seconds, r.step_seconds);
    report.peak_arena_bytes = std::max(report.peak_arena_bytes, r.peak_arena_bytes);
    report.peak_host_arena_bytes = std::max(report.peak_host_arena_bytes, r.peak_host_arena_bytes);
  }
  report.loss = loss_sum / loss_tokens;
  Model& model = runtime_.backend().model();
  if (model_is_moe(model_)) {
    // Every stage's share of each micro-batch's load-balancing loss, as the cross-entropy is
    // averaged; tokens per expert summed over the ranks (each token counted by its replica's first
    // tensor-parallel rank, each block by its stage).
    report.aux_loss = aux_loss_sum / loss_tokens;
    report.expert_tokens = model.moe_routing.expert_tokens;
    if (comm_.world_size() > 1) {
      std::vector<double> tokens(report.expert_tokens.size(), 0.0);
      if (runtime_.schedule().tp_rank == 0)
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<double>(report.expert_tokens[i]);
      comm_.all_reduce(tokens.data(), static_cast<int64_t>(tokens.size()), comm_.world()).wait();
      for (size_t i = 0; i < tokens.size(); ++i) report.expert_tokens[i] = static_cast<int64_t>(tokens[i]);
    }
  }
  report.tokens_per_second = static_cast<double>(plan_.global_batch_sequences * plan_.seq_len) / report.step_seconds;
  report.mfu = report.tokens_per_second * flops_per_token_ / matmul_peak_flops_;
  return report;
}

TrainerResult RankTrainer::run(const std::function<void(const StepReport&)>& on_step) {
  TrainerResult result;
  result.backend = runtime_.backend().name();
  if (!o_.checkpoint_dir.empty()) dist_agree_on(comm_, [&] { if (comm_.rank() == 0) lock_.emplace(o_.checkpoint_dir); });
  if (o_.resume) saved_step_ = result.first_step = resume();
  flops_per_token_ = model_flops_per_token(model_, plan_.seq_len).training;
  matmul_peak_flops_ = runtime_.backend().matmul_peak_flops() / setup_.slowdown;
  comm_.all_reduce(&matmul_peak_flops_, 1, comm_.world()).wait();
  result.gemm_peak_flops = matmul_peak_flops_;
  const bool lead = comm_.rank() == 0;
  StepLog log(lead ? o_.log_path : std::string());
  if (setup_.val && !o_.resume) result.initial_val_loss = validate();

  std::vector<RankStepStats> history, all;
  int64_t bad_in_row = 0;
  for (int64_t step = result.first_step + 1; step <= train_.steps; ++step) {
    if (trainer_inject_fault(comm_.rank(), step)) runtime_.gradient_poison_next_step();
    if (setup_.loader) batch_loader_read(*setup_.loader, static_cast<uint64_t>(step - 1), inputs_.data(), targets_.data());
    model_moe_routing_reset(runtime_.backend().model());
    RankStepStats stats = runtime_.step(inputs_.data(), targets_.data());
    stats.stop_signal = StopSignals::received();
    // An overflow the loss scale absorbed is expected now and then (not a bad step).
    const bool bad = stats.update_skipped && !stats.loss_scale_overflow;
    bad_in_row = bad ? bad_in_row + 1 : 0;
    if (bad) bad_step(step, stats.loss_finite, bad_in_row);
    if (stats.loss_scale_overflow && comm_.rank() == 0)
      fmt::print(stderr, "alloy: step {}: the gradients overflowed at loss scale {}; the update was skipped and the "
                         "scale halved to {}\n",
                 step, stats.loss_scale, runtime_.loss_scaler().scale);
    StepReport report = report_of(step, stats, all);
    const bool stopping = std::any_of(all.begin(), all.end(), [](const RankStepStats& r) { return r.stop_signal != 0; });
    const bool last = step == train_.steps;
    if (setup_.val && ((o_.val_every > 0 && step % o_.val_every == 0) || last)) {
      report.val_loss = validate();
      if (last) result.final_val_loss = report.val_loss;
    }
    // The step's log line goes first: a committed step always has one (a step logged but not
    // committed before a crash is run and logged again on resume).
    if (lead) {
      log.write(report, &all);
      if (o_.progress) trainer_print_progress(report, train_.steps);
    }
    const bool saving = !o_.checkpoint_dir.empty() && ((o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) || last || stopping);
    if (saving) save(step);
    if (on_step) on_step(report);
    history.push_back(stats);
    result.steps.push_back(report);
    result.peak_arena_bytes = std::max(result.peak_arena_bytes, report.peak_arena_bytes);
    result.peak_host_arena_bytes = std::max(result.peak_host_arena_bytes, report.peak_host_arena_bytes);
    // Every rank switches at the same step boundary, after this step's gather of the figures.
    if (history.size() == 1)
      comm_.collective_timing(true);
    else if (history.size() <= 1 + kTimedCollectiveSteps)
      ++result.collective_steps;
    if (history.size() == 1 + kTimedCollectiveSteps) comm_.collective_timing(false);
    if (stopping) {
      stop(step, all, saving, result);
      break;
    }
  }
  finish(result, history);
  return result;
}

// A step whose loss or gradient held NaN or Inf left the weights as they were (every rank agreed
// to skip it): a warning, or once max_bad_steps come in a row, the stop, naming the first such
// tensor (the loss first: a non-finite loss makes every gradient so) and the last good checkpoint.
void RankTrainer::bad_step(int64_t step, bool loss_finite, int64_t in_row) {
  const RankFinding first = loss_finite ? dist_first_finding(comm_, runtime_.gradient_nonfinite_name()) : RankFinding{};
  std::string what = "the loss";
  if (loss_finite) what = first.rank < 0 ? "the gradient norm" : first.text;
  if (first.rank >= 0 && comm_.world_size() > 1) what += fmt::format(" on rank {}", first.rank);
  if (in_row < o_.max_bad_steps) {
    if (comm_.rank() == 0)
      fmt::print(stderr,
                 "alloy: warning: step {}: {} is not finite (NaN or Inf); the update was skipped ({} of "
                 "--max-bad-steps {} in a row)\n",
                 step, what, in_row, o_.max_bad_steps);
    return;
  }
  const int64_t good = step - in_row;
  const std::string weights =
      good > 0 ? fmt::format("the weights are those after step {}", good) : "the weights are the initial ones";
  const std::string saved =
      saved_step_ >= 0 ? fmt::format("the last good checkpoint is {} (step {})", o_.checkpoint_dir, saved_step_)
                       : "no checkpoint was saved";
  throw NonFiniteError(fmt::format("step {}: {} is not finite (NaN or Inf), {} bad step(s) in a row; the update was "
                                   "skipped, so {}; {}",
                                   step, what, in_row, weights, saved),
                       {},
                       "lower the learning rate (--lr) or check the data, then continue from the last good checkpoint "
                       "(--resume); --max-bad-steps N skips up to N - 1 bad steps in a row");
}

void RankTrainer::finish(TrainerResult& result, const std::vector<RankStepStats>& history) {
  comm_.collective_timing(false);
  const RankGroups& groups = runtime_.groups();
  result.collectives = collectives_joined(comm_, comm_.take_collective_timings(),
                                          {{CollectiveGroup::CollectiveGroup_world, comm_.world()},
                                           {CollectiveGroup::CollectiveGroup_tensor, groups.tp},
                                           {CollectiveGroup::CollectiveGroup_data, groups.dp},
                                           {CollectiveGroup::CollectiveGroup_embedding, groups.embedding}},
                                          plan_, cluster_);
  RankSummary mine = trainer_summarise(history, runtime_.schedule());
  result.ranks.resize(static_cast<size_t>(comm_.world_size()));
  comm_.all_gather_bytes(&mine, result.ranks.data(), sizeof(RankSummary), comm_.world()).wait();
  if (!o_.trace_path.empty() && !history.empty()) dist_save_trace(runtime_, plan_, comm_, o_.trace_path);
  if (!o_.export_path.empty()) dist_export_weights(runtime_, plan_, comm_, o_.export_path);
  if (std::getenv("ALLOY_ARENA_REPORT") != nullptr) {  // what filled each rank's arena at its peak
    Arena& arena = runtime_.arena();
    std::string line = fmt::format("rank {} arena peak {:.2f} MiB:", comm_.rank(), arena.peak_bytes() / 1048576.0);
    for (const auto& [name, bytes] : arena.peak_breakdown()) line += fmt::format(" {} {:.4f};", name, bytes / 1048576.0);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

// Paces the traffic between ranks the cluster puts on different nodes to the links between them;
// rank 0 names the paced links.
void network_emulate(const Plan& plan, const ClusterSpec& cluster, Communicator& comm) {
  std::vector<int> device_of_rank;
  for (const RankInfo& info : plan_rank_map(plan)) device_of_rank.push_back(info.device_id);
  auto pacing = std::make_shared<const LinkPacing>(link_pacing_for_cluster(cluster, device_of_rank));
  dist_agree_on(comm, [&] { comm.links_pace(pacing); });
  if (comm.rank() == 0) fmt::print("network emulated between ranks: {}\n", pacing->describe());
}

// Checks every rank agrees on before any allocation, then the rank's resources and readers.
RankSetup rank_setup(const ModelSpec& model, TrainSpec& train, const Plan& plan, const ClusterSpec& cluster,
                     Communicator& comm, const TrainerOptions& o, const TrainBackend& backend) {
  if (comm.world_size() != plan.num_used_devices()) {
    throw AgreedError(fmt::format("the plan uses {} devices but {} ranks were started", plan.num_used_devices(),
                                  comm.world_size()),
                      {o.plan_path, "stages[].device_ids"}, fmt::format("launch with mpirun -np {}", plan.num_used_devices()));
  }
  dist_agree_on(comm, [&] {
    plan_validate_for(plan, model, cluster, o.plan_path);
    stage_backend_check_moe(backend.name, model, plan, o.plan_path);
    stage_backend_check_plan(backend.name, plan, o.plan_path);
    trainer_check_plan(plan, model, cluster, o);
    trainer_check_numbers(train, o);
    if (o.resume && o.checkpoint_dir.empty()) throw Error("--resume needs --checkpoint DIR", {"", "--resume"}, "name the checkpoint folder");
    if (o.keep_checkpoints < 1)
      throw Error(fmt::format("cannot keep {} checkpoints", o.keep_checkpoints), {"", "--keep-checkpoints"},
                  "keep at least 1 (the default is 2)");
  });
  // Emulated devices share this host's cores as the whole cluster would, threads included, so a
  // plan that uses fewer of its devices runs each as fast as the profile measured it.
  const int sharing = emulated_ranks_on_host(cluster, comm.local_size(), comm.local_size() == comm.world_size());
  runtime_set_threads(o.threads > 0 ? o.threads : runtime_threads_for_ranks(sharing));
  train.seq_len = plan.seq_len;
  train.global_batch_sequences = plan.global_batch_sequences;
  const RankInfo me = plan_rank_map(plan)[static_cast<size_t>(comm.rank())];
  const PlanStage& stage = plan.stages[static_cast<size_t>(me.stage)];
  const Device& device = cluster.devices[static_cast<size_t>(me.device_id)];
  const DeviceType& type = cluster.device_type(device);
  const NodeGroup& node_group = cluster.node_group(device);
  RankSetup setup;
  dist_agree_on(comm, [&] { setup.slowdown = device_slowdown(type, sharing, runtime_threads()); });
  if (o.emulate_network) network_emulate(plan, cluster, comm);
  setup.resources.backend = backend.make;
  setup.resources.slowdown = setup.slowdown;
  setup.resources.memory_cap_bytes = static_cast<int64_t>(o.memory_cap_bytes > 0 ? o.memory_cap_bytes : type.memory_bytes);
  setup.resources.host_memory_bytes = node_group.host_memory_bytes / node_group.devices_per_node;
  setup.resources.host_link_bytes_per_second = node_group.host_link_bytes_per_second;
  dist_agree_on(comm, [&] {
    BatchLoaderOptions lo;
    lo.batch_size = plan.global_batch_sequences;
    lo.seq_len = plan.seq_len;
    lo.seed = train.seed;
    if (stage.has_embedding || stage.has_head) {
      if (o.train_data.empty()) throw Error("no training data given", {"", "--data"}, "pass --data FILE.bin (make one with `alloy tokenize`)");
      setup.loader = batch_loader_create(token_file_open(o.train_data, model.vocab_size), lo);
    }
    if (!o.val_data.empty()) {
      lo.sampling = BatchSampling::BatchSampling_sequential;
      setup.val = batch_loader_create(token_file_open(o.val_data, model.vocab_size), lo);
    }
  });
  return setup;
}

}  // namespace

std::string trainer_model_fingerprint(const ModelSpec& m) { return m.name + "@" + model_fingerprint(m); }

TrainerResult train_run(const ModelSpec& model, TrainSpec train, const Plan& plan, const ClusterSpec& cluster,
                        Communicator& comm, const TrainerOptions& o, const TrainBackend& backend,
                        const std::function<void(const StepReport&)>& on_step) {
  RankSetup setup = rank_setup(model, train, plan, cluster, comm, o, backend);
  // From here an error on one rank alone ends the job at once (before buffers that transfers
  // in flight still use are freed); errors every rank agrees on still return normally, and so
  // does any error of a run with one rank, which has no peer to leave waiting.
  try {
    RankTrainer trainer(model, train, plan, cluster, comm, o, backend, setup);
    return trainer.run(on_step);
  } catch (const AgreedError&) {
    throw;
  } catch (const Error& e) {
    if (comm.world_size() == 1) throw;
    comm.abort(e.format(), kExitBadInput);
  } catch (const std::exception& e) {
    if (comm.world_size() == 1) throw;
    comm.abort(fmt::format("internal error: {}", e.what()), 1);
  }
  std::abort();  // not reached: Communicator::abort ends the process (GCC ignores [[noreturn]] on virtuals)
}

TrainerResult trainer_run(const ModelSpec& model, const TrainSpec& train, const TrainerOptions& options,
                          const std::function<void(const StepReport&)>& on_step) {
  const OneStage one = trainer_one_stage(model, train, options);
  std::unique_ptr<Communicator> comm = communicator_local();
  return train_run(model, train, one.plan, one.cluster, *comm, options, {}, on_step);
}

}  // namespace alloy
