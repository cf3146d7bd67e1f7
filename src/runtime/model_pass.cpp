// Forward and backward passes of a model chunk for one micro-batch, block by block, with
// per-layer recomputation and tensor-parallel blocks: column- then row-parallel, one all-reduce
// after each half forward and one before each norm backward, or with sequence parallelism an
// all-gather before each column-parallel layer and a reduce-scatter after each row-parallel one
// (norms and residuals then run on this rank's N / tp rows). Every activation and workspace
// buffer comes from the device arena.
#include <cstring>

#include <fmt/format.h>

#include "runtime/cpu/activation.hpp"
#include "runtime/cpu/attention.hpp"
#include "runtime/cpu/moe.hpp"
#include "runtime/cpu/embedding.hpp"
#include "runtime/cpu/loss.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/cpu/norm.hpp"
#include "runtime/model.hpp"
#include "runtime/model_internal.hpp"
#include "util/clock.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Allocation order matches block_activation_tensors() so the arena's accounting is comparable.
// Norm outputs hold all N rows (gathered under sequence parallelism); statistics, residuals and
// block outputs hold this rank's Nn rows.
void allocate_attention_inputs(const Model& model, const Dims& d, BlockActivations& a) {
  a.ln1 = take(model, int64_t{d.N} * d.C, "attn_norm.out");
  if (d.gpt2) a.ln1_mean = take(model, d.Nn, "attn_norm.mean");
  a.ln1_rstd = take(model, d.Nn, "attn_norm.rstd");
  a.qkv = take(model, int64_t{d.N} * d.R, "attn.qkv");
}

void allocate_attention_internals(const Model& model, const Dims& d, BlockActivations& a) {
  a.probs = take(model, int64_t{d.B} * d.Hq * d.T * d.T, "attn.probs");
  a.context = take(model, int64_t{d.N} * d.Hq * d.D, "attn.context");
}

void allocate_mlp(const Model& model, const Dims& d, int layer, BlockActivations& a) {
  a.residual1 = take(model, int64_t{d.Nn} * d.C, "attn.residual");
  a.ln2 = take(model, int64_t{d.N} * d.C, "mlp_norm.out");
  if (d.gpt2) a.ln2_mean = take(model, d.Nn, "mlp_norm.mean");
  a.ln2_rstd = take(model, d.Nn, "mlp_norm.rstd");
  if (model_block_is_moe(model.spec, layer)) {
    moe_allocate(model, d, a);
    return;
  }
  a.mlp_up = take(model, int64_t{d.N} * (d.gpt2 ? d.F : 2 * d.F), "mlp.up");
  a.mlp_act = take(model, int64_t{d.N} * d.F, "mlp.act");
}

// out: (Nn, C) = residual + inp W^T + b for a row-parallel layer; inp: (N, K) this rank's
// features. The partial products are summed over the tensor-parallel group.
void row_parallel_forward(const Model& model, const Dims& d, float* out, const float* inp, const float* w,
                          const float* b, int K, const float* residual) {
  const float* bias = d.tp_rank == 0 ? b : nullptr;
  if (!d.sp) {
    matmul_forward(out, inp, w, bias, d.N, K, d.C);
    tp_sum(model, out, int64_t{d.N} * d.C);
    residual_forward(out, out, residual, int64_t{d.N} * d.C);
    return;
  }
  float* partial = take(model, int64_t{d.N} * d.C, "row-parallel partial");
  matmul_forward(partial, inp, w, bias, d.N, K, d.C);
  sp_reduce_scatter(model, d, partial);
  residual_forward(out, partial + d.row_offset(), residual, int64_t{d.Nn} * d.C);
  give(model, partial);
}

// Norm of this rank's rows of x into its rows of out: (N, C), then all rows gathered.
void norm_gathered(const Model& model, const Dims& d, float* out, float* mean, float* rstd, const float* x,
                   const float* w, const float* b) {
  norm_forward(model, d, out + (d.sp ? d.row_offset() : 0), mean, rstd, x, w, b);
  if (d.sp) sp_gather(model, d, out);
}

// x: (Nn, C) -> a.residual1 = x + attn(norm1(x)); fills ln1, qkv, probs, context on the way.
void attention_half_forward(const Model& model, const Dims& d, const BlockTensors& w,
                            const float* x, BlockActivations& a) {
  norm_gathered(model, d, a.ln1, a.ln1_mean, a.ln1_rstd, x, w.attn_norm_w, w.attn_norm_b);
  matmul_forward(a.qkv, a.ln1, w.qkv_w, w.qkv_b, d.N, d.C, d.R);
  if (!d.gpt2) {
    rope_forward(a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, model.rope_frequencies.data());
  }
  attention_forward(a.context, a.probs, a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, d.window);
  row_parallel_forward(model, d, a.residual1, a.context, w.out_w, w.out_b, d.Hq * d.D, x);
}

