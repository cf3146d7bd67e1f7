// The Mixture-of-Experts MLP of a GPU model's block, with the CPU backend's numerics (moe.hpp):
// the router's product and routing kernels; the permutation computed on the host by the CPU's
// moe_permute from the picks (one small copy per block: the expert products need their row
// counts on the host anyway); the gathered rows through one product pair per expert with
// cuBLASLt; the weighted combine; the shared experts; the load-balancing loss's sums. Under
// expert parallelism the rows travel to their experts' members and back through the model's
// MoeExchange, reordered by moe_routing.hpp's copies.
#include "runtime/cuda/gpu_moe.hpp"

#include <fmt/format.h>

#include "runtime/cpu/moe.hpp"
#include "runtime/cuda/kernels.hpp"
#include "runtime/model_internal.hpp"
#include "runtime/moe_routing.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

struct GpuMoeDims {
  int N, C, E, K, Fe, Fs, NK;
  bool normalize;
};

GpuMoeDims gpu_moe_dims(const GpuModel& m, const GpuActivations& pass) {
  const MixtureOfExperts& moe = m.host->spec.moe;
  GpuMoeDims d{};
  d.N = pass.B * pass.T;
  d.C = static_cast<int>(m.host->spec.hidden_size);
  d.E = static_cast<int>(moe.num_experts);
  d.K = static_cast<int>(moe.experts_per_token);
  d.Fe = static_cast<int>(moe.expert_ffn_hidden_size);
  d.Fs = static_cast<int>(moe.num_shared_experts * moe.shared_expert_ffn_hidden_size);
  d.NK = d.N * d.K;
  d.normalize = moe.norm_topk_prob;
  return d;
}

template <typename T>
void upload(T* device, const std::vector<T>& host, cudaStream_t stream) {
  // Pageable memory: the call returns once the host data is copied out, so `host` may go.
  cuda_check(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
             "uploading MoE routing");
}

template <typename T>
std::vector<T> download(const T* device, int64_t count, cudaStream_t stream) {
  std::vector<T> host(static_cast<size_t>(count));
  cuda_check(cudaMemcpyAsync(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost, stream),
             "reading MoE routing");
  cuda_check(cudaStreamSynchronize(stream), "reading MoE routing");
  return host;
}

std::vector<int64_t> offsets64(const std::vector<int32_t>& offsets) {
  return std::vector<int64_t>(offsets.begin(), offsets.end());
}

// x: (rows of experts [first, first + count) at offsets, C) -> up, act, out of the same rows.
void experts_forward(GpuModel& m, const GpuMoeDims& d, const BlockTensors& w, const bf16* x, const int64_t* offsets,
                     int first, int count, bf16* up, bf16* act, bf16* out) {
  for (int j = 0; j < count; ++j) {
    const int64_t r0 = offsets[j];
    const int rows = static_cast<int>(offsets[j + 1] - r0);
    if (rows == 0) continue;
    const size_t e = static_cast<size_t>(first + j);
    m.matmul.forward(up + r0 * 2 * d.Fe, x + r0 * d.C, m.weight(w.expert_gate_up_w[e]), nullptr, nullptr, rows, d.C,
                     2 * d.Fe, 2 * d.Fe, m.stream);
    cuda_swiglu_forward(act + r0 * d.Fe, up + r0 * 2 * d.Fe, rows, d.Fe, m.stream);
    m.matmul.forward(out + r0 * d.C, act + r0 * d.Fe, m.weight(w.expert_down_w[e]), nullptr, nullptr, rows, d.Fe, d.C,
                     d.C, m.stream);
  }
}

