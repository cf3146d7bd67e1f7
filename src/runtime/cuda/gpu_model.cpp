// Forward and backward of the GPU model, block by block, on one stream: LayerNorm/RMSNorm, the
// q/k/v product, (RoPE), fused attention, the output product with the residual added in
// cuBLASLt's epilogue, the MLP, and the head with fused softmax cross-entropy. Every activation
// and scratch buffer comes from the GPU arena, so its peak is the measured activation memory.
#include "runtime/cuda/gpu_model.hpp"

#include <utility>

#include <fmt/format.h>

#include "runtime/cuda/attention.hpp"
#include "runtime/cuda/gpu_moe.hpp"
#include "runtime/cuda/kernels.hpp"
#include "runtime/model_internal.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Sizes of one micro-batch: N = B T rows; R = (Hq + 2 Hkv) D; U = the up projection's width.
struct GpuDims {
  int B, T, N, C, Hq, Hkv, D, R, F, U, V, ld;
  bool gpt2;
  float eps, theta;
};

GpuDims gpu_dims(const GpuModel& m, const GpuActivations& a) {
  const ModelSpec& s = m.host->spec;
  GpuDims d{};
  d.B = a.B;
  d.T = a.T;
  d.N = a.B * a.T;
  d.C = static_cast<int>(s.hidden_size);
  d.Hq = static_cast<int>(s.num_heads);
  d.Hkv = static_cast<int>(s.num_kv_heads);
  d.D = static_cast<int>(s.head_dim);
  d.R = (d.Hq + 2 * d.Hkv) * d.D;
  d.F = static_cast<int>(s.ffn_hidden_size);
  d.gpt2 = s.family == ModelFamily::ModelFamily_gpt2;
  d.U = d.gpt2 ? d.F : 2 * d.F;
  d.V = static_cast<int>(s.vocab_size);
  d.ld = gpu_logits_ld(s.vocab_size);
  d.eps = static_cast<float>(s.norm_eps);
  d.theta = static_cast<float>(s.rope_theta);
  return d;
}

void norm_forward(const GpuModel& m, const GpuDims& d, bf16* out, float* mean, float* rstd, const bf16* inp,
                  const float* w, const float* b) {
  if (d.gpt2) {
    cuda_layernorm_forward(out, mean, rstd, inp, m.weight(w), m.weight(b), d.N, d.C, d.eps, m.stream);
  } else {
    cuda_rmsnorm_forward(out, rstd, inp, m.weight(w), d.N, d.C, d.eps, m.stream);
  }
}

// dout: (N, C) -> dinp: (N, C) +=, and the norm's weight (and bias) gradients.
void norm_backward(const GpuModel& m, const GpuDims& d, bf16* dinp, const bf16* dout, const bf16* inp, const float* w,
                   const float* b, const float* mean, const float* rstd) {
  if (d.gpt2) {
    cuda_layernorm_backward(dinp, m.gradient(w), m.gradient(b), dout, inp, m.weight(w), mean, rstd, d.N, d.C,
                            m.stream);
  } else {
    cuda_rmsnorm_backward(dinp, m.gradient(w), dout, inp, m.weight(w), rstd, d.N, d.C, m.stream);
  }
}

// The dense MLP's activations only for a dense block: an MoE block takes its own (gpu_moe.cpp).
void allocate_block(GpuModel& m, const GpuDims& d, GpuBlockActivations& a, bool moe) {
  const int64_t NC = int64_t{d.N} * d.C;
  a.ln1 = gpu_take<bf16>(m, NC, "attn_norm.out");
  if (d.gpt2) a.ln1_mean = gpu_take<float>(m, d.N, "attn_norm.mean");
  a.ln1_rstd = gpu_take<float>(m, d.N, "attn_norm.rstd");
  a.qkv = gpu_take<bf16>(m, int64_t{d.N} * d.R, "attn.qkv");
  a.context = gpu_take<bf16>(m, int64_t{d.N} * d.Hq * d.D, "attn.context");
  a.lse = gpu_take<float>(m, int64_t{d.B} * d.Hq * d.T, "attn.lse");
  a.residual1 = gpu_take<bf16>(m, NC, "attn.residual");
  a.ln2 = gpu_take<bf16>(m, NC, "mlp_norm.out");
  if (d.gpt2) a.ln2_mean = gpu_take<float>(m, d.N, "mlp_norm.mean");
  a.ln2_rstd = gpu_take<float>(m, d.N, "mlp_norm.rstd");
  if (!moe) {
    a.mlp_up = gpu_take<bf16>(m, int64_t{d.N} * d.U, "mlp.up");
    a.mlp_act = gpu_take<bf16>(m, int64_t{d.N} * d.F, "mlp.act");
  }
  if (a.out == nullptr) a.out = gpu_take<bf16>(m, NC, "output");
}