// a.residual1 -> ln2, mlp_up, mlp_act (or the MoE MLP's activations); and a.out = residual1 +
// mlp(...) when with_output. counted: a forward whose MoE routing the model and pass count.
void mlp_half_forward(Model& model, const Dims& d, int layer, BlockActivations& a, bool with_output,
                      ChunkPass* counted) {
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  norm_gathered(model, d, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual1, w.mlp_norm_w, w.mlp_norm_b);
  if (model_block_is_moe(model.spec, layer)) {
    moe_mlp_forward(model, d, layer, a, with_output, counted);
    return;
  }
  if (d.gpt2) {
    matmul_forward(a.mlp_up, a.ln2, w.up_w, w.up_b, d.N, d.C, d.F);
    gelu_forward(a.mlp_act, a.mlp_up, int64_t{d.N} * d.F);
  } else {
    matmul_forward(a.mlp_up, a.ln2, w.up_w, nullptr, d.N, d.C, 2 * d.F);
    swiglu_forward(a.mlp_act, a.mlp_up, d.N, d.F);
  }
  if (with_output) row_parallel_forward(model, d, a.out, a.mlp_act, w.down_w, w.down_b, d.F, a.residual1);
}

void release_block(Model& model, BlockActivations& a) {
  for (float** buffer : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.probs, &a.context,
                         &a.residual1, &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.mlp_up, &a.mlp_act,
                         &a.out, &a.moe_probs, &a.moe_experts, &a.moe_weights, &a.moe_slots, &a.moe_offsets,
                         &a.moe_up, &a.moe_act, &a.moe_out, &a.shared_up, &a.shared_act, &a.shared_out,
                         &a.shared_gate, &a.moe_aux_sums, &a.moe_ep_counts, &a.moe_ep_in}) {
    give(model, *buffer);
  }
}

void block_forward(Model& model, ChunkPass& pass, const Dims& d, int layer, const float* x) {
  BlockActivations& a = pass.blocks[static_cast<size_t>(layer - pass.block_begin)];
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const Recompute level = model.recompute[static_cast<size_t>(layer)];
  allocate_attention_inputs(model, d, a);
  allocate_attention_internals(model, d, a);
  allocate_mlp(model, d, layer, a);
  a.out = take(model, int64_t{d.Nn} * d.C, "output");
  attention_half_forward(model, d, w, x, a);
  mlp_half_forward(model, d, layer, a, true, &pass);
  if (level != Recompute::Recompute_none) {
    give(model, a.probs);
    give(model, a.context);
  }
  if (level == Recompute::Recompute_full) {
    float* out = a.out;
    a.out = nullptr;
    release_block(model, a);
    a.out = out;
  }
}

// Rebuilds what the block's recomputation level dropped, from its input x.
void block_recompute(Model& model, ChunkPass& pass, const Dims& d, int layer, const float* x) {
  BlockActivations& a = pass.blocks[static_cast<size_t>(layer - pass.block_begin)];
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  switch (model.recompute[static_cast<size_t>(layer)]) {
    case Recompute::Recompute_none:
      return;
    case Recompute::Recompute_selective:
      allocate_attention_internals(model, d, a);
      attention_forward(a.context, a.probs, a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, d.window);
      return;
    case Recompute::Recompute_full:
      allocate_attention_inputs(model, d, a);
      allocate_attention_internals(model, d, a);
      allocate_mlp(model, d, layer, a);
      attention_half_forward(model, d, w, x, a);
      mlp_half_forward(model, d, layer, a, false, nullptr);
      return;
  }
}

// dres: (Nn, C) this rank's rows of the residual gradient -> (N, C) all rows, as the row-parallel
// layers' backward needs them (dres itself, or a gathered copy under sequence parallelism).
const float* gradient_all_rows(const Model& model, const Dims& d, const float* dres, float* scratch) {
  if (!d.sp) return dres;
  std::memcpy(scratch + d.row_offset(), dres, static_cast<size_t>(d.Nn) * d.C * sizeof(float));
  sp_gather(model, d, scratch);
  return scratch;
}