// dout: (rows, C) -> dx: (rows, C) overwritten, and the experts' weight gradients added.
void experts_backward(GpuModel& m, const GpuMoeDims& d, const BlockTensors& w, const bf16* x, const bf16* up,
                      const bf16* act, const bf16* dout, const int64_t* offsets, int first, int count, bf16* dx,
                      int64_t capacity_rows) {
  bf16* dact = gpu_take<bf16>(m, capacity_rows * d.Fe, "d moe.act");
  bf16* dup = gpu_take<bf16>(m, capacity_rows * 2 * d.Fe, "d moe.up");
  CudaMatmul& mm = m.matmul;
  for (int j = 0; j < count; ++j) {
    const int64_t r0 = offsets[j];
    const int rows = static_cast<int>(offsets[j + 1] - r0);
    if (rows == 0) continue;
    const size_t e = static_cast<size_t>(first + j);
    const float* down = w.expert_down_w[e];
    const float* gate_up = w.expert_gate_up_w[e];
    mm.backward_input(dact + r0 * d.Fe, dout + r0 * d.C, m.weight(down), rows, d.Fe, d.C, d.C, false, m.stream);
    mm.backward_weight(m.gradient(down), dout + r0 * d.C, act + r0 * d.Fe, rows, d.Fe, d.C, d.C, m.stream);
    cuda_swiglu_backward(dup + r0 * 2 * d.Fe, up + r0 * 2 * d.Fe, dact + r0 * d.Fe, rows, d.Fe, m.stream);
    mm.backward_input(dx + r0 * d.C, dup + r0 * 2 * d.Fe, m.weight(gate_up), rows, d.C, 2 * d.Fe, 2 * d.Fe, false,
                      m.stream);
    mm.backward_weight(m.gradient(gate_up), dup + r0 * 2 * d.Fe, x + r0 * d.C, rows, d.C, 2 * d.Fe, 2 * d.Fe,
                       m.stream);
  }
  gpu_give(m, dup);
  gpu_give(m, dact);
}

// Rows (R, C) from `in` to `out` by the copies of moe_ep_reorder_copies.
void ep_reorder(GpuModel& m, bf16* out, const bf16* in, const MoeEpRoute& r, int C, bool to_expert_major) {
  for (const MoeRowCopy& copy : moe_ep_reorder_copies(r, to_expert_major)) {
    cuda_check(cudaMemcpyAsync(out + copy.to_row * C, in + copy.from_row * C,
                               static_cast<size_t>(copy.rows * C) * sizeof(bf16), cudaMemcpyDeviceToDevice, m.stream),
               "reordering expert rows");
  }
}

// send: rows of C bf16 per member -> recv, through the model's exchange (bf16 pairs as floats).
void ep_exchange(const GpuModel& m, const bf16* send, const std::vector<int64_t>& send_rows, bf16* recv,
                 const std::vector<int64_t>& recv_rows, int C) {
  m.host->moe_exchange->members_exchange(reinterpret_cast<const float*>(send), send_rows,
                                         reinterpret_cast<float*>(recv), recv_rows, C / 2);
}

// xp: (N K, C) the block's permuted rows -> b.moe_out: (N K, C) from the experts' members.
void ep_forward(GpuModel& m, const GpuMoeDims& d, const BlockTensors& w, GpuBlockActivations& b, const bf16* xp) {
  const ModelShard& shard = m.host->shard;
  std::vector<int64_t> mine(static_cast<size_t>(d.E));
  for (int e = 0; e < d.E; ++e) mine[static_cast<size_t>(e)] = b.moe_offsets[e + 1] - b.moe_offsets[e];
  b.moe_ep_counts.assign(static_cast<size_t>(shard.ep) * d.E, 0);
  m.host->moe_exchange->members_gather(mine.data(), b.moe_ep_counts.data(), d.E);
  const MoeEpRoute r = moe_ep_route(m.host->spec, shard, b.moe_offsets.data(), b.moe_ep_counts.data());
  const int64_t rows = moe_ep_rows_capacity(r.R, d.NK);
  bf16* arrived = gpu_take<bf16>(m, rows * d.C, "moe.ep arrived rows");
  ep_exchange(m, xp, r.send_rows, arrived, r.recv_rows, d.C);
  b.moe_ep_in = gpu_take<bf16>(m, rows * d.C, "moe.ep in");
  ep_reorder(m, b.moe_ep_in, arrived, r, d.C, true);
  b.moe_up = gpu_take<bf16>(m, rows * 2 * d.Fe, "moe.up");
  b.moe_act = gpu_take<bf16>(m, rows * d.Fe, "moe.act");
  bf16* out = gpu_take<bf16>(m, rows * d.C, "moe.ep out");
  experts_forward(m, d, w, b.moe_ep_in, r.expert_rows.data(), r.lo, r.hi - r.lo, b.moe_up, b.moe_act, out);
  ep_reorder(m, arrived, out, r, d.C, false);
  ep_exchange(m, arrived, r.recv_rows, b.moe_out, r.send_rows, d.C);
  gpu_give(m, out);
  gpu_give(m, arrived);
}

