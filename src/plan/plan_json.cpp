// Plan <-> JSON (versioned, documented in docs/plan-format.md).
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan/plan.hpp"
#include "spec/error.hpp"
#include "spec/json_unique.hpp"
#include "spec/text_file.hpp"

namespace alloy {

namespace {

using OrderedJson = nlohmann::ordered_json;

// Sanity bounds of a plan's counts, as for the specs (docs/architecture.md): every product of
// them stays inside 64-bit integers.
constexpr int64_t kPlanJsonMostLayers = 10'000;
constexpr int64_t kPlanJsonMostDevices = 1 << 20;
constexpr int64_t kPlanJsonMostSequences = 10'000'000;
constexpr int64_t kPlanJsonMostChunks = 64;

std::string field_name(const char* key, const std::string& prefix) { return prefix.empty() ? key : prefix + "." + key; }

const OrderedJson& member(const OrderedJson& object, const char* key, const std::string& source, const std::string& prefix) {
  if (!object.is_object() || !object.contains(key))
    throw Error("missing required field", {source, field_name(key, prefix)}, "see docs/plan-format.md");
  return object.at(key);
}

// Reads `key` from `object` as T (text, true/false, a list of them, or a JSON value), or throws
// naming the field.
template <typename T>
T get(const OrderedJson& object, const char* key, const std::string& source, const std::string& prefix) {
  const OrderedJson& value = member(object, key, source, prefix);
  try {
    return value.get<T>();
  } catch (const OrderedJson::exception&) {
    throw Error("has the wrong type: " + value.dump(), {source, field_name(key, prefix)}, "see docs/plan-format.md");
  }
}

// A whole number in [low, high]: never truncated from a fraction, never wrapped from a larger one.
int64_t whole_from(const OrderedJson& value, int64_t low, int64_t high, const std::string& source, const std::string& field) {
  bool fits = false;
  int64_t whole = 0;
  if (value.is_number_unsigned()) {
    fits = value.get<uint64_t>() <= static_cast<uint64_t>(high);
    whole = fits ? static_cast<int64_t>(value.get<uint64_t>()) : 0;
  } else if (value.is_number_integer()) {
    whole = value.get<int64_t>();
    fits = true;
  } else {
    throw Error("must be a whole number, got " + value.dump(), {source, field}, "see docs/plan-format.md");
  }
  if (!fits || whole < low || whole > high)
    throw Error(fmt::format("is {}; it must lie in [{}, {}]", value.dump(), low, high), {source, field},
                "see docs/plan-format.md, or re-run `alloy plan`");
  return whole;
}

int64_t get_whole(const OrderedJson& object, const char* key, int64_t low, int64_t high, const std::string& source,
                  const std::string& prefix) {
  return whole_from(member(object, key, source, prefix), low, high, source, field_name(key, prefix));
}

std::vector<int> get_wholes(const OrderedJson& object, const char* key, int64_t low, int64_t high, const std::string& source,
                            const std::string& prefix) {
  const OrderedJson& list = member(object, key, source, prefix);
  const std::string field = field_name(key, prefix);
  if (!list.is_array()) throw Error("must be a list of whole numbers, got " + list.dump(), {source, field});
  std::vector<int> out;
  for (size_t i = 0; i < list.size(); ++i)
    out.push_back(static_cast<int>(whole_from(list[i], low, high, source, fmt::format("{}[{}]", field, i))));
  return out;
}

double number_from(const OrderedJson& value, const std::string& source, const std::string& field) {
  if (!value.is_number()) throw Error("must be a number, got " + value.dump(), {source, field}, "see docs/plan-format.md");
  return value.get<double>();
}

double get_number(const OrderedJson& object, const char* key, const std::string& source, const std::string& prefix) {
  return number_from(member(object, key, source, prefix), source, field_name(key, prefix));
}

// An optional number: `fallback` when absent, an error when present but not a number.
double get_number_or(const OrderedJson& object, const char* key, double fallback, const std::string& source,
                     const std::string& prefix) {
  return object.is_object() && object.contains(key) ? get_number(object, key, source, prefix) : fallback;
}

std::string get_text_or(const OrderedJson& object, const char* key, const std::string& source, const std::string& prefix) {
  return object.is_object() && object.contains(key) ? get<std::string>(object, key, source, prefix) : std::string();
}

OrderedJson memory_to_json(const std::vector<MemoryTerm>& terms) {
  OrderedJson out = OrderedJson::object();
  for (const MemoryTerm& t : terms) out[t.name] = t.bytes;
  return out;
}

OrderedJson replicas_to_json(const std::vector<PlanReplica>& replicas) {
  OrderedJson out = OrderedJson::array();
  for (const PlanReplica& r : replicas)
    out.push_back({{"device_type", r.device_type},
                   {"sequences", r.sequences},
                   {"pieces", r.pieces},
                   {"predicted",
                    {{"forward_seconds", r.forward_seconds},
                     {"backward_seconds", r.backward_seconds},
                     {"optimizer_seconds", r.optimizer_seconds},
                     {"memory_capacity_bytes", r.memory_capacity_bytes},
                     {"memory_bytes", memory_to_json(r.memory)}}}});
  return out;
}

std::vector<MemoryTerm> memory_from_json(const OrderedJson& memory, const std::string& source, const std::string& field) {
  if (!memory.is_object()) throw Error("must be an object of named byte counts", {source, field});
  std::vector<MemoryTerm> terms;
  for (auto it = memory.begin(); it != memory.end(); ++it) {
    terms.push_back({it.key(), number_from(it.value(), source, field + "." + it.key())});
  }
  return terms;
}

std::vector<PlanReplica> replicas_from_json(const OrderedJson& list, const std::string& source, const std::string& prefix) {
  if (!list.is_array())
    throw Error("must be a list of replicas", {source, prefix + ".replicas"},
                "write e.g. [{\"device_type\": \"a100\", \"sequences\": 3}, ...]");
  std::vector<PlanReplica> replicas;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string field = fmt::format("{}.replicas[{}]", prefix, i);
    PlanReplica r;
    r.device_type = get<std::string>(list[i], "device_type", source, field);
    r.sequences = get_whole(list[i], "sequences", 0, kPlanJsonMostSequences, source, field);
    if (list[i].contains("pieces")) r.pieces = static_cast<int>(get_whole(list[i], "pieces", 1, kPlanJsonMostSequences, source, field));
    if (list[i].contains("predicted")) {
      const OrderedJson& pr = list[i].at("predicted");
      const std::string pp = field + ".predicted";
      r.forward_seconds = get_number(pr, "forward_seconds", source, pp);
      r.backward_seconds = get_number(pr, "backward_seconds", source, pp);
      r.optimizer_seconds = get_number(pr, "optimizer_seconds", source, pp);
      r.memory_capacity_bytes = get_number(pr, "memory_capacity_bytes", source, pp);
      r.memory = memory_from_json(get<OrderedJson>(pr, "memory_bytes", source, pp), source, pp + ".memory_bytes");
    }
    replicas.push_back(std::move(r));
  }
  return replicas;
}

std::vector<LayerRange> chunks_from_json(const OrderedJson& list, const std::string& source, const std::string& field) {
  if (!list.is_array()) throw Error("must be a list of [begin, end) pairs", {source, field}, "write e.g. [[0, 16]]");
  std::vector<LayerRange> chunks;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string item = fmt::format("{}[{}]", field, i);
    if (!list[i].is_array() || list[i].size() != 2) throw Error("each chunk is [begin, end)", {source, item}, "write e.g. [[0, 16]]");
    chunks.push_back({static_cast<int>(whole_from(list[i][0], 0, kPlanJsonMostLayers, source, item + "[0]")),
                      static_cast<int>(whole_from(list[i][1], 0, kPlanJsonMostLayers, source, item + "[1]"))});
  }
  return chunks;
}

