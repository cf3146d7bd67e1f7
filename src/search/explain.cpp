#include "search/explain.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "search/planner.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

// Step time = m x bottleneck stage + the other stages' fill and drain (their first chunks' times)
// + the bottleneck's per-step overhead (equal to pipeline_step_seconds).
struct StepParts {
  double work_seconds = 0;      // m x the bottleneck stage's time per micro-batch
  double bubble_seconds = 0;    // the other stages' first chunks' times
  double overhead_seconds = 0;  // the bottleneck stage's per-step overhead
  int bottleneck = 0;
};

StepParts step_parts(const Plan& plan) {
  StepParts parts;
  double worst = -1;
  double fill_sum = 0;
  double bottleneck_fill = 0;
  double bottleneck_t = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    const double t = st.forward_seconds + st.backward_seconds;
    const double fill = static_cast<double>(st.chunks.front().size()) / st.num_blocks() * t;
    fill_sum += fill;
    const double g = plan.num_micro_batches * t - fill + st.gradient_sync_seconds + st.optimizer_seconds;
    if (g > worst) {
      worst = g;
      parts.bottleneck = static_cast<int>(s);
      bottleneck_t = t;
      bottleneck_fill = fill;
      parts.overhead_seconds = st.gradient_sync_seconds + st.optimizer_seconds;
    }
  }
  parts.work_seconds = plan.num_micro_batches * bottleneck_t;
  parts.bubble_seconds = fill_sum - bottleneck_fill;
  return parts;
}

// The device type that sets a stage's passes (or, `optimizer`, its optimizer step): its own, or
// under uneven data parallelism the slowest replica's at it ("cpu-half replica"), which can
// differ: a slow device has the smallest share of the passes and as large a shard to update.
std::string timing_type(const PlanStage& st, bool optimizer = false) {
  if (st.replicas.empty()) return st.device_type;
  const auto seconds = [optimizer](const PlanReplica& r) {
    return optimizer ? r.optimizer_seconds : r.forward_seconds + r.backward_seconds;
  };
  const PlanReplica* slowest = &st.replicas.front();
  for (const PlanReplica& r : st.replicas)
    if (seconds(r) > seconds(*slowest)) slowest = &r;
  return slowest->device_type + " replica";
}

int recomputed_blocks(const PlanStage& st) {
  int n = 0;
  for (Recompute r : st.recompute) n += r != Recompute::Recompute_none;
  return n;
}

// Gradient bytes per device of a stage: the largest over its replicas.
double stage_gradient_bytes(const PlanStage& st) {
  const auto term = [](const std::vector<MemoryTerm>& memory) {
    for (const MemoryTerm& t : memory)
      if (t.name == "gradients") return t.bytes;
    return 0.0;
  };
  double bytes = term(st.memory);
  for (const PlanReplica& r : st.replicas) bytes = std::max(bytes, term(r.memory));
  return bytes;
}

// "8.2 GiB less" or "0.1 GiB more": what sharding holds against accumulating in full.
std::string sharding_saves(double full_bytes, double sharded_bytes) {
  const double saved = (full_bytes - sharded_bytes) / kGiB;
  return fmt::format("{:.1f} GiB {}", std::abs(saved), saved >= 0 ? "less" : "more");
}

// "16 x a100-80gb-sxm 6, 8 x v100-32gb 2": each run of equal replicas (device type, sequences
// per micro-batch) once, with its length.
std::string replica_shares_summary(const PlanStage& st) {
  std::vector<std::string> runs;
  for (size_t r = 0; r < st.replicas.size();) {
    size_t e = r;
    while (e < st.replicas.size() && st.replicas[e].device_type == st.replicas[r].device_type &&
           st.replicas[e].sequences == st.replicas[r].sequences)
      ++e;
    const std::string share = fmt::format("{} {}", st.replicas[r].device_type, st.replicas[r].sequences);
    runs.push_back(e - r > 1 ? fmt::format("{} x {}", e - r, share) : share);
    r = e;
  }
  return fmt::format("{}", fmt::join(runs, ", "));
}

// The stage's forward and backward per step (the measure of the planner's 1% rule).
double stage_compute_seconds(const Plan& plan, const PlanStage& st) {
  return plan.num_micro_batches * (st.forward_seconds + st.backward_seconds);
}