// dyp: (N K, C) d(b.moe_out) -> dxp: (N K, C) d(the permuted rows), overwritten, from the members.
void ep_backward(GpuModel& m, const GpuMoeDims& d, const BlockTensors& w, const GpuBlockActivations& b,
                 const bf16* dyp, bf16* dxp) {
  const MoeEpRoute r = moe_ep_route(m.host->spec, m.host->shard, b.moe_offsets.data(), b.moe_ep_counts.data());
  const int64_t rows = moe_ep_rows_capacity(r.R, d.NK);
  bf16* arrived = gpu_take<bf16>(m, rows * d.C, "d moe.ep arrived rows");
  ep_exchange(m, dyp, r.send_rows, arrived, r.recv_rows, d.C);
  bf16* dout = gpu_take<bf16>(m, rows * d.C, "d moe.ep out");
  ep_reorder(m, dout, arrived, r, d.C, true);
  bf16* din = gpu_take<bf16>(m, rows * d.C, "d moe.ep in");
  experts_backward(m, d, w, b.moe_ep_in, b.moe_up, b.moe_act, dout, r.expert_rows.data(), r.lo, r.hi - r.lo, din,
                   rows);
  ep_reorder(m, arrived, din, r, d.C, false);
  ep_exchange(m, arrived, r.recv_rows, dxp, r.send_rows, d.C);
  gpu_give(m, din);
  gpu_give(m, dout);
  gpu_give(m, arrived);
}

// b.moe_experts -> b.moe_offsets (host), b.moe_slots and b.moe_rows (device), by the CPU's
// permutation; the picks counted into `counts` (E) when given.
void permute(GpuModel& m, const GpuMoeDims& d, GpuBlockActivations& b, int64_t* counts) {
  const std::vector<int32_t> experts = download(b.moe_experts, d.NK, m.stream);
  std::vector<int32_t> slots(static_cast<size_t>(d.NK)), rows(static_cast<size_t>(d.NK));
  b.moe_offsets.assign(static_cast<size_t>(d.E) + 1, 0);
  moe_permute(b.moe_offsets.data(), slots.data(), counts, experts.data(), d.N, d.E, d.K);
  moe_rows_of_slots(rows.data(), slots.data(), d.NK);
  b.moe_slots = gpu_take<int32_t>(m, d.NK, "moe.slots");
  b.moe_rows = gpu_take<int32_t>(m, d.NK, "moe.rows");
  upload(b.moe_slots, slots, m.stream);
  upload(b.moe_rows, rows, m.stream);
}

// (2 E + 1) the block's picks per expert, router probabilities summed per expert, and N.
std::vector<double> balance_sums(GpuModel& m, const GpuMoeDims& d, const GpuBlockActivations& b) {
  double* column_sums = gpu_take<double>(m, d.E, "moe.probability sums");
  cuda_check(cudaMemsetAsync(column_sums, 0, static_cast<size_t>(d.E) * sizeof(double), m.stream), "zeroing sums");
  cuda_moe_prob_sums(column_sums, b.moe_probs, d.N, d.E, m.stream);
  const std::vector<double> probabilities = download(column_sums, d.E, m.stream);
  gpu_give(m, column_sums);
  std::vector<double> sums(2 * static_cast<size_t>(d.E) + 1, 0.0);
  for (int e = 0; e < d.E; ++e) {
    sums[static_cast<size_t>(e)] = b.moe_offsets[static_cast<size_t>(e) + 1] - b.moe_offsets[static_cast<size_t>(e)];
    sums[static_cast<size_t>(d.E + e)] = probabilities[static_cast<size_t>(e)];
  }
  sums[2 * static_cast<size_t>(d.E)] = d.N;
  return sums;
}