// Everything but the block's output, which the next block reads.
void release_block_internals(GpuModel& m, GpuBlockActivations& a) {
  gpu_give(m, a.ln1);
  gpu_give(m, a.ln1_mean);
  gpu_give(m, a.ln1_rstd);
  gpu_give(m, a.qkv);
  gpu_give(m, a.context);
  gpu_give(m, a.lse);
  gpu_give(m, a.residual1);
  gpu_give(m, a.ln2);
  gpu_give(m, a.ln2_mean);
  gpu_give(m, a.ln2_rstd);
  gpu_give(m, a.mlp_up);
  gpu_give(m, a.mlp_act);
  gpu_moe_release(m, a);
}

// x: (N, C) -> a.out: (N, C) = block(x), filling every activation on the way. Without
// `with_output` it stops before the MLP's output projection: a recomputation keeps a.out, which
// the backward does not read.
// An MoE block's MLP is gpu_moe_forward's; `counted`: the pass's first forward of it.
void block_forward(GpuModel& m, GpuActivations& pass, const GpuDims& d, int layer, const bf16* x,
                   GpuBlockActivations& a, bool with_output, bool counted) {
  const BlockTensors& w = m.host->weights.blocks[static_cast<size_t>(layer)];
  cudaStream_t s = m.stream;
  norm_forward(m, d, a.ln1, a.ln1_mean, a.ln1_rstd, x, w.attn_norm_w, w.attn_norm_b);
  m.matmul.forward(a.qkv, a.ln1, m.weight(w.qkv_w), m.weight(w.qkv_b), nullptr, d.N, d.C, d.R, d.R, s);
  if (!d.gpt2) cuda_rope_forward(a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, d.theta, s);
  cuda_attention_forward(a.context, a.lse, a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, s);
  m.matmul.forward(a.residual1, a.context, m.weight(w.out_w), m.weight(w.out_b), x, d.N, d.Hq * d.D, d.C, d.C, s);
  norm_forward(m, d, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual1, w.mlp_norm_w, w.mlp_norm_b);
  if (model_block_is_moe(m.host->spec, layer)) {
    gpu_moe_forward(m, pass, layer, a, with_output, counted);
    return;
  }
  m.matmul.forward(a.mlp_up, a.ln2, m.weight(w.up_w), m.weight(w.up_b), nullptr, d.N, d.C, d.U, d.U, s);
  if (d.gpt2) {
    cuda_gelu_forward(a.mlp_act, a.mlp_up, int64_t{d.N} * d.F, s);
  } else {
    cuda_swiglu_forward(a.mlp_act, a.mlp_up, d.N, d.F, s);
  }
  if (with_output)
    m.matmul.forward(a.out, a.mlp_act, m.weight(w.down_w), m.weight(w.down_b), a.residual1, d.N, d.F, d.C, d.C, s);
}

