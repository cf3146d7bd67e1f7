// Checks of a plan against what a run can do, the checkpoint layout's fingerprint, per-rank
// summaries and the fault hook.
#include "runtime/trainer_setup.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "plan/runnable.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

// Bytes of host memory the rank of `stage` with the largest ZeRO share needs for its offloaded
// blocks: parameters and gradients whole, the two AdamW moments of its share (all of them below
// ZeRO 1), fp32 in the CPU runtime. Under expert parallelism each member holds its own routed
// experts, whose moments are shared over the members holding the same ones (dp / ep of them).
double offloaded_host_bytes(const Plan& plan, const ModelSpec& model, size_t stage) {
  const PlanStage& st = plan.stages[stage];
  const std::vector<bool> offloaded = st.layer_flags(st.offload, model.num_layers);
  const bool sharded = st.zero >= 1 && st.dp > 1;
  double share = 1.0;
  if (sharded) {
    share = 0;
    for (int d = 0; d < st.dp; ++d) share = std::max(share, st.zero_share(plan.micro_batch_sequences, d));
  }
  const int ep = std::max(1, st.ep);
  const double expert_share = sharded ? static_cast<double>(ep) / st.dp : 1.0;
  double most = 0;
  for (int member = 0; member < ep; ++member) {
    double floats = 0, expert_floats = 0;
    for (const ShardedTensor& t : shard_tensors(model, rank_shard(plan, static_cast<int>(stage), 0, member))) {
      if (t.name.rfind("layers.", 0) != 0 || !offloaded[static_cast<size_t>(std::stoi(t.name.substr(7)))]) continue;
      double numel = 1;
      for (int64_t extent : t.local_shape) numel *= static_cast<double>(extent);
      (ep > 1 && shard_is_routed_expert(t.name) ? expert_floats : floats) += numel;
    }
    most = std::max(most, floats * (2.0 + 2.0 * share) + expert_floats * (2.0 + 2.0 * expert_share));
  }
  return most * sizeof(float);
}