// dln: (N, C) this rank's part of the gradient of a column-parallel layer's input -> summed over
// the group; returns this rank's rows of it.
const float* column_parallel_input_gradient(const Model& model, const Dims& d, float* dln) {
  if (!d.sp) {
    tp_sum(model, dln, int64_t{d.N} * d.C);
    return dln;
  }
  sp_reduce_scatter(model, d, dln);
  return dln + d.row_offset();
}

// The dense MLP's backward: dres (Nn, C) d(block output) -> returns dln (N, C) d(mlp_norm.out)
// (this rank's part), and its weight gradients.
float* dense_mlp_backward(Model& model, const Dims& d, int layer, const BlockActivations& a, const float* dres,
                          float* gathered) {
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const BlockTensors& g = model.gradients.blocks[static_cast<size_t>(layer)];
  const int up_width = d.gpt2 ? d.F : 2 * d.F;
  float* dact = take_zeroed(model, int64_t{d.N} * d.F, "d mlp.act");
  linear_backward(model, dact, &g.down_w, &g.down_b, gradient_all_rows(model, d, dres, gathered), a.mlp_act, w.down_w,
                  d.N, d.F, d.C);
  float* dup = take_zeroed(model, int64_t{d.N} * up_width, "d mlp.up");
  if (d.gpt2) {
    gelu_backward(dup, a.mlp_up, dact, int64_t{d.N} * d.F);
  } else {
    swiglu_backward(dup, a.mlp_up, dact, d.N, d.F);
  }
  give(model, dact);
  float* dln = take_zeroed(model, int64_t{d.N} * d.C, "d norm.out");
  linear_backward(model, dln, &g.up_w, &g.up_b, dup, a.ln2, w.up_w, d.N, d.C, up_width);
  give(model, dup);
  return dln;
}

// dres: (Nn, C) holds dL/d(block output) on entry and dL/d(block input x) on exit. aux_scale:
// d(objective) / d(an MoE block's load-balancing term).
void block_backward(Model& model, ChunkPass& pass, const Dims& d, int layer, const float* x, float* dres,
                    float aux_scale) {
  block_recompute(model, pass, d, layer, x);
  BlockActivations& a = pass.blocks[static_cast<size_t>(layer - pass.block_begin)];
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const BlockTensors& g = model.gradients.blocks[static_cast<size_t>(layer)];
  const int64_t NC = int64_t{d.N} * d.C;
  float* gathered = d.sp ? take(model, NC, "d residual, all rows") : nullptr;
  float* dln = nullptr;
  const float* dnorm_out = nullptr;  // this rank's rows of d(mlp_norm.out), summed over tp
  if (model_block_is_moe(model.spec, layer)) {
    // Every tensor-parallel rank ran the whole MoE MLP on all rows: its input gradient is complete
    // on each rank, not a partial sum.
    dln = take_zeroed(model, NC, "d norm.out");
    const double* pooled = pass.balance_pooled ? pass.balance_sums.data() : nullptr;
    moe_mlp_backward(model, d, layer, a, gradient_all_rows(model, d, dres, gathered), dln, aux_scale, pooled);
    dnorm_out = dln + (d.sp ? d.row_offset() : 0);
  } else {
    dln = dense_mlp_backward(model, d, layer, a, dres, gathered);
    dnorm_out = column_parallel_input_gradient(model, d, dln);
  }
  norm_backward(model, d, dres, &g.mlp_norm_w, &g.mlp_norm_b, dnorm_out, a.residual1, w.mlp_norm_w, a.ln2_mean,
                a.ln2_rstd);

  float* dcontext = take_zeroed(model, int64_t{d.N} * d.Hq * d.D, "d attn.context");
  linear_backward(model, dcontext, &g.out_w, &g.out_b, gradient_all_rows(model, d, dres, gathered), a.context, w.out_w,
                  d.N, d.Hq * d.D, d.C);
  give(model, gathered);
  float* dqkv = take_zeroed(model, int64_t{d.N} * d.R, "d attn.qkv");
  float* scratch = take(model, attention_backward_scratch_floats(d.T), "attention scratch");
  attention_backward(dqkv, scratch, dcontext, a.probs, a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, d.window);
  give(model, scratch);
  give(model, dcontext);
  if (!d.gpt2) {
    rope_backward(dqkv, d.B, d.T, d.Hq, d.Hkv, d.D, model.rope_frequencies.data());
  }
  std::memset(dln, 0, static_cast<size_t>(NC) * sizeof(float));
  linear_backward(model, dln, &g.qkv_w, &g.qkv_b, dqkv, a.ln1, w.qkv_w, d.N, d.C, d.R);
  give(model, dqkv);
  norm_backward(model, d, dres, &g.attn_norm_w, &g.attn_norm_b, column_parallel_input_gradient(model, d, dln), x,
                w.attn_norm_w, a.ln1_mean, a.ln1_rstd);
  give(model, dln);
}