// The balance's bookkeeping after the routing: pooled sums into the pass, or this block's sums
// (over every replica's tokens) kept for its backward and its loss into the pass.
void balance_forward(GpuModel& m, const GpuMoeDims& d, GpuActivations& pass, GpuBlockActivations& b, bool counted) {
  const ModelSpec& spec = m.host->spec;
  if (model_balance_is_pooled(spec)) {
    if (!counted) return;
    const std::vector<double> sums = balance_sums(m, d, b);
    if (pass.balance_sums.empty()) pass.balance_sums.assign(sums.size(), 0.0);
    for (size_t i = 0; i < sums.size(); ++i) pass.balance_sums[i] += sums[i];
    return;
  }
  b.moe_aux_sums = balance_sums(m, d, b);
  if (m.host->moe_exchange != nullptr)
    m.host->moe_exchange->replicas_sum(b.moe_aux_sums.data(), static_cast<int64_t>(b.moe_aux_sums.size()));
  if (counted) {
    const double* sums = b.moe_aux_sums.data();
    pass.aux_loss += moe_aux_loss_from_sums(sums, sums[2 * d.E], d.E) / static_cast<double>(moe_block_count(spec));
  }
}

// b.out: (N, C) = b.residual1 + the shared experts + the weighted combine of the routed ones.
void output_forward(GpuModel& m, const GpuMoeDims& d, const BlockTensors& w, GpuBlockActivations& b) {
  if (d.Fs > 0) {
    m.matmul.forward(b.out, b.shared_act, m.weight(w.shared_down_w), nullptr, b.residual1, d.N, d.Fs, d.C, d.C,
                     m.stream);
  } else {
    cuda_check(cudaMemcpyAsync(b.out, b.residual1, static_cast<size_t>(int64_t{d.N} * d.C) * sizeof(bf16),
                               cudaMemcpyDeviceToDevice, m.stream),
               "copying the residual");
  }
  cuda_moe_combine_forward(b.out, b.moe_out, b.moe_weights, b.moe_rows, d.N, d.K, d.C, m.stream);
}

// dout: (N, C) -> dln: (N, C) = the shared experts' input gradient (0 without them), and their
// weight gradients.
void shared_backward(GpuModel& m, const GpuMoeDims& d, const BlockTensors& w, const GpuBlockActivations& b,
                     const bf16* dout, bf16* dln) {
  if (d.Fs == 0) {
    cuda_check(cudaMemsetAsync(dln, 0, static_cast<size_t>(int64_t{d.N} * d.C) * sizeof(bf16), m.stream),
               "zeroing d norm.out");
    return;
  }
  CudaMatmul& mm = m.matmul;
  bf16* dact = gpu_take<bf16>(m, int64_t{d.N} * d.Fs, "d moe.shared.act");
  mm.backward_input(dact, dout, m.weight(w.shared_down_w), d.N, d.Fs, d.C, d.C, false, m.stream);
  mm.backward_weight(m.gradient(w.shared_down_w), dout, b.shared_act, d.N, d.Fs, d.C, d.C, m.stream);
  bf16* dup = gpu_take<bf16>(m, int64_t{d.N} * 2 * d.Fs, "d moe.shared.up");
  cuda_swiglu_backward(dup, b.shared_up, dact, d.N, d.Fs, m.stream);
  gpu_give(m, dact);
  mm.backward_input(dln, dup, m.weight(w.shared_gate_up_w), d.N, d.C, 2 * d.Fs, 2 * d.Fs, false, m.stream);
  mm.backward_weight(m.gradient(w.shared_gate_up_w), dup, b.ln2, d.N, d.C, 2 * d.Fs, 2 * d.Fs, m.stream);
  gpu_give(m, dup);
}

