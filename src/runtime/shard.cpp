// Shard layouts: the full model's tensor list in buffer order, filtered to a rank's blocks and
// sliced for tensor parallelism.
#include "runtime/shard.hpp"

#include <fmt/format.h>

#include "plan/runnable.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// Rows of the full tensor the shard keeps, for the splits that slice whole rows.
std::vector<RowRange> kept_rows(const ModelSpec& spec, ShardSplit split, int64_t rows, int tp, int t) {
  const int64_t D = spec.head_dim;
  switch (split) {
    case ShardSplit::ShardSplit_heads: {
      const int64_t q = spec.num_heads / tp * D;
      const int64_t kv = spec.num_kv_heads / tp * D;
      const int64_t k_base = spec.num_heads * D;
      const int64_t v_base = k_base + spec.num_kv_heads * D;
      return {{t * q, (t + 1) * q}, {k_base + t * kv, k_base + (t + 1) * kv}, {v_base + t * kv, v_base + (t + 1) * kv}};
    }
    case ShardSplit::ShardSplit_rows: {
      const int64_t per = rows / tp;
      return {{t * per, (t + 1) * per}};
    }
    case ShardSplit::ShardSplit_gate_up: {
      const int64_t F = spec.ffn_hidden_size;
      const int64_t per = F / tp;
      return {{t * per, (t + 1) * per}, {F + t * per, F + (t + 1) * per}};
    }
    case ShardSplit::ShardSplit_vocab: {
      const auto [begin, end] = shard_vocab_range(spec, tp, t);
      return {{begin, end}};
    }
    default:
      return {{0, rows}};
  }
}

ShardedTensor slice(const ModelSpec& spec, const std::string& name, std::vector<int64_t> shape, int tp, int t) {
  ShardedTensor out;
  out.name = name;
  out.full_shape = shape;
  out.local_shape = shape;
  const ShardSplit split = tp == 1 ? ShardSplit::ShardSplit_replicated : shard_split_of(name);
  const int64_t cols = shape.size() == 2 ? shape[1] : 1;
  if (split == ShardSplit::ShardSplit_columns) {
    const int64_t per = cols / tp;
    for (int64_t r = 0; r < shape[0]; ++r) out.segments.push_back({r * cols + t * per, per});
    out.local_shape[1] = per;
    return out;
  }
  int64_t kept = 0;
  for (const RowRange& range : kept_rows(spec, split, shape[0], tp, t)) {
    out.segments.push_back({range.begin * cols, (range.end - range.begin) * cols});
    kept += range.end - range.begin;
  }
  out.local_shape[0] = kept;
  return out;
}

// An MoE block's MLP, in flat order: router, each routed expert's gate_up and down, the shared
// experts as one SwiGLU MLP of their widths together, and Qwen2-MoE's shared-expert gate.
// Experts are whole tensors on every tensor-parallel rank: the runtime runs the MoE MLP whole there.
// Routed experts [first, last) of block `layer`'s MoE MLP.
void add_routed_experts(std::vector<ShardedTensor>& out, const ModelSpec& spec, int64_t layer, int first, int last) {
  const int64_t C = spec.hidden_size;
  const int64_t Fe = spec.moe.expert_ffn_hidden_size;
  const std::string p = fmt::format("layers.{}.", layer);
  for (int e = first; e < last; ++e) {
    out.push_back(slice(spec, p + fmt::format("mlp.experts.{}.gate_up.weight", e), {2 * Fe, C}, 1, 0));
    out.push_back(slice(spec, p + fmt::format("mlp.experts.{}.down.weight", e), {C, Fe}, 1, 0));
  }
}

void add_moe_mlp(std::vector<ShardedTensor>& out, const ModelSpec& spec, const std::string& p, int tp, int t,
                 bool with_experts) {
  const MixtureOfExperts& moe = spec.moe;
  const int64_t C = spec.hidden_size;
  const int64_t Fe = moe.expert_ffn_hidden_size;
  const int64_t Fs = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { out.push_back(slice(spec, p + name, std::move(shape), tp, t)); };
  add("mlp.router.weight", {moe.num_experts, C});
  for (int64_t e = 0; with_experts && e < moe.num_experts; ++e) {
    add(fmt::format("mlp.experts.{}.gate_up.weight", e), {2 * Fe, C});
    add(fmt::format("mlp.experts.{}.down.weight", e), {C, Fe});
  }
  if (Fs > 0) {
    add("mlp.shared.gate_up.weight", {2 * Fs, C});
    add("mlp.shared.down.weight", {C, Fs});
    if (moe.shared_expert_gate) add("mlp.shared_gate.weight", {1, C});
  }
}

