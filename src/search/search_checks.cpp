// Checks around the search: pinned options against the specs, notes on the chosen plan (pins it
// could not apply, an MFU above the published), and the host-memory failure.
#include "search/search_checks.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "cost/runtime_traits.hpp"
#include "plan/runnable.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

// Data-parallel replicas a stage can have at most under the pinned tp and pp: the other stages
// one replica each, this one the rest.
int most_replicas(const ClusterSpec& cluster, const SearchOptions& o) {
  const int tp = std::max(1, o.tp);
  return (static_cast<int>(cluster.devices.size()) - (std::max(1, o.pp) - 1) * tp) / tp;
}

// ZeRO and the gradient strategy shard over data-parallel replicas: refuse pins that leave none.
void zero_pins_validate(const CostModel& cost, const SearchOptions& o) {
  const int devices = static_cast<int>(cost.cluster().devices.size());
  const bool one_replica = o.dp == 1 || most_replicas(cost.cluster(), o) < 2;
  const std::string why = o.dp == 1      ? "--dp 1 gives every stage one replica"
                          : devices < 2 ? "the cluster has one device, so every stage has one replica"
                                        : fmt::format("{} devices over tp {} and pp {} leave every stage one replica",
                                                      devices, std::max(1, o.tp), std::max(1, o.pp));
  if (o.zero >= 1 && one_replica)
    throw Error(fmt::format("ZeRO {} shards over data-parallel replicas, but {}: there is nothing to shard", o.zero, why),
                {"", "--zero"}, "drop --zero (one replica runs as ZeRO 0), or allow dp 2 or more (more devices, or a smaller --tp/--pp/--dp pin)");
  if (!o.shard_gradients) return;
  const char* strategy = *o.shard_gradients ? "shard" : "full";
  if (o.zero == 0 || o.zero == 1)
    throw Error(fmt::format("gradient strategy '{}' applies to ZeRO 2-3, but --zero {} keeps gradients whole", strategy, o.zero),
                {"", "--gradients"}, "pin --zero 2 or 3, or drop --gradients");
  if (one_replica)
    throw Error(fmt::format("gradient strategy '{}' applies to ZeRO 2-3 over data-parallel replicas, but {}", strategy, why),
                {"", "--gradients"}, "drop --gradients, or allow dp 2 or more");
}

}  // namespace

std::vector<std::string> zero_pin_notes(const Plan& plan, const SearchOptions& o) {
  std::vector<std::string> notes;
  if (o.zero < 1) return notes;
  for (size_t s = 0; s < plan.stages.size(); ++s)
    if (plan.stages[s].dp == 1)
      notes.push_back(fmt::format("--zero {} not applied to stage {}: it has one replica (dp 1), nothing to shard over, "
                                  "so it runs as ZeRO 0",
                                  o.zero, s));
  return notes;
}

std::vector<std::string> published_mfu_notes(const Plan& plan, const CostModel& cost) {
  const ClusterSpec& cluster = cost.cluster();
  const DeviceType* highest = nullptr;  // the used type with the highest published MFU
  for (const PlanStage& st : plan.stages) {
    std::vector<std::string> names = {st.device_type};
    for (const PlanReplica& r : st.replicas) names.push_back(r.device_type);
    for (const std::string& name : names) {
      for (const DeviceType& t : cluster.device_types) {
        if (t.name != name) continue;
        // The published figures are of 16-bit runs; other precisions have peaks of their own.
        const Precision run = precision_run_on(t, plan.precision);
        if (run != Precision::Precision_bf16 && run != Precision::Precision_fp16) return {};
        if (t.best_published_mfu <= 0) return {};  // a type without a published figure: nothing to compare
        if (highest == nullptr || t.best_published_mfu > highest->best_published_mfu) highest = &t;
      }
    }
  }
  if (highest == nullptr || plan.mfu <= highest->best_published_mfu) return {};
  return {fmt::format("warning: predicted MFU {:.1f}% is above the best published for training on {} ({:.1f}%, "
                      "docs/catalog.md): this prediction is likely optimistic; {}",
                      100 * plan.mfu, highest->name, 100 * highest->best_published_mfu,
                      cost.profile() ? "check that the profile was measured on these devices under load"
                                     : "`alloy profile` measures the devices")};
}

void search_check_expert_parallelism(const ModelSpec& model, const SearchOptions& o) {
  if (o.ep <= 0) return;
  if (!model_is_moe(model))
    throw Error(fmt::format("--ep {} splits experts, but {} has none", o.ep, model.name), {"", "ep"},
                "leave --ep out for a dense model");
  const int64_t experts = model.moe.num_experts;
  if (experts % o.ep != 0)
    throw Error(fmt::format("--ep {} does not divide the {} experts of {}", o.ep, experts, model.name), {"", "ep"},
                "pin an expert-parallel degree that divides the experts, or leave --ep out");
  if (o.dp > 0 && o.dp % o.ep != 0)
    throw Error(fmt::format("--ep {} does not divide --dp {}: expert-parallel groups are made of dp replicas", o.ep, o.dp),
                {"", "ep"}, "pin an expert-parallel degree that divides dp, or leave --ep out");
}

