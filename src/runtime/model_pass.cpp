// Forward and backward passes of the single-rank model, block by block, with per-layer
// recomputation. Every activation and workspace buffer comes from the device arena.
#include <cstring>

#include <fmt/format.h>

#include "runtime/cpu/activation.hpp"
#include "runtime/cpu/attention.hpp"
#include "runtime/cpu/embedding.hpp"
#include "runtime/cpu/loss.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/cpu/norm.hpp"
#include "runtime/model.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Sizes of one pass, in the kernels' int arguments.
struct Dims {
  int B, T, N, C, Hq, Hkv, D, R, F, V;
  bool gpt2;
};

Dims model_dims(const Model& model) {
  const ModelSpec& s = model.spec;
  Dims d{};
  d.B = model.B;
  d.T = model.T;
  d.N = model.B * model.T;
  d.C = static_cast<int>(s.hidden_size);
  d.Hq = static_cast<int>(s.num_heads);
  d.Hkv = static_cast<int>(s.num_kv_heads);
  d.D = static_cast<int>(s.head_dim);
  d.R = (d.Hq + 2 * d.Hkv) * d.D;
  d.F = static_cast<int>(s.ffn_hidden_size);
  d.V = static_cast<int>(s.vocab_size);
  d.gpt2 = s.family == ModelFamily::ModelFamily_gpt2;
  return d;
}

float* take(Model& model, int64_t floats, const char* what) {
  return model.arena->allocate_floats(floats, what);
}

float* take_zeroed(Model& model, int64_t floats, const char* what) {
  float* buffer = model.arena->allocate_floats(floats, what);
  std::memset(buffer, 0, static_cast<size_t>(floats) * sizeof(float));
  return buffer;
}

void give(Model& model, float*& buffer) {
  model.arena->release(buffer);
  buffer = nullptr;
}

// LayerNorm for the GPT-2 family, RMSNorm for LLaMA (mean unused there).
void norm_forward(const Model& model, const Dims& d, float* out, float* mean, float* rstd,
                  const float* inp, const float* w, const float* b) {
  const float eps = static_cast<float>(model.spec.norm_eps);
  if (d.gpt2) {
    layernorm_forward(out, mean, rstd, inp, w, b, d.N, d.C, eps);
  } else {
    rmsnorm_forward(out, rstd, inp, w, d.N, d.C, eps);
  }
}

void norm_backward(const Dims& d, float* dinp, float* dw, float* db, const float* dout,
                   const float* inp, const float* w, const float* mean, const float* rstd) {
  if (d.gpt2) {
    layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, d.N, d.C);
  } else {
    rmsnorm_backward(dinp, dw, dout, inp, w, rstd, d.N, d.C);
  }
}

// Allocation order matches block_activation_tensors() so the arena's accounting is comparable.
void allocate_attention_inputs(Model& model, const Dims& d, BlockActivations& a) {
  a.ln1 = take(model, int64_t{d.N} * d.C, "attn_norm.out");
  if (d.gpt2) a.ln1_mean = take(model, d.N, "attn_norm.mean");
  a.ln1_rstd = take(model, d.N, "attn_norm.rstd");
  a.qkv = take(model, int64_t{d.N} * d.R, "attn.qkv");
}

void allocate_attention_internals(Model& model, const Dims& d, BlockActivations& a) {
  a.probs = take(model, int64_t{d.B} * d.Hq * d.T * d.T, "attn.probs");
  a.context = take(model, int64_t{d.N} * d.Hq * d.D, "attn.context");
}

void allocate_mlp(Model& model, const Dims& d, BlockActivations& a) {
  a.residual1 = take(model, int64_t{d.N} * d.C, "attn.residual");
  a.ln2 = take(model, int64_t{d.N} * d.C, "mlp_norm.out");
  if (d.gpt2) a.ln2_mean = take(model, d.N, "mlp_norm.mean");
  a.ln2_rstd = take(model, d.N, "mlp_norm.rstd");
  a.mlp_up = take(model, int64_t{d.N} * (d.gpt2 ? d.F : 2 * d.F), "mlp.up");
  a.mlp_act = take(model, int64_t{d.N} * d.F, "mlp.act");
}

