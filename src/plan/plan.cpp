#include "plan/plan.hpp"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "spec/error.hpp"
#include "spec/moe.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

[[noreturn]] void fail(const std::string& source, const std::string& field, const std::string& what,
                       const std::string& hint = {}) {
  throw Error(what, {source, field}, hint);
}

std::string stage_field(size_t s, const char* name) { return fmt::format("stages[{}].{}", s, name); }

// The terms on the device: all but host_offload.
double device_memory_bytes(const std::vector<MemoryTerm>& memory) {
  double total = 0;
  for (const MemoryTerm& t : memory)
    if (t.name != "host_offload") total += t.bytes;
  return total;
}

// Uneven data parallelism: one replica per dp rank, each with at least one sequence of every
// micro-batch, together the whole micro-batch.
void replicas_validate(const Plan& plan, size_t s, const std::string& source) {
  const PlanStage& st = plan.stages[s];
  if (static_cast<int>(st.replicas.size()) != st.dp)
    fail(source, stage_field(s, "replicas"), fmt::format("has {} entries for dp {}", st.replicas.size(), st.dp),
         "list one replica per data-parallel rank, or none for an even split");
  int64_t sum = 0;
  for (size_t r = 0; r < st.replicas.size(); ++r) {
    if (st.replicas[r].sequences < 1)
      fail(source, fmt::format("stages[{}].replicas[{}].sequences", s, r),
           fmt::format("is {}; every replica takes at least one sequence of each micro-batch", st.replicas[r].sequences),
           "use fewer replicas or a larger micro-batch");
    sum += st.replicas[r].sequences;
    const std::string pieces = fmt::format("stages[{}].replicas[{}].pieces", s, r);
    if (st.replicas[r].pieces < 1 || st.replicas[r].pieces > st.replicas[r].sequences)
      fail(source, pieces, fmt::format("is {}; a share of {} sequences runs in 1 to {} pieces", st.replicas[r].pieces,
                                       st.replicas[r].sequences, st.replicas[r].sequences));
    if (st.replicas[r].pieces > 1 &&
        (plan.stages.size() > 1 || st.zero == 3 || plan.schedule != Schedule::Schedule_1f1b))
      fail(source, pieces,
           fmt::format("is {}; pieces need a single-stage 1F1B plan without ZeRO-3 (the plan has {} stages, {}, "
                       "ZeRO {})",
                       st.replicas[r].pieces, plan.stages.size(), schedule_name(plan.schedule), st.zero),
           "set pieces to 1 and use more micro-batches instead");
  }
  if (sum != plan.micro_batch_sequences)
    fail(source, stage_field(s, "replicas"),
         fmt::format("the replicas' sequences sum to {}, the micro-batch has {}", sum, plan.micro_batch_sequences),
         "make the shares add up to micro_batch_sequences");
  if (st.replicas.front().device_type != st.device_type)
    fail(source, stage_field(s, "device_type"),
         fmt::format("is {} but replica 0 is a {}", st.device_type, st.replicas.front().device_type),
         "under uneven data parallelism the stage's device_type is replica 0's");
}

}  // namespace

int PlanStage::num_blocks() const {
  int n = 0;
  for (const LayerRange& r : chunks) n += r.size();
  return n;
}

std::vector<bool> PlanStage::layer_flags(const std::vector<bool>& per_block, int64_t num_layers) const {
  std::vector<bool> layers(static_cast<size_t>(num_layers), false);
  size_t local = 0;
  for (const LayerRange& c : chunks)
    for (int b = c.begin; b < c.end; ++b, ++local) layers[static_cast<size_t>(b)] = local < per_block.size() && per_block[local];
  return layers;
}

double PlanStage::memory_total_bytes() const { return device_memory_bytes(memory); }

double PlanReplica::memory_total_bytes() const { return device_memory_bytes(memory); }

int64_t PlanReplica::piece_sequences(int k) const {
  return sequences / pieces + (k < sequences % pieces ? 1 : 0);
}