void search_options_validate(const CostModel& cost, const SearchOptions& o) {
  const ClusterSpec& cluster = cost.cluster();
  const TrainSpec& train = cost.train();
  const int layers = static_cast<int>(cost.model().num_layers);
  if (cluster.devices.empty())
    throw Error("the cluster has no devices", {cluster.source_path, "nodes"}, "add at least one node with devices");
  if (layers <= 0) throw Error("the model has no layers", {cost.model().source_path, "num_layers"});
  if (o.threads < 1 || o.threads > 2) throw Error("threads must be 1 or 2", {"", "threads"});
  search_check_expert_parallelism(cost.model(), o);
  if (train.global_batch_sequences <= 0)
    throw Error("global batch must be positive", {train.source_path, "global_batch"});
  if (o.objective == Objective::Objective_cost) {
    for (const NodeGroup& g : cluster.node_groups)
      if (g.price_per_device_hour <= 0)
        throw Error("objective 'cost' needs a price for every node group; '" + g.name + "' has none",
                    {cluster.source_path, "nodes.price_per_device_hour"},
                    "add price_per_device_hour to each node group, or use --objective throughput");
  }
  const int64_t batch = train.global_batch_sequences;
  const bool fixed_batch = train.min_global_batch <= 0 || train.max_global_batch <= 0;
  if (fixed_batch && o.num_micro_batches > 0 && batch % o.num_micro_batches != 0)
    throw Error(fmt::format("global batch of {} sequences is not divisible by {} micro-batches", batch,
                            o.num_micro_batches),
                {train.source_path, "global_batch"}, "choose a micro-batch count that divides the global batch");
  if (fixed_batch && o.micro_batch_sequences > 0 && batch % o.micro_batch_sequences != 0)
    throw Error(fmt::format("global batch of {} sequences is not divisible into micro-batches of {}", batch,
                            o.micro_batch_sequences),
                {train.source_path, "global_batch"}, "choose a micro-batch size that divides the global batch");
  if (fixed_batch && o.micro_batch_sequences > 0 && o.num_micro_batches > 0 &&
      o.micro_batch_sequences * o.num_micro_batches != batch)
    throw Error(fmt::format("micro-batch {} x {} micro-batches is not the global batch {}", o.micro_batch_sequences,
                            o.num_micro_batches, batch),
                {train.source_path, "global_batch"}, "pin only one of the two, or make them multiply to the batch");
  if (fixed_batch && o.dp > 0 && batch % o.dp != 0)
    throw Error(fmt::format("global batch of {} sequences does not split over dp {}", batch, o.dp),
                {train.source_path, "global_batch"}, "choose a dp that divides the global batch");
  if (o.tp > 0 && (o.tp & (o.tp - 1)) != 0)
    throw Error(fmt::format("tp {} is not a power of two", o.tp), {"", "tp"}, "use 1, 2, 4, 8, ...");
  if (o.tp > 0) {
    const StageSupport support = tp_runnable(cost.model(), o.tp);
    if (!support.ok)
      throw Error(fmt::format("--tp {} cannot run: {}", o.tp, support.feature), {"", "--tp"}, support.reason);
  }
  if (o.prefetch_depth < 0 || o.prefetch_depth > kMaxOffloadPrefetchDepth)
    throw Error(fmt::format("prefetch depth {} is out of range", o.prefetch_depth), {"", "prefetch_depth"},
                fmt::format("use 1 to {} offloaded blocks fetched ahead", kMaxOffloadPrefetchDepth));
  if (o.offload_activations < 0)
    throw Error(fmt::format("--offload-activations {} is negative", o.offload_activations), {"", "--offload-activations"},
                "give the number of layers per stage whose activations wait in host memory (0 for none)");
  if (o.zero > 3) throw Error(fmt::format("ZeRO stage {} does not exist", o.zero), {"", "zero"}, "use 0, 1, 2 or 3");
  zero_pins_validate(cost, o);
  if (!o.layer_split.empty()) {
    int total = 0;
    for (int n : o.layer_split) {
      if (n <= 0) throw Error("every stage needs at least one layer", {"", "layer_split"});
      total += n;
    }
    if (total != layers)
      throw Error(fmt::format("layer split covers {} layers, the model has {}", total, layers), {"", "layer_split"},
                  "give one count per stage, summing to the model's layers");
    if (o.pp > 0 && static_cast<int>(o.layer_split.size()) != o.pp)
      throw Error(fmt::format("layer split has {} stages but pp is {}", o.layer_split.size(), o.pp), {"", "layer_split"});
  }
}

void search_host_memory_fail(const ClusterSpec& cluster, const HostShortfall& need) {
  const DeviceType& type = cluster.device_types[need.type];
  const NodeGroup* group = nullptr;  // the type's node group with the least host memory per device
  for (const NodeGroup& g : cluster.node_groups)
    if (g.device_type_index == need.type &&
        (!group || g.host_memory_bytes / g.devices_per_node < group->host_memory_bytes / group->devices_per_node))
      group = &g;
  throw Error(fmt::format("offloading enough layers to fit {} device memory needs {} of host memory per node "
                          "({} for each of its {} devices), but node group '{}' has {} (host_memory)",
                          type.name, units_format_bytes(need.bytes_per_device * group->devices_per_node),
                          units_format_bytes(need.bytes_per_device), group->devices_per_node, group->name,
                          units_format_bytes(group->host_memory_bytes)),
              {cluster.source_path, "nodes.host_memory"},
              "give the nodes more host memory (host_memory in the cluster file), offload fewer layers (more "
              "recomputation, ZeRO or a smaller micro-batch), or add devices");
}

}  // namespace alloy
