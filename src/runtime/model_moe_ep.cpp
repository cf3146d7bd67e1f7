// Expert parallelism of an MoE block: the members of an expert-parallel group each hold some of
// the routed experts (model.shard). A member routes its own tokens, sends each permuted row to the
// member holding its expert (all-to-all), runs its experts on the rows it receives from every
// member, and sends the outputs back; the backward returns the outputs' gradients to the experts'
// member and the inputs' gradients to the token's member the same way.
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/model_internal.hpp"
#include "runtime/moe_routing.hpp"

namespace alloy {

namespace {

// Rows (R, C) between arrival order and expert-major order (moe_ep_reorder_copies).
void moe_ep_reorder(float* out, const float* in, const MoeEpRoute& r, int C, bool to_expert_major) {
  for (const MoeRowCopy& copy : moe_ep_reorder_copies(r, to_expert_major))
    std::memcpy(out + copy.to_row * C, in + copy.from_row * C, static_cast<size_t>(copy.rows * C) * sizeof(float));
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
  const MoeEpRoute r = moe_ep_route(model.spec, model.shard, offsets, counts);

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
  const MoeEpRoute r = moe_ep_route(model.spec, model.shard, offsets, reinterpret_cast<const int64_t*>(a.moe_ep_counts));
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
