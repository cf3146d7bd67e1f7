// The runtime's limits on a stage's layout, shared by the planner and the runtime's plan checks.
#include "plan/runnable.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace alloy {

namespace {

StageSupport refuse(std::string feature, std::string field, std::string reason) {
  return {false, std::move(feature), std::move(field), std::move(reason)};
}

bool tp_fits(const ModelSpec& model, int tp) {
  return model.num_heads % tp == 0 && model.num_kv_heads % tp == 0 && model.ffn_hidden_size % tp == 0 &&
         model.vocab_size >= tp;
}

}  // namespace

StageSupport tp_runnable(const ModelSpec& model, int tp) {
  if (tp < 1) return refuse(fmt::format("tensor parallelism {}", tp), "tp", "use a tp of at least 1");
  const struct {
    int64_t value;
    const char* field;
    const char* what;
  } divided[] = {{model.num_heads, "num_attention_heads", "attention heads"},
                 {model.num_kv_heads, "num_key_value_heads", "key/value heads"},
                 {model.ffn_hidden_size, "intermediate_size", "FFN width"}};
  for (const auto& d : divided) {
    if (d.value % tp == 0) continue;
    return refuse(fmt::format("tensor parallelism {}, which does not divide model {}'s {} ({})", tp, model.name, d.what,
                              d.value),
                  d.field,
                  fmt::format("choose a tp degree that divides the heads ({}), the key/value heads ({}) and the FFN "
                              "width ({}): {}",
                              model.num_heads, model.num_kv_heads, model.ffn_hidden_size, tp_runnable_list(model, 64)));
  }
  if (model.vocab_size < tp)
    return refuse(fmt::format("tensor parallelism {}, which exceeds model {}'s vocabulary of {}", tp, model.name,
                              model.vocab_size),
                  "vocab_size", fmt::format("use a smaller tp degree: {}", tp_runnable_list(model, 64)));
  return {};
}

StageSupport stage_features_runnable(const StageLayout& layout) {
  const int s = layout.stage;
  if (layout.offload && layout.shard_gradients)
    return refuse("sharded gradients with weight offload", fmt::format("stages[{}].shard_gradients", s),
                  "offloaded blocks accumulate their gradients in host memory and reduce them once per step; set "
                  "shard_gradients to false on that stage, or re-plan without offload (--no-offload)");
  if (layout.shard_gradients && layout.most_pieces > 1)
    return refuse(fmt::format("sharded gradients with a replica's share in {} passes", layout.most_pieces),
                  fmt::format("stages[{}].shard_gradients", s),
                  "every member reduce-scatters after each micro-batch, so replicas must run as many passes; set it "
                  "to false, or give every replica one pass (pieces 1)");
  if (layout.sequence_parallel && layout.tp > 1) {
    for (size_t d = 0; d < layout.replica_tokens.size(); ++d) {
      const int64_t tokens = layout.replica_tokens[d];
      if (tokens % layout.tp == 0) continue;
      return refuse(fmt::format("sequence parallelism over replica {}'s {} tokens with tp {}", d, tokens, layout.tp),
                    fmt::format("stages[{}].sequence_parallel", s),
                    "the tokens do not divide; set it to false, or change the micro-batch");
    }
  }
  return {};
}

StageSupport stage_layout_runnable(const ModelSpec& model, const StageLayout& layout) {
  StageSupport tp = tp_runnable(model, layout.tp);
  if (!tp.ok) {
    tp.field = fmt::format("stages[{}].tp", layout.stage);
    return tp;
  }
  return stage_features_runnable(layout);
}

StageLayout stage_layout_of(const Plan& plan, int stage) {
  const PlanStage& st = plan.stages[static_cast<size_t>(stage)];
  StageLayout layout;
  layout.stage = stage;
  layout.tp = st.tp;
  layout.dp = st.dp;
  layout.sequence_parallel = st.sequence_parallel;
  layout.offload = std::find(st.offload.begin(), st.offload.end(), true) != st.offload.end();
  layout.shard_gradients = st.gradients_sharded();
  for (const PlanReplica& r : st.replicas) layout.most_pieces = std::max(layout.most_pieces, r.pieces);
  for (int d = 0; d < st.dp; ++d)
    layout.replica_tokens.push_back(st.replica_sequences(plan.micro_batch_sequences, d) * plan.seq_len);
  return layout;
}

std::string tp_runnable_list(const ModelSpec& model, int most) {
  std::string out;
  for (int tp = 1; tp <= most; tp *= 2) {
    if (!tp_fits(model, tp)) continue;
    out += out.empty() ? fmt::format("{}", tp) : fmt::format(", {}", tp);
  }
  return out;
}

}  // namespace alloy
