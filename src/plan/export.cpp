#include "plan/export.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace alloy {

namespace {

// What every stage shares, or the first difference found.
struct UniformShape {
  int tp = 1;
  int dp = 1;
  int zero = 0;
  bool sequence_parallel = false;
  std::vector<std::string> differences;
};

UniformShape uniform_shape(const Plan& plan) {
  UniformShape u;
  const PlanStage& first = plan.stages.front();
  u.tp = first.tp;
  u.dp = first.dp;
  u.zero = first.zero;
  u.sequence_parallel = first.sequence_parallel;
  std::set<std::string> types;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    types.insert(st.device_type);
    if (st.tp != u.tp || st.dp != u.dp) {
      u.differences.push_back(fmt::format("stage {} has tp {} dp {} while stage 0 has tp {} dp {}: one shape for all "
                                          "stages is required",
                                          s, st.tp, st.dp, u.tp, u.dp));
    }
    if (!st.replicas.empty())
      u.differences.push_back(fmt::format("stage {} splits each micro-batch unevenly over its replicas (uneven data "
                                          "parallelism): the target gives every replica the same share",
                                          s));
    if (st.zero != u.zero) u.differences.push_back(fmt::format("stage {} uses ZeRO {}, stage 0 ZeRO {}", s, st.zero, u.zero));
    if (st.sequence_parallel != u.sequence_parallel) {
      u.differences.push_back(fmt::format("sequence parallelism differs between stage 0 and stage {}", s));
    }
  }
  if (types.size() > 1) {
    u.differences.push_back(fmt::format("{} device types: the target balances nothing by device speed, so the uneven "
                                        "split is what keeps the faster devices busy",
                                        types.size()));
  }
  return u;
}

struct RecomputeSummary {
  int full = 0;       // blocks under full recomputation (same count in every stage, or -1)
  int selective = 0;  // blocks under selective recomputation
  bool per_stage_equal = true;
};

RecomputeSummary recompute_summary(const Plan& plan) {
  RecomputeSummary r;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    int full = 0, selective = 0;
    for (Recompute level : plan.stages[s].recompute) {
      full += level == Recompute::Recompute_full;
      selective += level == Recompute::Recompute_selective;
    }
    if (s == 0) {
      r.full = full;
      r.selective = selective;
    } else if (full != r.full || selective != r.selective) {
      r.per_stage_equal = false;
    }
  }
  return r;
}

int offloaded_blocks(const Plan& plan) {
  int n = 0;
  for (const auto& st : plan.stages) n += static_cast<int>(std::count(st.offload.begin(), st.offload.end(), true));
  return n;
}

// Blocks per stage (all chunks).
std::vector<int> stage_blocks(const Plan& plan) {
  std::vector<int> out;
  for (const auto& st : plan.stages) out.push_back(st.num_blocks());
  return out;
}

const char* precision_flag(Precision p) {
  switch (p) {
    case Precision::Precision_bf16: return "--bf16";
    case Precision::Precision_fp16: return "--fp16";
    default: return "";
  }
}

void add_model_arguments(std::vector<std::string>& args, const ModelSpec& m, int64_t seq_len) {
  args.push_back(fmt::format("--num-layers {}", m.num_layers));
  args.push_back(fmt::format("--hidden-size {}", m.hidden_size));
  args.push_back(fmt::format("--ffn-hidden-size {}", m.ffn_hidden_size));
  args.push_back(fmt::format("--num-attention-heads {}", m.num_heads));
  args.push_back(fmt::format("--seq-length {}", seq_len));
  args.push_back(fmt::format("--max-position-embeddings {}", m.max_seq_len));
  if (m.family == ModelFamily::ModelFamily_llama) {
    if (m.num_kv_heads != m.num_heads) {
      args.push_back("--group-query-attention");
      args.push_back(fmt::format("--num-query-groups {}", m.num_kv_heads));
    }
    args.push_back("--swiglu");
    args.push_back("--normalization RMSNorm");
    args.push_back("--position-embedding-type rope");
    args.push_back(fmt::format("--rotary-base {:g}", m.rope_theta));
    args.push_back("--disable-bias-linear");
    if (m.qkv_bias) args.push_back("--add-qkv-bias");
  }
  if (!m.tied_embeddings) args.push_back("--untie-embeddings-and-output-weights");
}

}  // namespace