// scratch.dres holds dL/d(block output) on entry and dL/d(block input x) on exit.
// sc.dres: (N, C) d(block output) -> sc.dln: (N, C) d(mlp_norm.out) (overwritten), and the
// dense MLP's weight gradients.
void dense_mlp_backward(GpuModel& m, const GpuDims& d, const BlockTensors& w, const GpuBlockActivations& a,
                        GpuBackwardScratch& sc) {
  cudaStream_t s = m.stream;
  CudaMatmul& mm = m.matmul;
  mm.backward_input(sc.dact, sc.dres, m.weight(w.down_w), d.N, d.F, d.C, d.C, false, s);
  mm.backward_weight(m.gradient(w.down_w), sc.dres, a.mlp_act, d.N, d.F, d.C, d.C, s);
  if (w.down_b != nullptr) cuda_bias_backward(m.gradient(w.down_b), sc.dres, d.N, d.C, s);
  bf16* dup = sc.dact;
  if (d.gpt2) {
    cuda_gelu_backward(sc.dact, a.mlp_up, sc.dact, int64_t{d.N} * d.F, s);
  } else {
    cuda_swiglu_backward(sc.dup, a.mlp_up, sc.dact, d.N, d.F, s);
    dup = sc.dup;
  }
  mm.backward_input(sc.dln, dup, m.weight(w.up_w), d.N, d.C, d.U, d.U, false, s);
  mm.backward_weight(m.gradient(w.up_w), dup, a.ln2, d.N, d.C, d.U, d.U, s);
  if (w.up_b != nullptr) cuda_bias_backward(m.gradient(w.up_b), dup, d.N, d.U, s);
}

// scratch.dres holds dL/d(block output) on entry and dL/d(block input x) on exit. aux_scale:
// d(objective) / d(an MoE block's load-balancing term).
void block_backward(GpuModel& m, const GpuActivations& pass, const GpuDims& d, int layer, const bf16* x,
                    const GpuBlockActivations& a, GpuBackwardScratch& sc, float aux_scale) {
  cudaStream_t s = m.stream;
  CudaMatmul& mm = m.matmul;
  const BlockTensors& w = m.host->weights.blocks[static_cast<size_t>(layer)];
  if (model_block_is_moe(m.host->spec, layer)) {
    gpu_moe_backward(m, pass, layer, a, sc.dres, sc.dln, aux_scale);
  } else {
    dense_mlp_backward(m, d, w, a, sc);
  }
  norm_backward(m, d, sc.dres, sc.dln, a.residual1, w.mlp_norm_w, w.mlp_norm_b, a.ln2_mean, a.ln2_rstd);

  const int HD = d.Hq * d.D;
  mm.backward_input(sc.dcontext, sc.dres, m.weight(w.out_w), d.N, HD, d.C, d.C, false, s);
  mm.backward_weight(m.gradient(w.out_w), sc.dres, a.context, d.N, HD, d.C, d.C, s);
  if (w.out_b != nullptr) cuda_bias_backward(m.gradient(w.out_b), sc.dres, d.N, d.C, s);
  cuda_attention_backward(sc.dqkv, sc.attention_workspace, sc.dcontext, a.qkv, a.context, a.lse, d.B, d.T, d.Hq,
                          d.Hkv, d.D, s);
  if (!d.gpt2) cuda_rope_backward(sc.dqkv, d.B, d.T, d.Hq, d.Hkv, d.D, d.theta, s);
  mm.backward_input(sc.dln, sc.dqkv, m.weight(w.qkv_w), d.N, d.C, d.R, d.R, false, s);
  mm.backward_weight(m.gradient(w.qkv_w), sc.dqkv, a.ln1, d.N, d.C, d.R, d.R, s);
  if (w.qkv_b != nullptr) cuda_bias_backward(m.gradient(w.qkv_b), sc.dqkv, d.N, d.R, s);
  norm_backward(m, d, sc.dres, sc.dln, x, w.attn_norm_w, w.attn_norm_b, a.ln1_mean, a.ln1_rstd);
}

void mark(const GpuModel& m, const std::vector<cudaEvent_t> GpuPhaseEvents::*which, size_t index) {
  if (m.phases != nullptr) cuda_check(cudaEventRecord((m.phases->*which)[index], m.stream), "recording a phase event");
}

const bf16* block_input(const GpuActivations& a, int layer) {
  return layer == a.chunk.block_begin ? a.input : a.blocks[static_cast<size_t>(layer - 1)].out;
}

void release_head(GpuModel& m, GpuActivations& a) {
  gpu_give(m, a.lnf);
  gpu_give(m, a.lnf_mean);
  gpu_give(m, a.lnf_rstd);
  gpu_give(m, a.logits);
}