// Input of block `layer` of the pass: the chunk input for its first block, else the previous
// block's output.
const float* block_input(const ChunkPass& pass, const Dims& d, int layer) {
  if (layer == pass.block_begin) return pass.input + (d.sp ? d.row_offset() : 0);
  return pass.blocks[static_cast<size_t>(layer - 1 - pass.block_begin)].out;
}

// The chunk's output with all rows: the last block's output, or its rows gathered from the
// group under sequence parallelism.
const float* chunk_output(Model& model, ChunkPass& pass, const Dims& d) {
  const float* last = block_input(pass, d, pass.block_end);
  if (!d.sp) return last;
  if (pass.output == nullptr) {
    pass.output = take(model, int64_t{d.N} * d.C, "stage output");
    std::memcpy(pass.output + d.row_offset(), last, static_cast<size_t>(d.Nn) * d.C * sizeof(float));
    sp_gather(model, d, pass.output);
  }
  return pass.output;
}

}  // namespace

void chunk_begin(Model& model, ChunkPass& pass, int block_begin, int block_end, bool embeds, bool heads,
                 const int32_t* inputs, const int32_t* targets, int B, int T) {
  model_check_tokens(model, embeds ? inputs : nullptr, heads ? targets : nullptr, B, T);
  chunk_release(model, pass);
  pass.B = B;
  pass.T = T;
  pass.block_begin = block_begin;
  pass.block_end = block_end;
  pass.embeds = embeds;
  pass.heads = heads;
  const int64_t N = int64_t{B} * T;
  if (embeds) pass.inputs.assign(inputs, inputs + N);
  if (heads) pass.targets.assign(targets, targets + N);
  pass.blocks.assign(static_cast<size_t>(block_end - block_begin), BlockActivations{});
  pass.backward_next = block_end;
  pass.aux_loss = 0.0f;
  pass.balance_sums.assign(model_balance_is_pooled(model.spec) ? 2 * model.spec.moe.num_experts + 1 : 0, 0.0);
  pass.balance_pooled = false;
  pass.active = true;
  pass.input = take(model, N * model.spec.hidden_size, embeds ? "embedding output" : "stage input");
  if (model.shard.sequence_parallel && model.shard.tp > 1 && N % model.shard.tp != 0) {
    throw Error(fmt::format("sequence parallelism over {} ranks needs the micro-batch's {} tokens to divide evenly",
                            model.shard.tp, N),
                {"", "micro_batch_sequences"}, "choose a micro-batch whose tokens divide by tp");
  }
}

// Adds the CPU time this thread spends in its scope to the model's tally for `kind`, when the
// model keeps one (waits block without CPU time, so they stay out).
class LayerCpuTimer {
 public:
  LayerCpuTimer(const Model& model, LayerKind kind)
      : tally_(model.layer_cpu_seconds), kind_(kind), start_(tally_ ? thread_cpu_seconds() : 0) {}
  ~LayerCpuTimer() {
    if (tally_) (*tally_)[static_cast<size_t>(kind_)] += thread_cpu_seconds() - start_;
  }
  LayerCpuTimer(const LayerCpuTimer&) = delete;
  LayerCpuTimer& operator=(const LayerCpuTimer&) = delete;

 private:
  std::array<double, kLayerKinds>* tally_;
  LayerKind kind_;
  double start_;
};

const float* chunk_forward(Model& model, ChunkPass& pass) {
  const Dims d = model_dims(model, pass);
  if (pass.embeds) {
    UnitWeights weights(model, kUnitEmbedding, false);
    LayerCpuTimer timer(model, LayerKind::LayerKind_embedding);
    embedding_pass_forward(model, pass, dims_all_rows(d));
  }
  for (int layer = pass.block_begin; layer < pass.block_end; layer++) {
    UnitWeights weights(model, layer, false);
    {
      LayerCpuTimer timer(model, LayerKind::LayerKind_block);
      block_forward(model, pass, d, layer, block_input(pass, d, layer));
    }
    if (model.activation_store != nullptr) model.activation_store->saved(pass, layer);
  }
  const float* out = chunk_output(model, pass, d);
  if (!pass.heads) return out;
  UnitWeights weights(model, kUnitHead, false);
  LayerCpuTimer timer(model, LayerKind::LayerKind_head);
  pass.loss = head_pass_forward(model, pass, dims_all_rows(d), out);
  return nullptr;
}