PlanExport plan_export_megatron(const Plan& plan, const ModelSpec& model, const TrainSpec& train) {
  PlanExport out;
  UniformShape u = uniform_shape(plan);
  out.unsupported = u.differences;
  const int pp = static_cast<int>(plan.stages.size());
  std::vector<std::string> args;
  args.push_back(fmt::format("--tensor-model-parallel-size {}", u.tp));
  args.push_back(fmt::format("--pipeline-model-parallel-size {}", pp));
  // Megatron's micro-batch is per data-parallel replica.
  args.push_back(fmt::format("--micro-batch-size {}", std::max<int64_t>(1, plan.micro_batch_sequences / u.dp)));
  args.push_back(fmt::format("--global-batch-size {}", plan.global_batch_sequences));
  add_model_arguments(args, model, plan.seq_len);
  if (const char* p = precision_flag(plan.precision); *p) args.push_back(p);
  if (u.sequence_parallel) args.push_back("--sequence-parallel");
  if (u.zero == 1 || u.zero == 2) args.push_back("--use-distributed-optimizer");
  if (u.zero == 3) out.unsupported.push_back("ZeRO-3 (parameter sharding) has no Megatron-LM equivalent used here");

  const std::vector<int> blocks = stage_blocks(plan);
  if (plan.schedule == Schedule::Schedule_interleaved) {
    bool even = std::all_of(blocks.begin(), blocks.end(), [&](int b) { return b == blocks.front(); });
    if (!even) out.unsupported.push_back("an uneven layer split with the interleaved schedule");
    const bool equal_chunks = std::all_of(plan.stages.begin(), plan.stages.end(), [](const PlanStage& st) {
      return std::all_of(st.chunks.begin(), st.chunks.end(), [&](const LayerRange& c) { return c.size() == st.chunks.front().size(); });
    });
    if (!equal_chunks)
      out.unsupported.push_back(
          "model chunks of unequal layer counts (--num-layers-per-virtual-pipeline-stage gives every chunk the same "
          "count; the one given is the first stage's first chunk)");
    args.push_back(fmt::format("--num-layers-per-virtual-pipeline-stage {}", plan.stages.front().chunks.front().size()));
  } else if (pp > 1) {
    // Megatron allows a different first and last stage; the middle stages share the rest evenly.
    std::vector<int> middle(blocks.begin() + 1, blocks.end() - 1);
    bool middle_even = std::all_of(middle.begin(), middle.end(), [&](int b) { return b == middle.front(); });
    if (!middle_even) {
      out.unsupported.push_back("an uneven split among the middle stages (Megatron-LM only varies the first and last)");
    }
    int even_share = model.num_layers / pp;
    if (blocks.front() != even_share || blocks.back() != even_share || model.num_layers % pp != 0) {
      args.push_back(fmt::format("--decoder-first-pipeline-num-layers {}", blocks.front()));
      args.push_back(fmt::format("--decoder-last-pipeline-num-layers {}", blocks.back()));
    }
  }
  if (plan.schedule == Schedule::Schedule_gpipe) {
    out.unsupported.push_back("the GPipe schedule (Megatron-LM always runs 1F1B; memory differs, not results)");
  }

  RecomputeSummary r = recompute_summary(plan);
  if (!r.per_stage_equal) out.unsupported.push_back("recomputation that differs between stages");
  if (r.full > 0 && r.selective > 0) {
    out.unsupported.push_back("full and selective recomputation mixed in one stage");
  } else if (r.full > 0) {
    args.push_back("--recompute-granularity full");
    args.push_back("--recompute-method block");
    args.push_back(fmt::format("--recompute-num-layers {}", r.full));
  } else if (r.selective > 0) {
    args.push_back("--recompute-granularity selective");
    int stage_blocks_0 = blocks.front();
    if (r.selective != stage_blocks_0) out.unsupported.push_back("selective recomputation on only some blocks");
  }
  if (int n = offloaded_blocks(plan); n > 0) {
    out.unsupported.push_back(fmt::format("offload of {} blocks' weights and optimizer state to host memory", n));
  }
  for (size_t i = 0; i < args.size(); ++i) out.text += (i == 0 ? "" : " \\\n  ") + args[i];
  out.text += "\n";
  out.notes.push_back(fmt::format("launch {} ranks; Megatron-LM orders them tp-dp-pp, so list hosts in the plan's "
                                  "stage order",
                                  plan.num_used_devices()));
  out.notes.push_back(fmt::format("add data, tokenizer and checkpoint arguments; --clip-grad {:g}", train.grad_clip));
  return out;
}

