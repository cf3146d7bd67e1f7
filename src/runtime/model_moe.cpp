// The Mixture-of-Experts MLP of a block: router, dropless top-k routing, each routed expert's
// SwiGLU on its rows of the permuted tokens, the weighted combine, the shared experts (with
// Qwen2-MoE's sigmoid gate) and the load-balancing loss. The backward writes the weight
// gradients in the reverse of the flat order (shared gate, shared down and gate_up, experts
// last to first with down before gate_up, router), as the gradient sink expects.
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/cpu/activation.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/cpu/moe.hpp"
#include "runtime/model_internal.hpp"

namespace alloy {

namespace {

// Expert ids, slots and offsets are int32, kept in the arena's float-sized buffers.
int32_t* moe_ints(float* buffer) { return reinterpret_cast<int32_t*>(buffer); }

// Offsets (E + 1) of the permutation as int64, for the expert loops.
std::vector<int64_t> moe_offsets64(const BlockActivations& a, int E) {
  const int32_t* offsets = moe_ints(a.moe_offsets);
  return std::vector<int64_t>(offsets, offsets + E + 1);
}

// a.ln2 -> a.shared_up, a.shared_act, and a.shared_out and a.shared_gate when gated (an ungated
// shared output goes straight into the block output instead).
void moe_shared_forward(const MoeDims& m, const BlockTensors& w, BlockActivations& a) {
  matmul_forward(a.shared_up, a.ln2, w.shared_gate_up_w, nullptr, m.N, m.C, 2 * m.Fs);
  swiglu_forward(a.shared_act, a.shared_up, m.N, m.Fs);
  if (!m.gated) return;
  matmul_forward(a.shared_out, a.shared_act, w.shared_down_w, nullptr, m.N, m.Fs, m.C);
  moe_gate_forward(a.shared_gate, a.ln2, w.shared_gate_w, m.N, m.C);
}

// out: (N, C) = residual (N, C; nullptr: none) + shared experts + the weighted combine of the
// routed experts.
void moe_output_rows(const MoeDims& m, const BlockTensors& w, const BlockActivations& a, float* out,
                     const float* residual) {
  const int64_t NC = int64_t{m.N} * m.C;
  if (m.Fs > 0 && !m.gated) {
    matmul_forward(out, a.shared_act, w.shared_down_w, nullptr, m.N, m.Fs, m.C);
    if (residual != nullptr) residual_forward(out, out, residual, NC);
  } else if (residual != nullptr) {
    std::memcpy(out, residual, static_cast<size_t>(NC) * sizeof(float));
  } else {
    std::memset(out, 0, static_cast<size_t>(NC) * sizeof(float));
  }
  if (m.gated) moe_gated_add_forward(out, a.shared_out, a.shared_gate, m.N, m.C);
  moe_combine_forward(out, a.moe_out, a.moe_weights, moe_ints(a.moe_slots), m.N, m.K, m.C);
}

// a.out: (Nn, C) = a.residual1 + the MoE MLP's output on this rank's rows. Under sequence
// parallelism every tensor-parallel rank ran the whole MLP on all N rows and keeps its Nn.
void moe_output_forward(const Model& model, const Dims& d, const MoeDims& m, const BlockTensors& w,
                        BlockActivations& a) {
  if (!d.sp) {
    moe_output_rows(m, w, a, a.out, a.residual1);
    return;
  }
  float* full = take(model, int64_t{m.N} * m.C, "moe output, all rows");
  moe_output_rows(m, w, a, full, nullptr);
  residual_forward(a.out, full + d.row_offset(), a.residual1, int64_t{d.Nn} * d.C);
  give(model, full);
}

// dout: (N, C) -> dln += the shared experts' input gradient, and their weight gradients.
void moe_shared_backward(Model& model, const MoeDims& m, int layer, const BlockActivations& a, const float* dout,
                         float* dln) {
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const BlockTensors& g = model.gradients.blocks[static_cast<size_t>(layer)];
  float* dshared_out = nullptr;
  if (m.gated) {
    dshared_out = take(model, int64_t{m.N} * m.C, "d moe.shared.out");
    float* dgate_logit = take(model, m.N, "d moe.shared.gate");
    moe_gated_add_backward(dshared_out, dgate_logit, dout, a.shared_out, a.shared_gate, m.N, m.C);
    linear_backward(model, dln, &g.shared_gate_w, nullptr, dgate_logit, a.ln2, w.shared_gate_w, m.N, m.C, 1);
    give(model, dgate_logit);
  }
  float* dact = take_zeroed(model, int64_t{m.N} * m.Fs, "d moe.shared.act");
  linear_backward(model, dact, &g.shared_down_w, nullptr, m.gated ? dshared_out : dout, a.shared_act, w.shared_down_w,
                  m.N, m.Fs, m.C);
  if (dshared_out != nullptr) give(model, dshared_out);
  float* dup = take_zeroed(model, int64_t{m.N} * 2 * m.Fs, "d moe.shared.up");
  swiglu_backward(dup, a.shared_up, dact, m.N, m.Fs);
  give(model, dact);
  linear_backward(model, dln, &g.shared_gate_up_w, nullptr, dup, a.ln2, w.shared_gate_up_w, m.N, m.C, 2 * m.Fs);
  give(model, dup);
}

// dyp: (N K, C) d(experts' outputs) -> dln += the routed experts' input gradient (through the
// permutation), and their weight gradients: on this rank, or by the experts' members.
void moe_experts_backward(Model& model, const MoeDims& m, int layer, const BlockActivations& a, const float* dyp,
                          float* dln) {
  const int32_t* slots = moe_ints(a.moe_slots);
  float* dxp = take_zeroed(model, int64_t{m.NK} * m.C, "d moe gathered input");
  if (model.shard.experts_split()) {
    moe_ep_backward(model, m, layer, a, dyp, dxp);
  } else {
    float* xp = take(model, int64_t{m.NK} * m.C, "moe gathered input");
    moe_gather(xp, a.ln2, slots, m.NK, m.K, m.C);
    const std::vector<int64_t> offsets = moe_offsets64(a, m.E);
    moe_experts_run_backward(model, m, layer, xp, a.moe_up, a.moe_act, dyp, offsets.data(), 0, m.E, dxp, m.NK);
    give(model, xp);
  }
  moe_scatter_add(dln, dxp, slots, m.NK, m.K, m.C);
  give(model, dxp);
}

// The load-balancing loss's sums over every replica's tokens into a.moe_aux_sums: (2 E) picks and
// probability sums, then the tokens counted.
void moe_aux_sums_gather(Model& model, const MoeDims& m, BlockActivations& a) {
  a.moe_aux_sums = take(model, 2 * (2 * int64_t{m.E} + 1), "moe.aux sums");
  double* sums = reinterpret_cast<double*>(a.moe_aux_sums);
  std::fill(sums, sums + 2 * m.E + 1, 0.0);
  moe_aux_sums_add(sums, a.moe_probs, moe_ints(a.moe_offsets), m.N, m.E);
  sums[2 * m.E] = m.N;
  model.moe_exchange->replicas_sum(sums, 2 * int64_t{m.E} + 1);
}

// The per-block balance: this block's load-balancing loss, over every replica's tokens when
// a.moe_aux_sums holds their sums.
double moe_block_aux_loss(const MoeDims& m, const BlockActivations& a) {
  const double* sums = reinterpret_cast<const double*>(a.moe_aux_sums);
  return sums != nullptr ? moe_aux_loss_from_sums(sums, sums[2 * m.E], m.E)
                         : moe_aux_loss_forward(a.moe_probs, moe_ints(a.moe_offsets), m.N, m.E);
}

// The pooled balance: sums: (2 E + 1) += this block's picks and probability sums per expert and
// its N routed rows.
void moe_balance_sums_add(const MoeDims& m, const BlockActivations& a, double* sums) {
  moe_aux_sums_add(sums, a.moe_probs, moe_ints(a.moe_offsets), m.N, m.E);
  sums[2 * m.E] += m.N;
}

}  // namespace

MoeDims moe_dims(const Model& model, const Dims& d) {
  const MixtureOfExperts& moe = model.spec.moe;
  MoeDims m{};
  m.N = d.N;
  m.C = d.C;
  m.E = static_cast<int>(moe.num_experts);
  m.K = static_cast<int>(moe.experts_per_token);
  m.Fe = static_cast<int>(moe.expert_ffn_hidden_size);
  m.Fs = static_cast<int>(moe.num_shared_experts * moe.shared_expert_ffn_hidden_size);
  m.NK = m.N * m.K;
  m.gated = m.Fs > 0 && moe.shared_expert_gate;
  m.normalize = moe.norm_topk_prob;
  return m;
}

void moe_experts_run_forward(const MoeDims& m, const BlockTensors& w, const float* x, const int64_t* offsets, int first,
                             int count, float* up, float* act, float* out) {
  for (int j = 0; j < count; j++) {
    const int64_t r0 = offsets[j];
    const int rows = static_cast<int>(offsets[j + 1] - offsets[j]);
    if (rows == 0) continue;
    const size_t e = static_cast<size_t>(first + j);
    matmul_forward(up + r0 * 2 * m.Fe, x + r0 * m.C, w.expert_gate_up_w[e], nullptr, rows, m.C, 2 * m.Fe);
    swiglu_forward(act + r0 * m.Fe, up + r0 * 2 * m.Fe, rows, m.Fe);
    matmul_forward(out + r0 * m.C, act + r0 * m.Fe, w.expert_down_w[e], nullptr, rows, m.Fe, m.C);
  }
}

void moe_experts_run_backward(Model& model, const MoeDims& m, int layer, const float* x, const float* up,
                              const float* act, const float* dout, const int64_t* offsets, int first, int count,
                              float* dx, int64_t capacity_rows) {
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const BlockTensors& g = model.gradients.blocks[static_cast<size_t>(layer)];
  float* dact = take_zeroed(model, capacity_rows * m.Fe, "d moe.act");
  float* dup = take_zeroed(model, capacity_rows * 2 * m.Fe, "d moe.up");
  for (int j = count - 1; j >= 0; j--) {
    const int64_t r0 = offsets[j];
    const int rows = static_cast<int>(offsets[j + 1] - offsets[j]);
    const size_t e = static_cast<size_t>(first + j);
    linear_backward(model, dact + r0 * m.Fe, &g.expert_down_w[e], nullptr, dout + r0 * m.C, act + r0 * m.Fe,
                    w.expert_down_w[e], rows, m.Fe, m.C);
    if (rows > 0) swiglu_backward(dup + r0 * 2 * m.Fe, up + r0 * 2 * m.Fe, dact + r0 * m.Fe, rows, m.Fe);
    linear_backward(model, dx + r0 * m.C, &g.expert_gate_up_w[e], nullptr, dup + r0 * 2 * m.Fe, x + r0 * m.C,
                    w.expert_gate_up_w[e], rows, m.C, 2 * m.Fe);
  }
  give(model, dup);
  give(model, dact);
}

int64_t moe_block_count(const ModelSpec& spec) {
  return model_is_moe(spec) ? spec.num_layers - spec.moe.first_dense_layers : 0;
}

void moe_allocate(const Model& model, const Dims& d, BlockActivations& a) {
  const MoeDims m = moe_dims(model, d);
  a.moe_probs = take(model, int64_t{m.N} * m.E, "moe.probs");
  a.moe_experts = take(model, m.NK, "moe.experts");
  a.moe_weights = take(model, m.NK, "moe.weights");
  a.moe_slots = take(model, m.NK, "moe.slots");
  a.moe_offsets = take(model, m.E + 1, "moe.offsets");
  if (!model.shard.experts_split()) {  // else sized by the rows the member receives (moe_ep_forward)
    a.moe_up = take(model, int64_t{m.NK} * 2 * m.Fe, "moe.up");
    a.moe_act = take(model, int64_t{m.NK} * m.Fe, "moe.act");
  }
  a.moe_out = take(model, int64_t{m.NK} * m.C, "moe.out");
  if (m.Fs == 0) return;
  a.shared_up = take(model, int64_t{m.N} * 2 * m.Fs, "moe.shared.up");
  a.shared_act = take(model, int64_t{m.N} * m.Fs, "moe.shared.act");
  if (!m.gated) return;
  a.shared_out = take(model, int64_t{m.N} * m.C, "moe.shared.out");
  a.shared_gate = take(model, m.N, "moe.shared.gate");
}

void moe_mlp_forward(Model& model, const Dims& d, int layer, BlockActivations& a, bool with_output, ChunkPass* counted) {
  const MoeDims m = moe_dims(model, d);
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  float* logits = take(model, int64_t{m.N} * m.E, "moe.logits");
  matmul_forward(logits, a.ln2, w.router_w, nullptr, m.N, m.C, m.E);
  moe_route_forward(a.moe_probs, moe_ints(a.moe_experts), a.moe_weights, logits, m.N, m.E, m.K, m.normalize);
  give(model, logits);
  int64_t* counts = counted != nullptr ? model.moe_routing.expert_tokens.data() + int64_t{layer} * m.E : nullptr;
  moe_permute(moe_ints(a.moe_offsets), moe_ints(a.moe_slots), counts, moe_ints(a.moe_experts), m.N, m.E, m.K);
  float* xp = take(model, int64_t{m.NK} * m.C, "moe gathered input");
  moe_gather(xp, a.ln2, moe_ints(a.moe_slots), m.NK, m.K, m.C);
  if (model.shard.experts_split()) {
    moe_ep_forward(model, m, layer, a, xp);
  } else {
    const std::vector<int64_t> offsets = moe_offsets64(a, m.E);
    moe_experts_run_forward(m, w, xp, offsets.data(), 0, m.E, a.moe_up, a.moe_act, a.moe_out);
  }
  give(model, xp);
  if (m.Fs > 0) moe_shared_forward(m, w, a);
  if (model_balance_is_pooled(model.spec)) {
    if (counted != nullptr) moe_balance_sums_add(m, a, counted->balance_sums.data());
  } else {
    if (model.moe_exchange != nullptr) moe_aux_sums_gather(model, m, a);  // every forward: the backward needs them
    if (counted != nullptr) {
      counted->aux_loss += static_cast<float>(moe_block_aux_loss(m, a) / static_cast<double>(moe_block_count(model.spec)));
    }
  }
  if (with_output) moe_output_forward(model, d, m, w, a);
}

void moe_mlp_backward(Model& model, const Dims& d, int layer, const BlockActivations& a, const float* dout, float* dln,
                      float aux_scale, const double* pooled_sums) {
  const MoeDims m = moe_dims(model, d);
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const BlockTensors& g = model.gradients.blocks[static_cast<size_t>(layer)];
  if (m.Fs > 0) moe_shared_backward(model, m, layer, a, dout, dln);
  float* dyp = take(model, int64_t{m.NK} * m.C, "d moe.out");
  float* dweights = take(model, m.NK, "d moe.weights");
  moe_combine_backward(dyp, dweights, dout, a.moe_out, a.moe_weights, moe_ints(a.moe_slots), m.N, m.K, m.C);
  moe_experts_backward(model, m, layer, a, dyp, dln);
  give(model, dyp);
  // d(aux)/d(probs[n, e]) is E f_e / N with the f_e of the balance's form: the pooled picks
  // over the pooled rows, or this block's over every replica's tokens, or over this pass's.
  std::vector<float> aux_dprobs(static_cast<size_t>(m.E));
  if (pooled_sums != nullptr) {
    moe_aux_backward_from_sums(aux_dprobs.data(), pooled_sums, pooled_sums[2 * m.E], m.N, m.E, aux_scale);
  } else if (a.moe_aux_sums != nullptr) {
    const double* sums = reinterpret_cast<const double*>(a.moe_aux_sums);
    moe_aux_backward_from_sums(aux_dprobs.data(), sums, sums[2 * m.E], m.N, m.E, aux_scale);
  } else {
    moe_aux_loss_backward(aux_dprobs.data(), moe_ints(a.moe_offsets), m.N, m.E, aux_scale);
  }
  float* dlogits = take(model, int64_t{m.N} * m.E, "d moe.logits");
  moe_route_backward(dlogits, dweights, aux_dprobs.data(), a.moe_probs, moe_ints(a.moe_experts), a.moe_weights, m.N,
                     m.E, m.K, m.normalize);
  give(model, dweights);
  linear_backward(model, dln, &g.router_w, nullptr, dlogits, a.ln2, w.router_w, m.N, m.C, m.E);
  give(model, dlogits);
}

}  // namespace alloy