// The plan-wide predictions: figures for people, re-priced by simulate and report.
void predicted_from_json(const OrderedJson& pr, const std::string& source, Plan* plan) {
  const std::string pp = "predicted";
  plan->step_seconds = get_number(pr, "step_seconds", source, pp);
  plan->tokens_per_second = get_number(pr, "tokens_per_second", source, pp);
  plan->mfu = get_number(pr, "mfu", source, pp);
  plan->hfu = get_number(pr, "hfu", source, pp);
  plan->bubble_fraction = get_number(pr, "bubble_fraction", source, pp);
  plan->price_per_million_tokens = get_number_or(pr, "price_per_million_tokens", 0.0, source, pp);
  plan->offload_step_seconds = get_number_or(pr, "offload_step_seconds", 0.0, source, pp);
  plan->host_offload_bytes_per_node = get_number_or(pr, "host_offload_bytes_per_node", 0.0, source, pp);
  plan->host_memory_bytes_per_node = get_number_or(pr, "host_memory_bytes_per_node", 0.0, source, pp);
  if (pr.contains("runner_ups")) {
    const OrderedJson& list = pr.at("runner_ups");
    if (!list.is_array()) throw Error("must be a list of runner-ups", {source, "predicted.runner_ups"});
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string field = fmt::format("predicted.runner_ups[{}]", i);
      plan->runner_ups.push_back({get_text_or(list[i], "shape", source, field),
                                  get_number_or(list[i], "step_seconds", 0.0, source, field),
                                  get_number_or(list[i], "tokens_per_second", 0.0, source, field),
                                  get_text_or(list[i], "reason", source, field)});
    }
  }
  if (pr.contains("notes")) plan->notes = get<std::vector<std::string>>(pr, "notes", source, pp);
}

}  // namespace

