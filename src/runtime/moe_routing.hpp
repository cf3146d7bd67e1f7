// Expert parallelism's bookkeeping of one MoE block, shared by every backend: how many permuted
// rows each member of an expert-parallel group sends each other member, and the row copies that
// reorder the rows a member receives between arrival order and the order its experts run in.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/shard.hpp"
#include "spec/model.hpp"

namespace alloy {

// How one block's rows travel: G members, member g holding experts [first[g], first[g + 1]).
struct MoeEpRoute {
  int G = 0;
  int E = 0;
  int me = 0;
  int lo = 0, hi = 0;                // this member's experts
  std::vector<int> first;            // (G + 1)
  std::vector<int64_t> counts;       // (G x E) rows member g routes to expert e
  std::vector<int64_t> send_rows;    // (G) rows this member sends member g (its permuted rows of g's experts)
  std::vector<int64_t> recv_rows;    // (G) rows this member receives from member g
  std::vector<int64_t> expert_rows;  // (hi - lo + 1) offsets of this member's experts in the expert-major rows
  int64_t R = 0;                     // rows received
};

// offsets: (E + 1) this member's permutation (moe_permute), counts: (G x E) every member's rows
// per expert (gathered) -> the route of `shard`'s member.
MoeEpRoute moe_ep_route(const ModelSpec& spec, const ModelShard& shard, const int32_t* offsets, const int64_t* counts);

// One contiguous copy of `rows` rows from row `from_row` to row `to_row`.
struct MoeRowCopy {
  int64_t from_row = 0;
  int64_t to_row = 0;
  int64_t rows = 0;
};

// The copies that move the R received rows between the order they arrive in (member after
// member, each member's rows expert after expert) and the order the experts run in (expert after
// expert, members ascending within): arrival to expert-major when to_expert_major, else back.
// Empty pieces are left out.
std::vector<MoeRowCopy> moe_ep_reorder_copies(const MoeEpRoute& r, bool to_expert_major);

// Rows to allocate for R received rows: R rounded up to an eighth of the member's own N K rows.
// An arena reuses a released buffer only for the same size, and R changes with the routing every
// pass: a few sizes keep the buffers reused instead of fresh memory each time.
int64_t moe_ep_rows_capacity(int64_t R, int NK);

}  // namespace alloy
