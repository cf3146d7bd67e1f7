// Shared by the model's pass files (not a public API): sizes of one pass, arena helpers, norm
// dispatch, tensor-parallel sums, and the embedding and head passes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "runtime/cpu/norm.hpp"
#include "runtime/model.hpp"

namespace alloy {

// Sizes of one pass on this rank, in the kernels' int arguments: heads, FFN width and
// vocabulary are this tensor-parallel rank's share.
struct Dims {
  int B, T, N, C, Hq, Hkv, D, R, F, V;
  int Nn;               // rows of the residual stream on this rank: N, or N / tp with sequence parallelism
  int64_t vocab_begin;  // first vocabulary row of this rank
  int tp, tp_rank;
  bool sp;              // sequence parallelism: norms and residuals on this rank's Nn rows
  bool gpt2;
  int window;           // the sliding window (0: none)
  int64_t row_offset() const { return int64_t{tp_rank} * Nn * C; }  // floats to this rank's rows
};

inline Dims model_dims(const Model& model, const ChunkPass& pass) {
  const ModelSpec& s = model.spec;
  const int tp = model.shard.tp;
  Dims d{};
  d.B = pass.B;
  d.T = pass.T;
  d.N = pass.B * pass.T;
  d.C = static_cast<int>(s.hidden_size);
  d.Hq = static_cast<int>(s.num_heads / tp);
  d.Hkv = static_cast<int>(s.num_kv_heads / tp);
  d.D = static_cast<int>(s.head_dim);
  d.R = (d.Hq + 2 * d.Hkv) * d.D;
  d.F = static_cast<int>(s.ffn_hidden_size / tp);
  const auto [vocab_begin, vocab_end] = shard_vocab_range(s, tp, model.shard.tp_rank);
  d.V = static_cast<int>(vocab_end - vocab_begin);
  d.vocab_begin = vocab_begin;
  d.tp = tp;
  d.tp_rank = model.shard.tp_rank;
  d.sp = model.shard.sequence_parallel && tp > 1;
  d.Nn = d.sp ? d.N / tp : d.N;
  d.gpt2 = s.family == ModelFamily::ModelFamily_gpt2;
  d.window = static_cast<int>(std::min<int64_t>(s.sliding_window, pass.T));
  return d;
}

// The same pass without sequence parallelism (the embedding and head work on all rows).
inline Dims dims_all_rows(Dims d) {
  d.sp = false;
  d.Nn = d.N;
  return d;
}

inline float* take(const Model& model, int64_t floats, const char* what) { return model.arena->allocate_floats(floats, what); }

inline float* take_zeroed(const Model& model, int64_t floats, const char* what) {
  float* buffer = model.arena->allocate_floats(floats, what);
  std::memset(buffer, 0, static_cast<size_t>(floats) * sizeof(float));
  return buffer;
}

inline void give(const Model& model, float*& buffer) {
  model.arena->release(buffer);
  buffer = nullptr;
}

// Sum over the tensor-parallel group (nothing on a single rank).
inline void tp_sum(const Model& model, float* data, int64_t count) {
  if (model.shard.tp > 1) model.tp_ops->all_reduce_sum(data, count);
}

// Sequence parallelism: data (N, C) holds this rank's rows at d.row_offset(); afterwards every
// row (all-gather), or this rank's rows summed over the group (reduce-scatter).
inline void sp_gather(const Model& model, const Dims& d, float* data) {
  model.tp_ops->all_gather(data, int64_t{d.Nn} * d.C);
}
inline void sp_reduce_scatter(const Model& model, const Dims& d, float* data) {
  model.tp_ops->reduce_scatter(data, int64_t{d.Nn} * d.C);
}

// LayerNorm for the GPT-2 family, RMSNorm for LLaMA (mean unused there), over d.Nn rows.
inline void norm_forward(const Model& model, const Dims& d, float* out, float* mean, float* rstd, const float* inp,
                         const float* w, const float* b) {
  const float eps = static_cast<float>(model.spec.norm_eps);
  if (d.gpt2) {
    layernorm_forward(out, mean, rstd, inp, w, b, d.Nn, d.C, eps);
  } else {
    rmsnorm_forward(out, rstd, inp, w, d.Nn, d.C, eps);
  }
}


// The weights of `unit` resident for a scope: gathered by the model's parameter source (ZeRO 3)
// or fetched from host memory (offload) and let go at the end; nothing to do when the weights
// live in the device arena.
class UnitWeights {
 public:
  UnitWeights(const Model& model, int unit, bool backward)
      : source_(model.parameter_source), unit_(unit), backward_(backward) {
    if (source_ != nullptr) source_->acquire(unit_, backward_);
  }
  ~UnitWeights() {
    if (source_ != nullptr) source_->release(unit_, backward_);
  }
  UnitWeights(const UnitWeights&) = delete;
  UnitWeights& operator=(const UnitWeights&) = delete;