// Why stage `s` of `plan` uses its strategy, from `other`: the same plan with the stage switched.
// Times are the stage's exposed gradient sync per step (what the strategy changes).
std::string gradient_strategy_note(const Plan& plan, const Plan& other, int s) {
  const PlanStage& st = plan.stages[s];
  const PlanStage& alt = other.stages[s];
  if (st.gradients_sharded()) {
    const double added = st.gradient_sync_seconds - alt.gradient_sync_seconds;
    const std::string saves = sharding_saves(stage_gradient_bytes(alt), stage_gradient_bytes(st));
    std::string note = added < 5e-5
                           ? fmt::format("stage {} shards gradients: {} per device at no extra time", s, saves)
                           : fmt::format("stage {} shards gradients: {} per device for +{:.1f} ms of reduce-scatter per "
                                         "step ({:.1f}% of the stage's compute; accumulating in full must save over 1% "
                                         "to be chosen)",
                                         s, saves, added * 1e3, 100 * added / stage_compute_seconds(plan, st));
    if (alt.memory_total_bytes() > alt.memory_capacity_bytes)
      note += fmt::format(" (in full it would need {:.1f} of {:.1f} GiB)", alt.memory_total_bytes() / kGiB,
                          alt.memory_capacity_bytes / kGiB);
    return note;
  }
  const double added = alt.gradient_sync_seconds - st.gradient_sync_seconds;
  const std::string saves = sharding_saves(stage_gradient_bytes(st), stage_gradient_bytes(alt));
  if (added < 5e-5)
    return fmt::format("stage {} accumulates gradients in full: sharding would hold {} per device at no extra time",
                       s, saves);
  return fmt::format("stage {} accumulates gradients in full: sharding would hold {} per device but add {:.1f} ms of "
                     "reduce-scatter per step, and memory fits",
                     s, saves, added * 1e3);
}

}  // namespace

std::vector<std::string> gradient_strategy_notes(const Plan& plan, const CostModel& cost) {
  std::vector<std::string> notes;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    if (st.zero < 2 || st.dp < 2) continue;
    const bool in_pieces = std::any_of(st.replicas.begin(), st.replicas.end(), [](const PlanReplica& r) { return r.pieces > 1; });
    if (in_pieces) {
      notes.push_back(fmt::format("stage {} accumulates gradients in full: its replicas run their shares in several "
                                  "passes, which sharding does not support",
                                  s));
      continue;
    }
    if (std::find(st.offload.begin(), st.offload.end(), true) != st.offload.end()) {
      notes.push_back(fmt::format("stage {} accumulates gradients in full: its offloaded layers sum theirs in host "
                                  "memory and reduce them once per step, which sharding does not support",
                                  s));
      continue;
    }
    Plan other = plan;
    other.runner_ups.clear();
    other.stages[s].shard_gradients = !st.gradients_sharded();
    plan_evaluate(&other, cost);
    notes.push_back(gradient_strategy_note(plan, other, static_cast<int>(s)));
  }
  return notes;
}

Plan plan_build(const CostModel& cost, const Structure& s, const std::vector<std::vector<int>>& device_ids,
                const std::vector<int>& blocks, const std::vector<StageOption>& options, Objective objective) {
  Plan plan;
  plan_set_identity(&plan, cost, objective);
  plan.global_batch_sequences = s.global_batch;
  plan.micro_batch_sequences = s.micro_batch_sequences();
  plan.num_micro_batches = s.micro_batches;
  plan.schedule = s.schedule;
  plan.virtual_chunks = s.virtual_chunks;
  const int p = static_cast<int>(blocks.size());
  size_t stage = 0;
  for (const TypeGroup& g : *s.groups) {
    for (int j = 0; j < g.stages; ++j, ++stage) {
      PlanStage st;
      st.device_type = cost.cluster().device_types[g.device_type].name;
      st.device_ids = device_ids[stage];
      st.tp = g.tp;
      st.dp = g.dp;
      const StageOption& o = options[stage];
      st.zero = o.zero;
      st.shard_gradients = o.shard_gradients;
      st.sequence_parallel = o.sequence_parallel;
      st.ep = o.ep;
      st.offload_prefetch_depth = o.prefetch_depth;
      st.has_embedding = stage == 0;
      st.has_head = static_cast<int>(stage) == p - 1;
      const int n = blocks[stage];
      for (int b = 0; b < n; ++b) {
        st.recompute.push_back(b < o.full ? Recompute::Recompute_full
                                          : (b < o.full + o.selective ? Recompute::Recompute_selective
                                                                      : Recompute::Recompute_none));
        st.offload.push_back(b < o.offloaded);
        if (o.parked > 0) st.offload_activations.push_back(b >= o.full && b < o.full + o.parked);
      }
      plan.stages.push_back(std::move(st));
    }
  }
  // Chunk c of every stage in pipeline order, then chunk c + 1; a stage's chunks as even as its
  // blocks allow, the larger first.
  int next = 0;
  for (int c = 0; c < s.virtual_chunks; ++c)
    for (int st = 0; st < p; ++st) {
      const int size = chunk_blocks(blocks[st], s.virtual_chunks, c);
      plan.stages[st].chunks.push_back({next, next + size});
      next += size;
    }
  plan_evaluate(&plan, cost);
  return plan;
}