// x: (B, T, C) -> a.residual1 = x + attn(norm1(x)); fills ln1, qkv, probs, context on the way.
void attention_half_forward(const Model& model, const Dims& d, const BlockTensors& w,
                            const float* x, BlockActivations& a) {
  norm_forward(model, d, a.ln1, a.ln1_mean, a.ln1_rstd, x, w.attn_norm_w, w.attn_norm_b);
  matmul_forward(a.qkv, a.ln1, w.qkv_w, w.qkv_b, d.N, d.C, d.R);
  if (!d.gpt2) {
    rope_forward(a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D, static_cast<float>(model.spec.rope_theta));
  }
  attention_forward(a.context, a.probs, a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D);
  matmul_forward(a.residual1, a.context, w.out_w, w.out_b, d.N, d.Hq * d.D, d.C);
  residual_forward(a.residual1, a.residual1, x, int64_t{d.N} * d.C);
}

// a.residual1 -> ln2, mlp_up, mlp_act; and a.out = residual1 + mlp(...) when with_output.
void mlp_half_forward(const Model& model, const Dims& d, const BlockTensors& w,
                      BlockActivations& a, bool with_output) {
  norm_forward(model, d, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual1, w.mlp_norm_w, w.mlp_norm_b);
  if (d.gpt2) {
    matmul_forward(a.mlp_up, a.ln2, w.up_w, w.up_b, d.N, d.C, d.F);
    gelu_forward(a.mlp_act, a.mlp_up, int64_t{d.N} * d.F);
  } else {
    matmul_forward(a.mlp_up, a.ln2, w.up_w, nullptr, d.N, d.C, 2 * d.F);
    swiglu_forward(a.mlp_act, a.mlp_up, d.N, d.F);
  }
  if (with_output) {
    matmul_forward(a.out, a.mlp_act, w.down_w, w.down_b, d.N, d.F, d.C);
    residual_forward(a.out, a.out, a.residual1, int64_t{d.N} * d.C);
  }
}

void release_block(Model& model, BlockActivations& a) {
  for (float** buffer : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.probs, &a.context,
                         &a.residual1, &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.mlp_up, &a.mlp_act,
                         &a.out}) {
    give(model, *buffer);
  }
}

