// The distributed training loop: checks agreed by every rank, data for the stages that read
// tokens, steps, per-rank checkpoints with exact resume, and the JSON-lines log from rank 0.
#include "runtime/dist/dist_trainer.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/device_speed.hpp"
#include "runtime/dist/collective_join.hpp"
#include "runtime/io/batch_loader.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/io/token_file.hpp"
#include "runtime/threads.hpp"
#include "runtime/trainer.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

// Bytes of host memory one rank of `stage` needs for its offloaded blocks: parameters,
// gradients and the two AdamW moments, fp32 in the CPU runtime.
double offloaded_host_bytes(const Plan& plan, const ModelSpec& model, size_t stage) {
  const std::vector<bool> offloaded = plan.stages[stage].layer_flags(plan.stages[stage].offload, model.num_layers);
  double floats = 0;
  for (const ShardedTensor& t : shard_tensors(model, rank_shard(plan, static_cast<int>(stage), 0))) {
    if (t.name.rfind("layers.", 0) != 0 || !offloaded[static_cast<size_t>(std::stoi(t.name.substr(7)))]) continue;
    double numel = 1;
    for (int64_t extent : t.local_shape) numel *= static_cast<double>(extent);
    floats += numel;
  }
  return floats * 4.0 * sizeof(float);
}

// Offloading stages: data parallelism is not run with offload, and the offloaded state must fit
// each device's share of its node's host memory.
void check_offload(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const std::string& source) {
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    if (std::find(st.offload.begin(), st.offload.end(), true) == st.offload.end()) continue;
    if (st.dp > 1)
      throw Error(fmt::format("stage {} offloads blocks with data parallelism {}: the CPU runtime offloads only without it", s, st.dp),
                  {source, fmt::format("stages[{}].dp", s)}, "re-plan with --dp 1, or without offload (--no-offload)");
    const NodeGroup& group = cluster.node_groups[static_cast<size_t>(cluster.devices[static_cast<size_t>(st.device_ids.front())].node_group)];
    const double share = group.host_memory_bytes / group.devices_per_node;
    const double needed = offloaded_host_bytes(plan, model, s);
    if (needed > share)
      throw Error(fmt::format("stage {} keeps {} of offloaded blocks in host memory per device, but each of node group "
                              "'{}''s {} devices has {} ({} per node)",
                              s, units_format_bytes(needed), group.name, group.devices_per_node, units_format_bytes(share),
                              units_format_bytes(group.host_memory_bytes)),
                  {cluster.source_path, "nodes[].host_memory"},
                  "give the nodes more host memory, offload fewer blocks, or spread the model over more devices");
  }
}

// What the CPU runtime cannot run yet, named with the plan field to change.
void check_runnable(const Plan& plan, const ModelSpec& model, const std::string& source) {
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    for (int d = 0; d < st.dp; ++d) {
      const int64_t tokens = st.replica_sequences(plan.micro_batch_sequences, d) * plan.seq_len;
      if (st.sequence_parallel && st.tp > 1 && tokens % st.tp != 0)
        throw Error(fmt::format("sequence parallelism splits replica {}'s {} tokens over tp {}: they do not divide", d,
                                tokens, st.tp),
                    {source, fmt::format("stages[{}].sequence_parallel", s)}, "set it to false, or change the micro-batch");
    }
    shard_check_tp(model, st.tp);
  }
}

// Identifies the layout a checkpoint was written under: stages, shapes, batches, schedule.
std::string plan_layout_fingerprint(const Plan& plan) {
  std::string text = fmt::format("{} {} {} {} {} {}", plan.seq_len, plan.global_batch_sequences,
                                 plan.micro_batch_sequences, plan.num_micro_batches, static_cast<int>(plan.schedule),
                                 plan.virtual_chunks);
  for (const PlanStage& st : plan.stages) {
    text += fmt::format("|{} {} {}", st.tp, st.dp, st.zero);
    for (const LayerRange& c : st.chunks) text += fmt::format(" [{},{})", c.begin, c.end);
    for (bool offloaded : st.offload) text += offloaded ? "o" : "-";
    // Under ZeRO the shares set which floats each replica's optimizer state holds.
    if (st.zero >= 1)
      for (const PlanReplica& r : st.replicas) text += fmt::format(" s{}", r.sequences);
  }
  return fmt::format("{:016x}", std::hash<std::string>{}(text));
}