// dweights: (N, K) -> dln += the router's input gradient, with the load-balancing loss's, and
// the router's weight gradient.
void router_backward(GpuModel& m, const GpuMoeDims& d, const BlockTensors& w, const GpuActivations& pass,
                     const GpuBlockActivations& b, const float* dweights, bf16* dln, float aux_scale) {
  const std::vector<double>& sums = pass.balance_pooled ? pass.balance_sums : b.moe_aux_sums;
  std::vector<float> aux_dprobs(static_cast<size_t>(d.E));
  moe_aux_backward_from_sums(aux_dprobs.data(), sums.data(), sums[2 * static_cast<size_t>(d.E)], d.N, d.E, aux_scale);
  float* daux = gpu_take<float>(m, d.E, "d moe.probs (balance)");
  upload(daux, aux_dprobs, m.stream);
  bf16* dlogits = gpu_take<bf16>(m, int64_t{d.N} * d.E, "d moe.logits");
  cuda_moe_route_backward(dlogits, dweights, daux, b.moe_probs, b.moe_experts, b.moe_weights, d.N, d.E, d.K,
                          d.normalize, m.stream);
  m.matmul.backward_input(dln, dlogits, m.weight(w.router_w), d.N, d.C, d.E, d.E, true, m.stream);
  m.matmul.backward_weight(m.gradient(w.router_w), dlogits, b.ln2, d.N, d.C, d.E, d.E, m.stream);
  gpu_give(m, dlogits);
  gpu_give(m, daux);
}

}  // namespace

void gpu_moe_check(const Model& host) {
  const ModelSpec& s = host.spec;
  if (!model_is_moe(s)) return;
  auto refuse = [&](const std::string& what, const char* field) {
    throw Error(fmt::format("the GPU model does not run {} yet, which model {} uses", what, s.name),
                {s.source_path, field}, "train this model on CPU ranks (--device cpu)");
  };
  if (s.moe.num_shared_experts > 0 && s.moe.shared_expert_gate) refuse("the shared experts' sigmoid gate", "moe");
  if (s.moe.num_experts > kCudaMoeMaxExperts)
    refuse(fmt::format("more than {} routed experts", kCudaMoeMaxExperts), "moe.experts");
  if (host.shard.experts_split() && s.hidden_size % 2 != 0)
    refuse("expert parallelism with an odd hidden size (rows travel as bf16 pairs)", "hidden_size");
}