void block_forward(Model& model, const Dims& d, int layer, const float* x) {
  BlockActivations& a = model.blocks[static_cast<size_t>(layer)];
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const Recompute level = model.recompute[static_cast<size_t>(layer)];
  allocate_attention_inputs(model, d, a);
  allocate_attention_internals(model, d, a);
  allocate_mlp(model, d, a);
  a.out = take(model, int64_t{d.N} * d.C, "output");
  attention_half_forward(model, d, w, x, a);
  mlp_half_forward(model, d, w, a, true);
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
void block_recompute(Model& model, const Dims& d, int layer, const float* x) {
  BlockActivations& a = model.blocks[static_cast<size_t>(layer)];
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  switch (model.recompute[static_cast<size_t>(layer)]) {
    case Recompute::Recompute_none:
      return;
    case Recompute::Recompute_selective:
      allocate_attention_internals(model, d, a);
      attention_forward(a.context, a.probs, a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D);
      return;
    case Recompute::Recompute_full:
      allocate_attention_inputs(model, d, a);
      allocate_attention_internals(model, d, a);
      allocate_mlp(model, d, a);
      attention_half_forward(model, d, w, x, a);
      mlp_half_forward(model, d, w, a, false);
      return;
  }
}

// dres: (B, T, C) holds dL/d(block output) on entry and dL/d(block input x) on exit.
void block_backward(Model& model, const Dims& d, int layer, const float* x, float* dres) {
  block_recompute(model, d, layer, x);
  BlockActivations& a = model.blocks[static_cast<size_t>(layer)];
  const BlockTensors& w = model.weights.blocks[static_cast<size_t>(layer)];
  const BlockTensors& g = model.gradients.blocks[static_cast<size_t>(layer)];
  const int64_t NC = int64_t{d.N} * d.C;
  const int up_width = d.gpt2 ? d.F : 2 * d.F;

  float* dact = take_zeroed(model, int64_t{d.N} * d.F, "d mlp.act");
  matmul_backward(dact, g.down_w, g.down_b, dres, a.mlp_act, w.down_w, d.N, d.F, d.C);
  float* dup = take_zeroed(model, int64_t{d.N} * up_width, "d mlp.up");
  if (d.gpt2) {
    gelu_backward(dup, a.mlp_up, dact, int64_t{d.N} * d.F);
  } else {
    swiglu_backward(dup, a.mlp_up, dact, d.N, d.F);
  }
  give(model, dact);
  float* dln = take_zeroed(model, NC, "d norm.out");
  matmul_backward(dln, g.up_w, g.up_b, dup, a.ln2, w.up_w, d.N, d.C, up_width);
  give(model, dup);
  norm_backward(d, dres, g.mlp_norm_w, g.mlp_norm_b, dln, a.residual1, w.mlp_norm_w, a.ln2_mean,
                a.ln2_rstd);

  float* dcontext = take_zeroed(model, int64_t{d.N} * d.Hq * d.D, "d attn.context");
  matmul_backward(dcontext, g.out_w, g.out_b, dres, a.context, w.out_w, d.N, d.Hq * d.D, d.C);
  float* dqkv = take_zeroed(model, int64_t{d.N} * d.R, "d attn.qkv");
  float* scratch = take(model, attention_backward_scratch_floats(d.T), "attention scratch");
  attention_backward(dqkv, scratch, dcontext, a.probs, a.qkv, d.B, d.T, d.Hq, d.Hkv, d.D);
  give(model, scratch);
  give(model, dcontext);
  if (!d.gpt2) {
    rope_backward(dqkv, d.B, d.T, d.Hq, d.Hkv, d.D, static_cast<float>(model.spec.rope_theta));
  }
  std::memset(dln, 0, static_cast<size_t>(NC) * sizeof(float));
  matmul_backward(dln, g.qkv_w, g.qkv_b, dqkv, a.ln1, w.qkv_w, d.N, d.C, d.R);
  give(model, dqkv);
  norm_backward(d, dres, g.attn_norm_w, g.attn_norm_b, dln, x, w.attn_norm_w, a.ln1_mean,
                a.ln1_rstd);
  give(model, dln);
}

void model_check_inputs(const Model& model, const int32_t* inputs, const int32_t* targets, int B,
                        int T) {
  if (B < 1 || T < 1) {
    throw Error(fmt::format("micro-batch must have B >= 1 and T >= 1, got B={} T={}", B, T));
  }
  if (T > model.spec.max_seq_len) {
    throw Error(fmt::format("sequence length {} exceeds the model's maximum of {}", T,
                            model.spec.max_seq_len),
                {model.spec.source_path, "max_position_embeddings"},
                "lower seq_len in the training config or use a model with longer positions");
  }
  const int64_t N = int64_t{B} * T;
  for (int64_t i = 0; i < N; i++) {
    for (const int32_t* ids : {inputs, targets}) {
      if (ids[i] < 0 || ids[i] >= model.spec.vocab_size) {
        throw Error(fmt::format("token id {} at batch row {}, position {} is outside the "
                                "vocabulary [0, {})",
                                ids[i], i / T, i % T, model.spec.vocab_size),
                    {}, "tokenize with the model's tokenizer, or raise vocab_size");
      }
    }
  }
}

}  // namespace