std::string rank_checkpoint_dir(const std::string& dir, int rank) { return fmt::format("{}/rank-{:05d}", dir, rank); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

RankSummary summarise(const std::vector<RankStepStats>& steps, const RankSchedule& schedule) {
  RankSummary s;
  s.rank = schedule.rank;
  s.stage = schedule.stage;
  s.tp_rank = schedule.tp_rank;
  s.dp_rank = schedule.dp_rank;
  const size_t skip = steps.size() > 1 ? 1 : 0;  // the first step warms caches and allocators
  std::vector<double> step, compute, wait, comm, pass, optimizer;
  std::array<std::vector<double>, kLayerKinds> layer_cpu;
  for (size_t i = skip; i < steps.size(); ++i) {
    step.push_back(steps[i].step_seconds);
    compute.push_back(steps[i].compute_seconds);
    wait.push_back(steps[i].wait_seconds);
    comm.push_back(steps[i].communication_seconds);
    pass.push_back(steps[i].pass_seconds);
    optimizer.push_back(steps[i].optimizer_seconds);
    for (size_t k = 0; k < layer_cpu.size(); ++k) layer_cpu[k].push_back(steps[i].layer_cpu_seconds[k]);
    s.peak_arena_bytes = std::max(s.peak_arena_bytes, static_cast<double>(steps[i].peak_arena_bytes));
  }
  s.step_seconds = median(step);
  s.compute_seconds = median(compute);
  s.wait_seconds = median(wait);
  s.communication_seconds = median(comm);
  s.pass_seconds = median(pass);
  s.optimizer_seconds = median(optimizer);
  for (size_t k = 0; k < layer_cpu.size(); ++k) s.layer_cpu_seconds[k] = median(layer_cpu[k]);
  return s;
}

// Test hook: ALLOY_FAULT=kill:R:S or throw:R:S makes rank R kill itself (SIGKILL) or throw an
// error at the start of step S, to check that the whole job ends promptly with a clear message.
void inject_fault(int rank, int64_t step) {
  const char* spec = std::getenv("ALLOY_FAULT");
  if (spec == nullptr) return;
  char kind[16] = {0};
  int fault_rank = -1;
  long long fault_step = -1;
  if (std::sscanf(spec, "%15[a-z]:%d:%lld", kind, &fault_rank, &fault_step) != 3 || fault_rank != rank ||
      fault_step != step)
    return;
  if (std::string(kind) == "kill") {
    std::fprintf(stderr, "alloy: ALLOY_FAULT: rank %d kills itself at step %lld\n", rank, fault_step);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  throw Error(fmt::format("injected failure at step {}", step), {"", "ALLOY_FAULT"}, "unset ALLOY_FAULT");
}

void print_progress(const DistStepReport& r, int64_t total) {
  std::fprintf(stderr, "step %5lld/%lld  loss %.4f  lr %.2e  gnorm %.3f  %.0f tok/s  step %s\n",
               static_cast<long long>(r.step), static_cast<long long>(total), r.loss, r.learning_rate, r.grad_norm,
               r.tokens_per_second, units_format_seconds(r.step_seconds).c_str());
}

// The steps of one rank, from building its runtime to the gathered summaries.
DistTrainResult train_ranks(const ModelSpec& model, const TrainSpec& train, const Plan& plan,
                            const ClusterSpec& cluster, Communicator& comm, const DistTrainOptions& o,
                            std::optional<BatchLoader>& loader, const RankResources& resources) {
  RankRuntime runtime(plan, model, train, comm, resources);
  DistTrainResult result;
  const std::string fingerprint =
      fmt::format("{}|plan {}|rank {}", trainer_model_fingerprint(model), plan_layout_fingerprint(plan), comm.rank());
  if (o.resume) {
    dist_agree_on(comm, [&] {
      CheckpointState state = checkpoint_load(rank_checkpoint_dir(o.checkpoint_dir, comm.rank()), fingerprint,
                                              runtime.parameter_refs(), runtime.optimizer_refs());
      result.first_step = state.step;
    });
    double steps[2] = {static_cast<double>(result.first_step), -static_cast<double>(result.first_step)};
    comm.all_reduce(steps, 2, comm.world(), ReduceOp::ReduceOp_max).wait();
    if (steps[0] != -steps[1]) {
      throw AgreedError(fmt::format("the ranks' checkpoints are from different steps ({} to {}): a save was interrupted",
                              -steps[1], steps[0]),
                  {o.checkpoint_dir, "rank-*/checkpoint.json"}, "restore every rank's folder from the same save, or start afresh");
    }
    runtime.optimizer_steps() = result.first_step;
  }

  std::ofstream log;
  if (comm.rank() == 0 && !o.log_path.empty()) {
    log.open(o.log_path, std::ios::app);
    if (!log) throw Error("cannot open the log file for writing", {o.log_path, "--log"}, "check the folder exists");
  }
  const int64_t T = plan.seq_len;
  std::vector<int32_t> inputs(static_cast<size_t>(plan.global_batch_sequences * T)), targets(inputs.size());
  std::vector<RankStepStats> history;
  auto save = [&](int64_t step) {
    CheckpointState state;
    state.step = step;
    state.fingerprint = fingerprint;
    checkpoint_save(rank_checkpoint_dir(o.checkpoint_dir, comm.rank()), runtime.parameter_refs(),
                    runtime.optimizer_refs(), state);
    if (comm.rank() == 0) plan_save(plan, o.checkpoint_dir + "/plan.json");
  };
  for (int64_t step = result.first_step + 1; step <= train.steps; ++step) {
    inject_fault(comm.rank(), step);
    if (loader) batch_loader_read(*loader, static_cast<uint64_t>(step - 1), inputs.data(), targets.data());
    RankStepStats stats = runtime.step(inputs.data(), targets.data());
    // Every rank's figures for this step, on every rank: the loss from the head stage's ranks,
    // the step time of the slowest, and the per-rank breakdown for the log.
    std::vector<RankStepStats> all(static_cast<size_t>(comm.world_size()));
    comm.all_gather_bytes(&stats, all.data(), sizeof(RankStepStats), comm.world()).wait();
    DistStepReport report{step, 0, stats.learning_rate, stats.grad_norm, 0, 0, 0};
    double loss_sum = 0, loss_tokens = 0;
    for (const RankStepStats& r : all) {
      loss_sum += r.loss_sum;
      loss_tokens += r.loss_tokens;
      report.step_seconds = std::max(report.step_seconds, r.step_seconds);
      report.peak_arena_bytes = std::max(report.peak_arena_bytes, static_cast<double>(r.peak_arena_bytes));
    }
    report.loss = loss_sum / loss_tokens;
    report.tokens_per_second = static_cast<double>(plan.global_batch_sequences * T) / report.step_seconds;
    if (!o.checkpoint_dir.empty() && ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || step == train.steps)) save(step);
    if (comm.rank() == 0) {
      if (log.is_open()) {
        nlohmann::json j = {{"step", step}, {"loss", report.loss}, {"lr", report.learning_rate},
                            {"grad_norm", report.grad_norm}, {"step_seconds", report.step_seconds},
                            {"tokens_per_second", report.tokens_per_second},
                            {"peak_arena_bytes", report.peak_arena_bytes}};
        for (const RankStepStats& r : all) {
          j["ranks"].push_back({{"step_seconds", r.step_seconds}, {"compute_seconds", r.compute_seconds},
                                {"wait_seconds", r.wait_seconds}, {"communication_seconds", r.communication_seconds},
                                {"peak_arena_bytes", r.peak_arena_bytes}});
        }
        log << j.dump() << "\n" << std::flush;
      }
      if (o.progress) print_progress(report, train.steps);
    }
    history.push_back(stats);
    result.steps.push_back(report);
    // Every rank switches at the same step boundary, after this step's gather of the figures.
    if (history.size() == 1)
      comm.collective_timing(true);
    else if (history.size() <= 1 + kTimedCollectiveSteps)
      ++result.collective_steps;
    if (history.size() == 1 + kTimedCollectiveSteps) comm.collective_timing(false);
  }
  comm.collective_timing(false);
  const RankGroups& groups = runtime.groups();
  result.collectives = collectives_joined(comm, comm.take_collective_timings(),
                                          {{CollectiveGroup::CollectiveGroup_world, comm.world()},
                                           {CollectiveGroup::CollectiveGroup_tensor, groups.tp},
                                           {CollectiveGroup::CollectiveGroup_data, groups.dp},
                                           {CollectiveGroup::CollectiveGroup_embedding, groups.embedding}},
                                          plan, cluster);
  RankSummary mine = summarise(history, runtime.schedule());
  result.ranks.resize(static_cast<size_t>(comm.world_size()));
  comm.all_gather_bytes(&mine, result.ranks.data(), sizeof(RankSummary), comm.world()).wait();
  if (!o.trace_path.empty() && !history.empty()) dist_save_trace(runtime, plan, comm, o.trace_path);
  if (!o.export_path.empty()) dist_export_weights(runtime, plan, comm, o.export_path);
  if (std::getenv("ALLOY_ARENA_REPORT") != nullptr) {  // what filled each rank's arena at its peak
    std::string line = fmt::format("rank {} arena peak {:.2f} MiB:", comm.rank(), runtime.arena().peak_bytes() / 1048576.0);
    for (const auto& [name, bytes] : runtime.arena().peak_breakdown()) line += fmt::format(" {} {:.2f};", name, bytes / 1048576.0);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  return result;
}

}  // namespace

void dist_agree(Communicator& comm, const std::string& problem) {
  constexpr int64_t kRecordBytes = 2048;
  std::vector<char> mine(kRecordBytes, 0);
  std::memcpy(mine.data(), problem.data(), std::min<size_t>(problem.size(), kRecordBytes - 1));
  std::vector<char> all(static_cast<size_t>(kRecordBytes * comm.world_size()));
  comm.all_gather_bytes(mine.data(), all.data(), kRecordBytes, comm.world()).wait();
  for (int r = 0; r < comm.world_size(); ++r) {
    const char* text = all.data() + static_cast<int64_t>(r) * kRecordBytes;
    if (text[0] != '\0') throw AgreedError(fmt::format("rank {} of {}: {}", r, comm.world_size(), std::string(text)));
  }
}

void dist_agree_on(Communicator& comm, const std::function<void()>& check) {
  std::string problem;
  try {
    check();
  } catch (const AgreedError&) {
    throw;
  } catch (const Error& e) {
    problem = e.format();
  }
  dist_agree(comm, problem);
}

DistTrainResult dist_train_run(const ModelSpec& model, TrainSpec train, const Plan& plan, const ClusterSpec& cluster,
                               Communicator& comm, const DistTrainOptions& o) {
  if (comm.world_size() != plan.num_used_devices()) {
    throw AgreedError(fmt::format("the plan uses {} devices but {} ranks were started", plan.num_used_devices(),
                            comm.world_size()),
                {o.plan_path, "stages[].device_ids"}, fmt::format("launch with mpirun -np {}", plan.num_used_devices()));
  }
  dist_agree_on(comm, [&] {
    plan_validate_for(plan, model, cluster, o.plan_path);
    check_runnable(plan, model, o.plan_path);
    check_offload(plan, model, cluster, o.plan_path);
    if (o.resume && o.checkpoint_dir.empty()) throw Error("--resume needs --checkpoint DIR", {"", "--resume"}, "name the checkpoint folder");
  });
  // Emulated devices share this host's cores as the whole cluster would, threads included, so a
  // plan that uses fewer of its devices runs each as fast as the profile measured it.
  const int sharing = emulated_ranks_on_host(cluster, comm.local_size(), comm.local_size() == comm.world_size());
  runtime_set_threads(o.threads > 0 ? o.threads : runtime_threads_for_ranks(sharing));
  train.seq_len = plan.seq_len;
  train.global_batch_sequences = plan.global_batch_sequences;
  const std::vector<RankInfo> ranks = plan_rank_map(plan);
  const RankInfo& me = ranks[comm.rank()];
  const PlanStage& stage = plan.stages[me.stage];
  const DeviceType& device = cluster.device_types[cluster.devices[me.device_id].device_type_index];
  double slowdown = 1.0;
  dist_agree_on(comm, [&] { slowdown = device_slowdown(device, sharing, runtime_threads()); });
  const NodeGroup& node_group = cluster.node_groups[static_cast<size_t>(cluster.devices[me.device_id].node_group)];
  RankResources resources;
  resources.memory_cap_bytes = static_cast<int64_t>(o.memory_cap_bytes > 0 ? o.memory_cap_bytes : device.memory_bytes);
  resources.host_memory_bytes = node_group.host_memory_bytes / node_group.devices_per_node;
  resources.host_link_bytes_per_second = node_group.host_link_bytes_per_second;

  std::optional<BatchLoader> loader;
  dist_agree_on(comm, [&] {
    if (!stage.has_embedding && !stage.has_head) return;
    if (o.train_data.empty()) throw Error("no training data given", {"", "--data"}, "pass --data FILE.bin");
    BatchLoaderOptions lo;
    lo.batch_size = plan.global_batch_sequences;
    lo.seq_len = plan.seq_len;
    lo.seed = train.seed;
    loader = batch_loader_create(token_file_open(o.train_data, model.vocab_size), lo);
  });

  // From here an error on one rank alone ends the job at once (before buffers that transfers
  // in flight still use are freed); errors every rank agrees on still return normally.
  try {
    resources.slowdown = slowdown;
    return train_ranks(model, train, plan, cluster, comm, o, loader, resources);
  } catch (const AgreedError&) {
    throw;
  } catch (const Error& e) {
    comm.abort(e.format(), kExitBadInput);
  } catch (const std::exception& e) {
    comm.abort(fmt::format("internal error: {}", e.what()), 1);
  }
  std::abort();  // not reached: Communicator::abort ends the process (GCC ignores [[noreturn]] on virtuals)
}

}  // namespace alloy
