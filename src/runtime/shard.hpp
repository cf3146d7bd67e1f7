// Model shards: which parameters one rank holds (its pipeline blocks, the embedding and head
// when its stage has them) and which slice of each under tensor parallelism. Shared by the
// model's layout, its initialisation and the gathering of full weights from every rank.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "spec/model.hpp"

namespace alloy {

struct ModelShard {
  std::vector<std::pair<int, int>> block_ranges;  // blocks [first, second), ascending
  bool has_embedding = true;   // token (and position) embedding
  bool has_head = true;        // final norm and LM head (a copy of the token embedding when tied)
  int tp = 1;                  // tensor-parallel degree
  int tp_rank = 0;
  bool sequence_parallel = false;  // norms and residuals on N / tp token rows per rank
  // Expert parallelism: every MoE block's routed experts split over the ep members of an
  // expert-parallel group, member m holding experts_per_member[m] consecutive ids (empty: the
  // same number each); this rank is member ep_rank. A split shard keeps its routed experts after
  // all other tensors (block by block), out of the data-parallel gradient buckets.
  int ep = 1;
  int ep_rank = 0;
  std::vector<int> experts_per_member;
  bool experts_split() const { return ep > 1; }
};

// The routed experts [first, second) of every MoE block that expert-parallel member `member` of
// `shard`'s group holds (all of them when the experts are not split).
std::pair<int, int> shard_expert_range(const ModelSpec& spec, const ModelShard& shard, int member);

// Whether `name` is a routed expert's tensor ("layers.L.mlp.experts.e.*").
bool shard_is_routed_expert(const std::string& name);

// Whether block `layer` of `spec` is a Mixture-of-Experts block (past moe.first_dense_layers).
bool model_block_is_moe(const ModelSpec& spec, int64_t layer);

// The whole model on one rank.
ModelShard shard_full(const ModelSpec& spec);

// How tensor parallelism splits a parameter.
enum class ShardSplit {
  ShardSplit_replicated,  // every tp rank holds all of it (norms, row-parallel biases)
  ShardSplit_heads,       // attn.qkv rows: this rank's query heads, then its key and value heads
  ShardSplit_rows,        // output features (mlp.up and its bias)
  ShardSplit_gate_up,     // mlp.gate_up rows: this rank's slice of the gate half, then of the up half
  ShardSplit_columns,     // input features (attn.out, mlp.down): row-parallel layers
  ShardSplit_vocab,       // token embedding and LM head rows: a contiguous vocabulary range
};
ShardSplit shard_split_of(const std::string& name);

// A run of floats of the full tensor (offset from the tensor's start) that the shard holds;
// the shard's tensor is the concatenation of its segments in order.
struct ShardSegment {
  int64_t full_offset = 0;
  int64_t count = 0;
};

struct ShardedTensor {
  std::string name;                   // e.g. "layers.3.attn.qkv.weight"
  std::vector<int64_t> full_shape;
  std::vector<int64_t> local_shape;
  std::vector<ShardSegment> segments;
};

// The tensors of a shard in buffer order, with their slices. Throws alloy::Error when tp does
// not divide the heads, kv heads or FFN width (naming the field).
std::vector<ShardedTensor> shard_tensors(const ModelSpec& spec, const ModelShard& shard);

// Vocabulary rows [first, second) of tp rank `tp_rank`; ranges differ by at most one row.
std::pair<int64_t, int64_t> shard_vocab_range(const ModelSpec& spec, int tp, int tp_rank);

// Checks that tp can split this model; throws alloy::Error naming the field otherwise.
void shard_check_tp(const ModelSpec& spec, int tp);

}  // namespace alloy