// dres stays when the output's gradient was received into it (gpu_output_gradient).
void take_scratch(GpuModel& m, const GpuDims& d, GpuBackwardScratch& sc) {
  const int64_t NC = int64_t{d.N} * d.C;
  if (sc.dres == nullptr) sc.dres = gpu_take<bf16>(m, NC, "d residual");
  sc.dact = gpu_take<bf16>(m, int64_t{d.N} * d.F, "d mlp.act");
  if (!d.gpt2) sc.dup = gpu_take<bf16>(m, int64_t{d.N} * d.U, "d mlp.up");
  sc.dln = gpu_take<bf16>(m, NC, "d norm.out");
  sc.dcontext = gpu_take<bf16>(m, int64_t{d.N} * d.Hq * d.D, "d attn.context");
  sc.dqkv = gpu_take<bf16>(m, int64_t{d.N} * d.R, "d attn.qkv");
  sc.attention_workspace =
      m.arena->allocate(cuda_attention_backward_workspace_bytes(d.B, d.T, d.Hq, d.Hkv, d.D), "attention workspace");
}

void give_scratch(GpuModel& m, GpuBackwardScratch& sc) {
  m.arena->release(sc.attention_workspace);
  sc.attention_workspace = nullptr;
  for (bf16** buffer : {&sc.dres, &sc.dact, &sc.dup, &sc.dln, &sc.dcontext, &sc.dqkv}) gpu_give(m, *buffer);
}

// The head's backward, the top piece's first part. The loss's gradient is computed here rather
// than fused into the forward's cross-entropy: only the backward knows its loss_scale, and a
// forward may have no backward at all (validation). It costs one more read of the logits than
// the fused kernel and rounds dlogits to bf16 once, already scaled.
// -> sc.dres: (N, C) = dL/d(last block's output)
void head_backward(GpuModel& m, const GpuDims& d, GpuActivations& a, float loss_scale) {
  const ModelTensors& w = m.host->weights;
  cudaStream_t s = m.stream;
  GpuBackwardScratch& sc = a.scratch;
  cuda_crossentropy(a.logits, a.losses, a.targets, d.N, d.V, d.ld, loss_scale / static_cast<float>(d.N), true, s);
  m.matmul.backward_input(sc.dln, a.logits, m.head_weight, d.N, d.C, d.ld, d.ld, false, s);
  m.matmul.backward_weight(m.gradient(w.lm_head), a.logits, a.lnf, d.N, d.C, d.V, d.ld, s);
  cuda_check(cudaMemsetAsync(sc.dres, 0, static_cast<size_t>(d.N) * d.C * sizeof(bf16), s), "zeroing d residual");
  norm_backward(m, d, sc.dres, sc.dln, gpu_chunk_output(a), w.final_norm_w, w.final_norm_b, a.lnf_mean, a.lnf_rstd);
  release_head(m, a);
}

// Throws alloy::Error unless the stage holds `c`'s blocks, and its embedding and head where `c` runs them.
void check_chunk(const GpuModel& m, const GpuChunk& c) {
  const ModelShard& shard = m.host->shard;
  const int L = static_cast<int>(m.host->spec.num_layers);
  bool held = false;
  for (const auto& [first, end] : shard.block_ranges) held = held || (first <= c.block_begin && c.block_end <= end);
  held = held && c.block_begin >= 0 && c.block_begin <= c.block_end && c.block_end <= L;
  if (held && (!c.embeds || (c.block_begin == 0 && shard.has_embedding)) && (!c.heads || (c.block_end == L && shard.has_head)))
    return;
  throw Error(fmt::format("the GPU model's stage does not hold blocks [{}, {}){}{}", c.block_begin, c.block_end,
                          c.embeds ? " with the embedding" : "", c.heads ? " with the head" : ""));
}

void upload_weights(GpuModel& m) {
  const size_t bytes = static_cast<size_t>(m.num_parameters) * sizeof(float);
  cuda_check(cudaMemcpyAsync(m.params, m.host->params, bytes, cudaMemcpyHostToDevice, m.stream), "uploading weights");
  cuda_float_to_bf16(m.weights, m.params, m.num_parameters, m.stream);
  gpu_model_refresh_head(m);
  cuda_check(cudaStreamSynchronize(m.stream), "uploading weights");
}

}  // namespace