PlanReplica PlanStage::replica(int64_t micro_batch_sequences, int dp_rank) const {
  if (!replicas.empty()) return replicas.at(static_cast<size_t>(dp_rank));
  return {device_type,     micro_batch_sequences / dp, 1, forward_seconds, backward_seconds, optimizer_seconds, memory,
          memory_capacity_bytes};
}

int64_t PlanStage::replica_sequences(int64_t micro_batch_sequences, int dp_rank) const {
  return replicas.empty() ? micro_batch_sequences / dp : replicas.at(static_cast<size_t>(dp_rank)).sequences;
}

int64_t PlanStage::replica_offset(int64_t micro_batch_sequences, int dp_rank) const {
  if (replicas.empty()) return dp_rank * (micro_batch_sequences / dp);
  int64_t offset = 0;
  for (int r = 0; r < dp_rank; ++r) offset += replica_sequences(micro_batch_sequences, r);
  return offset;
}

std::pair<int64_t, int64_t> PlanStage::zero_piece(int64_t micro_batch_sequences, int64_t count, int dp_rank) const {
  if (replicas.empty()) {
    const int64_t base = count / dp, extra = count % dp;
    const int64_t begin = dp_rank * base + std::min<int64_t>(dp_rank, extra);
    return {begin, begin + base + (dp_rank < extra ? 1 : 0)};
  }
  // Boundaries at floor(count * sequences before the replica / micro-batch), split so that no
  // product passes (micro-batch)^2: a bucket's floats times a batch's sequences could pass 2^63.
  const int64_t whole = count / micro_batch_sequences, rest = count % micro_batch_sequences;
  const auto boundary = [&](int64_t sequences) { return whole * sequences + rest * sequences / micro_batch_sequences; };
  const int64_t before = replica_offset(micro_batch_sequences, dp_rank);
  return {boundary(before), boundary(before + replica_sequences(micro_batch_sequences, dp_rank))};
}

double PlanStage::zero_share(int64_t micro_batch_sequences, int dp_rank) const {
  if (replicas.empty()) return 1.0 / dp;
  return static_cast<double>(replica_sequences(micro_batch_sequences, dp_rank)) / static_cast<double>(micro_batch_sequences);
}

bool flags_any(const std::vector<bool>& flags) { return std::find(flags.begin(), flags.end(), true) != flags.end(); }

TrainSpec plan_train_spec(TrainSpec train, const Plan& plan) {
  train.seq_len = plan.seq_len;
  train.global_batch_sequences = plan.global_batch_sequences;
  train.precision = plan.precision;
  train.gradient_bucket_mib = plan.gradient_bucket_bytes / (1024.0 * 1024.0);
  return train;
}

int Plan::num_used_devices() const {
  int n = 0;
  for (const PlanStage& s : stages) n += static_cast<int>(s.device_ids.size());
  return n;
}

std::string model_fingerprint(const ModelSpec& m) {
  std::string text = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", static_cast<int>(m.family), m.num_layers,
                                 m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.ffn_hidden_size,
                                 m.vocab_size, m.max_seq_len, m.tied_embeddings, m.qkv_bias, m.linear_bias,
                                 m.norm_bias);
  // Added only where set, so the fingerprints of models without them stay what they were.
  if (m.rope_scaling.type != RopeScalingType::RopeScalingType_none)
    text += fmt::format("|rope {} {} {} {} {}", rope_scaling_type_name(m.rope_scaling.type), m.rope_scaling.factor,
                        m.rope_scaling.low_freq_factor, m.rope_scaling.high_freq_factor,
                        m.rope_scaling.original_max_positions);
  if (m.sliding_window > 0) text += fmt::format("|window {}", m.sliding_window);
  if (model_is_moe(m)) text += "|" + moe_yaml(m.moe);
  return fnv1a_hex(text);
}