// The offloaded state of every offloading stage must fit each device's share of its node's host
// memory (whether a backend offloads at all is its own answer: stage_backend_supports).
void check_offload(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const std::string& source) {
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    if (std::find(st.offload.begin(), st.offload.end(), true) == st.offload.end()) continue;
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

void check_validation(const Plan& plan, const TrainerOptions& o) {
  if (o.val_data.empty()) return;
  if (plan.stages.size() != 1 || plan.stages.front().tp != 1)
    throw Error(fmt::format("validation needs the whole model on every rank, and the plan has {} stage(s) with tp {}",
                            plan.stages.size(), plan.stages.front().tp),
                {"", "--val-data"}, "drop --val-data, or validate with a one-stage plan without tensor parallelism");
}

// The optimizer's settings reach its kernels as fp32: a larger double becomes Inf there.
bool fits_fp32(double value) { return std::fabs(value) <= std::numeric_limits<float>::max(); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

RankSummary trainer_summarise(const std::vector<RankStepStats>& steps, const RankSchedule& schedule) {
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
    if (static_cast<double>(steps[i].peak_arena_bytes) > s.peak_arena_bytes) {
      s.peak_arena_bytes = static_cast<double>(steps[i].peak_arena_bytes);
      s.peak_term_bytes = steps[i].peak_term_bytes;
    }
    s.peak_host_arena_bytes = std::max(s.peak_host_arena_bytes, static_cast<double>(steps[i].peak_host_arena_bytes));
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

namespace {

// The kind of ALLOY_FAULT when it names this rank and step; "" otherwise.
std::string fault_kind_at(int rank, int64_t step) {
  const char* spec = std::getenv("ALLOY_FAULT");
  if (spec == nullptr) return {};
  char kind[16] = {0};
  int fault_rank = -1;
  long long fault_step = -1;
  if (std::sscanf(spec, "%15[a-z]:%d:%lld", kind, &fault_rank, &fault_step) != 3 || fault_rank != rank ||
      fault_step != step)
    return {};
  return kind;
}

void fault_kill_self(int rank, int64_t step, const char* when) {
  std::fprintf(stderr, "alloy: ALLOY_FAULT: rank %d kills itself %s step %lld\n", rank, when, static_cast<long long>(step));
  std::fflush(stderr);
  std::raise(SIGKILL);
}

}  // namespace

bool trainer_inject_fault(int rank, int64_t step) {
  const std::string kind = fault_kind_at(rank, step);
  if (kind.empty() || kind == "killsave" || kind == "failsave") return false;
  if (kind == "nan") return true;
  if (kind == "kill") fault_kill_self(rank, step, "at");
  if (kind == "term") {
    std::raise(SIGTERM);
    return false;
  }
  if (kind == "stall") {  // its peers' communicator timeout ends the job
    std::fprintf(stderr, "alloy: ALLOY_FAULT: rank %d stalls at step %lld\n", rank, static_cast<long long>(step));
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::hours(24));
  }
  throw Error(fmt::format("injected failure at step {}", step), {"", "ALLOY_FAULT"}, "unset ALLOY_FAULT");
}

void trainer_check_numbers(const TrainSpec& train, const TrainerOptions& o) {
  if (!fits_fp32(train.learning_rate) || !(train.learning_rate > 0))
    throw Error(fmt::format("the learning rate is {}: it must be a finite number above 0 that fp32 holds",
                            train.learning_rate),
                {"", "--lr"}, "pass e.g. --lr 3e-4 (or set learning_rate in the training setup)");
  const std::pair<const char*, double> fields[] = {{"min_learning_rate", train.min_learning_rate},
                                                   {"weight_decay", train.weight_decay},
                                                   {"beta1", train.beta1},
                                                   {"beta2", train.beta2},
                                                   {"adam_eps", train.adam_eps},
                                                   {"grad_clip", train.grad_clip}};
  for (const auto& [field, value] : fields)
    if (!fits_fp32(value))
      throw Error(fmt::format("{} is {}: the optimizer needs a finite number that fp32 holds", field, value),
                  {"", field},
                  fmt::format("set a finite {} in the training setup", field));
  if (o.max_bad_steps < 1)
    throw Error(fmt::format("--max-bad-steps is {}: at least 1 bad step must stop the run", o.max_bad_steps),
                {"", "--max-bad-steps"}, "pass 1 (stop at the first bad step) or more to skip that many in a row");
}

void trainer_inject_save_fault(int rank, int64_t step) {
  const std::string kind = fault_kind_at(rank, step);
  if (kind == "killsave") fault_kill_self(rank, step, "while saving");
  if (kind == "failsave")
    throw Error(fmt::format("injected write failure in the checkpoint of step {}", step), {"", "ALLOY_FAULT"},
                "unset ALLOY_FAULT");
}

void trainer_check_plan(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const TrainerOptions& o) {
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StageSupport support = tp_runnable(model, plan.stages[s].tp);
    if (!support.ok)
      throw Error(fmt::format("stage {} asks for {}", s, support.feature), {o.plan_path, fmt::format("stages[{}].tp", s)},
                  support.reason + ", and re-plan");
  }
  check_offload(plan, model, cluster, o.plan_path);
  check_validation(plan, o);
}

std::string plan_layout_fingerprint(const Plan& plan) {
  std::string text = fmt::format("{} {} {} {} {} {}", plan.seq_len, plan.global_batch_sequences,
                                 plan.micro_batch_sequences, plan.num_micro_batches, static_cast<int>(plan.schedule),
                                 plan.virtual_chunks);
  for (const PlanStage& st : plan.stages) {
    text += fmt::format("|{} {} {}", st.tp, st.dp, st.zero);
    for (const LayerRange& c : st.chunks) text += fmt::format(" [{},{})", c.begin, c.end);
    for (bool offloaded : st.offload) text += offloaded ? "o" : "-";
    // Under ZeRO the shares and the buckets (they cut the pieces: a bucket size in bytes of
    // gradient elements of gradient_bytes) set which floats each replica's optimizer state holds.
    if (st.zero >= 1)
      for (const PlanReplica& r : st.replicas) text += fmt::format(" s{}", r.sequences);
    if (st.zero >= 1 && st.dp > 1) text += fmt::format(" b{}/{}", plan.gradient_bucket_bytes, plan.gradient_bytes);
    // Expert parallelism sets which routed experts each replica stores.
    if (st.ep > 1) text += fmt::format(" ep{}:{}", st.ep, fmt::join(st.experts_per_member, ","));
  }
  return fmt::format("{:016x}", std::hash<std::string>{}(text));
}

}  // namespace alloy