void chunk_balance_pool(const Model& model, ChunkPass& pass, const double* sums) {
  const int E = static_cast<int>(model.spec.moe.num_experts);
  if (!model_balance_is_pooled(model.spec) || !pass.active) {
    throw Error("pooled load-balancing sums given to a pass that has none to pool");
  }
  pass.balance_sums.assign(sums, sums + 2 * E + 1);
  pass.balance_pooled = true;
  pass.aux_loss = static_cast<float>(moe_aux_loss_from_sums(sums, sums[2 * E], E));
}

float* chunk_output_gradient(Model& model, ChunkPass& pass) {
  if (pass.gradient == nullptr) {
    pass.gradient = take_zeroed(model, int64_t{pass.B} * pass.T * model.spec.hidden_size, "d residual");
  }
  return pass.gradient;
}

const float* chunk_backward(Model& model, ChunkPass& pass, int block_begin, int block_end, float loss_scale) {
  if (!pass.active || block_end != pass.backward_next || block_begin < pass.block_begin || block_begin > block_end) {
    throw Error(fmt::format("backward of blocks [{}, {}) out of order: the pass expects blocks ending at {}",
                            block_begin, block_end, pass.backward_next));
  }
  if (model_balance_is_pooled(model.spec) && !pass.balance_pooled) {
    throw Error("chunk backward started without the micro-batch's pooled load-balancing sums (chunk_balance_pool)");
  }
  const Dims d = model_dims(model, pass);
  if (block_end == pass.block_end && pass.heads) {
    UnitWeights weights(model, kUnitHead, true);
    LayerCpuTimer timer(model, LayerKind::LayerKind_head);
    head_pass_backward(model, pass, dims_all_rows(d), chunk_output(model, pass, d), loss_scale);
  }
  if (pass.gradient == nullptr) throw Error("chunk backward started without the gradient of its output");
  float* dres = pass.gradient + (d.sp ? d.row_offset() : 0);
  const int64_t moe_blocks = moe_block_count(model.spec);
  const float aux_scale = moe_blocks == 0 ? 0.0f
                                          : static_cast<float>(loss_scale * model.spec.moe.router_aux_loss_coef /
                                                               static_cast<double>(moe_blocks));
  for (int layer = block_end - 1; layer >= block_begin; layer--) {
    UnitWeights weights(model, layer, true);
    if (model.activation_store != nullptr) model.activation_store->needed(pass, layer);
    {
      LayerCpuTimer timer(model, LayerKind::LayerKind_block);
      block_backward(model, pass, d, layer, block_input(pass, d, layer), dres, aux_scale);
    }
    release_block(model, pass.blocks[static_cast<size_t>(layer - pass.block_begin)]);
  }
  pass.backward_next = block_begin;
  if (block_begin != pass.block_begin) return nullptr;
  if (d.sp) sp_gather(model, d, pass.gradient);
  if (!pass.embeds) return pass.gradient;
  LayerCpuTimer timer(model, LayerKind::LayerKind_embedding);
  embedding_pass_backward(model, pass, dims_all_rows(d));
  return nullptr;
}

void chunk_release(Model& model, ChunkPass& pass) {
  if (!pass.active) return;
  if (model.activation_store != nullptr) model.activation_store->dropped(pass);
  for (BlockActivations& a : pass.blocks) release_block(model, a);
  head_pass_release(model, pass);
  give(model, pass.input);
  give(model, pass.output);
  give(model, pass.gradient);
  pass.active = false;
}

float model_forward(Model& model, const int32_t* inputs, const int32_t* targets, int B, int T) {
  chunk_begin(model, model.pass, 0, static_cast<int>(model.spec.num_layers), true, true, inputs, targets, B, T);
  chunk_forward(model, model.pass);
  // The one pass holds every MoE block and token of the micro-batch.
  if (model_balance_is_pooled(model.spec)) chunk_balance_pool(model, model.pass, model.pass.balance_sums.data());
  return model.pass.loss;
}

void model_backward(Model& model, float loss_scale) {
  if (!model.pass.active) {
    throw Error("model_backward called without a preceding model_forward");
  }
  chunk_backward(model, model.pass, model.pass.block_begin, model.pass.block_end, loss_scale);
  chunk_release(model, model.pass);
}

void model_release_activations(Model& model) { chunk_release(model, model.pass); }

}  // namespace alloy