std::string cluster_fingerprint(const ClusterSpec& c) {
  std::string text = fmt::format("net {} {}|", c.network.bandwidth_bytes_per_second, c.network.latency_seconds);
  for (const DeviceType& t : c.device_types)
    text += fmt::format("type {} {} {} {} {}|", t.name, t.peak_flops_bf16, t.peak_flops_fp32, t.memory_bytes, t.speed);
  for (const NodeGroup& g : c.node_groups)
    text += fmt::format("group {} {} {} {} {}|", g.count, g.devices_per_node, g.device_type_index,
                        g.intra_node.bandwidth_bytes_per_second, g.host_link_bytes_per_second);
  // The network tiers, added only where a cluster has them, so the others keep their fingerprints.
  bool tiered = !c.racks.empty() || !c.sites.empty();
  for (const NodeGroup& g : c.node_groups) tiered = tiered || g.network.bandwidth_bytes_per_second > 0;
  if (!tiered) return fnv1a_hex(text);
  for (const NodeGroup& g : c.node_groups)
    text += fmt::format("place {} {} {} {}|", g.rack, g.site, g.network.bandwidth_bytes_per_second, g.network.latency_seconds);
  for (const Rack& r : c.racks)
    text += fmt::format("rack {} {} {} {} {}|", r.name, r.site, r.uplink_bytes_per_second, r.oversubscription, r.latency_seconds);
  for (const Site& site : c.sites) text += fmt::format("site {}|", site.name);
  text += fmt::format("wan {} {}|", c.wan.bandwidth_bytes_per_second, c.wan.latency_seconds);
  return fnv1a_hex(text);
}