float model_forward(Model& model, const int32_t* inputs, const int32_t* targets, int B, int T) {
  model_check_inputs(model, inputs, targets, B, T);
  model_release_activations(model);
  model.B = B;
  model.T = T;
  const int64_t N = int64_t{B} * T;
  model.inputs.assign(inputs, inputs + N);
  model.targets.assign(targets, targets + N);
  model.blocks.assign(static_cast<size_t>(model.spec.num_layers), BlockActivations{});
  model.has_activations = true;
  const Dims d = model_dims(model);
  HeadActivations& h = model.head;

  h.embedded = take(model, N * d.C, "embedding output");
  embedding_forward(h.embedded, inputs, model.weights.token, model.weights.position, B, T, d.C);
  const float* x = h.embedded;
  for (int layer = 0; layer < static_cast<int>(model.spec.num_layers); layer++) {
    block_forward(model, d, layer, x);
    x = model.blocks[static_cast<size_t>(layer)].out;
  }
  h.lnf = take(model, N * d.C, "final_norm.out");
  if (d.gpt2) h.lnf_mean = take(model, N, "final_norm.mean");
  h.lnf_rstd = take(model, N, "final_norm.rstd");
  h.logits = take(model, N * d.V, "logits");
  h.losses = take(model, N, "losses");
  h.lse = take(model, N, "lse");
  norm_forward(model, d, h.lnf, h.lnf_mean, h.lnf_rstd, x, model.weights.final_norm_w,
               model.weights.final_norm_b);
  matmul_forward(h.logits, h.lnf, model.weights.lm_head, nullptr, d.N, d.C, d.V);
  return crossentropy_forward(h.losses, h.lse, h.logits, targets, d.N, d.V);
}

void model_backward(Model& model, float loss_scale) {
  if (!model.has_activations) {
    throw Error("model_backward called without a preceding model_forward");
  }
  const Dims d = model_dims(model);
  HeadActivations& h = model.head;
  const int64_t NC = int64_t{d.N} * d.C;
  const int L = static_cast<int>(model.spec.num_layers);
  const float* last = model.blocks[static_cast<size_t>(L - 1)].out;

  crossentropy_backward_inplace(h.logits, h.lse, model.targets.data(), d.N, d.V,
                                loss_scale / static_cast<float>(d.N));
  float* dlnf = take_zeroed(model, NC, "d final_norm.out");
  matmul_backward(dlnf, model.gradients.lm_head, nullptr, h.logits, h.lnf, model.weights.lm_head,
                  d.N, d.C, d.V);
  give(model, h.logits);
  give(model, h.losses);
  give(model, h.lse);
  float* dres = take_zeroed(model, NC, "d residual");
  norm_backward(d, dres, model.gradients.final_norm_w, model.gradients.final_norm_b, dlnf, last,
                model.weights.final_norm_w, h.lnf_mean, h.lnf_rstd);
  give(model, dlnf);
  give(model, h.lnf);
  give(model, h.lnf_mean);
  give(model, h.lnf_rstd);

  for (int layer = L - 1; layer >= 0; layer--) {
    const float* x = layer == 0 ? h.embedded : model.blocks[static_cast<size_t>(layer - 1)].out;
    block_backward(model, d, layer, x, dres);
    release_block(model, model.blocks[static_cast<size_t>(layer)]);
  }
  embedding_backward(model.gradients.token, model.gradients.position, dres, model.inputs.data(),
                     d.B, d.T, d.C);
  give(model, dres);
  give(model, h.embedded);
  model.has_activations = false;
}

void model_release_activations(Model& model) {
  if (!model.has_activations) return;
  for (BlockActivations& a : model.blocks) release_block(model, a);
  HeadActivations& h = model.head;
  for (float** buffer : {&h.embedded, &h.lnf, &h.lnf_mean, &h.lnf_rstd, &h.logits, &h.losses,
                         &h.lse}) {
    give(model, *buffer);
  }
  model.has_activations = false;
}

}  // namespace alloy