int gpu_logits_ld(int64_t vocab_size) { return static_cast<int>((vocab_size + 63) / 64 * 64); }

GpuModel::GpuModel(const Model& host_model, Arena& device_arena, cudaStream_t compute_stream)
    : host(&host_model), arena(&device_arena), stream(compute_stream), num_parameters(host_model.num_parameters) {
  const ModelSpec& s = host->spec;
  const ModelShard& shard = host->shard;
  if (shard.tp != 1) {
    throw Error(fmt::format("the GPU model does not split layers by tensor parallelism (tp {}) yet", shard.tp),
                {"", "--device"}, "run tensor-parallel plans on CPU ranks, or re-plan with --tp 1");
  }
  if (s.rope_scaling.type != RopeScalingType::RopeScalingType_none || s.sliding_window > 0) {
    throw Error(fmt::format("the GPU model implements neither RoPE scaling nor sliding-window attention yet, which "
                            "model {} uses",
                            s.name),
                {s.source_path, s.sliding_window > 0 ? "sliding_window" : "rope_scaling"},
                "train this model on CPU ranks (--device cpu)");
  }
  cuda_attention_check_shape(static_cast<int>(s.num_heads), static_cast<int>(s.num_kv_heads),
                             static_cast<int>(s.head_dim));
  gpu_moe_check(*host);
  params = gpu_take<float>(*this, num_parameters, "parameters (fp32)");
  grads = gpu_take<float>(*this, num_parameters, "gradients (fp32)");
  weights = gpu_take<bf16>(*this, num_parameters, "weights (bf16 copy)");
  if (shard.has_head) {
    const int64_t head_elements = int64_t{gpu_logits_ld(s.vocab_size)} * s.hidden_size;
    head_weight = gpu_take<bf16>(*this, head_elements, "lm_head (bf16, padded)");
    cuda_check(cudaMemsetAsync(head_weight, 0, static_cast<size_t>(head_elements) * sizeof(bf16), stream),
               "zeroing the padded head");
  }
  upload_weights(*this);
  gpu_model_zero_grad(*this);
}

GpuModel::~GpuModel() {
  gpu_give(*this, head_weight);
  gpu_give(*this, weights);
  gpu_give(*this, grads);
  gpu_give(*this, params);
}

bf16* GpuModel::weight(const float* host_tensor) const {
  return host_tensor == nullptr ? nullptr : weights + (host_tensor - host->params);
}

float* GpuModel::gradient(const float* host_tensor) const {
  return host_tensor == nullptr ? nullptr : grads + (host_tensor - host->params);
}

void gpu_model_refresh_head(GpuModel& m) {
  if (m.head_weight == nullptr) return;  // a stage without the head
  const ModelSpec& s = m.host->spec;
  const size_t bytes = static_cast<size_t>(s.vocab_size * s.hidden_size) * sizeof(bf16);
  cuda_check(cudaMemcpyAsync(m.head_weight, m.weight(m.host->weights.lm_head), bytes, cudaMemcpyDeviceToDevice,
                             m.stream),
             "refreshing the padded head");
}

void gpu_model_zero_grad(GpuModel& m) {
  cuda_check(cudaMemsetAsync(m.grads, 0, static_cast<size_t>(m.num_parameters) * sizeof(float), m.stream),
             "zeroing gradients");
}