 private:
  ParameterSource* source_;
  int unit_;
  bool backward_;
};

// inputs, targets: (B, T) or nullptr when the chunk does not read them. Throws alloy::Error for
// ids outside the vocabulary or T above the model's maximum.
void model_check_tokens(const Model& model, const int32_t* inputs, const int32_t* targets, int B, int T);

// Backward writers of parameter gradients (model_gradients.cpp). Each takes the slots of
// Model::gradients it writes and tells the model's gradient sink, when there is one, before and
// after; matrices are then written in the row pieces the sink asks for, last rows first.
// dout: (Nn, C) -> dinp: (Nn, C) +=, and the norm's weight (and bias, slot nullptr for none).
void norm_backward(Model& model, const Dims& d, float* dinp, float* const* dw, float* const* db, const float* dout,
                   const float* inp, const float* w, const float* mean, const float* rstd);
// dout: (N, OC) -> dinp: (N, C) += dout W (skipped when nullptr), dW (OC, C) += dout^T inp and
// db (OC) += column sums (slot nullptr for none).
void linear_backward(Model& model, float* dinp, float* const* dw, float* const* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC);
// dout: (B, T, C) -> the token table's rows of this rank (vocabulary-parallel from
// d.vocab_begin) and the learned positions, where the model has them.
void embedding_gradients(Model& model, const Dims& d, const float* dout, const int32_t* tokens);

// Mixture-of-Experts MLP of block `layer` (model_moe.cpp), on all N rows (no tensor parallelism).
// The activations it keeps in `a`, allocated in this order.
void moe_allocate(const Model& model, const Dims& d, BlockActivations& a);
// a.ln2 -> the routing and expert activations in `a`; a.out = a.residual1 + the MoE MLP's output
// when with_output. counted: a forward (not a recomputation), whose routing is added to
// model.moe_routing and whose load-balancing statistics to counted (its balance_sums when
// pooled, else its aux_loss).
void moe_mlp_forward(Model& model, const Dims& d, int layer, BlockActivations& a, bool with_output, ChunkPass* counted);
// dout: (N, C) d(block output) -> dln: (N, C) += d(a.ln2), and the block's MoE weight gradients;
// aux_scale: d(objective) / d(this block's load-balancing term), router_aux_loss_coef over the
// MoE blocks times the loss scale; pooled_sums: the micro-batch's pooled balance sums (2 E + 1),
// nullptr for the per-block balance.
void moe_mlp_backward(Model& model, const Dims& d, int layer, const BlockActivations& a, const float* dout, float* dln,
                      float aux_scale, const double* pooled_sums);
// Blocks of the model that are MoE blocks.
int64_t moe_block_count(const ModelSpec& spec);

// An MoE block's sizes for N token rows: E experts, K picks, Fe an expert's width, Fs the shared
// experts' widths together.
struct MoeDims {
  int N, C, E, K, Fe, Fs;
  int NK;
  bool gated;      // a sigmoid gate on the shared experts' output
  bool normalize;  // routing weights renormalised over the picks
};
MoeDims moe_dims(const Model& model, const Dims& d);

// Experts [first, first + count) of block `layer` on x: (rows, C) grouped by expert, expert
// first + j on rows [offsets[j], offsets[j + 1]) -> up: (rows, 2 Fe), act: (rows, Fe), out: (rows, C).
void moe_experts_run_forward(const MoeDims& m, const BlockTensors& w, const float* x, const int64_t* offsets, int first,
                             int count, float* up, float* act, float* out);
// dout: (rows, C) -> dx: (rows, C) += d(x), and the experts' weight gradients, the last expert
// first with down before gate_up (the reverse of the flat order). capacity_rows (>= rows): the
// size of its scratch buffers.
void moe_experts_run_backward(Model& model, const MoeDims& m, int layer, const float* x, const float* up,
                              const float* act, const float* dout, const int64_t* offsets, int first, int count,
                              float* dx, int64_t capacity_rows);

// Expert parallelism (model_moe_ep.cpp), for a shard whose experts are split: xp: (N K, C) the
// block's permuted rows (a.moe_offsets) -> a.moe_out: (N K, C) their experts' outputs, computed by
// the experts' members; keeps a.moe_ep_counts, a.moe_ep_in, a.moe_up and a.moe_act.
void moe_ep_forward(Model& model, const MoeDims& m, int layer, BlockActivations& a, const float* xp);
// dyp: (N K, C) d(a.moe_out) -> dxp: (N K, C) += d(xp), and this member's experts' weight gradients
// from every member's rows.
void moe_ep_backward(Model& model, const MoeDims& m, int layer, const BlockActivations& a, const float* dyp, float* dxp);

// pass.inputs -> pass.input (B, T, C): token (and position) embedding, vocabulary-parallel.
void embedding_pass_forward(Model& model, ChunkPass& pass, const Dims& d);
// pass.gradient (B, T, C) -> embedding gradients.
void embedding_pass_backward(Model& model, ChunkPass& pass, const Dims& d);
// x: (B, T, C) the last block's output -> mean loss of the pass's tokens (vocabulary-parallel
// cross-entropy under tensor parallelism).
float head_pass_forward(Model& model, ChunkPass& pass, const Dims& d, const float* x);
// Allocates pass.gradient and fills it with dL/dx, scaled by loss_scale / (local tokens).
void head_pass_backward(Model& model, ChunkPass& pass, const Dims& d, const float* x, float loss_scale);
void head_pass_release(Model& model, ChunkPass& pass);

}  // namespace alloy
