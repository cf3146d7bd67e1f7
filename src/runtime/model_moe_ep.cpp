// Expert parallelism of an MoE block: the members of an expert-parallel group each hold some of
// the routed experts (model.shard). A member routes its own tokens, sends each permuted row to the
// member holding its expert (all-to-all), runs its experts on the rows it receives from every
// member, and sends the outputs back; the backward returns the outputs' gradients to the experts'
// member and the inputs' gradients to the token's member the same way.
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/model_internal.hpp"

namespace alloy {

namespace {

// How one block's rows travel: G members, member g holding experts [first[g], first[g + 1]).
struct MoeEpRoute {
  int G = 0;
  int E = 0;
  int me = 0;
  int lo = 0, hi = 0;                // this member's experts
  std::vector<int> first;            // (G + 1)
  const int64_t* counts = nullptr;   // (G x E) rows member g routes to expert e
  std::vector<int64_t> send_rows;    // (G) rows this member sends member g (its permuted rows of g's experts)
  std::vector<int64_t> recv_rows;    // (G) rows this member receives from member g
  std::vector<int64_t> expert_rows;  // (hi - lo + 1) offsets of this member's experts in the expert-major rows
  int64_t R = 0;                     // rows received
};

MoeEpRoute moe_ep_route(const Model& model, const MoeDims& m, const int32_t* offsets, const int64_t* counts) {
  const ModelShard& shard = model.shard;
  MoeEpRoute r;
  r.G = shard.ep;
  r.E = m.E;
  r.me = shard.ep_rank;
  for (int g = 0; g < r.G; ++g) r.first.push_back(shard_expert_range(model.spec, shard, g).first);
  r.first.push_back(m.E);
  r.lo = r.first[static_cast<size_t>(r.me)];
  r.hi = r.first[static_cast<size_t>(r.me) + 1];
  r.counts = counts;
  for (int g = 0; g < r.G; ++g) {
    r.send_rows.push_back(offsets[r.first[static_cast<size_t>(g) + 1]] - offsets[r.first[static_cast<size_t>(g)]]);
    int64_t rows = 0;
    for (int e = r.lo; e < r.hi; ++e) rows += counts[int64_t{g} * m.E + e];
    r.recv_rows.push_back(rows);
    r.R += rows;
  }
  r.expert_rows.push_back(0);
  for (int e = r.lo; e < r.hi; ++e) {
    int64_t rows = 0;
    for (int g = 0; g < r.G; ++g) rows += counts[int64_t{g} * m.E + e];
    r.expert_rows.push_back(r.expert_rows.back() + rows);
  }
  return r;
}

// Rows (R, C) between the order they arrive in (member after member, each member's rows expert
// after expert) and the order the experts run in (expert after expert, members ascending within).
void moe_ep_reorder(float* out, const float* in, const MoeEpRoute& r, int C, bool to_expert_major) {
  std::vector<int64_t> at_expert(r.expert_rows.begin(), r.expert_rows.end() - 1);
  int64_t arrived = 0;
  for (int g = 0; g < r.G; ++g) {
    for (int e = r.lo; e < r.hi; ++e) {
      const int64_t rows = r.counts[int64_t{g} * r.E + e];
      int64_t& at = at_expert[static_cast<size_t>(e - r.lo)];
      const float* src = in + (to_expert_major ? arrived : at) * C;
      float* dst = out + (to_expert_major ? at : arrived) * C;
      std::memcpy(dst, src, static_cast<size_t>(rows * C) * sizeof(float));
      arrived += rows;
      at += rows;
    }
  }
}

// Rows to allocate for R received rows: R rounded up to an eighth of the member's own N K rows.
// The arena reuses a released buffer only for the same size, and R changes with the routing every
// pass: a few sizes keep the buffers reused instead of fresh memory (zeroed by the system) each time.
int64_t moe_ep_rows_capacity(int64_t R, int NK) {
  const int64_t step = std::max<int64_t>(1, (int64_t{NK} + 7) / 8);
  return (R + step - 1) / step * step;
}

}  // namespace

void moe_ep_forward(Model& model, const MoeDims& m, int layer, BlockActivations& a, const float* xp) {
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const int32_t* offsets = reinterpret_cast<const int32_t*>(a.moe_offsets);
  const int G = model.shard.ep;
  std::vector<int64_t> mine(static_cast<size_t>(m.E));
  for (int e = 0; e < m.E; ++e) mine[static_cast<size_t>(e)] = offsets[e + 1] - offsets[e];
  a.moe_ep_counts = take(model, 2 * int64_t{G} * m.E, "moe.ep counts");
  int64_t* counts = reinterpret_cast<int64_t*>(a.moe_ep_counts);
  model.moe_exchange->members_gather(mine.data(), counts, m.E);
  const MoeEpRoute r = moe_ep_route(model, m, offsets, counts);

  const int64_t rows = moe_ep_rows_capacity(r.R, m.NK);
  float* arrived = take(model, rows * m.C, "moe.ep arrived rows");
  model.moe_exchange->members_exchange(xp, r.send_rows, arrived, r.recv_rows, m.C);
  a.moe_ep_in = take(model, rows * m.C, "moe.ep in");
  moe_ep_reorder(a.moe_ep_in, arrived, r, m.C, true);
  a.moe_up = take(model, rows * 2 * m.Fe, "moe.up");
  a.moe_act = take(model, rows * m.Fe, "moe.act");
  float* out = take(model, rows * m.C, "moe.ep out");
  moe_experts_run_forward(m, w, a.moe_ep_in, r.expert_rows.data(), r.lo, r.hi - r.lo, a.moe_up, a.moe_act, out);
  moe_ep_reorder(arrived, out, r, m.C, false);
  give(model, out);
  model.moe_exchange->members_exchange(arrived, r.recv_rows, a.moe_out, r.send_rows, m.C);
  give(model, arrived);
}

void moe_ep_backward(Model& model, const MoeDims& m, int layer, const BlockActivations& a, const float* dyp, float* dxp) {
  const int32_t* offsets = reinterpret_cast<const int32_t*>(a.moe_offsets);
  const MoeEpRoute r = moe_ep_route(model, m, offsets, reinterpret_cast<const int64_t*>(a.moe_ep_counts));
  const int64_t rows = moe_ep_rows_capacity(r.R, m.NK);
  float* arrived = take(model, rows * m.C, "d moe.ep arrived rows");
  model.moe_exchange->members_exchange(dyp, r.send_rows, arrived, r.recv_rows, m.C);
  float* dout = take(model, rows * m.C, "d moe.ep out");
  moe_ep_reorder(dout, arrived, r, m.C, true);
  float* din = take_zeroed(model, rows * m.C, "d moe.ep in");
  moe_experts_run_backward(model, m, layer, a.moe_ep_in, a.moe_up, a.moe_act, dout, r.expert_rows.data(), r.lo,
                           r.hi - r.lo, din, rows);
  moe_ep_reorder(arrived, din, r, m.C, false);
  give(model, din);
  give(model, dout);
  float* returned = take(model, int64_t{m.NK} * m.C, "d moe.ep returned rows");
  model.moe_exchange->members_exchange(arrived, r.recv_rows, returned, r.send_rows, m.C);
  for (int64_t i = 0; i < int64_t{m.NK} * m.C; ++i) dxp[i] += returned[i];
  give(model, returned);
  give(model, arrived);
}

}  // namespace alloy
