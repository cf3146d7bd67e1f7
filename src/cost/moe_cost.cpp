#include "cost/moe_cost.hpp"

#include <algorithm>
#include <cmath>

#include "cost/cost_model.hpp"
#include "cost/network_paths.hpp"
#include "spec/error.hpp"

#include <fmt/format.h>

namespace alloy {

namespace {

// Upper-tail quantile of the standard normal, x with Q(x) = p for 0 < p <= 0.5: Abramowitz and
// Stegun, Handbook of Mathematical Functions, 26.2.23 (absolute error below 4.5e-4).
double moe_normal_upper_quantile(double p) {
  const double t = std::sqrt(-2.0 * std::log(p));
  return t - (2.515517 + 0.802853 * t + 0.010328 * t * t) / (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t);
}

// Devices of the dp ranks `ranks` of a stage (tp fastest, then dp), in rank order.
std::vector<int> moe_member_ids(const std::vector<int>& stage_ids, int tp, const std::vector<int>& ranks) {
  std::vector<int> out;
  for (int d : ranks)
    for (int t = 0; t < tp; ++t) out.push_back(stage_ids[static_cast<size_t>(d) * tp + t]);
  return out;
}

}  // namespace

ModelSpec moe_dense_part(const ModelSpec& model) {
  ModelSpec dense = model;
  dense.moe = MixtureOfExperts{};
  dense.ffn_hidden_size = model.moe.num_shared_experts * model.moe.shared_expert_ffn_hidden_size;
  return dense;
}

double moe_shared_parameters_beyond_share(const ModelSpec& model, int tp) {
  const double shared_ffn = static_cast<double>(model.moe.num_shared_experts * model.moe.shared_expert_ffn_hidden_size);
  return 3.0 * static_cast<double>(model.hidden_size) * shared_ffn * (1.0 - 1.0 / tp);
}

int64_t moe_expert_parameters(const ModelSpec& model) {
  return 3 * model.hidden_size * model.moe.expert_ffn_hidden_size;
}

int64_t moe_router_parameters(const ModelSpec& model) {
  return model.hidden_size * model.moe.num_experts + (model.moe.shared_expert_gate ? model.hidden_size : 0);
}

std::vector<double> moe_expert_shares(const ModelSpec& model, const std::vector<double>& expert_tokens) {
  const size_t experts = static_cast<size_t>(model.moe.num_experts);
  if (expert_tokens.empty() || experts == 0) return {};
  if (expert_tokens.size() % experts != 0)
    throw Error(fmt::format("expert_tokens has {} values; {} has {} routed experts per MoE block", expert_tokens.size(),
                            model.name, experts),
                {"", "expert_tokens"}, "give one count per expert, or layers x experts as alloy train's step log writes them");
  std::vector<double> shares(experts, 0.0);
  double total = 0;
  for (size_t i = 0; i < expert_tokens.size(); ++i) {
    shares[i % experts] += expert_tokens[i];
    total += expert_tokens[i];
  }
  for (double& share : shares) share /= total;
  return shares;
}

double moe_routing_skew(const std::vector<double>& shares, int begin, int end) {
  if (shares.empty() || end <= begin) return 1.0;
  double load = 0;
  for (int e = begin; e < end; ++e) load += shares[static_cast<size_t>(e)];
  return load * static_cast<double>(shares.size()) / (end - begin);
}

double moe_even_split_skew(const std::vector<double>& shares, int ep) {
  if (shares.empty() || ep <= 1) return 1.0;
  const int each = static_cast<int>(shares.size()) / ep;
  double worst = 0;
  for (int m = 0; m < ep; ++m) worst = std::max(worst, moe_routing_skew(shares, m * each, (m + 1) * each));
  return worst;
}

double expected_max_standard_normal(int n) {
  if (n <= 1) return 0;
  const double q = (n - 0.375) / (n + 0.25);
  return moe_normal_upper_quantile(1.0 - q);
}

double moe_expected_imbalance(double picks, double expert_share, int members) {
  if (members <= 1 || picks <= 0 || expert_share <= 0 || expert_share >= 1) return 1.0;
  return 1.0 + expected_max_standard_normal(members) * std::sqrt((1.0 - expert_share) / (picks * expert_share));
}

MoeRoutedWork moe_routed_work(const ModelSpec& m, const StageShape& shape, int64_t seq_len, Precision precision) {
  const MixtureOfExperts& moe = m.moe;
  const double e = precision_bytes(precision);
  const double c = static_cast<double>(m.hidden_size);
  const double fe = static_cast<double>(moe.expert_ffn_hidden_size);
  const double experts = static_cast<double>(moe.num_experts);
  const double k = static_cast<double>(moe.experts_per_token);
  const double tokens = static_cast<double>(shape.micro_batch) * static_cast<double>(seq_len);
  const double group_sequences =
      shape.expert_group_sequences > 0 ? shape.expert_group_sequences : static_cast<double>(shape.micro_batch) * shape.ep;
  const double held = shape.held_experts > 0 ? shape.held_experts : experts;
  MoeRoutedWork out;
  out.routed_rows = group_sequences * static_cast<double>(seq_len) * k * held / experts * shape.expert_load_factor;
  const double rows = out.routed_rows;
  const double router_flops = 2.0 * tokens * c * experts;
  const double expert_flops = 2.0 * rows * static_cast<double>(moe_expert_parameters(m));
  LayerWork& w = out.work;
  w.forward_flops = router_flops + expert_flops;
  // Expert weights read once; per routed row its input and output (C), gate/up (2 F_e) written,
  // the SwiGLU reading them and writing F_e; the router's probabilities per token.
  const double weight_bytes = held * static_cast<double>(moe_expert_parameters(m)) * e;
  const double row_bytes = rows * (2.0 * c + 5.0 * fe) * e;
  const double router_bytes = tokens * (c + 2.0 * experts) * e;
  w.forward_bytes = weight_bytes + row_bytes + router_bytes;
  w.forward_elementwise_bytes = rows * (3.0 * fe + c) * e + 2.0 * tokens * experts * e;
  w.backward_flops = 2.0 * w.forward_flops;
  w.backward_bytes = 2.0 * w.forward_bytes;
  w.full_recompute_flops = w.forward_flops;
  w.matmul_rows = rows / std::max(1.0, held);  // each expert's rows: a grouped product
  w.matmul_cols = fe;
  // The buffers the runtime allocates (runtime/model_moe.cpp, model_moe_ep.cpp), in rows: the
  // member's own N k routed rows, and the rows its experts run. Under expert parallelism those
  // arrive from the group and their buffers are rounded up to an eighth of the own rows (the
  // arena reuses only equal sizes); without, they are the own rows.
  const double own_rows = tokens * k;
  const bool split = shape.ep > 1;
  const double step = std::max(1.0, std::ceil(own_rows / 8.0));
  const double expert_rows = split ? std::ceil(rows / step) * step : own_rows;
  // Kept for the backward: router probabilities (N x E), picks, weights and slots (N x k each),
  // the experts' outputs in the own rows' order, and per expert row gate/up and the SwiGLU, and
  // under expert parallelism the arrived inputs.
  out.activation_bytes = (tokens * (experts + 3.0 * k) + own_rows * c + expert_rows * (3.0 * fe + (split ? c : 0))) * e;
  // The MoE MLP's backward at its peak, in the experts' backward: the MLP input's gradient
  // (N x C), the gradients of the experts' outputs and of their gathered inputs in the own rows'
  // order (and the weights'), the gathered inputs again (or, split, the arrived gradients, their
  // reordered copy and the experts' input gradients, each an expert row of C), and per expert
  // row the gradients of the SwiGLU and of gate/up.
  const double gathered_or_exchanged = split ? expert_rows * 3.0 * c : own_rows * c;
  out.workspace_bytes = (tokens * c + own_rows * (2.0 * c + 1.0) + gathered_or_exchanged + expert_rows * 3.0 * fe) * e;
  out.dispatch_bytes = tokens * k * c * e;
  // The shared experts run whole on every tp rank too; the dense part prices a 1/tp share of them.
  const double shared_ffn = static_cast<double>(moe.num_shared_experts * moe.shared_expert_ffn_hidden_size);
  const double beyond_share = 1.0 - 1.0 / shape.tp;
  if (shared_ffn > 0 && beyond_share > 0) {
    const double shared_flops = 2.0 * tokens * 3.0 * c * shared_ffn * beyond_share;
    w.forward_flops += shared_flops;
    w.backward_flops += 2.0 * shared_flops;
    w.full_recompute_flops += shared_flops;
    const double shared_bytes = (3.0 * c * shared_ffn + tokens * 5.0 * shared_ffn) * e * beyond_share;
    w.forward_bytes += shared_bytes;
    w.backward_bytes += 2.0 * shared_bytes;
    w.forward_elementwise_bytes += tokens * 3.0 * shared_ffn * e * beyond_share;
    out.activation_bytes += tokens * 3.0 * shared_ffn * e * beyond_share;
    out.workspace_bytes += tokens * 3.0 * shared_ffn * e * beyond_share;
  }
  return out;
}

double all_to_all_seconds(double bytes_per_member, const GroupPlacement& g) {
  if (g.ranks <= 1 || bytes_per_member <= 0) return 0;
  const double n = g.ranks;
  const double per_node = std::ceil(n / std::max(1, g.nodes));
  const double local = bytes_per_member * (per_node - 1.0) / n;
  const double remote = bytes_per_member * (n - per_node) / n;
  const double intra_seconds = local > 0 ? local / g.intra_node.bandwidth_bytes_per_second : 0;
  double remote_seconds = 0;
  if (remote > 0) {
    const double nic = g.network.bandwidth_bytes_per_second / std::max(1, g.concurrent_per_node);
    double rate = nic;
    if (g.shared_bytes_per_second > 0) rate = std::min(rate, g.shared_bytes_per_second);
    remote_seconds = remote / rate;
  }
  const double latency = g.nodes > 1 ? g.network.latency_seconds : g.intra_node.latency_seconds;
  return std::max(intra_seconds, remote_seconds) + (n - 1.0) * latency;
}

void moe_shape_set(const CostModel& cost, StageShape* shape, const std::vector<int>& stage_ids, int ep,
                   double held_experts, int dp_rank, double group_sequences, double routing_skew) {
  const ModelSpec& model = cost.model();
  if (!model_is_moe(model)) return;
  ep = std::max(1, ep);
  const int tp = shape->tp;
  const int dp = shape->dp;
  const Link intra = cost.type_intra_node_link(shape->device_type);
  const double experts = static_cast<double>(model.moe.num_experts);
  shape->ep = ep;
  shape->held_experts = held_experts > 0 ? held_experts : experts / ep;
  shape->expert_group_sequences = group_sequences;
  const double group = group_sequences > 0 ? group_sequences : static_cast<double>(shape->micro_batch) * ep;
  const double picks = group * static_cast<double>(cost.train().seq_len) * static_cast<double>(model.moe.experts_per_token);
  shape->expert_load_factor = routing_skew * moe_expected_imbalance(picks, shape->held_experts / experts, ep);
  // Under ZeRO 1-3 an expert-parallel member's experts shard over the dp / ep members holding the
  // same ones (their own buckets, docs/runtime-distributed.md); with ep 1 over every replica.
  shape->expert_zero_share = static_cast<double>(ep) / dp;
  const int first = dp_rank / ep * ep;
  std::vector<int> group_ranks, same_experts;
  for (int d = first; d < first + ep && d < dp; ++d) group_ranks.push_back(d);
  for (int d = dp_rank % ep; d < dp; d += ep) same_experts.push_back(d);
  shape->ep_group = network_dp_group(cost.cluster(), moe_member_ids(stage_ids, tp, group_ranks), tp,
                                     static_cast<int>(group_ranks.size()), intra);
  shape->expert_dp_group = network_dp_group(cost.cluster(), moe_member_ids(stage_ids, tp, same_experts), tp,
                                            static_cast<int>(same_experts.size()), intra);
}

}  // namespace alloy