void gpu_chunk_activations_begin(GpuModel& m, GpuActivations& a, const GpuChunk& chunk, const int32_t* inputs,
                                 const int32_t* targets, int B, int T) {
  check_chunk(m, chunk);
  model_check_tokens(*m.host, chunk.embeds ? inputs : nullptr, chunk.heads ? targets : nullptr, B, T);
  gpu_activations_release(m, a);
  a.B = B;
  a.T = T;
  a.chunk = chunk;
  const int64_t N = int64_t{B} * T;
  const size_t token_bytes = static_cast<size_t>(N) * sizeof(int32_t);
  if (chunk.embeds) {
    a.tokens = gpu_take<int32_t>(m, N, "token ids");
    cuda_check(cudaMemcpyAsync(a.tokens, inputs, token_bytes, cudaMemcpyHostToDevice, m.stream), "uploading tokens");
  }
  if (chunk.heads) {
    a.targets = gpu_take<int32_t>(m, N, "target ids");
    cuda_check(cudaMemcpyAsync(a.targets, targets, token_bytes, cudaMemcpyHostToDevice, m.stream), "uploading targets");
  }
  a.input = gpu_take<bf16>(m, N * m.host->spec.hidden_size, chunk.embeds ? "embedding.out" : "stage input");
}

void gpu_activations_begin(GpuModel& m, GpuActivations& a, const int32_t* inputs, const int32_t* targets, int B,
                           int T) {
  gpu_chunk_activations_begin(m, a, GpuChunk{0, static_cast<int>(m.host->spec.num_layers), true, true}, inputs,
                              targets, B, T);
}

void gpu_model_forward(GpuModel& m, GpuActivations& a) {
  if (a.input == nullptr || a.forwarded)
    throw Error("gpu_model_forward needs a pass begun and not yet run", {}, "call gpu_activations_begin first");
  const GpuDims d = gpu_dims(m, a);
  const ModelTensors& w = m.host->weights;
  cudaStream_t s = m.stream;
  const size_t L = static_cast<size_t>(m.host->spec.num_layers);
  mark(m, &GpuPhaseEvents::forward, 0);
  a.aux_loss = 0;
  a.balance_sums.clear();
  a.balance_pooled = false;
  if (a.chunk.embeds)
    cuda_embedding_forward(a.input, a.tokens, m.weight(w.token), m.weight(w.position), d.B, d.T, d.C, s);
  mark(m, &GpuPhaseEvents::forward, 1);
  a.blocks.assign(L, GpuBlockActivations{});
  for (int l = a.chunk.block_begin; l < a.chunk.block_end; ++l) {
    const size_t layer = static_cast<size_t>(l);
    GpuBlockActivations& b = a.blocks[layer];
    allocate_block(m, d, b, model_block_is_moe(m.host->spec, l));
    block_forward(m, a, d, l, block_input(a, l), b, true, true);
    // Under full recomputation only the output stays; the backward runs the block again.
    if (m.host->recompute[layer] == Recompute::Recompute_full) release_block_internals(m, b);
    mark(m, &GpuPhaseEvents::forward, 2 + layer);
  }
  a.forwarded = true;
  a.backward_next = a.chunk.block_end;
  if (!a.chunk.heads) return;
  a.lnf = gpu_take<bf16>(m, int64_t{d.N} * d.C, "final_norm.out");
  if (d.gpt2) a.lnf_mean = gpu_take<float>(m, d.N, "final_norm.mean");
  a.lnf_rstd = gpu_take<float>(m, d.N, "final_norm.rstd");
  norm_forward(m, d, a.lnf, a.lnf_mean, a.lnf_rstd, gpu_chunk_output(a), w.final_norm_w, w.final_norm_b);
  a.logits = gpu_take<bf16>(m, int64_t{d.N} * d.ld, "logits");
  // Over the padded vocabulary: columns [V, ld) come out 0 and the loss ignores them.
  m.matmul.forward(a.logits, a.lnf, m.head_weight, nullptr, nullptr, d.N, d.C, d.ld, d.ld, s);
  a.losses = gpu_take<float>(m, d.N, "losses");
  cuda_crossentropy(a.logits, a.losses, a.targets, d.N, d.V, d.ld, 0.0f, false, s);
  mark(m, &GpuPhaseEvents::forward, L + 2);
}

const bf16* gpu_chunk_output(const GpuActivations& a) {
  return a.chunk.block_end > a.chunk.block_begin ? a.blocks[static_cast<size_t>(a.chunk.block_end - 1)].out : a.input;
}

