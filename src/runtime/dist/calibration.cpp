#include "runtime/dist/calibration.hpp"

#include <map>

#include <fmt/format.h>

#include "cost/layer_cost.hpp"

namespace alloy {

namespace {

struct TypeSums {
  double pass_measured = 0, pass_predicted = 0, optimizer_measured = 0, optimizer_predicted = 0;
  std::array<double, kLayerKinds> layer_measured = {0, 0, 0}, layer_predicted = {0, 0, 0};
};

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
    const double selective_share = work.forward_flops > 0 ? work.selective_flops / work.forward_flops : 0;
    double seconds = st.num_blocks() * (block->forward_seconds + block->backward_seconds);
    for (Recompute r : st.recompute) {
      if (r == Recompute::Recompute_full) seconds += block->forward_seconds;
      if (r == Recompute::Recompute_selective) seconds += block->forward_seconds * selective_share;
    }
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

const char* kind_label(int kind) {
  switch (static_cast<LayerKind>(kind)) {
    case LayerKind::LayerKind_embedding: return "embedding";
    case LayerKind::LayerKind_block: return "blocks";
    case LayerKind::LayerKind_head: return "head";
  }
  return "?";
}

}  // namespace

std::vector<DeviceTypeCalibration> dist_calibration(const DistTrainResult& result, const Plan& plan,
                                                    const Profile& profile, const ModelSpec& model) {
  std::map<std::string, TypeSums> by_type;
  for (const RankSummary& r : result.ranks) {
    const PlanStage& st = plan.stages[r.stage];
    const PlanReplica replica = st.replica(plan.micro_batch_sequences, r.dp_rank);
    TypeSums& s = by_type[replica.device_type];
    s.optimizer_measured += r.optimizer_seconds;
    s.optimizer_predicted += replica.optimizer_seconds;
    // The profile holds compute alone: the passes' compute (their waits for ZeRO-3 gathers and
    // tensor-parallel sums left out) against the profile's times of the same layers, both split
    // over the kinds (the measured side by where this rank's CPU time went). Where the profile
    // lacks a shape, the whole passes against the plan's prediction.
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
    const double compute = r.compute_seconds - r.optimizer_seconds;
    s.pass_measured += compute;
    s.pass_predicted += plan.num_micro_batches * predicted;
    if (cpu <= 0) continue;
    for (size_t k = 0; k < kLayerKinds; ++k) {
      s.layer_measured[k] += compute * r.layer_cpu_seconds[k] / cpu;
      s.layer_predicted[k] += plan.num_micro_batches * weights[k];
    }
  }
  std::vector<DeviceTypeCalibration> out;
  for (const auto& [type, s] : by_type) {
    DeviceTypeCalibration c;
    c.device_type = type;
    if (s.pass_predicted > 0 && s.pass_measured > 0) c.pass_ratio = s.pass_measured / s.pass_predicted;
    if (s.optimizer_predicted > 0 && s.optimizer_measured > 0) c.optimizer_ratio = s.optimizer_measured / s.optimizer_predicted;
    for (size_t k = 0; k < kLayerKinds; ++k) {
      c.layer_share[k] = s.pass_measured > 0 ? s.layer_measured[k] / s.pass_measured : 0;
      if (s.layer_predicted[k] > 0 && c.layer_share[k] >= kCalibrationMinimumShare)
        c.layer_ratio[k] = s.layer_measured[k] / s.layer_predicted[k];
    }
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
  }
  return out;
}

std::string calibration_describe(const DeviceTypeCalibration& c) {
  std::string text;
  for (int k = 0; k < kLayerKinds; ++k)
    if (c.layer_ratio[static_cast<size_t>(k)] > 0)
      text += fmt::format("{} {:.2f}x, ", kind_label(k), c.layer_ratio[static_cast<size_t>(k)]);
  return text + fmt::format("forward and backward {:.2f}x, optimizer {:.2f}x", c.pass_ratio, c.optimizer_ratio);
}

}  // namespace alloy