void gpu_moe_forward(GpuModel& m, GpuActivations& pass, int layer, GpuBlockActivations& b, bool with_output,
                     bool counted) {
  const GpuMoeDims d = gpu_moe_dims(m, pass);
  const BlockTensors& w = m.host->weights.blocks[static_cast<size_t>(layer)];
  bf16* logits = gpu_take<bf16>(m, int64_t{d.N} * d.E, "moe.logits");
  m.matmul.forward(logits, b.ln2, m.weight(w.router_w), nullptr, nullptr, d.N, d.C, d.E, d.E, m.stream);
  b.moe_probs = gpu_take<float>(m, int64_t{d.N} * d.E, "moe.probs");
  b.moe_experts = gpu_take<int32_t>(m, d.NK, "moe.experts");
  b.moe_weights = gpu_take<float>(m, d.NK, "moe.weights");
  cuda_moe_route_forward(b.moe_probs, b.moe_experts, b.moe_weights, logits, d.N, d.E, d.K, d.normalize, m.stream);
  gpu_give(m, logits);
  const bool counts = counted && m.routing != nullptr;
  permute(m, d, b, counts ? m.routing->expert_tokens.data() + int64_t{layer} * d.E : nullptr);

  bf16* xp = gpu_take<bf16>(m, int64_t{d.NK} * d.C, "moe gathered input");
  cuda_moe_gather(xp, b.ln2, b.moe_slots, d.NK, d.K, d.C, m.stream);
  b.moe_out = gpu_take<bf16>(m, int64_t{d.NK} * d.C, "moe.out");
  if (m.host->shard.experts_split()) {
    ep_forward(m, d, w, b, xp);
  } else {
    b.moe_up = gpu_take<bf16>(m, int64_t{d.NK} * 2 * d.Fe, "moe.up");
    b.moe_act = gpu_take<bf16>(m, int64_t{d.NK} * d.Fe, "moe.act");
    const std::vector<int64_t> offsets = offsets64(b.moe_offsets);
    experts_forward(m, d, w, xp, offsets.data(), 0, d.E, b.moe_up, b.moe_act, b.moe_out);
  }
  gpu_give(m, xp);
  if (d.Fs > 0) {
    b.shared_up = gpu_take<bf16>(m, int64_t{d.N} * 2 * d.Fs, "moe.shared.up");
    b.shared_act = gpu_take<bf16>(m, int64_t{d.N} * d.Fs, "moe.shared.act");
    m.matmul.forward(b.shared_up, b.ln2, m.weight(w.shared_gate_up_w), nullptr, nullptr, d.N, d.C, 2 * d.Fs,
                     2 * d.Fs, m.stream);
    cuda_swiglu_forward(b.shared_act, b.shared_up, d.N, d.Fs, m.stream);
  }
  balance_forward(m, d, pass, b, counted);
  if (with_output) output_forward(m, d, w, b);
}

void gpu_moe_backward(GpuModel& m, const GpuActivations& pass, int layer, const GpuBlockActivations& b,
                      const bf16* dout, bf16* dln, float aux_scale) {
  const GpuMoeDims d = gpu_moe_dims(m, pass);
  const BlockTensors& w = m.host->weights.blocks[static_cast<size_t>(layer)];
  shared_backward(m, d, w, b, dout, dln);
  bf16* dyp = gpu_take<bf16>(m, int64_t{d.NK} * d.C, "d moe.out");
  float* dweights = gpu_take<float>(m, d.NK, "d moe.weights");
  cuda_moe_combine_backward(dyp, dweights, dout, b.moe_out, b.moe_weights, b.moe_rows, d.N, d.K, d.C, m.stream);
  bf16* dxp = gpu_take<bf16>(m, int64_t{d.NK} * d.C, "d moe gathered input");
  if (m.host->shard.experts_split()) {
    ep_backward(m, d, w, b, dyp, dxp);
  } else {
    bf16* xp = gpu_take<bf16>(m, int64_t{d.NK} * d.C, "moe gathered input");
    cuda_moe_gather(xp, b.ln2, b.moe_slots, d.NK, d.K, d.C, m.stream);
    const std::vector<int64_t> offsets = offsets64(b.moe_offsets);
    experts_backward(m, d, w, xp, b.moe_up, b.moe_act, dyp, offsets.data(), 0, d.E, dxp, d.NK);
    gpu_give(m, xp);
  }
  cuda_moe_scatter_add(dln, dxp, b.moe_rows, d.N, d.K, d.C, m.stream);
  gpu_give(m, dxp);
  gpu_give(m, dyp);
  router_backward(m, d, w, pass, b, dweights, dln, aux_scale);
  gpu_give(m, dweights);
}

void gpu_moe_release(GpuModel& m, GpuBlockActivations& b) {
  gpu_give(m, b.moe_probs);
  gpu_give(m, b.moe_experts);
  gpu_give(m, b.moe_weights);
  gpu_give(m, b.moe_slots);
  gpu_give(m, b.moe_rows);
  gpu_give(m, b.moe_up);
  gpu_give(m, b.moe_act);
  gpu_give(m, b.moe_out);
  gpu_give(m, b.moe_ep_in);
  gpu_give(m, b.shared_up);
  gpu_give(m, b.shared_act);
}

}  // namespace alloy
