// Cache keys of the planner's searcher: the per-layer costs of a stage shape (UnitKey) and the
// option sets of a stage position (SlotKey), which differ only in their block count.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <vector>

#include "search/stage_options.hpp"

namespace alloy {

// `links`: the stage's data-parallel group (and, for MoE models, its expert groups) as the
// links they run on (GroupLinksIds): two placements of one shape behind unequal networks differ.
struct UnitKey {
  int type, tp, dp, dp_nodes, concurrent, sp;
  int64_t micro_batch;
  int ep = 1;
  int links = 0;
  bool operator==(const UnitKey&) const = default;
};

// A stage position's option sets differ only in their block count: one key for all counts.
struct SlotKey {
  UnitKey unit;
  double in_flight, boundary_seconds;
  int chunks_sent, flags, micro_batches;
  int leading_dense_blocks, virtual_chunks;  // StageSlot's: an MoE model's dense blocks from the stage's first on
  int interleaved_stages;  // the pipeline's stages under interleaving (unequal chunks' peak), else 0
  bool operator==(const SlotKey&) const = default;
};

// Option sets of one slot key by block count, computed on first use. Sized once, so a set's
// address stays valid.
struct SlotOptionSets {
  explicit SlotOptionSets(int layers) : sets(static_cast<size_t>(layers) + 1), computed(static_cast<size_t>(layers) + 1, 0) {}
  std::vector<std::vector<StageOption>> sets;
  std::vector<char> computed;
};

struct KeyHash {
  static size_t mix(size_t h, uint64_t v) { return (h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2))); }
  static uint64_t bits(double d) {
    uint64_t b;
    std::memcpy(&b, &d, sizeof b);
    return b;
  }
  size_t operator()(const UnitKey& k) const {
    size_t h = 0;
    for (int64_t v : {int64_t(k.type), int64_t(k.tp), int64_t(k.dp), int64_t(k.dp_nodes), int64_t(k.concurrent),
                      int64_t(k.sp), k.micro_batch, int64_t(k.ep), int64_t(k.links)})
      h = mix(h, static_cast<uint64_t>(v));
    return h;
  }
  size_t operator()(const SlotKey& k) const {
    size_t h = (*this)(k.unit);
    h = mix(h, bits(k.in_flight));
    h = mix(h, bits(k.boundary_seconds));
    h = mix(h, static_cast<uint64_t>(k.chunks_sent) * 7 + k.flags);
    h = mix(h, static_cast<uint64_t>(k.micro_batches));
    h = mix(h, static_cast<uint64_t>(k.leading_dense_blocks) * 64 + static_cast<uint64_t>(k.virtual_chunks));
    h = mix(h, static_cast<uint64_t>(k.interleaved_stages));
    return h;
  }
};

// Small ids for the distinct link sets of communication groups: equal ids, equal placements as
// the cost model prices them (members, nodes, and every link and shared rate they run on).
class GroupLinksIds {
 public:
  int id(std::initializer_list<const GroupPlacement*> groups) {
    std::vector<double> key;
    for (const GroupPlacement* g : groups)
      key.insert(key.end(), {double(g->ranks), double(g->nodes), double(g->concurrent_per_node),
                             g->intra_node.bandwidth_bytes_per_second, g->intra_node.latency_seconds,
                             g->network.bandwidth_bytes_per_second, g->network.latency_seconds,
                             g->shared_bytes_per_second, g->shared_across_nodes_bytes_per_second, double(g->domains),
                             double(g->ranks_per_domain), g->inside_bytes_per_second, g->inside_latency_seconds,
                             g->across_bytes_per_second, g->across_latency_seconds, g->crosses_measured_link ? 1.0 : 0.0});
    return ids_.emplace(std::move(key), static_cast<int>(ids_.size())).first->second;
  }

 private:
  std::map<std::vector<double>, int> ids_;
};

}  // namespace alloy