PlanExport plan_export_deepspeed(const Plan& plan, const ModelSpec& model, const TrainSpec& train) {
  PlanExport out;
  UniformShape u = uniform_shape(plan);
  out.unsupported = u.differences;
  const int pp = static_cast<int>(plan.stages.size());
  const int64_t per_replica = std::max<int64_t>(1, plan.micro_batch_sequences / u.dp);
  nlohmann::ordered_json config;
  config["train_batch_size"] = plan.global_batch_sequences;
  config["train_micro_batch_size_per_gpu"] = per_replica;
  config["gradient_accumulation_steps"] = plan.num_micro_batches;
  config["gradient_clipping"] = train.grad_clip;
  if (plan.precision == Precision::Precision_bf16) config["bf16"] = {{"enabled", true}};
  if (plan.precision == Precision::Precision_fp16) config["fp16"] = {{"enabled", true}};
  nlohmann::ordered_json zero = {{"stage", u.zero}};
  if (int n = offloaded_blocks(plan); n > 0) {
    int total = 0;
    for (const auto& st : plan.stages) total += st.num_blocks();
    if (n == total && u.zero >= 2) {
      zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
      if (u.zero == 3) zero["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
    } else {
      out.unsupported.push_back(fmt::format("offload of only {} of {} blocks (DeepSpeed offloads all or nothing)", n, total));
    }
  }
  config["zero_optimization"] = zero;
  if (pp > 1 && u.zero >= 2) out.unsupported.push_back("ZeRO 2 or 3 together with pipeline parallelism (DeepSpeed allows ZeRO 1)");

  RecomputeSummary r = recompute_summary(plan);
  if (r.full > 0 || r.selective > 0) {
    config["activation_checkpointing"] = {{"partition_activations", u.tp > 1}, {"contiguous_memory_optimization", false}};
    out.notes.push_back(fmt::format("wrap {} blocks per stage in deepspeed.checkpointing.checkpoint", r.full + r.selective));
    if (r.selective > 0) out.unsupported.push_back("selective recomputation (DeepSpeed checkpoints whole blocks)");
  }
  if (plan.schedule == Schedule::Schedule_interleaved) out.unsupported.push_back("the interleaved 1F1B schedule");
  if (plan.schedule == Schedule::Schedule_gpipe && pp > 1) {
    out.unsupported.push_back("the GPipe schedule (DeepSpeed's pipeline engine runs 1F1B)");
  }
  const std::vector<int> blocks = stage_blocks(plan);
  if (pp > 1) {
    bool even = std::all_of(blocks.begin(), blocks.end(), [&](int b) { return b == blocks.front(); });
    out.notes.push_back(fmt::format("PipelineModule(num_stages={}, partition_method=\"{}\")", pp,
                                    even ? "uniform" : "parameters"));
    if (!even) out.unsupported.push_back("an explicit uneven layer split (DeepSpeed balances by parameters instead)");
  }
  if (u.tp > 1) out.notes.push_back(fmt::format("tensor parallelism of {} comes from Megatron-DeepSpeed's model code", u.tp));
  if (u.sequence_parallel) out.unsupported.push_back("Megatron-style sequence parallelism");
  out.text = config.dump(2) + "\n";
  out.notes.push_back(fmt::format("build the {}-layer model from the Hugging Face config of {}", model.num_layers, model.name));
  return out;
}

std::string plan_export_render(const PlanExport& e, const std::string& target) {
  std::string out = e.text;
  for (const auto& note : e.notes) out += fmt::format("# {}: {}\n", target, note);
  if (e.exact()) {
    out += fmt::format("# {} expresses this plan exactly.\n", target);
  } else {
    out += fmt::format("# {} cannot express these parts of the plan; it will run a different layout:\n", target);
    for (const auto& u : e.unsupported) out += fmt::format("#   - {}\n", u);
  }
  return out;
}

}  // namespace alloy