std::string plan_to_json(const Plan& plan) {
  OrderedJson j;
  j["version"] = plan.version;
  j["model"] = {{"name", plan.model_name}, {"fingerprint", plan.model_fingerprint}, {"num_layers", plan.num_layers}};
  j["cluster"] = {{"name", plan.cluster_name}, {"fingerprint", plan.cluster_fingerprint}, {"num_devices", plan.num_devices}};
  j["objective"] = plan.objective;
  j["seq_len"] = plan.seq_len;
  j["global_batch_sequences"] = plan.global_batch_sequences;
  j["micro_batch_sequences"] = plan.micro_batch_sequences;
  j["num_micro_batches"] = plan.num_micro_batches;
  j["schedule"] = schedule_name(plan.schedule);
  j["virtual_chunks"] = plan.virtual_chunks;
  j["gradient_bucket_bytes"] = plan.gradient_bucket_bytes;
  j["gradient_bytes"] = plan.gradient_bytes;
  j["reduce_scatter_bytes"] = plan.reduce_scatter_bytes;
  j["precision"] = precision_name(plan.precision);
  OrderedJson stages = OrderedJson::array();
  for (const PlanStage& s : plan.stages) {
    OrderedJson st;
    st["device_type"] = s.device_type;
    st["device_ids"] = s.device_ids;
    st["tp"] = s.tp;
    st["dp"] = s.dp;
    st["zero"] = s.zero;
    st["shard_gradients"] = s.shard_gradients;
    st["sequence_parallel"] = s.sequence_parallel;
    if (s.ep > 1) st["ep"] = s.ep;
    if (!s.experts_per_member.empty()) st["experts_per_member"] = s.experts_per_member;
    OrderedJson chunks = OrderedJson::array();
    for (const LayerRange& r : s.chunks) chunks.push_back({r.begin, r.end});
    st["chunks"] = chunks;
    st["has_embedding"] = s.has_embedding;
    st["has_head"] = s.has_head;
    OrderedJson rc = OrderedJson::array();
    for (Recompute r : s.recompute) rc.push_back(recompute_name(r));
    st["recompute"] = rc;
    OrderedJson off = OrderedJson::array();
    for (bool b : s.offload) off.push_back(b);
    st["offload"] = off;
    if (std::find(s.offload_activations.begin(), s.offload_activations.end(), true) != s.offload_activations.end()) {
      OrderedJson acts = OrderedJson::array();
      for (bool b : s.offload_activations) acts.push_back(b);
      st["offload_activations"] = acts;
    }
    st["offload_prefetch_depth"] = s.offload_prefetch_depth;
    if (!s.replicas.empty()) st["replicas"] = replicas_to_json(s.replicas);
    st["predicted"] = {{"forward_seconds", s.forward_seconds},
                       {"backward_seconds", s.backward_seconds},
                       {"gradient_sync_seconds", s.gradient_sync_seconds},
                       {"optimizer_seconds", s.optimizer_seconds},
                       {"offload_exposed_seconds", s.offload_exposed_seconds},
                       {"offload_exposed_forward_seconds", s.offload_exposed_forward_seconds},
                       {"boundary_send_seconds", s.boundary_send_seconds},
                       {"first_gather_forward_seconds", s.first_gather_forward_seconds},
                       {"first_gather_backward_seconds", s.first_gather_backward_seconds},
                       {"micro_batches_in_flight", s.micro_batches_in_flight},
                       {"memory_capacity_bytes", s.memory_capacity_bytes},
                       {"memory_bytes", memory_to_json(s.memory)}};
    stages.push_back(st);
  }
  j["stages"] = stages;
  OrderedJson runner_ups = OrderedJson::array();
  for (const RunnerUp& r : plan.runner_ups)
    runner_ups.push_back({{"shape", r.shape},
                          {"step_seconds", r.step_seconds},
                          {"tokens_per_second", r.tokens_per_second},
                          {"reason", r.reason}});
  j["predicted"] = {{"step_seconds", plan.step_seconds},
                    {"tokens_per_second", plan.tokens_per_second},
                    {"mfu", plan.mfu},
                    {"hfu", plan.hfu},
                    {"bubble_fraction", plan.bubble_fraction},
                    {"price_per_million_tokens", plan.price_per_million_tokens},
                    {"offload_step_seconds", plan.offload_step_seconds},
                    {"host_offload_bytes_per_node", plan.host_offload_bytes_per_node},
                    {"host_memory_bytes_per_node", plan.host_memory_bytes_per_node},
                    {"runner_ups", runner_ups},
                    {"notes", plan.notes}};
  if (!plan.inputs.empty())
    j["inputs"] = {{"model", plan.inputs.model}, {"cluster", plan.inputs.cluster}, {"train", plan.inputs.train}};
  return j.dump(2) + "\n";
}