void plan_validate(const Plan& plan, const std::string& source) {
  if (plan.version != kPlanVersion)
    fail(source, "version", fmt::format("unsupported plan version {}", plan.version),
         fmt::format("this Alloy reads version {}; re-run `alloy plan`", kPlanVersion));
  if (plan.num_layers <= 0) fail(source, "num_layers", "must be positive");
  if (plan.stages.empty()) fail(source, "stages", "a plan needs at least one stage");
  if (plan.num_micro_batches <= 0) fail(source, "num_micro_batches", "must be positive");
  if (plan.micro_batch_sequences <= 0) fail(source, "micro_batch_sequences", "must be positive");
  if (plan.micro_batch_sequences * plan.num_micro_batches != plan.global_batch_sequences)
    fail(source, "global_batch_sequences",
         fmt::format("{} is not micro_batch_sequences x num_micro_batches = {} x {}", plan.global_batch_sequences,
                     plan.micro_batch_sequences, plan.num_micro_batches));
  if (plan.virtual_chunks < 1) fail(source, "virtual_chunks", "must be at least 1");
  if ((plan.schedule == Schedule::Schedule_interleaved) != (plan.virtual_chunks > 1))
    fail(source, "virtual_chunks", "the interleaved schedule needs virtual_chunks >= 2, the others exactly 1");

  std::vector<int> device_owner;
  int next_layer = 0;
  const size_t p = plan.stages.size();
  for (size_t s = 0; s < p; ++s) {
    const PlanStage& st = plan.stages[s];
    if (st.tp < 1) fail(source, stage_field(s, "tp"), "must be at least 1");
    if (st.dp < 1) fail(source, stage_field(s, "dp"), "must be at least 1");
    if (st.zero < 0 || st.zero > 3) fail(source, stage_field(s, "zero"), "ZeRO stage must be 0, 1, 2 or 3");
    if (st.shard_gradients && (st.zero < 2 || st.dp < 2))
      fail(source, stage_field(s, "shard_gradients"),
           fmt::format("gradients are sharded over data-parallel members under ZeRO 2 or 3; this stage has zero {} "
                       "and dp {}",
                       st.zero, st.dp),
           "set shard_gradients to false, or use zero 2 or 3 with dp >= 2");
    if (st.ep < 1 || st.dp % st.ep != 0)
      fail(source, stage_field(s, "ep"),
           fmt::format("is {}; expert-parallel groups are made of data-parallel replicas, so ep divides dp {}", st.ep,
                       st.dp),
           "give an ep that divides the stage's dp (1: every replica holds every expert)");
    if (!st.experts_per_member.empty() &&
        (static_cast<int>(st.experts_per_member.size()) != st.ep ||
         std::any_of(st.experts_per_member.begin(), st.experts_per_member.end(), [](int e) { return e < 1; })))
      fail(source, stage_field(s, "experts_per_member"),
           fmt::format("has {} entries for ep {}; each member of an expert-parallel group holds at least one expert",
                       st.experts_per_member.size(), st.ep),
           "give one positive count per member, or leave it out for an even split");
    if (st.sequence_parallel && st.tp < 2)
      fail(source, stage_field(s, "sequence_parallel"), "sequence parallelism needs tp >= 2");
    if (static_cast<int>(st.device_ids.size()) != st.tp * st.dp)
      fail(source, stage_field(s, "device_ids"),
           fmt::format("has {} devices but tp x dp = {} x {}", st.device_ids.size(), st.tp, st.dp));
    if (static_cast<int>(st.chunks.size()) != plan.virtual_chunks)
      fail(source, stage_field(s, "chunks"),
           fmt::format("has {} chunks, the schedule has {} per stage", st.chunks.size(), plan.virtual_chunks));
    // Before the per-block lists, whose lengths follow the chunks.
    for (size_t c = 0; c < st.chunks.size(); ++c)
      if (st.chunks[c].size() <= 0)
        fail(source, fmt::format("stages[{}].chunks[{}]", s, c),
             fmt::format("empty layer range [{}, {})", st.chunks[c].begin, st.chunks[c].end),
             "give every chunk at least one layer (a stage of n layers takes at most n chunks)");
    if (st.replicas.empty() && plan.micro_batch_sequences % st.dp != 0)
      fail(source, stage_field(s, "dp"),
           fmt::format("micro-batch of {} sequences does not split over dp {}", plan.micro_batch_sequences, st.dp),
           "change the micro-batch, or give each replica its share in `replicas`");
    if (!st.replicas.empty()) replicas_validate(plan, s, source);
    if (static_cast<int>(st.recompute.size()) != st.num_blocks())
      fail(source, stage_field(s, "recompute"),
           fmt::format("has {} entries for {} blocks", st.recompute.size(), st.num_blocks()));
    if (static_cast<int>(st.offload.size()) != st.num_blocks())
      fail(source, stage_field(s, "offload"),
           fmt::format("has {} entries for {} blocks", st.offload.size(), st.num_blocks()));
    if (!st.offload_activations.empty() && static_cast<int>(st.offload_activations.size()) != st.num_blocks())
      fail(source, stage_field(s, "offload_activations"),
           fmt::format("has {} entries for {} blocks", st.offload_activations.size(), st.num_blocks()));
    if (st.offload_prefetch_depth < 1 || st.offload_prefetch_depth > kMaxOffloadPrefetchDepth)
      fail(source, stage_field(s, "offload_prefetch_depth"),
           fmt::format("is {}; it counts blocks fetched ahead, 1 to {}", st.offload_prefetch_depth, kMaxOffloadPrefetchDepth));
    if (st.has_embedding != (s == 0))
      fail(source, stage_field(s, "has_embedding"), "the embedding belongs to the first stage only");
    if (st.has_head != (s + 1 == p)) fail(source, stage_field(s, "has_head"), "the head belongs to the last stage only");
    for (int id : st.device_ids) {
      if (id < 0 || id >= plan.num_devices)
        fail(source, stage_field(s, "device_ids"),
             fmt::format("device {} is outside the cluster's 0..{}", id, plan.num_devices - 1));
      if (device_owner.size() <= static_cast<size_t>(id)) device_owner.resize(id + 1, -1);
      if (device_owner[id] >= 0)
        fail(source, stage_field(s, "device_ids"),
             fmt::format("device {} is already used by stage {}", id, device_owner[id]));
      device_owner[id] = static_cast<int>(s);
    }
  }
  // Pipeline order: chunk 0 of every stage, then chunk 1, ...; each starts where the last ended.
  for (int c = 0; c < plan.virtual_chunks; ++c) {
    for (size_t s = 0; s < p; ++s) {
      const LayerRange& r = plan.stages[s].chunks[c];
      const std::string field = fmt::format("stages[{}].chunks[{}]", s, c);
      if (r.begin != next_layer)
        fail(source, field,
             fmt::format("starts at layer {} but layer {} is the next one in pipeline order", r.begin, next_layer),
             "every layer must be in exactly one stage, contiguously");
      next_layer = r.end;
    }
  }
  if (next_layer != plan.num_layers)
    fail(source, "stages", fmt::format("layers cover [0, {}) but the model has {}", next_layer, plan.num_layers));
}

