// What a distributed run hands back to people: the predicted-against-measured table, the Chrome
// trace of the real step (the simulator's format, so both open side by side) and the full
// weights gathered from every rank's shard.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "runtime/parallel/dist_report.hpp"
#include "runtime/parallel/gather_records.hpp"
#include "runtime/memory_terms.hpp"
#include "runtime/io/safetensors.hpp"
#include "plan/trace.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"
#include "util/table.hpp"

namespace alloy {

double dist_predicted_arena_bytes(const std::vector<MemoryTerm>& memory) {
  double bytes = 0;
  for (double b : memory_terms_predicted(memory, false)) bytes += b;
  return bytes;
}

double dist_predicted_host_bytes(const std::vector<MemoryTerm>& memory) {
  for (const MemoryTerm& t : memory)
    if (t.name == "host_offload") return t.bytes;
  return 0;
}

double dist_measured_step_seconds(const TrainerResult& result) {
  double slowest = 0;
  for (const RankSummary& r : result.ranks) slowest = std::max(slowest, r.step_seconds);
  return slowest;
}

namespace {

// One rank's arena peak by term beside its replica's predicted arena memory by term.
struct RankMemory {
  const RankSummary* rank = nullptr;
  std::array<double, kMemoryTermKinds> predicted{};
  double measured_total = 0;
  double predicted_total = 0;
  double error() const { return measured_total > 0 ? (predicted_total - measured_total) / measured_total : 0.0; }
};

RankMemory rank_memory(const RankSummary& r, const Plan& plan) {
  const PlanStage& stage = plan.stages[static_cast<size_t>(r.stage)];
  const bool offloads_weights = std::find(stage.offload.begin(), stage.offload.end(), true) != stage.offload.end();
  RankMemory m;
  m.rank = &r;
  m.predicted = memory_terms_predicted(stage.replica(plan.micro_batch_sequences, r.dp_rank).memory, offloads_weights);
  for (int64_t b : r.peak_term_bytes) m.measured_total += static_cast<double>(b);
  for (double b : m.predicted) m.predicted_total += b;
  return m;
}

// Every rank when there are at most kMemoryTableRanks; beyond, per stage the rank whose total is
// predicted worst (a stage's ranks hold the same shapes, so one row pair per stage stays
// readable on hundreds of ranks and still shows where the prediction is furthest off).
constexpr size_t kMemoryTableRanks = 8;

std::vector<RankMemory> memory_table_rows(const TrainerResult& result, const Plan& plan) {
  std::vector<RankMemory> rows;
  for (const RankSummary& r : result.ranks) rows.push_back(rank_memory(r, plan));
  if (rows.size() <= kMemoryTableRanks) return rows;
  std::map<int, RankMemory> worst;  // by stage
  for (const RankMemory& m : rows) {
    auto it = worst.find(m.rank->stage);
    if (it == worst.end() || std::abs(m.error()) > std::abs(it->second.error())) worst[m.rank->stage] = m;
  }
  rows.clear();
  for (const auto& [stage, m] : worst) rows.push_back(m);
  return rows;
}

// Measured against predicted arena memory by term: a row pair per rank (or per stage).
std::string memory_table_render(const TrainerResult& result, const Plan& plan) {
  std::vector<std::string> headers = {"rank>", "stage>", ""};
  for (int k = 0; k < kMemoryTermKinds; ++k)
    headers.push_back(std::string(memory_term_name(static_cast<MemoryTermKind>(k))) + ">");
  headers.insert(headers.end(), {"total>", "error>"});
  TextTable table(headers);
  const std::vector<RankMemory> rows = memory_table_rows(result, plan);
  for (const RankMemory& m : rows) {
    std::vector<std::string> measured = {std::to_string(m.rank->rank), std::to_string(m.rank->stage), "measured"};
    std::vector<std::string> predicted = {"", "", "predicted"};
    for (size_t k = 0; k < static_cast<size_t>(kMemoryTermKinds); ++k) {
      measured.push_back(units_format_bytes(static_cast<double>(m.rank->peak_term_bytes[k])));
      predicted.push_back(units_format_bytes(m.predicted[k]));
    }
    measured.insert(measured.end(), {units_format_bytes(m.measured_total), ""});
    predicted.insert(predicted.end(),
                     {units_format_bytes(m.predicted_total), fmt::format("{:+.1f}%", 100 * m.error())});
    table.add_row(measured);
    table.add_row(predicted);
  }
  std::string text = "arena memory at each rank's peak by term, measured against predicted";
  text += rows.size() < result.ranks.size() ? " (per stage, its rank with the largest error):\n" : ":\n";
  return text + table.render() +
         "  error: (predicted - measured) / measured total; terms are described in docs/runtime-distributed.md\n";
}

bool plan_offloads(const Plan& plan) {
  return std::any_of(plan.stages.begin(), plan.stages.end(),
                     [](const PlanStage& st) { return flags_any(st.offload) || flags_any(st.offload_activations); });
}

// Measured against predicted host memory of the ranks of offloading stages: a row per rank (per
// stage beyond kMemoryTableRanks, its rank furthest from the prediction).
std::string host_memory_table_render(const TrainerResult& result, const Plan& plan) {
  struct Row {
    const RankSummary* rank;
    double predicted;
    double error() const {
      return rank->peak_host_arena_bytes > 0 ? (predicted - rank->peak_host_arena_bytes) / rank->peak_host_arena_bytes : 0.0;
    }
  };
  std::vector<Row> rows;
  for (const RankSummary& r : result.ranks) {
    const PlanStage& st = plan.stages[static_cast<size_t>(r.stage)];
    if (!flags_any(st.offload) && !flags_any(st.offload_activations)) continue;
    rows.push_back({&r, dist_predicted_host_bytes(st.replica(plan.micro_batch_sequences, r.dp_rank).memory)});
  }
  const bool per_stage = rows.size() > kMemoryTableRanks;
  if (per_stage) {
    std::map<int, Row> worst;
    for (const Row& row : rows) {
      auto it = worst.find(row.rank->stage);
      if (it == worst.end() || std::abs(row.error()) > std::abs(it->second.error())) worst.insert_or_assign(row.rank->stage, row);
    }
    rows.clear();
    for (const auto& [stage, row] : worst) rows.push_back(row);
  }
  TextTable table({"rank>", "stage>", "measured>", "predicted>", "error>"});
  for (const Row& row : rows)
    table.add_row({std::to_string(row.rank->rank), std::to_string(row.rank->stage),
                   units_format_bytes(row.rank->peak_host_arena_bytes), units_format_bytes(row.predicted),
                   fmt::format("{:+.1f}%", 100 * row.error())});
  return fmt::format("host memory of the offloading ranks, measured (the host arena's peak) against predicted "
                     "(host_offload){}:\n",
                     per_stage ? " (per stage, its rank with the largest error)" : "") +
         table.render();
}

}  // namespace

std::string dist_render_summary(const TrainerResult& result, const Plan& plan) {
  TextTable table({"rank>", "stage>", "device", "tp rank>", "dp rank>", "step>", "compute>", "waiting>", "comm busy>",
                   "peak memory>", "predicted>"});
  for (const RankSummary& r : result.ranks) {
    const PlanReplica replica = plan.stages[r.stage].replica(plan.micro_batch_sequences, r.dp_rank);
    table.add_row({std::to_string(r.rank), std::to_string(r.stage), replica.device_type, std::to_string(r.tp_rank),
                   std::to_string(r.dp_rank), units_format_seconds(r.step_seconds),
                   units_format_seconds(r.compute_seconds), units_format_seconds(r.wait_seconds),
                   units_format_seconds(r.communication_seconds), units_format_bytes(r.peak_arena_bytes),
                   units_format_bytes(dist_predicted_arena_bytes(replica.memory))});
  }
  std::string text = table.render();
  const double slowest = dist_measured_step_seconds(result);
  text += fmt::format("step time: predicted {}, measured {} (median of the steps after the first; {:.2f}x)\n",
                      units_format_seconds(plan.step_seconds), units_format_seconds(slowest),
                      plan.step_seconds > 0 ? slowest / plan.step_seconds : 0.0);
  const char* computed = result.backend == "cpu" ? "fp32" : "bf16 with fp32 master weights";
  text += fmt::format("memory: measured is the rank's arena peak (the {} backend computes in {}); predicted is the plan's "
                      "per-device memory in {} without the framework context, communication buffers and allocator margin "
                      "(not in the arena)\n",
                      result.backend, computed, precision_name(plan.precision));
  text += memory_table_render(result, plan);
  if (plan_offloads(plan)) text += host_memory_table_render(result, plan);
  return text;
}

void dist_save_trace(RankRuntime& runtime, const Plan& plan, Communicator& comm, const std::string& path) {
  SimResult sim;
  double earliest = -runtime.step_start_seconds();
  comm.all_reduce(&earliest, 1, comm.world(), ReduceOp::ReduceOp_max).wait();
  earliest = -earliest;
  const std::vector<RankInfo> ranks = plan_rank_map(plan);
  for (int r = 0; r < comm.world_size(); ++r) {
    std::vector<SimInterval> intervals = gather_records_on_root(comm, runtime.intervals(), r);
    std::vector<MemorySample> memory = gather_records_on_root(comm, runtime.memory_samples(), r);
    std::vector<double> offset = gather_records_on_root(comm, std::vector<double>{runtime.step_start_seconds() - earliest}, r);
    if (comm.rank() != 0) continue;
    SimLane lane;
    lane.rank = r;
    lane.stage = ranks[r].stage;
    lane.device_id = ranks[r].device_id;
    lane.device_type = plan.stages[lane.stage].replica(plan.micro_batch_sequences, ranks[r].dp_rank).device_type;
    for (MemorySample m : memory) {
      m.seconds += offset[0];
      lane.memory.push_back(m);
    }
    for (SimInterval iv : intervals) {
      iv.lane = r;
      iv.start_seconds += offset[0];
      iv.end_seconds += offset[0];
      sim.step_seconds = std::max(sim.step_seconds, iv.end_seconds);
      sim.intervals.push_back(iv);
    }
    sim.lanes.push_back(lane);
  }
  if (comm.rank() == 0) trace_save(sim, plan, path);
}

void dist_export_weights(RankRuntime& runtime, const Plan& plan, Communicator& comm, const std::string& path) {
  runtime.state_check_finite("export the weights", path, false);
  const std::vector<float> mine = runtime.full_parameters();
  const ModelSpec& spec = runtime.model().spec;
  const std::vector<RankInfo> ranks = plan_rank_map(plan);
  std::map<std::string, std::vector<float>> full;
  std::vector<ShardedTensor> order = shard_tensors(spec, shard_full(spec));
  for (int r = 0; r < comm.world_size(); ++r) {
    // The first replica of each stage, or its first expert-parallel group (each member its experts).
    if (ranks[r].dp_rank >= plan.stages[ranks[r].stage].ep) continue;
    const std::vector<float> params = gather_records_on_root(comm, mine, r);
    if (comm.rank() != 0) continue;
    const PlanStage& st = plan.stages[ranks[r].stage];
    int64_t offset = 0;
    for (const ShardedTensor& t : shard_tensors(spec, rank_shard(plan, ranks[r].stage, ranks[r].tp_rank, ranks[r].dp_rank))) {
      const bool copy_of_embedding = t.name == "embed.token" && !st.has_embedding;
      std::vector<float>& out = full[t.name];
      int64_t numel = 1;
      for (int64_t e : t.full_shape) numel *= e;
      out.resize(static_cast<size_t>(numel));
      for (const ShardSegment& seg : t.segments) {
        if (!copy_of_embedding)
          std::memcpy(out.data() + seg.full_offset, params.data() + offset, static_cast<size_t>(seg.count) * sizeof(float));
        offset += seg.count;
      }
    }
  }
  if (comm.rank() != 0) return;
  std::vector<TensorRef> refs;
  for (const ShardedTensor& t : order) refs.push_back({t.name, t.full_shape, full.at(t.name).data()});
  safetensors_save(path, refs, {{"format", "pt"}, {"source", "alloy train --plan (gathered from every rank)"}});
}

}  // namespace alloy