Plan plan_from_json(const std::string& text, const std::string& source) {
  OrderedJson j;
  try {
    j = json_parse_unique_keys<OrderedJson>(text, source);
  } catch (const OrderedJson::exception& e) {  // syntax, or a number too large for a double
    throw Error(std::string("not valid JSON: ") + e.what(), {source, ""}, "a plan file is written by `alloy plan`");
  }
  if (!j.is_object()) throw Error("a plan must be a JSON object", {source, ""});
  Plan plan;
  plan.version = static_cast<int>(get_whole(j, "version", 0, INT32_MAX, source, ""));
  if (plan.version != kPlanVersion)
    throw Error(fmt::format("unsupported plan version {}", plan.version), {source, "version"},
                fmt::format("this Alloy reads version {}; re-run `alloy plan`", kPlanVersion));
  const OrderedJson model = get<OrderedJson>(j, "model", source, "");
  plan.model_name = get<std::string>(model, "name", source, "model");
  plan.model_fingerprint = get<std::string>(model, "fingerprint", source, "model");
  plan.num_layers = static_cast<int>(get_whole(model, "num_layers", 1, kPlanJsonMostLayers, source, "model"));
  const OrderedJson cluster = get<OrderedJson>(j, "cluster", source, "");
  plan.cluster_name = get<std::string>(cluster, "name", source, "cluster");
  plan.cluster_fingerprint = get<std::string>(cluster, "fingerprint", source, "cluster");
  plan.num_devices = static_cast<int>(get_whole(cluster, "num_devices", 1, kPlanJsonMostDevices, source, "cluster"));
  plan.objective = get<std::string>(j, "objective", source, "");
  plan.seq_len = get_whole(j, "seq_len", 1, kPlanJsonMostSequences, source, "");
  plan.global_batch_sequences = get_whole(j, "global_batch_sequences", 1, kPlanJsonMostSequences, source, "");
  plan.micro_batch_sequences = get_whole(j, "micro_batch_sequences", 1, kPlanJsonMostSequences, source, "");
  plan.num_micro_batches = static_cast<int>(get_whole(j, "num_micro_batches", 1, kPlanJsonMostSequences, source, ""));
  const std::string schedule = get<std::string>(j, "schedule", source, "");
  if (!schedule_parse(schedule, &plan.schedule))
    throw Error("unknown schedule '" + schedule + "'", {source, "schedule"}, "use gpipe, 1f1b or interleaved");
  plan.virtual_chunks = static_cast<int>(get_whole(j, "virtual_chunks", 1, kPlanJsonMostChunks, source, ""));
  plan.gradient_bucket_bytes = get_number_or(j, "gradient_bucket_bytes", plan.gradient_bucket_bytes, source, "");
  if (!(plan.gradient_bucket_bytes >= 1024 && plan.gradient_bucket_bytes <= 65536.0 * 1024 * 1024))
    throw Error(fmt::format("gradient bucket of {} bytes", plan.gradient_bucket_bytes), {source, "gradient_bucket_bytes"},
                "write a size from 1024 bytes to 64 GiB (the train file's gradient_bucket_mib, in bytes)");
  for (auto [key, bytes] : {std::pair{"gradient_bytes", &plan.gradient_bytes},
                            std::pair{"reduce_scatter_bytes", &plan.reduce_scatter_bytes}}) {
    const double value = get_number_or(j, key, *bytes, source, "");
    if (value != 1 && value != 2 && value != 4)
      throw Error(fmt::format("{} bytes per gradient element", value), {source, key},
                  "write 4 (fp32 gradients), 2 (16-bit) or 1 (fp8), as the planner does");
    *bytes = static_cast<int>(value);
  }
  const std::string precision = get<std::string>(j, "precision", source, "");
  if (!precision_parse(precision, &plan.precision))
    throw Error("unknown precision '" + precision + "'", {source, "precision"}, "use fp32, tf32, bf16, fp16 or fp8");

  const OrderedJson stages = get<OrderedJson>(j, "stages", source, "");
  if (!stages.is_array()) throw Error("must be a list", {source, "stages"});
  for (size_t i = 0; i < stages.size(); ++i) {
    const OrderedJson& st = stages[i];
    const std::string prefix = fmt::format("stages[{}]", i);
    PlanStage s;
    s.device_type = get<std::string>(st, "device_type", source, prefix);
    s.device_ids = get_wholes(st, "device_ids", 0, kPlanJsonMostDevices - 1, source, prefix);
    s.tp = static_cast<int>(get_whole(st, "tp", 1, kPlanJsonMostDevices, source, prefix));
    s.dp = static_cast<int>(get_whole(st, "dp", 1, kPlanJsonMostDevices, source, prefix));
    s.zero = static_cast<int>(get_whole(st, "zero", 0, 3, source, prefix));
    if (st.contains("shard_gradients")) s.shard_gradients = get<bool>(st, "shard_gradients", source, prefix);
    s.sequence_parallel = get<bool>(st, "sequence_parallel", source, prefix);
    if (st.contains("ep")) s.ep = static_cast<int>(get_whole(st, "ep", 1, kPlanJsonMostDevices, source, prefix));
    if (st.contains("experts_per_member"))
      s.experts_per_member = get_wholes(st, "experts_per_member", 1, 1 << 20, source, prefix);
    s.chunks = chunks_from_json(member(st, "chunks", source, prefix), source, prefix + ".chunks");
    s.has_embedding = get<bool>(st, "has_embedding", source, prefix);
    s.has_head = get<bool>(st, "has_head", source, prefix);
    for (const std::string& name : get<std::vector<std::string>>(st, "recompute", source, prefix)) {
      Recompute r;
      if (!recompute_parse(name, &r))
        throw Error("unknown recompute level '" + name + "'", {source, prefix + ".recompute"},
                    "use none, selective or full");
      s.recompute.push_back(r);
    }
    for (bool b : get<std::vector<bool>>(st, "offload", source, prefix)) s.offload.push_back(b);
    if (st.contains("offload_activations"))
      for (bool b : get<std::vector<bool>>(st, "offload_activations", source, prefix)) s.offload_activations.push_back(b);
    if (st.contains("offload_prefetch_depth"))
      s.offload_prefetch_depth = static_cast<int>(get_whole(st, "offload_prefetch_depth", 1, 8, source, prefix));
    if (st.contains("predicted")) {
      const OrderedJson& pr = st.at("predicted");
      const std::string pp = prefix + ".predicted";
      s.forward_seconds = get_number(pr, "forward_seconds", source, pp);
      s.backward_seconds = get_number(pr, "backward_seconds", source, pp);
      s.gradient_sync_seconds = get_number(pr, "gradient_sync_seconds", source, pp);
      s.optimizer_seconds = get_number(pr, "optimizer_seconds", source, pp);
      s.offload_exposed_seconds = get_number_or(pr, "offload_exposed_seconds", 0.0, source, pp);
      s.offload_exposed_forward_seconds = get_number_or(pr, "offload_exposed_forward_seconds", 0.0, source, pp);
      s.boundary_send_seconds = get_number_or(pr, "boundary_send_seconds", 0.0, source, pp);
      s.first_gather_forward_seconds = get_number_or(pr, "first_gather_forward_seconds", 0.0, source, pp);
      s.first_gather_backward_seconds = get_number_or(pr, "first_gather_backward_seconds", 0.0, source, pp);
      s.micro_batches_in_flight = get_number(pr, "micro_batches_in_flight", source, pp);
      s.memory_capacity_bytes = get_number(pr, "memory_capacity_bytes", source, pp);
      s.memory = memory_from_json(get<OrderedJson>(pr, "memory_bytes", source, pp), source, pp + ".memory_bytes");
    }
    if (st.contains("replicas")) s.replicas = replicas_from_json(st.at("replicas"), source, prefix);
    plan.stages.push_back(std::move(s));
  }
  if (j.contains("predicted")) predicted_from_json(j.at("predicted"), source, &plan);
  if (j.contains("inputs")) {
    const OrderedJson& inputs = j.at("inputs");
    plan.inputs.model = get<std::string>(inputs, "model", source, "inputs");
    plan.inputs.cluster = get<std::string>(inputs, "cluster", source, "inputs");
    plan.inputs.train = get<std::string>(inputs, "train", source, "inputs");
  }
  plan_validate(plan, source);
  return plan;
}

Plan plan_load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open plan file", {path, ""}, "write one with `alloy plan ... -o plan.json`");
  std::stringstream text;
  text << in.rdbuf();
  return plan_from_json(text.str(), path);
}

void plan_save(const Plan& plan, const std::string& path) { text_file_write(path, plan_to_json(plan), "plan file"); }

}  // namespace alloy