namespace {

// A stage's expert parallelism against the model: only MoE models split experts, and the split
// covers every expert.
void plan_check_experts(const PlanStage& st, size_t s, const ModelSpec& model, const std::string& source) {
  if (st.ep == 1) return;
  const int experts = static_cast<int>(model.moe.num_experts);
  if (experts == 0)
    fail(source, stage_field(s, "ep"), fmt::format("is {} but {} is a dense model: it has no experts to split", st.ep, model.name),
         "set ep to 1");
  if (st.experts_per_member.empty() && experts % st.ep != 0)
    fail(source, stage_field(s, "ep"),
         fmt::format("{} experts do not split evenly over ep {}", experts, st.ep),
         "give an ep that divides the experts, or the counts per member in experts_per_member");
  int total = 0;
  for (int e : st.experts_per_member) total += e;
  if (!st.experts_per_member.empty() && total != experts)
    fail(source, stage_field(s, "experts_per_member"),
         fmt::format("holds {} experts in all; {} has {}", total, model.name, experts),
         "give counts that sum to the model's experts");
}

}  // namespace

void plan_validate_for(const Plan& plan, const ModelSpec& model, const ClusterSpec& cluster, const std::string& source) {
  plan_validate(plan, source);
  if (plan.model_fingerprint != model_fingerprint(model))
    fail(source, "model_fingerprint",
         fmt::format("the plan is for model '{}', not for '{}' (architectures differ)", plan.model_name, model.name),
         "re-run `alloy plan` for this model");
  if (plan.cluster_fingerprint != cluster_fingerprint(cluster))
    fail(source, "cluster_fingerprint",
         fmt::format("the plan is for cluster '{}', not for '{}' (devices or links differ)", plan.cluster_name,
                     cluster.name),
         "re-run `alloy plan` for this cluster");
  if (plan.num_devices != static_cast<int>(cluster.devices.size()))
    fail(source, "num_devices", fmt::format("plan expects {} devices, cluster has {}", plan.num_devices,
                                            cluster.devices.size()));
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    plan_check_experts(st, s, model, source);
    for (size_t i = 0; i < st.device_ids.size(); ++i) {
      const Device& d = cluster.devices[st.device_ids[i]];
      const std::string expected = st.replica(plan.micro_batch_sequences, static_cast<int>(i) / st.tp).device_type;
      if (cluster.device_type(d).name != expected)
        fail(source, stage_field(s, "device_ids"),
             fmt::format("device {} is a {}, {} is {}", d.id, cluster.device_type(d).name,
                         st.replicas.empty() ? "the stage" : fmt::format("replica {}", i / st.tp), expected));
      const Device& leader = cluster.devices[st.device_ids[i - i % st.tp]];
      if (d.node != leader.node)
        fail(source, stage_field(s, "device_ids"),
             fmt::format("tp group of device {} spans nodes {} and {}", d.id, leader.node, d.node),
             "tensor parallelism must stay inside one node");
    }
  }
  plan_check_host_memory(plan, cluster, source);
}

std::vector<double> plan_host_offload_bytes_by_node(const Plan& plan, const ClusterSpec& cluster) {
  std::vector<double> by_node(cluster.num_nodes, 0.0);
  for (const PlanStage& st : plan.stages) {
    double per_device = 0;
    for (const MemoryTerm& t : st.memory)
      if (t.name == "host_offload") per_device = t.bytes;
    for (int id : st.device_ids) by_node[cluster.devices[id].node] += per_device;
  }
  return by_node;
}