bf16* gpu_output_gradient(GpuModel& m, GpuActivations& a) {
  if (a.chunk.heads) throw Error("a chunk that ends in the loss takes no gradient of its output");
  GpuBackwardScratch& sc = a.scratch;
  if (sc.dres == nullptr) {
    const int64_t NC = int64_t{a.B} * a.T * m.host->spec.hidden_size;
    sc.dres = gpu_take<bf16>(m, NC, "d residual");
    cuda_check(cudaMemsetAsync(sc.dres, 0, static_cast<size_t>(NC) * sizeof(bf16), m.stream), "zeroing d residual");
  }
  return sc.dres;
}

const bf16* gpu_model_backward(GpuModel& m, GpuActivations& a, int block_begin, int block_end, float loss_scale) {
  const int L = static_cast<int>(m.host->spec.num_layers);
  if (!a.forwarded || block_end != a.backward_next || block_begin < a.chunk.block_begin || block_begin > block_end) {
    throw Error(fmt::format("backward of blocks [{}, {}) out of order: the pass expects blocks ending at {}{}",
                            block_begin, block_end, a.backward_next, a.forwarded ? "" : ", after a forward"));
  }
  if (block_end == a.chunk.block_end && !a.chunk.heads && a.scratch.dres == nullptr)
    throw Error("backward of a chunk that does not head needs its output's gradient first (gpu_output_gradient)");
  const ModelSpec& spec = m.host->spec;
  if (model_balance_is_pooled(spec) && !a.balance_pooled)
    throw Error("backward started without the micro-batch's pooled load-balancing sums (pass_balance_pool)");
  const int64_t moe_blocks = moe_block_count(spec);
  const float aux_scale =
      moe_blocks == 0 ? 0.0f
                      : static_cast<float>(loss_scale * spec.moe.router_aux_loss_coef / static_cast<double>(moe_blocks));
  const GpuDims d = gpu_dims(m, a);
  const ModelTensors& w = m.host->weights;
  GpuBackwardScratch& sc = a.scratch;
  if (block_end == a.chunk.block_end) {
    mark(m, &GpuPhaseEvents::backward, 0);
    take_scratch(m, d, sc);
    if (a.chunk.heads) head_backward(m, d, a, loss_scale);
    mark(m, &GpuPhaseEvents::backward, 1);
  }
  for (int layer = block_end - 1; layer >= block_begin; --layer) {
    GpuBlockActivations& b = a.blocks[static_cast<size_t>(layer)];
    const bf16* x = block_input(a, layer);
    if (b.qkv == nullptr) {  // dropped by full recomputation
      allocate_block(m, d, b, model_block_is_moe(m.host->spec, layer));
      block_forward(m, a, d, layer, x, b, false, false);
    }
    block_backward(m, a, d, layer, x, b, sc, aux_scale);
    release_block_internals(m, b);
    gpu_give(m, b.out);
    mark(m, &GpuPhaseEvents::backward, static_cast<size_t>(2 + (L - 1 - layer)));
  }
  a.backward_next = block_begin;
  if (block_begin != a.chunk.block_begin) return nullptr;
  if (!a.chunk.embeds) {  // dres now holds dL/d(input): kept for the send
    a.input_gradient = std::exchange(sc.dres, nullptr);
    give_scratch(m, sc);
    return a.input_gradient;
  }
  cuda_embedding_backward(m.gradient(w.token), m.gradient(w.position), sc.dres, a.tokens, d.B, d.T, d.C, m.stream);
  mark(m, &GpuPhaseEvents::backward, static_cast<size_t>(L + 2));
  give_scratch(m, sc);
  return nullptr;
}

void gpu_activations_release(GpuModel& m, GpuActivations& a) {
  give_scratch(m, a.scratch);
  release_head(m, a);
  for (GpuBlockActivations& b : a.blocks) {
    release_block_internals(m, b);
    gpu_give(m, b.out);
  }
  a.blocks.clear();
  gpu_give(m, a.losses);
  gpu_give(m, a.input_gradient);
  gpu_give(m, a.input);
  gpu_give(m, a.tokens);
  gpu_give(m, a.targets);
  a.forwarded = false;
  a.backward_next = a.chunk.block_begin;
}

}  // namespace alloy