void add_block(std::vector<ShardedTensor>& out, const ModelSpec& spec, int64_t i, int tp, int t, bool with_experts) {
  const int64_t C = spec.hidden_size;
  const int64_t D = spec.head_dim;
  const int64_t qkv_rows = (spec.num_heads + 2 * spec.num_kv_heads) * D;
  const int64_t F = spec.ffn_hidden_size;
  const std::string p = fmt::format("layers.{}.", i);
  auto add = [&](const std::string& name, std::vector<int64_t> shape) { out.push_back(slice(spec, p + name, std::move(shape), tp, t)); };
  add("attn_norm.weight", {C});
  if (spec.norm_bias) add("attn_norm.bias", {C});
  add("attn.qkv.weight", {qkv_rows, C});
  if (spec.qkv_bias) add("attn.qkv.bias", {qkv_rows});
  add("attn.out.weight", {C, spec.num_heads * D});
  if (spec.linear_bias) add("attn.out.bias", {C});
  add("mlp_norm.weight", {C});
  if (spec.norm_bias) add("mlp_norm.bias", {C});
  if (model_block_is_moe(spec, i)) {
    add_moe_mlp(out, spec, p, tp, t, with_experts);
    return;
  }
  if (spec.family == ModelFamily::ModelFamily_gpt2) {
    add("mlp.up.weight", {F, C});
    if (spec.linear_bias) add("mlp.up.bias", {F});
  } else {
    add("mlp.gate_up.weight", {2 * F, C});
  }
  add("mlp.down.weight", {C, F});
  if (spec.linear_bias) add("mlp.down.bias", {C});
}

}  // namespace

bool model_block_is_moe(const ModelSpec& spec, int64_t layer) {
  return model_is_moe(spec) && layer >= spec.moe.first_dense_layers;
}

ModelShard shard_full(const ModelSpec& spec) {
  ModelShard shard;
  shard.block_ranges = {{0, static_cast<int>(spec.num_layers)}};
  return shard;
}

std::pair<int, int> shard_expert_range(const ModelSpec& spec, const ModelShard& shard, int member) {
  const int experts = static_cast<int>(spec.moe.num_experts);
  if (!shard.experts_split()) return {0, experts};
  if (shard.experts_per_member.empty()) return {member * experts / shard.ep, (member + 1) * experts / shard.ep};
  int first = 0;
  for (int m = 0; m < member; ++m) first += shard.experts_per_member[static_cast<size_t>(m)];
  return {first, first + shard.experts_per_member[static_cast<size_t>(member)]};
}

bool shard_is_routed_expert(const std::string& name) {
  return name.rfind("layers.", 0) == 0 && name.find(".mlp.experts.") != std::string::npos;
}

ShardSplit shard_split_of(const std::string& name) {
  if (name == "embed.token" || name == "lm_head.weight") return ShardSplit::ShardSplit_vocab;
  if (name.ends_with("attn.qkv.weight") || name.ends_with("attn.qkv.bias")) return ShardSplit::ShardSplit_heads;
  if (name.ends_with("mlp.up.weight") || name.ends_with("mlp.up.bias")) return ShardSplit::ShardSplit_rows;
  if (name.ends_with("mlp.gate_up.weight")) return ShardSplit::ShardSplit_gate_up;
  if (name.ends_with("attn.out.weight") || name.ends_with("mlp.down.weight")) return ShardSplit::ShardSplit_columns;
  return ShardSplit::ShardSplit_replicated;
}

std::pair<int64_t, int64_t> shard_vocab_range(const ModelSpec& spec, int tp, int tp_rank) {
  const int64_t base = spec.vocab_size / tp;
  const int64_t extra = spec.vocab_size % tp;
  const int64_t begin = tp_rank * base + std::min<int64_t>(tp_rank, extra);
  return {begin, begin + base + (tp_rank < extra ? 1 : 0)};
}

void shard_check_tp(const ModelSpec& spec, int tp) {
  const StageSupport support = tp_runnable(spec, tp);
  if (!support.ok) throw Error(support.feature, {spec.source_path, support.field}, support.reason);
}

std::vector<ShardedTensor> shard_tensors(const ModelSpec& spec, const ModelShard& shard) {
  if (shard.tp < 1 || shard.tp_rank < 0 || shard.tp_rank >= shard.tp) {
    throw Error(fmt::format("tensor-parallel rank {} of {} is out of range", shard.tp_rank, shard.tp));
  }
  shard_check_tp(spec, shard.tp);
  const int64_t C = spec.hidden_size;
  const int tp = shard.tp;
  const int t = shard.tp_rank;
  std::vector<ShardedTensor> out;
  if (shard.has_embedding) {
    out.push_back(slice(spec, "embed.token", {spec.vocab_size, C}, tp, t));
    if (spec.family == ModelFamily::ModelFamily_gpt2) out.push_back(slice(spec, "embed.position", {spec.max_seq_len, C}, tp, t));
  }
  for (const auto& [first, last] : shard.block_ranges)
    for (int64_t i = first; i < last; ++i) add_block(out, spec, i, tp, t, !shard.experts_split());
  if (shard.has_head) {
    out.push_back(slice(spec, "final_norm.weight", {C}, tp, t));
    if (spec.norm_bias) out.push_back(slice(spec, "final_norm.bias", {C}, tp, t));
    if (!spec.tied_embeddings) {
      out.push_back(slice(spec, "lm_head.weight", {spec.vocab_size, C}, tp, t));
    } else if (!shard.has_embedding) {
      out.push_back(slice(spec, "embed.token", {spec.vocab_size, C}, tp, t));  // the tied head's own copy
    }
  }
  if (shard.experts_split()) {
    const auto [first_expert, last_expert] = shard_expert_range(spec, shard, shard.ep_rank);
    for (const auto& [first, last] : shard.block_ranges)
      for (int64_t i = first; i < last; ++i)
        if (model_block_is_moe(spec, i)) add_routed_experts(out, spec, i, first_expert, last_expert);
  }
  return out;
}

}  // namespace alloy