void plan_check_host_memory(const Plan& plan, const ClusterSpec& cluster, const std::string& source) {
  const std::vector<double> by_node = plan_host_offload_bytes_by_node(plan, cluster);
  for (const Device& d : cluster.devices) {
    const NodeGroup& g = cluster.node_group(d);
    const double need = by_node[d.node];
    if (need <= g.host_memory_bytes) continue;
    fail(source, "stages[].offload",
         fmt::format("the offloaded layers need {:.1f} GiB of host memory on node {} (group '{}'), which has {:.1f} GiB "
                     "(cluster {}, nodes.host_memory)",
                     need / kGiB, d.node, g.name, g.host_memory_bytes / kGiB, cluster.name),
         "give the nodes more host memory, offload fewer layers, or spread the model over more devices; then re-run "
         "`alloy plan`");
  }
}

std::vector<RankInfo> plan_rank_map(const Plan& plan) {
  std::vector<RankInfo> ranks;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    for (int d = 0; d < st.dp; ++d)
      for (int t = 0; t < st.tp; ++t) {
        RankInfo r;
        r.rank = static_cast<int>(ranks.size());
        r.device_id = st.device_ids[static_cast<size_t>(d) * st.tp + t];
        r.stage = static_cast<int>(s);
        r.tp_rank = t;
        r.dp_rank = d;
        ranks.push_back(r);
      }
  }
  return ranks;
}

std::vector<int> plan_tp_group(const Plan& plan, int rank) {
  const std::vector<RankInfo> map = plan_rank_map(plan);
  const RankInfo& me = map.at(rank);
  std::vector<int> group;
  for (const RankInfo& r : map)
    if (r.stage == me.stage && r.dp_rank == me.dp_rank) group.push_back(r.rank);
  return group;
}

std::vector<int> plan_ep_group(const Plan& plan, int rank) {
  const std::vector<RankInfo> map = plan_rank_map(plan);
  const RankInfo& me = map.at(rank);
  const int ep = plan.stages[static_cast<size_t>(me.stage)].ep;
  std::vector<int> group;
  for (const RankInfo& r : map)
    if (r.stage == me.stage && r.tp_rank == me.tp_rank && r.dp_rank / ep == me.dp_rank / ep) group.push_back(r.rank);
  return group;
}

std::vector<int> plan_expert_dp_group(const Plan& plan, int rank) {
  const std::vector<RankInfo> map = plan_rank_map(plan);
  const RankInfo& me = map.at(rank);
  const int ep = plan.stages[static_cast<size_t>(me.stage)].ep;
  std::vector<int> group;
  for (const RankInfo& r : map)
    if (r.stage == me.stage && r.tp_rank == me.tp_rank && r.dp_rank % ep == me.dp_rank % ep) group.push_back(r.rank);
  return group;
}

std::vector<int> plan_stage_expert_dp_ids(const PlanStage& stage, int dp_rank) {
  std::vector<int> ids;
  for (int d = dp_rank % stage.ep; d < stage.dp; d += stage.ep)
    for (int t = 0; t < stage.tp; ++t) ids.push_back(stage.device_ids[static_cast<size_t>(d * stage.tp + t)]);
  return ids;
}

std::pair<int, int> plan_expert_range(const PlanStage& stage, int num_experts, int ep_rank) {
  if (stage.experts_per_member.empty()) {
    const int each = num_experts / stage.ep;
    return {ep_rank * each, (ep_rank + 1) * each};
  }
  int begin = 0;
  for (int m = 0; m < ep_rank; ++m) begin += stage.experts_per_member[static_cast<size_t>(m)];
  return {begin, begin + stage.experts_per_member[static_cast<size_t>(ep_rank)]};
}

std::vector<int> plan_dp_group(const Plan& plan, int rank) {
  const std::vector<RankInfo> map = plan_rank_map(plan);
  const RankInfo& me = map.at(rank);
  std::vector<int> group;
  for (const RankInfo& r : map)
    if (r.stage == me.stage && r.tp_rank == me.tp_rank) group.push_back(r.rank);
  return group;
}

}  // namespace alloy
