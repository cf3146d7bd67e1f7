// Forward and backward of the GPU model, block by block, on one stream: LayerNorm/RMSNorm, the
// q/k/v product, (RoPE), fused attention, the output product with the residual added in
// cuBLASLt's epilogue, the MLP, and the head with fused softmax cross-entropy. Every activation
// and scratch buffer comes from the GPU arena, so its peak is the measured activation memory.
#include "runtime/cuda/gpu_model.hpp"

#include <fmt/format.h>

#include "runtime/cuda/attention.hpp"
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

GpuDims gpu_dims(const GpuModel& m) {
  const ModelSpec& s = m.host->spec;
  GpuDims d{};
  d.B = m.B;
  d.T = m.T;
  d.N = m.B * m.T;
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

template <typename T>
T* take(GpuModel& m, int64_t count, const char* what) {
  return static_cast<T*>(m.arena->allocate(count * static_cast<int64_t>(sizeof(T)), what));
}

template <typename T>
void give(GpuModel& m, T*& buffer) {
  m.arena->release(buffer);
  buffer = nullptr;
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

void allocate_block(GpuModel& m, const GpuDims& d, GpuBlockActivations& a) {
  const int64_t NC = int64_t{d.N} * d.C;
  a.ln1 = take<bf16>(m, NC, "attn_norm.out");
  if (d.gpt2) a.ln1_mean = take<float>(m, d.N, "attn_norm.mean");
  a.ln1_rstd = take<float>(m, d.N, "attn_norm.rstd");
  a.qkv = take<bf16>(m, int64_t{d.N} * d.R, "attn.qkv");
  a.context = take<bf16>(m, int64_t{d.N} * d.Hq * d.D, "attn.context");
  a.lse = take<float>(m, int64_t{d.B} * d.Hq * d.T, "attn.lse");
  a.residual1 = take<bf16>(m, NC, "attn.residual");
  a.ln2 = take<bf16>(m, NC, "mlp_norm.out");
  if (d.gpt2) a.ln2_mean = take<float>(m, d.N, "mlp_norm.mean");
  a.ln2_rstd = take<float>(m, d.N, "mlp_norm.rstd");
  a.mlp_up = take<bf16>(m, int64_t{d.N} * d.U, "mlp.up");
  a.mlp_act = take<bf16>(m, int64_t{d.N} * d.F, "mlp.act");
  if (a.out == nullptr) a.out = take<bf16>(m, NC, "output");
}

// Everything but the block's output, which the next block reads.
void release_block_internals(GpuModel& m, GpuBlockActivations& a) {
  give(m, a.ln1);
  give(m, a.ln1_mean);
  give(m, a.ln1_rstd);
  give(m, a.qkv);
  give(m, a.context);
  give(m, a.lse);
  give(m, a.residual1);
  give(m, a.ln2);
  give(m, a.ln2_mean);
  give(m, a.ln2_rstd);
  give(m, a.mlp_up);
  give(m, a.mlp_act);
}

// x: (N, C) -> a.out: (N, C) = block(x), filling every activation on the way. Without
// `with_output` it stops before the MLP's output projection: a recomputation keeps a.out, which
// the backward does not read.
void block_forward(GpuModel& m, const GpuDims& d, const BlockTensors& w, const bf16* x, GpuBlockActivations& a,
                   bool with_output) {
  cudaStream_t s = m.stream;
  norm_forward(m, d, a.ln1, a.ln1_mean, a.ln1_rstd, x, w.attn_norm_w, w.attn_norm_b);
  m.matmul.forward(a.qkv, a.ln1, m.weight(w.qkv_w), m.weight(w.qkv_b), nullptr, d.N, d.C, d.R, d.R, s);
  if (!d.gpt2) cuda_rope_forward(a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, d.theta, s);
  cuda_attention_forward(a.context, a.lse, a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, s);
  m.matmul.forward(a.residual1, a.context, m.weight(w.out_w), m.weight(w.out_b), x, d.N, d.Hq * d.D, d.C, d.C, s);
  norm_forward(m, d, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual1, w.mlp_norm_w, w.mlp_norm_b);
  m.matmul.forward(a.mlp_up, a.ln2, m.weight(w.up_w), m.weight(w.up_b), nullptr, d.N, d.C, d.U, d.U, s);
  if (d.gpt2) {
    cuda_gelu_forward(a.mlp_act, a.mlp_up, int64_t{d.N} * d.F, s);
  } else {
    cuda_swiglu_forward(a.mlp_act, a.mlp_up, d.N, d.F, s);
  }
  if (with_output)
    m.matmul.forward(a.out, a.mlp_act, m.weight(w.down_w), m.weight(w.down_b), a.residual1, d.N, d.F, d.C, d.C, s);
}

// Gradient buffers of one backward, shared by every block.
struct Scratch {
  bf16* dres = nullptr;     // (N, C) dL/d(residual stream), carried down through the blocks
  bf16* dact = nullptr;     // (N, F)
  bf16* dup = nullptr;      // (N, 2F), LLaMA only
  bf16* dln = nullptr;      // (N, C)
  bf16* dcontext = nullptr; // (N, Hq D)
  bf16* dqkv = nullptr;     // (N, R)
  void* attention_workspace = nullptr;
};

// scratch.dres holds dL/d(block output) on entry and dL/d(block input x) on exit.
void block_backward(GpuModel& m, const GpuDims& d, const BlockTensors& w, const bf16* x, const GpuBlockActivations& a,
                    Scratch& sc) {
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

const bf16* block_input(const GpuModel& m, size_t layer) {
  return layer == 0 ? m.embedded : m.blocks[layer - 1].out;
}

void release_head(GpuModel& m) {
  give(m, m.lnf);
  give(m, m.lnf_mean);
  give(m, m.lnf_rstd);
  give(m, m.logits);
}

void release_all(GpuModel& m) {
  release_head(m);
  for (GpuBlockActivations& a : m.blocks) {
    release_block_internals(m, a);
    give(m, a.out);
  }
  m.blocks.clear();
  give(m, m.embedded);
  give(m, m.tokens);
  give(m, m.targets);
}

}  // namespace

int gpu_logits_ld(int64_t vocab_size) { return static_cast<int>((vocab_size + 63) / 64 * 64); }

GpuModel::GpuModel(const Model& host_model, Arena& device_arena, cudaStream_t compute_stream)
    : host(&host_model), arena(&device_arena), stream(compute_stream), num_parameters(host_model.num_parameters) {
  const ModelSpec& s = host->spec;
  if (host->shard.tp != 1 || static_cast<int64_t>(host->shard.block_ranges.size()) != 1) {
    throw Error("the GPU model runs whole models on one GPU for now", {"", "--device"},
                "run multi-GPU plans on CPU ranks, or a one-GPU plan on the GPU");
  }
  cuda_attention_check_shape(static_cast<int>(s.num_heads), static_cast<int>(s.num_kv_heads),
                             static_cast<int>(s.head_dim));
  params = take<float>(*this, num_parameters, "parameters (fp32)");
  grads = take<float>(*this, num_parameters, "gradients (fp32)");
  weights = take<bf16>(*this, num_parameters, "weights (bf16 copy)");
  const int64_t head_elements = int64_t{gpu_logits_ld(s.vocab_size)} * s.hidden_size;
  head_weight = take<bf16>(*this, head_elements, "lm_head (bf16, padded)");
  cuda_check(cudaMemsetAsync(head_weight, 0, static_cast<size_t>(head_elements) * sizeof(bf16), stream),
             "zeroing the padded head");
  recompute.assign(static_cast<size_t>(s.num_layers), Recompute::Recompute_none);
  gpu_model_upload(*this);
  gpu_model_zero_grad(*this);
}

GpuModel::~GpuModel() {
  release_all(*this);
  give(*this, losses);
  give(*this, head_weight);
  give(*this, weights);
  give(*this, grads);
  give(*this, params);
}

bf16* GpuModel::weight(const float* host_tensor) const {
  return host_tensor == nullptr ? nullptr : weights + (host_tensor - host->params);
}

float* GpuModel::gradient(const float* host_tensor) const {
  return host_tensor == nullptr ? nullptr : grads + (host_tensor - host->params);
}

void gpu_model_upload(GpuModel& m) {
  const size_t bytes = static_cast<size_t>(m.num_parameters) * sizeof(float);
  cuda_check(cudaMemcpyAsync(m.params, m.host->params, bytes, cudaMemcpyHostToDevice, m.stream), "uploading weights");
  cuda_float_to_bf16(m.weights, m.params, m.num_parameters, m.stream);
  gpu_model_refresh_head(m);
  cuda_check(cudaStreamSynchronize(m.stream), "uploading weights");
}

void gpu_model_refresh_head(GpuModel& m) {
  const ModelSpec& s = m.host->spec;
  const size_t bytes = static_cast<size_t>(s.vocab_size * s.hidden_size) * sizeof(bf16);
  cuda_check(cudaMemcpyAsync(m.head_weight, m.weight(m.host->weights.lm_head), bytes, cudaMemcpyDeviceToDevice,
                             m.stream),
             "refreshing the padded head");
}

void gpu_model_download(GpuModel& m) {
  const size_t bytes = static_cast<size_t>(m.num_parameters) * sizeof(float);
  cuda_check(cudaMemcpyAsync(m.host->params, m.params, bytes, cudaMemcpyDeviceToHost, m.stream),
             "downloading weights");
  cuda_check(cudaStreamSynchronize(m.stream), "downloading weights");
}

void gpu_model_zero_grad(GpuModel& m) {
  cuda_check(cudaMemsetAsync(m.grads, 0, static_cast<size_t>(m.num_parameters) * sizeof(float), m.stream),
             "zeroing gradients");
}

void gpu_model_release_activations(GpuModel& m) { release_all(m); }

void gpu_model_forward(GpuModel& m, const int32_t* inputs, const int32_t* targets, int B, int T, bool training,
                       float loss_scale) {
  model_check_tokens(*m.host, inputs, targets, B, T);
  release_all(m);
  m.B = B;
  m.T = T;
  const GpuDims d = gpu_dims(m);
  const ModelTensors& w = m.host->weights;
  cudaStream_t s = m.stream;
  const size_t token_bytes = static_cast<size_t>(d.N) * sizeof(int32_t);
  m.tokens = take<int32_t>(m, d.N, "token ids");
  m.targets = take<int32_t>(m, d.N, "target ids");
  cuda_check(cudaMemcpyAsync(m.tokens, inputs, token_bytes, cudaMemcpyHostToDevice, s), "uploading tokens");
  cuda_check(cudaMemcpyAsync(m.targets, targets, token_bytes, cudaMemcpyHostToDevice, s), "uploading targets");
  give(m, m.losses);
  m.losses = take<float>(m, d.N, "losses");

  const size_t L = m.recompute.size();
  mark(m, &GpuPhaseEvents::forward, 0);
  m.embedded = take<bf16>(m, int64_t{d.N} * d.C, "embedding.out");
  cuda_embedding_forward(m.embedded, m.tokens, m.weight(w.token), m.weight(w.position), B, T, d.C, s);
  mark(m, &GpuPhaseEvents::forward, 1);
  m.blocks.assign(L, GpuBlockActivations{});
  for (size_t layer = 0; layer < L; ++layer) {
    GpuBlockActivations& a = m.blocks[layer];
    allocate_block(m, d, a);
    block_forward(m, d, w.blocks[layer], block_input(m, layer), a, true);
    // Without a backward to follow, or under full recomputation, only the output stays.
    if (!training || m.recompute[layer] == Recompute::Recompute_full) release_block_internals(m, a);
    if (!training && layer > 0) give(m, m.blocks[layer - 1].out);
    mark(m, &GpuPhaseEvents::forward, 2 + layer);
  }
  m.lnf = take<bf16>(m, int64_t{d.N} * d.C, "final_norm.out");
  if (d.gpt2) m.lnf_mean = take<float>(m, d.N, "final_norm.mean");
  m.lnf_rstd = take<float>(m, d.N, "final_norm.rstd");
  norm_forward(m, d, m.lnf, m.lnf_mean, m.lnf_rstd, m.blocks.back().out, w.final_norm_w, w.final_norm_b);
  m.logits = take<bf16>(m, int64_t{d.N} * d.ld, "logits");
  // Over the padded vocabulary: columns [V, ld) come out 0 and the loss ignores them.
  m.matmul.forward(m.logits, m.lnf, m.head_weight, nullptr, nullptr, d.N, d.C, d.ld, d.ld, s);
  cuda_crossentropy(m.logits, m.losses, m.targets, d.N, d.V, d.ld, loss_scale / static_cast<float>(d.N), training, s);
  mark(m, &GpuPhaseEvents::forward, L + 2);
  if (!training) release_all(m);
}

void gpu_model_backward(GpuModel& m) {
  if (m.logits == nullptr) {
    throw Error("gpu_model_backward without a training forward before it", {}, "call gpu_model_forward(training=true)");
  }
  const GpuDims d = gpu_dims(m);
  const ModelTensors& w = m.host->weights;
  cudaStream_t s = m.stream;
  const int64_t NC = int64_t{d.N} * d.C;
  Scratch sc;
  sc.dres = take<bf16>(m, NC, "d residual");
  sc.dact = take<bf16>(m, int64_t{d.N} * d.F, "d mlp.act");
  if (!d.gpt2) sc.dup = take<bf16>(m, int64_t{d.N} * d.U, "d mlp.up");
  sc.dln = take<bf16>(m, NC, "d norm.out");
  sc.dcontext = take<bf16>(m, int64_t{d.N} * d.Hq * d.D, "d attn.context");
  sc.dqkv = take<bf16>(m, int64_t{d.N} * d.R, "d attn.qkv");
  sc.attention_workspace =
      m.arena->allocate(cuda_attention_backward_workspace_bytes(d.B, d.T, d.Hq, d.Hkv, d.D), "attention workspace");

  const size_t L = m.blocks.size();
  mark(m, &GpuPhaseEvents::backward, 0);
  // Head: logits hold dlogits; dres = norm backward of dlnf.
  m.matmul.backward_input(sc.dln, m.logits, m.head_weight, d.N, d.C, d.ld, d.ld, false, s);
  m.matmul.backward_weight(m.gradient(w.lm_head), m.logits, m.lnf, d.N, d.C, d.V, d.ld, s);
  cuda_check(cudaMemsetAsync(sc.dres, 0, static_cast<size_t>(NC) * sizeof(bf16), s), "zeroing d residual");
  const bf16* top = m.blocks.back().out;
  norm_backward(m, d, sc.dres, sc.dln, top, w.final_norm_w, w.final_norm_b, m.lnf_mean, m.lnf_rstd);
  release_head(m);
  mark(m, &GpuPhaseEvents::backward, 1);

  for (size_t layer = L; layer-- > 0;) {
    GpuBlockActivations& a = m.blocks[layer];
    const bf16* x = block_input(m, layer);
    if (m.recompute[layer] == Recompute::Recompute_full) {
      allocate_block(m, d, a);
      block_forward(m, d, w.blocks[layer], x, a, false);
    }
    block_backward(m, d, w.blocks[layer], x, a, sc);
    if (m.on_block_gradients) m.on_block_gradients(static_cast<int>(layer));
    release_block_internals(m, a);
    give(m, a.out);
    mark(m, &GpuPhaseEvents::backward, 2 + (L - 1 - layer));
  }
  cuda_embedding_backward(m.gradient(w.token), m.gradient(w.position), sc.dres, m.tokens, d.B, d.T, d.C, s);
  mark(m, &GpuPhaseEvents::backward, L + 2);

  m.arena->release(sc.attention_workspace);
  for (bf16** buffer : {&sc.dres, &sc.dact, &sc.dup, &sc.dln, &sc.dcontext, &sc.dqkv}) give(m, *buffer);
  release_all(m);
}

}  // namespace alloy
