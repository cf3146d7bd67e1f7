// Plans as aligned text tables for people: the whole-plan summary, one row per stage, the
// memory breakdown per stage, runner-ups with the reason each lost, notes.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "plan/plan.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {


// "0-3,8-11" from ascending or unordered ids.
std::string id_ranges(std::vector<int> ids) {
  std::sort(ids.begin(), ids.end());
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j > i ? fmt::format("{}-{}", ids[i], ids[j]) : fmt::format("{}", ids[i]);
    i = j + 1;
  }
  return out;
}

std::string layer_ranges(const PlanStage& st) {
  std::string out;
  for (const LayerRange& r : st.chunks) out += fmt::format("{}[{},{})", out.empty() ? "" : " ", r.begin, r.end);
  return out;
}

// "8 layers, depth 2", "activations of 4 layers, depth 1", both joined by " + ", or "none".
std::string offload_summary(const PlanStage& st) {
  const auto count = [](const std::vector<bool>& flags) { return std::count(flags.begin(), flags.end(), true); };
  std::vector<std::string> parts;
  if (count(st.offload) > 0) parts.push_back(fmt::format("{} layers", count(st.offload)));
  if (count(st.offload_activations) > 0) parts.push_back(fmt::format("activations of {}", count(st.offload_activations)));
  if (parts.empty()) return "none";
  return fmt::format("{}, depth {}", fmt::join(parts, " + "), st.offload_prefetch_depth);
}

std::string recompute_summary(const PlanStage& st) {
  int sel = 0;
  int full = 0;
  for (Recompute r : st.recompute) {
    sel += r == Recompute::Recompute_selective;
    full += r == Recompute::Recompute_full;
  }
  if (sel == 0 && full == 0) return "none";
  std::string out;
  if (full > 0) out += fmt::format("full x{}", full);
  if (sel > 0) out += fmt::format("{}sel x{}", out.empty() ? "" : " ", sel);
  return out;
}

// Renders rows as columns padded to their widest cell; first row is the header.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = " ";
    for (size_t c = 0; c < row.size(); ++c) line += " " + row[c] + std::string(width[c] - row[c].size(), ' ');
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// Stages under uneven data parallelism: each replica's device, share and predictions.
std::string replicas_table(const Plan& plan) {
  std::vector<std::vector<std::string>> rows = {{"stage", "replica", "type", "devices", "sequences", "fwd ms", "bwd ms",
                                                 "opt ms", "memory GiB", "use"}};
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    for (size_t r = 0; r < st.replicas.size(); ++r) {
      const PlanReplica& rep = st.replicas[r];
      const auto first = st.device_ids.begin() + static_cast<std::ptrdiff_t>(r) * st.tp;
      const double total = rep.memory_total_bytes();
      rows.push_back({fmt::format("{}", s), fmt::format("{}", r), rep.device_type,
                      id_ranges(std::vector<int>(first, first + st.tp)),
                      fmt::format("{} of {}{}", rep.sequences, plan.micro_batch_sequences,
                                  rep.pieces > 1 ? fmt::format(" in {} passes", rep.pieces) : ""),
                      fmt::format("{:.2f}", rep.forward_seconds * 1e3), fmt::format("{:.2f}", rep.backward_seconds * 1e3),
                      fmt::format("{:.2f}", rep.optimizer_seconds * 1e3),
                      fmt::format("{:.1f} / {:.1f}", total / kGiB, rep.memory_capacity_bytes / kGiB),
                      rep.memory_capacity_bytes > 0 ? fmt::format("{:.0f}%", 100 * total / rep.memory_capacity_bytes) : "-"});
    }
  }
  if (rows.size() == 1) return "";
  return "\n  Replicas (uneven data parallelism: each takes its share of every micro-batch; the stage row shows the "
         "slowest replica's times and the fullest one's memory)\n" + table(rows);
}

}  // namespace