std::string plan_shape_summary(const Plan& plan) {
  std::string out = fmt::format("pp {}: ", plan.stages.size());
  // Consecutive stages of the same type and shape are written once, with their count.
  for (size_t s = 0; s < plan.stages.size();) {
    const PlanStage& st = plan.stages[s];
    size_t e = s;
    int layers = 0;
    while (e < plan.stages.size() && plan.stages[e].device_type == st.device_type && plan.stages[e].tp == st.tp &&
           plan.stages[e].dp == st.dp && plan.stages[e].replicas.empty() && st.replicas.empty())
      layers += plan.stages[e++].num_blocks();
    if (e == s) layers += plan.stages[e++].num_blocks();
    if (s > 0) out += " | ";
    out += fmt::format("{} tp{} dp{}", st.device_type, st.tp, st.dp);
    if (!st.replicas.empty()) out += fmt::format(" uneven ({})", replica_shares_summary(st));
    if (e - s > 1) out += fmt::format(" x{}", e - s);
    out += fmt::format(" {}L", layers);
    s = e;
  }
  out += fmt::format("; {}", schedule_name(plan.schedule));
  if (plan.virtual_chunks > 1) out += fmt::format(" v{}", plan.virtual_chunks);
  out += fmt::format(", {} x {} seq", plan.num_micro_batches, plan.micro_batch_sequences);
  return out;
}

RunnerUp runner_up_explain(const Plan& best, const Plan& other, bool by_cost) {
  RunnerUp r;
  r.shape = plan_shape_summary(other);
  r.step_seconds = other.step_seconds;
  r.tokens_per_second = other.tokens_per_second;
  const double gap = by_cost ? other.price_per_million_tokens / best.price_per_million_tokens - 1.0
                             : best.tokens_per_second / other.tokens_per_second - 1.0;
  const StepParts a = step_parts(best);
  const StepParts b = step_parts(other);
  // Compare per token so different batch sizes are comparable.
  const double per_a = 1.0 / (best.global_batch_sequences * best.seq_len);
  const double per_b = 1.0 / (other.global_batch_sequences * other.seq_len);
  const double d_steady = b.work_seconds * per_b - a.work_seconds * per_a;
  const double d_fill = b.bubble_seconds * per_b - a.bubble_seconds * per_a;
  const double d_overhead = b.overhead_seconds * per_b - a.overhead_seconds * per_a;
  const PlanStage& slow = other.stages[b.bottleneck];
  std::string why;
  if (d_steady >= d_fill && d_steady >= d_overhead) {
    const PlanStage& ours = best.stages[a.bottleneck];
    why = fmt::format("{} stage {} is the bottleneck ({:.1f} ms per micro-batch of {} seq, vs {:.1f} ms of {}",
                      timing_type(slow), b.bottleneck, (slow.forward_seconds + slow.backward_seconds) * 1e3,
                      other.micro_batch_sequences, (ours.forward_seconds + ours.backward_seconds) * 1e3,
                      best.micro_batch_sequences);
    const int rc = recomputed_blocks(slow);
    if (rc > 0) why += fmt::format(", {} of {} layers recomputed", rc, slow.num_blocks());
    why += ")";
  } else if (d_fill >= d_overhead) {
    why = fmt::format("longer pipeline fill and drain (bubble {:.0f}% vs {:.0f}%)", other.bubble_fraction * 100,
                      best.bubble_fraction * 100);
  } else {
    why = fmt::format("exposed gradient sync and optimizer step on {} stage {} ({:.1f} ms vs {:.1f} ms)",
                      timing_type(slow, true), b.bottleneck, b.overhead_seconds * 1e3, a.overhead_seconds * 1e3);
  }
  const std::string margin = gap * 100 < 0.5 ? "+<1%" : fmt::format("+{:.0f}%", gap * 100);
  r.reason = fmt::format("{}: {}{}", why, margin, by_cost ? " price per token" : "");
  return r;
}

}  // namespace alloy
