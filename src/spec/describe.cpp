#include "spec/describe.hpp"

#include <map>

#include <fmt/format.h>

#include "spec/moe.hpp"
#include "spec/units.hpp"
#include "util/table.hpp"

namespace alloy {

namespace {

// "  Mixture of Experts: 64 routed experts of width 1408, 6 per token, ..." or "" for a dense model.
std::string moe_describe(const MixtureOfExperts& moe) {
  if (moe.num_experts == 0) return "";
  std::string out = fmt::format("  Mixture of Experts: {} routed experts of width {}, {} per token ({})",
                                moe.num_experts, moe.expert_ffn_hidden_size, moe.experts_per_token,
                                moe.norm_topk_prob ? "weights renormalised" : "softmax weights kept");
  if (moe.num_shared_experts > 0)
    out += fmt::format(", {} shared expert{} of width {}{}", moe.num_shared_experts, moe.num_shared_experts == 1 ? "" : "s",
                       moe.shared_expert_ffn_hidden_size, moe.shared_expert_gate ? " behind a sigmoid gate" : "");
  if (moe.first_dense_layers > 0) out += fmt::format(", first {} block(s) dense", moe.first_dense_layers);
  return out + "\n  Load-balancing loss: " + moe_balance_describe(moe) + "\n";
}

void add_block_rows(TextTable& params, const ModelSpec& m, const ModelParameterCounts& counts) {
  const int64_t dense_blocks = model_is_moe(m) ? m.moe.first_dense_layers : m.num_layers;
  if (dense_blocks > 0)
    params.add_row({model_is_moe(m) ? "per dense block" : "per block", text_thousands(counts.per_block),
                    fmt::format("x {} blocks", dense_blocks)});
  if (!model_is_moe(m)) return;
  params.add_row({"per MoE block", text_thousands(counts.per_moe_block),
                  fmt::format("x {} blocks ({})", m.num_layers - dense_blocks, moe_summary(m.moe))});
  params.add_row({"  active per token", text_thousands(counts.per_moe_block_active), ""});
}

}  // namespace

ModelStateBytes model_state_bytes(int64_t parameters, Precision precision, int optimizer_states) {
  const double n = static_cast<double>(parameters);
  ModelStateBytes b;
  b.weights = n * precision_bytes(precision);
  b.master_weights = precision_bytes(precision) < 4 ? 4.0 * n : 0.0;
  // Beside fp32 master weights gradients accumulate in fp32 (the cost model's gradient bytes).
  b.gradients = 4.0 * n;
  b.optimizer_states = 4.0 * n * optimizer_states;
  return b;
}

std::string model_describe(const ModelSpec& m, int64_t seq_len, int optimizer_states) {
  const ModelParameterCounts counts = model_parameter_counts(m);
  const ModelFlopsPerToken flops = model_flops_per_token(m, seq_len);
  std::string out = fmt::format("Model {} ({} family, model_type {}{})\n", m.name, model_family_name(m.family),
                                m.model_type, m.source_path.empty() ? "" : ", from " + m.source_path);
  out += fmt::format("  {} layers, hidden {}, {} heads ({} key/value, head dim {}), ffn {}, vocab {}, max seq {}\n",
                     m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.ffn_hidden_size,
                     m.vocab_size, m.max_seq_len);
  std::string positions;
  if (m.family == ModelFamily::ModelFamily_llama) positions = fmt::format(", rope theta {:g}", m.rope_theta);
  if (m.rope_scaling.type == RopeScalingType::RopeScalingType_linear)
    positions += fmt::format(" scaled linearly by {:g}", m.rope_scaling.factor);
  if (m.rope_scaling.type == RopeScalingType::RopeScalingType_llama3)
    positions += fmt::format(" with llama3 scaling (factor {:g}, low/high frequency factors {:g}/{:g}, original context {})",
                             m.rope_scaling.factor, m.rope_scaling.low_freq_factor, m.rope_scaling.high_freq_factor,
                             m.rope_scaling.original_max_positions);
  if (m.sliding_window > 0) positions += fmt::format(", sliding window of {} tokens", m.sliding_window);
  out += fmt::format("  embeddings {}, biases {}, norm eps {:g}{}\n", m.tied_embeddings ? "tied" : "untied",
                     m.linear_bias ? "everywhere" : (m.qkv_bias ? "on q/k/v only" : "none"), m.norm_eps, positions);
  out += moe_describe(m.moe) + "\n";

  TextTable params({"parameters", "count>", ""});
  params.add_row({"embedding", text_thousands(counts.embedding), ""});
  add_block_rows(params, m, counts);
  params.add_row({"final norm", text_thousands(counts.final_norm), ""});
  params.add_row({"lm head", text_thousands(counts.lm_head), m.tied_embeddings ? "tied to embedding" : ""});
  params.add_row({"total", text_thousands(counts.total), units_format_count(static_cast<double>(counts.total))});
  if (model_is_moe(m))
    params.add_row({"active per token", text_thousands(counts.active), units_format_count(static_cast<double>(counts.active))});
  out += params.render() + "\n";

  out += fmt::format("  FLOPs per token at sequence {}{}: forward {}, training (forward + backward) {}\n\n", seq_len,
                     model_is_moe(m) ? " (active experts only)" : "", units_format_flop_count(flops.forward),
                     units_format_flop_count(flops.training));

  TextTable states({"model states", "weights>", "+ gradients>", "+ master fp32>", "+ optimizer>", "total>", "bytes/param>"});
  for (Precision p : {Precision::Precision_fp32, Precision::Precision_bf16, Precision::Precision_fp8}) {
    ModelStateBytes b = model_state_bytes(counts.total, p, optimizer_states);
    states.add_row({precision_name(p), units_format_bytes(b.weights), units_format_bytes(b.gradients),
                    b.master_weights > 0 ? units_format_bytes(b.master_weights) : "-",
                    units_format_bytes(b.optimizer_states), units_format_bytes(b.total()),
                    fmt::format("{:g}", b.total() / static_cast<double>(counts.total))});
  }
  out += states.render();
  out += fmt::format("  (optimizer: {} fp32 state(s) per parameter; gradients accumulate in fp32 beside fp32 master "
                     "weights; no sharding, before activations)\n",
                     optimizer_states);
  return out;
}

namespace {
std::string peak_or_dash(double flops) { return flops > 0 ? units_format_flops(flops) : "-"; }
}  // namespace

std::string cluster_describe(const ClusterSpec& c) {
  std::string out = fmt::format("Cluster {} (from {}): {} nodes, {} devices, {} device type{}\n\n", c.name,
                                c.source_path, c.num_nodes, c.devices.size(), c.device_types.size(),
                                c.device_types.size() == 1 ? "" : "s");
  TextTable groups({"node group", "nodes>", "dev/node>", "device type", "intra-node link", "host memory/node>",
                    "host link>", "price/dev-h>"});
  for (const auto& g : c.node_groups) {
    groups.add_row({g.name, std::to_string(g.count), std::to_string(g.devices_per_node),
                    c.device_types[g.device_type_index].name,
                    fmt::format("{} {} {}", g.intra_node.kind, units_format_bandwidth(g.intra_node.bandwidth_bytes_per_second),
                                units_format_seconds(g.intra_node.latency_seconds)),
                    units_format_bytes(g.host_memory_bytes), units_format_bandwidth(g.host_link_bytes_per_second),
                    g.price_per_device_hour > 0 ? fmt::format("${:.2f}", g.price_per_device_hour) : "-"});
  }
  out += groups.render() + "\n";

  std::map<int, int> count_by_type;
  for (const auto& d : c.devices) count_by_type[d.device_type_index]++;
  TextTable types({"device type", "vendor", "count>", "memory>", "mem bw>", "fp32>", "tf32>", "bf16>", "fp16>", "fp8>", "speed>"});
  for (const auto& [index, count] : count_by_type) {
    const DeviceType& t = c.device_types[index];
    types.add_row({t.name, t.vendor, std::to_string(count), units_format_bytes(t.memory_bytes),
                   units_format_bandwidth(t.memory_bandwidth_bytes_per_second), peak_or_dash(t.peak_flops_fp32 * t.speed),
                   peak_or_dash(t.peak_flops_tf32 * t.speed), peak_or_dash(t.peak_flops_bf16 * t.speed),
                   peak_or_dash(t.peak_flops_fp16 * t.speed), peak_or_dash(t.peak_flops_fp8 * t.speed),
                   fmt::format("{:g}", t.speed)});
  }
  out += types.render() + "\n";

  TextTable totals({"aggregate", "value>"});
  for (Precision p : {Precision::Precision_fp32, Precision::Precision_tf32, Precision::Precision_bf16,
                      Precision::Precision_fp16, Precision::Precision_fp8}) {
    double sum = 0;
    for (const auto& d : c.devices) sum += c.device_type(d).peak_flops(p);
    totals.add_row({fmt::format("peak {} (dense)", precision_name(p)), units_format_flops(sum)});
  }
  double device_memory = 0, host_memory = 0;
  for (const auto& d : c.devices) device_memory += c.device_type(d).memory_bytes;
  for (const auto& g : c.node_groups) host_memory += g.host_memory_bytes * g.count;
  totals.add_row({"device memory", units_format_bytes(device_memory)});
  totals.add_row({"host memory", units_format_bytes(host_memory)});
  out += totals.render();
  out += "  (a device without a precision counts at the next wider mode it has, e.g. fp8 -> bf16 -> fp32)\n\n";
  out += fmt::format("  network between nodes: {} {} per node, latency {}\n", c.network.kind,
                     units_format_bandwidth(c.network.bandwidth_bytes_per_second),
                     units_format_seconds(c.network.latency_seconds));
  return out;
}

std::string train_describe(const TrainSpec& t) {
  return fmt::format(
      "Training setup (from {}): sequence {}, global batch {} sequences ({} tokens), {} compute{}{}, {} optimizer,\n"
      "  {} steps, lr {:g} -> {:g} (warm-up {}), weight decay {:g}, grad clip {:g}, seed {}\n",
      t.source_path.empty() ? "defaults" : t.source_path, t.seq_len, t.global_batch_sequences,
      text_thousands(t.global_batch_sequences * t.seq_len), precision_name(t.precision),
      t.master_weights_fp32 && t.precision != Precision::Precision_fp32 ? " with fp32 master weights" : "",
      t.gradient_communication == Precision::Precision_bf16 ? ", ZeRO 2-3 gradients sent in bf16" : "",
      t.optimizer, t.steps, t.learning_rate, t.min_learning_rate, t.warmup_steps, t.weight_decay, t.grad_clip, t.seed);
}

}  // namespace alloy