std::string plan_render_text(const Plan& plan, const RenderOptions& options) {
  std::string out;
  out += fmt::format("Plan for {} on {} ({} of {} devices), objective {}\n", plan.model_name, plan.cluster_name,
                     plan.num_used_devices(), plan.num_devices, plan.objective);
  const bool priced = options.unpriced_reason.empty();
  if (priced) {
    out += fmt::format("  step {:.3f} s   {:.0f} tokens/s   MFU {:.1f}%   HFU {:.1f}%   bubble {:.1f}%", plan.step_seconds,
                       plan.tokens_per_second, plan.mfu * 100, plan.hfu * 100, plan.bubble_fraction * 100);
    if (plan.price_per_million_tokens > 0) out += fmt::format("   {:.4f} per million tokens", plan.price_per_million_tokens);
  } else {
    out += "  unpriced: " + options.unpriced_reason;
  }
  out += "\n";
  out += fmt::format("  batch {} sequences x {} tokens = {} micro-batches of {}, schedule {}", plan.global_batch_sequences,
                     plan.seq_len, plan.num_micro_batches, plan.micro_batch_sequences, schedule_name(plan.schedule));
  if (plan.virtual_chunks > 1) out += fmt::format(" with {} chunks per stage", plan.virtual_chunks);
  out += fmt::format(", {}\n", precision_name(plan.precision));
  if (plan.host_offload_bytes_per_node > 0)
    out += fmt::format("  offload: {} of host memory per node (of {}), host copies add {:.1f} ms to the step\n",
                       units_format_bytes(plan.host_offload_bytes_per_node),
                       units_format_bytes(plan.host_memory_bytes_per_node), plan.offload_step_seconds * 1e3);
  out += "\n";

  std::vector<std::vector<std::string>> rows = {{"stage", "type", "devices", "layers", "tp", "dp", "zero", "grads", "sp",
                                                 "recompute", "offload", "fwd ms", "bwd ms", "sync ms", "opt ms",
                                                 "memory GiB", "use"}};
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    const double total = st.memory_total_bytes();
    const bool mixed = std::any_of(st.replicas.begin(), st.replicas.end(),
                                   [&](const PlanReplica& r) { return r.device_type != st.device_type; });
    rows.push_back({fmt::format("{}", s), mixed ? "mixed" : st.device_type, id_ranges(st.device_ids), layer_ranges(st),
                    fmt::format("{}", st.tp), fmt::format("{}", st.dp), fmt::format("{}", st.zero),
                    st.gradients_sharded() ? "shard" : "full",
                    st.sequence_parallel ? "yes" : "no", recompute_summary(st),
                    offload_summary(st),
                    fmt::format("{:.2f}", st.forward_seconds * 1e3), fmt::format("{:.2f}", st.backward_seconds * 1e3),
                    fmt::format("{:.2f}", st.gradient_sync_seconds * 1e3),
                    fmt::format("{:.2f}", st.optimizer_seconds * 1e3),
                    fmt::format("{:.1f} / {:.1f}", total / kGiB, st.memory_capacity_bytes / kGiB),
                    st.memory_capacity_bytes > 0 ? fmt::format("{:.0f}%", 100 * total / st.memory_capacity_bytes) : "-"});
  }
  // Mixture-of-Experts plans: each stage's expert-parallel degree (and uneven expert counts).
  const bool experts = std::any_of(plan.stages.begin(), plan.stages.end(),
                                   [](const PlanStage& st) { return st.ep > 1 || !st.experts_per_member.empty(); });
  if (experts) {
    rows[0].insert(rows[0].begin() + 6, "ep");
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const PlanStage& st = plan.stages[s];
      rows[s + 1].insert(rows[s + 1].begin() + 6, st.experts_per_member.empty()
                                                      ? fmt::format("{}", st.ep)
                                                      : fmt::format("{} ({})", st.ep, fmt::join(st.experts_per_member, "/")));
    }
  }
  if (!priced)  // the choices only: no predicted times or memory
    for (std::vector<std::string>& row : rows) row.resize(experts ? 12 : 11);
  out += table(rows);
  if (priced) out += replicas_table(plan);

  if (priced && options.show_memory_terms && !plan.stages.empty() && !plan.stages.front().memory.empty()) {
    out += "\n  Memory per device, GiB (micro-batches in flight in brackets)\n";
    std::vector<std::vector<std::string>> mem = {{"term"}};
    for (size_t s = 0; s < plan.stages.size(); ++s)
      mem[0].push_back(fmt::format("stage {} [{:g}]", s, plan.stages[s].micro_batches_in_flight));
    for (size_t term = 0; term < plan.stages.front().memory.size(); ++term) {
      std::vector<std::string> row = {plan.stages.front().memory[term].name};
      for (const PlanStage& st : plan.stages)
        row.push_back(term < st.memory.size() ? fmt::format("{:.3f}", st.memory[term].bytes / kGiB) : "-");
      mem.push_back(row);
    }
    std::vector<std::string> total = {"total on device"};
    for (const PlanStage& st : plan.stages) total.push_back(fmt::format("{:.3f}", st.memory_total_bytes() / kGiB));
    mem.push_back(total);
    out += table(mem);
  }

  if (priced && options.show_runner_ups && !plan.runner_ups.empty()) {
    out += "\n  Runner-ups\n";
    std::vector<std::vector<std::string>> ru = {{"#", "layout", "step s", "tokens/s", "why it lost"}};
    for (size_t i = 0; i < plan.runner_ups.size(); ++i) {
      const RunnerUp& r = plan.runner_ups[i];
      ru.push_back({fmt::format("{}", i + 1), r.shape, fmt::format("{:.3f}", r.step_seconds),
                    fmt::format("{:.0f}", r.tokens_per_second), r.reason});
    }
    out += table(ru);
  } else if (priced && options.show_runner_ups) {
    out += fmt::format("\n  Runner-ups\n    none: no other layout of the {} device(s) fits (micro-batch, recomputation and "
                       "ZeRO are chosen inside the layout)\n",
                       plan.num_used_devices());
  }
  if (!plan.notes.empty()) {
    out += "\n  Notes\n";
    for (const std::string& n : plan.notes) out += "    " + n + "\n";
  }
  return out;
}

}  // namespace alloy
