// Plan <-> JSON (versioned, documented in docs/plan-format.md).
#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan/plan.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

using OrderedJson = nlohmann::ordered_json;

// Reads `key` from `object` as T, or throws naming the field.
template <typename T>
T get(const OrderedJson& object, const char* key, const std::string& source, const std::string& prefix) {
  const std::string field = prefix.empty() ? key : prefix + "." + key;
  if (!object.contains(key)) throw Error("missing required field", {source, field}, "see docs/plan-format.md");
  try {
    return object.at(key).get<T>();
  } catch (const OrderedJson::exception&) {
    throw Error("has the wrong type: " + object.at(key).dump(), {source, field}, "see docs/plan-format.md");
  }
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
    if (!it.value().is_number()) throw Error("must be a number of bytes", {source, field + "." + it.key()});
    terms.push_back({it.key(), it.value().get<double>()});
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
    r.sequences = get<int64_t>(list[i], "sequences", source, field);
    if (list[i].contains("pieces")) r.pieces = get<int>(list[i], "pieces", source, field);
    if (list[i].contains("predicted")) {
      const OrderedJson& pr = list[i].at("predicted");
      const std::string pp = field + ".predicted";
      r.forward_seconds = get<double>(pr, "forward_seconds", source, pp);
      r.backward_seconds = get<double>(pr, "backward_seconds", source, pp);
      r.optimizer_seconds = get<double>(pr, "optimizer_seconds", source, pp);
      r.memory_capacity_bytes = get<double>(pr, "memory_capacity_bytes", source, pp);
      r.memory = memory_from_json(get<OrderedJson>(pr, "memory_bytes", source, pp), source, pp + ".memory_bytes");
    }
    replicas.push_back(std::move(r));
  }
  return replicas;
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
  j["precision"] = precision_name(plan.precision);
  OrderedJson stages = OrderedJson::array();
  for (const PlanStage& s : plan.stages) {
    OrderedJson st;
    st["device_type"] = s.device_type;
    st["device_ids"] = s.device_ids;
    st["tp"] = s.tp;
    st["dp"] = s.dp;
    st["zero"] = s.zero;
    st["sequence_parallel"] = s.sequence_parallel;
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
  return j.dump(2) + "\n";
}

