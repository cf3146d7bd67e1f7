#include "runtime/parallel/calibration.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cost/layer_cost.hpp"

namespace alloy {

namespace {

// One rank's measured and predicted seconds of a step's passes, or of its optimizer step.
struct MeasuredPredicted {
  double measured = 0, predicted = 0;
};

// A rank's passes and optimizer step, for comparing ranks that do the same work.
struct AlikeRank {
  MeasuredPredicted passes, optimizer;
};

struct TypeSums {
  double pass_measured = 0, pass_predicted = 0, optimizer_measured = 0, optimizer_predicted = 0;
  std::array<double, kLayerKinds> layer_measured = {0, 0, 0}, layer_predicted = {0, 0, 0};
  std::map<std::pair<CollectiveOp, int>, CollectiveCalibration> collectives;  // by kind and group size
  // Per set of ranks doing the same work (one stage, one share of each micro-batch).
  std::map<std::pair<int, int64_t>, std::vector<AlikeRank>> alike;
};

// max(measured / predicted) over `ranks` / (sum measured / sum predicted); 1 without figures.
double slowest_over_average(const std::vector<AlikeRank>& ranks, MeasuredPredicted AlikeRank::*part) {
  double measured = 0, predicted = 0, slowest = 0;
  for (const AlikeRank& rank : ranks) {
    const MeasuredPredicted& r = rank.*part;
    if (r.measured <= 0 || r.predicted <= 0) continue;
    measured += r.measured;
    predicted += r.predicted;
    slowest = std::max(slowest, r.measured / r.predicted);
  }
  return measured > 0 ? slowest / (measured / predicted) : 1.0;
}

// How much slower than the type's average the slowest of ranks doing the same work ran, the
// largest over the sets of alike ranks, for the passes and the optimizer. A synchronous step
// waits for the slowest of them, so the calibrated profile is the slowest one's (small-gpt's two
// data-parallel replicas on this machine's 2 cores computed 91 and 102 ms of the same passes).
struct Lift {
  double passes = 1, optimizer = 1;
};

Lift slowest_alike_lift(const TypeSums& s) {
  Lift lift;
  for (const auto& [work, ranks] : s.alike) {
    lift.passes = std::max(lift.passes, slowest_over_average(ranks, &AlikeRank::passes));
    lift.optimizer = std::max(lift.optimizer, slowest_over_average(ranks, &AlikeRank::optimizer));
  }
  return lift;
}

// Each collective its members waited for from its start against the profile's time for its
// size, kind, group size and placement, on every device type among its members. The others are
// left out (CollectiveTiming::blocked): ZeRO-2's re-gathers over 2 ranks, posted together for
// every bucket, took 5.4x their profiled time each, and moving the profile by that priced
// every exposed all-gather at 5x.
void collectives_sum(const TrainerResult& result, const Plan& plan, const Profile& profile,
                     std::map<std::string, TypeSums>* by_type) {
  for (const JoinedCollective& j : result.collectives) {
    if (!j.blocked) continue;
    std::set<std::string> types;
    for (int r : j.ranks) {
      const RankSummary& rank = result.ranks[static_cast<size_t>(r)];
      types.insert(plan.stages[rank.stage].replica(plan.micro_batch_sequences, rank.dp_rank).device_type);
    }
    for (const std::string& type : types) {
      const ProfiledCollective* profiled = profile.find_collective(type, j.op, j.group_size, j.spans_nodes);
      // Below the profile's smallest size a collective's time is its latency and the poll
      // intervals: the gradient norm's 8-byte all-reduce over 2 ranks ran 1.6-4.3x its profile,
      // and that ratio had moved the 17 MB gradient all-reduces of every plan.
      if (profiled == nullptr || (!profiled->samples.empty() && j.bytes < profiled->samples.front().bytes))
        continue;
      CollectiveCalibration& c = (*by_type)[type].collectives[{j.op, j.group_size}];
      c.op = j.op;
      c.group_size = j.group_size;
      c.count += 1;
      c.measured_seconds += j.seconds;
      c.predicted_seconds += profiled->seconds(static_cast<double>(j.bytes));
    }
  }
}

// The profile's forward and backward seconds of one micro-batch through each layer kind of the
// stage (recomputation included), or nothing when the profile lacks a shape the stage runs.
bool predicted_layer_weights(const Plan& plan, const PlanStage& st, const std::string& device_type, int64_t sequences,
                             const Profile& profile, const ModelSpec& model, std::array<double, kLayerKinds>* weights) {
  const int b = static_cast<int>(sequences);
  const int seq = static_cast<int>(plan.seq_len);
  auto entry = [&](LayerKind kind) { return profile.layer_at(device_type, kind, b, seq, st.tp, st.sequence_parallel); };
  *weights = {0, 0, 0};
  if (st.num_blocks() > 0) {
    const std::optional<ProfiledLayer> block = entry(LayerKind::LayerKind_block);
    if (!block) return false;
    const LayerWork work = block_work(model, b, seq, st.tp, st.sequence_parallel, plan.precision);
    double seconds = st.num_blocks() * (block->forward_seconds + block->backward_seconds);
    for (Recompute r : st.recompute) seconds += block->forward_seconds * recompute_forward_share(work, r);
    (*weights)[static_cast<int>(LayerKind::LayerKind_block)] = seconds;
  }
  for (const auto& [present, kind] : {std::pair{st.has_embedding, LayerKind::LayerKind_embedding},
                                      std::pair{st.has_head, LayerKind::LayerKind_head}}) {
    if (!present) continue;
    const std::optional<ProfiledLayer> layer = entry(kind);
    if (!layer) return false;
    (*weights)[static_cast<int>(kind)] = layer->forward_seconds + layer->backward_seconds;
  }
  return true;
}

// The profile's seconds per layer kind of one micro-batch on a replica (its pieces summed).
bool predicted_replica_weights(const Plan& plan, const PlanStage& st, const PlanReplica& replica, const Profile& profile,
                               const ModelSpec& model, std::array<double, kLayerKinds>* weights) {
  *weights = {0, 0, 0};
  for (int k = 0; k < replica.pieces; ++k) {
    std::array<double, kLayerKinds> piece;
    if (!predicted_layer_weights(plan, st, replica.device_type, replica.piece_sequences(k), profile, model, &piece))
      return false;
    for (size_t i = 0; i < kLayerKinds; ++i) (*weights)[i] += piece[i];
  }
  return true;
}

// Seconds per step of ZeRO-3 gathers that rank `r` did not wait for: they copied while its
// passes computed, on the same cores, and lengthened them by about their own time (the cost
// model prices them so on CPU devices). The gathers are the rank's all_gathers over its data-
// parallel group (a ZeRO-3 stage re-gathers nothing after the optimizer); what its passes
// waited covers the rest of them.
double hidden_gather_seconds(const TrainerResult& result, const Plan& plan, const RankSummary& r) {
  const PlanStage& st = plan.stages[r.stage];
  if (st.zero != 3 || st.dp < 2 || result.collective_steps < 1) return 0;
  double gathers = 0;
  for (const JoinedCollective& j : result.collectives)
    if (j.op == CollectiveOp::CollectiveOp_all_gather && j.group == CollectiveGroup::CollectiveGroup_data &&
        std::find(j.ranks.begin(), j.ranks.end(), r.rank) != j.ranks.end())
      gathers += j.seconds;
  gathers /= static_cast<double>(result.collective_steps);
  const double waited_in_passes = r.pass_seconds - (r.compute_seconds - r.optimizer_seconds);
  return std::max(0.0, gathers - waited_in_passes);
}

const char* kind_label(int kind) {
  switch (static_cast<LayerKind>(kind)) {
    case LayerKind::LayerKind_embedding: return "embedding";
    case LayerKind::LayerKind_block: return "blocks";
    case LayerKind::LayerKind_head: return "head";
  }
  return "?";
}

// The ratio for a collective of `op` over `group_size` ranks: the run's own for that kind and
// size; else its ratio for that kind over every size it ran (an all-reduce's slowdown inside
// training is more like another all-reduce's than an all-gather's); else all its collectives'.
double collective_ratio_for(const DeviceTypeCalibration& r, CollectiveOp op, int group_size) {
  double measured = 0, predicted = 0;
  for (const CollectiveCalibration& c : r.collectives) {
    if (c.op != op) continue;
    if (c.group_size == group_size) return c.ratio();
    measured += c.measured_seconds;
    predicted += c.predicted_seconds;
  }
  return predicted > 0 ? measured / predicted : r.collective_ratio;
}

}  // namespace

std::vector<DeviceTypeCalibration> dist_calibration(const TrainerResult& result, const Plan& plan,
                                                    const Profile& profile, const ModelSpec& model) {
  std::map<std::string, TypeSums> by_type;
  for (const RankSummary& r : result.ranks) {
    const PlanStage& st = plan.stages[r.stage];
    const PlanReplica replica = st.replica(plan.micro_batch_sequences, r.dp_rank);
    TypeSums& s = by_type[replica.device_type];
    s.optimizer_measured += r.optimizer_seconds;
    s.optimizer_predicted += replica.optimizer_seconds;
    AlikeRank& alike = s.alike[{r.stage, replica.sequences}].emplace_back();
    alike.optimizer = {r.optimizer_seconds, replica.optimizer_seconds};
    // The profile holds compute alone: the passes' compute (their waits for ZeRO-3 gathers and
    // tensor-parallel sums left out, and the gathers that ran inside them, though never more
    // than half the passes, which only a timing gone wrong would claim) against the profile's
    // times of the same layers, both split over the kinds (the measured side by where this
    // rank's CPU time went). Where the profile lacks a shape, the whole passes against the
    // plan's prediction.
    std::array<double, kLayerKinds> weights;
    double cpu = 0, predicted = 0;
    for (int k = 0; k < kLayerKinds; ++k) cpu += r.layer_cpu_seconds[static_cast<size_t>(k)];
    const bool weighed = predicted_replica_weights(plan, st, replica, profile, model, &weights);
    for (double w : weights) predicted += w;
    if (!weighed || predicted <= 0) {
      s.pass_measured += r.pass_seconds;
      s.pass_predicted += plan.num_micro_batches * (replica.forward_seconds + replica.backward_seconds);
      continue;
    }
    const double passes = r.compute_seconds - r.optimizer_seconds;
    const double compute = std::max(0.5 * passes, passes - hidden_gather_seconds(result, plan, r));
    s.pass_measured += compute;
    s.pass_predicted += plan.num_micro_batches * predicted;
    alike.passes = {compute, plan.num_micro_batches * predicted};
    if (cpu <= 0) continue;
    for (size_t k = 0; k < kLayerKinds; ++k) {
      s.layer_measured[k] += compute * r.layer_cpu_seconds[k] / cpu;
      s.layer_predicted[k] += plan.num_micro_batches * weights[k];
    }
  }
  collectives_sum(result, plan, profile, &by_type);
  std::vector<DeviceTypeCalibration> out;
  for (const auto& [type, s] : by_type) {
    DeviceTypeCalibration c;
    c.device_type = type;
    double measured = 0, predicted = 0;
    for (const auto& [key, collective] : s.collectives) {
      if (collective.predicted_seconds <= 0 || collective.measured_seconds <= 0) continue;
      c.collectives.push_back(collective);
      measured += collective.measured_seconds;
      predicted += collective.predicted_seconds;
    }
    if (predicted > 0) c.collective_ratio = measured / predicted;
    if (s.pass_predicted > 0 && s.pass_measured > 0) c.pass_ratio = s.pass_measured / s.pass_predicted;
    if (s.optimizer_predicted > 0 && s.optimizer_measured > 0) c.optimizer_ratio = s.optimizer_measured / s.optimizer_predicted;
    for (size_t k = 0; k < kLayerKinds; ++k) {
      c.layer_share[k] = s.pass_measured > 0 ? s.layer_measured[k] / s.pass_measured : 0;
      if (s.layer_predicted[k] > 0 && c.layer_share[k] >= kCalibrationMinimumShare)
        c.layer_ratio[k] = s.layer_measured[k] / s.layer_predicted[k];
    }
    const Lift lift = slowest_alike_lift(s);
    c.slowest_alike_lift = lift.passes;
    c.pass_ratio *= lift.passes;
    for (double& ratio : c.layer_ratio) ratio *= lift.passes;
    c.optimizer_ratio *= lift.optimizer;
    out.push_back(c);
  }
  return out;
}

Profile profile_calibrated(const Profile& profile, const std::vector<DeviceTypeCalibration>& ratios) {
  Profile out = profile;
  for (const DeviceTypeCalibration& r : ratios) {
    auto it = out.device_types.find(r.device_type);
    if (it == out.device_types.end()) continue;
    for (ProfiledLayer& layer : it->second.layers) {
      const double kind_ratio = r.layer_ratio[static_cast<size_t>(layer.kind)];
      const double ratio = kind_ratio > 0 ? kind_ratio : r.pass_ratio;
      layer.forward_seconds *= ratio;
      layer.backward_seconds *= ratio;
    }
    it->second.optimizer_seconds_per_parameter *= r.optimizer_ratio;
    if (r.collective_ratio <= 0) continue;
    for (ProfiledCollective& pc : it->second.collectives) {
      const double ratio = collective_ratio_for(r, pc.op, pc.group_size);
      pc.latency_seconds *= ratio;
      pc.bandwidth_bytes_per_second /= ratio;
      for (CollectiveSample& sample : pc.samples) sample.seconds *= ratio;
    }
  }
  return out;
}

std::string calibration_describe(const DeviceTypeCalibration& c) {
  std::string text;
  for (size_t k = 0; k < kLayerKinds; ++k) {
    const char* kind = kind_label(static_cast<int>(k));
    if (c.layer_ratio[k] > 0)
      text += fmt::format("{} {:.2f}x, ", kind, c.layer_ratio[k]);
    else if (c.layer_share[k] > 0)
      text += fmt::format("{} {:.0f}% of the passes (too brief for a factor of its own), ", kind, 100 * c.layer_share[k]);
  }
  text += fmt::format("forward and backward {:.2f}x, optimizer {:.2f}x", c.pass_ratio, c.optimizer_ratio);
  if (c.slowest_alike_lift > 1.005)
    text += fmt::format(" (the slowest of ranks doing the same work: {:+.0f}%)", 100 * (c.slowest_alike_lift - 1));
  if (c.collective_ratio <= 0) return text;
  std::vector<std::string> kinds;
  for (const CollectiveCalibration& k : c.collectives)
    kinds.push_back(
        fmt::format("{} over {} {:.2f}x of {}", collective_op_name(k.op), k.group_size, k.ratio(), k.count));
  return text + fmt::format(", collectives {:.2f}x ({})", c.collective_ratio, fmt::join(kinds, ", "));
}

}  // namespace alloy