Plan plan_from_json(const std::string& text, const std::string& source) {
  OrderedJson j;
  try {
    j = OrderedJson::parse(text);
  } catch (const OrderedJson::parse_error& e) {
    throw Error(std::string("not valid JSON: ") + e.what(), {source, ""}, "a plan file is written by `alloy plan`");
  }
  if (!j.is_object()) throw Error("a plan must be a JSON object", {source, ""});
  Plan plan;
  plan.version = get<int>(j, "version", source, "");
  if (plan.version != kPlanVersion)
    throw Error(fmt::format("unsupported plan version {}", plan.version), {source, "version"},
                fmt::format("this Alloy reads version {}; re-run `alloy plan`", kPlanVersion));
  const OrderedJson model = get<OrderedJson>(j, "model", source, "");
  plan.model_name = get<std::string>(model, "name", source, "model");
  plan.model_fingerprint = get<std::string>(model, "fingerprint", source, "model");
  plan.num_layers = get<int>(model, "num_layers", source, "model");
  const OrderedJson cluster = get<OrderedJson>(j, "cluster", source, "");
  plan.cluster_name = get<std::string>(cluster, "name", source, "cluster");
  plan.cluster_fingerprint = get<std::string>(cluster, "fingerprint", source, "cluster");
  plan.num_devices = get<int>(cluster, "num_devices", source, "cluster");
  plan.objective = get<std::string>(j, "objective", source, "");
  plan.seq_len = get<int64_t>(j, "seq_len", source, "");
  plan.global_batch_sequences = get<int64_t>(j, "global_batch_sequences", source, "");
  plan.micro_batch_sequences = get<int64_t>(j, "micro_batch_sequences", source, "");
  plan.num_micro_batches = get<int>(j, "num_micro_batches", source, "");
  const std::string schedule = get<std::string>(j, "schedule", source, "");
  if (!schedule_parse(schedule, &plan.schedule))
    throw Error("unknown schedule '" + schedule + "'", {source, "schedule"}, "use gpipe, 1f1b or interleaved");
  plan.virtual_chunks = get<int>(j, "virtual_chunks", source, "");
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
    s.device_ids = get<std::vector<int>>(st, "device_ids", source, prefix);
    s.tp = get<int>(st, "tp", source, prefix);
    s.dp = get<int>(st, "dp", source, prefix);
    s.zero = get<int>(st, "zero", source, prefix);
    s.sequence_parallel = get<bool>(st, "sequence_parallel", source, prefix);
    for (const auto& r : get<std::vector<std::vector<int>>>(st, "chunks", source, prefix)) {
      if (r.size() != 2)
        throw Error("each chunk is [begin, end)", {source, prefix + ".chunks"}, "write e.g. [[0, 16]]");
      s.chunks.push_back({r[0], r[1]});
    }
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
    if (st.contains("offload_prefetch_depth")) s.offload_prefetch_depth = get<int>(st, "offload_prefetch_depth", source, prefix);
    if (st.contains("predicted")) {
      const OrderedJson& pr = st.at("predicted");
      const std::string pp = prefix + ".predicted";
      s.forward_seconds = get<double>(pr, "forward_seconds", source, pp);
      s.backward_seconds = get<double>(pr, "backward_seconds", source, pp);
      s.gradient_sync_seconds = get<double>(pr, "gradient_sync_seconds", source, pp);
      s.optimizer_seconds = get<double>(pr, "optimizer_seconds", source, pp);
      s.offload_exposed_seconds = pr.value("offload_exposed_seconds", 0.0);
      s.micro_batches_in_flight = get<double>(pr, "micro_batches_in_flight", source, pp);
      s.memory_capacity_bytes = get<double>(pr, "memory_capacity_bytes", source, pp);
      s.memory = memory_from_json(get<OrderedJson>(pr, "memory_bytes", source, pp), source, pp + ".memory_bytes");
    }
    if (st.contains("replicas")) s.replicas = replicas_from_json(st.at("replicas"), source, prefix);
    plan.stages.push_back(std::move(s));
  }
  if (j.contains("predicted")) {
    const OrderedJson& pr = j.at("predicted");
    plan.step_seconds = get<double>(pr, "step_seconds", source, "predicted");
    plan.tokens_per_second = get<double>(pr, "tokens_per_second", source, "predicted");
    plan.mfu = get<double>(pr, "mfu", source, "predicted");
    plan.hfu = get<double>(pr, "hfu", source, "predicted");
    plan.bubble_fraction = get<double>(pr, "bubble_fraction", source, "predicted");
    plan.price_per_million_tokens = pr.value("price_per_million_tokens", 0.0);
    plan.offload_step_seconds = pr.value("offload_step_seconds", 0.0);
    plan.host_offload_bytes_per_node = pr.value("host_offload_bytes_per_node", 0.0);
    plan.host_memory_bytes_per_node = pr.value("host_memory_bytes_per_node", 0.0);
    if (pr.contains("runner_ups"))
      for (const OrderedJson& r : pr.at("runner_ups"))
        plan.runner_ups.push_back({r.value("shape", ""), r.value("step_seconds", 0.0),
                                   r.value("tokens_per_second", 0.0), r.value("reason", "")});
    if (pr.contains("notes")) plan.notes = pr.at("notes").get<std::vector<std::string>>();
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

void plan_save(const Plan& plan, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw Error("cannot write plan file", {path, ""}, "check that the directory exists and is writable");
  out << plan_to_json(plan);
}

}  // namespace alloy
