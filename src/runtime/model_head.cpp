// The ends of the model: token checks, the (vocabulary-parallel) embedding, and the final norm,
// LM head and cross-entropy, whose vocabulary is split across tensor-parallel ranks when tp > 1.
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "runtime/cpu/embedding.hpp"
#include "runtime/cpu/loss.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/model_internal.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Vocabulary-parallel lookup: rows this rank holds, zeros elsewhere, positions on tp rank 0;
// the tensor-parallel sum completes every row.
void embedding_forward_vocab_parallel(const Model& model, const Dims& d, float* out, const int32_t* tokens) {
  const float* wte = model.weights.token;
  const float* wpe = d.tp_rank == 0 ? model.weights.position : nullptr;
#pragma omp parallel for
  for (int n = 0; n < d.N; n++) {
    float* row = out + int64_t{n} * d.C;
    const int64_t local = tokens[n] - d.vocab_begin;
    const bool mine = local >= 0 && local < d.V;
    for (int c = 0; c < d.C; c++) row[c] = mine ? wte[local * d.C + c] : 0.0f;
    if (wpe != nullptr) {
      const float* position = wpe + int64_t{n % d.T} * d.C;
      for (int c = 0; c < d.C; c++) row[c] += position[c];
    }
  }
}

// logits: (N, V local) -> losses, lse: (N) over the whole vocabulary; returns the mean loss.
float crossentropy_forward_vocab_parallel(Model& model, const Dims& d, HeadActivations& h, const int32_t* targets) {
  std::vector<float> maxima(static_cast<size_t>(d.N));
  std::vector<float> sums(2 * static_cast<size_t>(d.N));  // exp sums, then target logits
  crossentropy_slice_maxima(maxima.data(), h.logits, d.N, d.V);
  model.tp_ops->all_reduce_max(maxima.data(), d.N);
  crossentropy_slice_sums(sums.data(), sums.data() + d.N, h.logits, maxima.data(), targets, d.vocab_begin, d.N, d.V);
  tp_sum(model, sums.data(), 2 * int64_t{d.N});
  double total = 0;
  for (int n = 0; n < d.N; n++) {
    h.lse[n] = maxima[n] + std::log(sums[n]);
    h.losses[n] = h.lse[n] - sums[d.N + n];
    total += h.losses[n];
  }
  return static_cast<float>(total / d.N);
}

}  // namespace

void model_check_tokens(const Model& model, const int32_t* inputs, const int32_t* targets, int B, int T) {
  if (B < 1 || T < 1) {
    throw Error(fmt::format("micro-batch must have B >= 1 and T >= 1, got B={} T={}", B, T));
  }
  if (T > model.spec.max_seq_len) {
    throw Error(fmt::format("sequence length {} exceeds the model's maximum of {}", T, model.spec.max_seq_len),
                {model.spec.source_path, "max_position_embeddings"},
                "lower seq_len in the training config or use a model with longer positions");
  }
  const int64_t N = int64_t{B} * T;
  for (const int32_t* ids : {inputs, targets}) {
    if (ids == nullptr) continue;
    for (int64_t i = 0; i < N; i++) {
      if (ids[i] < 0 || ids[i] >= model.spec.vocab_size) {
        throw Error(fmt::format("token id {} at batch row {}, position {} is outside the vocabulary [0, {})", ids[i],
                                i / T, i % T, model.spec.vocab_size),
                    {}, "tokenize with the model's tokenizer, or raise vocab_size");
      }
    }
  }
}

void embedding_pass_forward(Model& model, ChunkPass& pass, const Dims& d) {
  if (d.tp == 1) {
    embedding_forward(pass.input, pass.inputs.data(), model.weights.token, model.weights.position, d.B, d.T, d.C);
    return;
  }
  embedding_forward_vocab_parallel(model, d, pass.input, pass.inputs.data());
  tp_sum(model, pass.input, int64_t{d.N} * d.C);
}

void embedding_pass_backward(Model& model, ChunkPass& pass, const Dims& d) {
  embedding_gradients(model, d, pass.gradient, pass.inputs.data());
}

float head_pass_forward(Model& model, ChunkPass& pass, const Dims& d, const float* x) {
  HeadActivations& h = pass.head;
  const int64_t N = d.N;
  h.lnf = take(model, N * d.C, "final_norm.out");
  if (d.gpt2) h.lnf_mean = take(model, N, "final_norm.mean");
  h.lnf_rstd = take(model, N, "final_norm.rstd");
  h.logits = take(model, N * d.V, "logits");
  h.losses = take(model, N, "losses");
  h.lse = take(model, N, "lse");
  norm_forward(model, d, h.lnf, h.lnf_mean, h.lnf_rstd, x, model.weights.final_norm_w, model.weights.final_norm_b);
  matmul_forward(h.logits, h.lnf, model.weights.lm_head, nullptr, d.N, d.C, d.V);
  if (d.tp == 1) return crossentropy_forward(h.losses, h.lse, h.logits, pass.targets.data(), d.N, d.V);
  return crossentropy_forward_vocab_parallel(model, d, h, pass.targets.data());
}

void head_pass_backward(Model& model, ChunkPass& pass, const Dims& d, const float* x, float loss_scale) {
  HeadActivations& h = pass.head;
  const int64_t NC = int64_t{d.N} * d.C;
  const float dloss = loss_scale / static_cast<float>(d.N);
  if (d.tp == 1) {
    crossentropy_backward_inplace(h.logits, h.lse, pass.targets.data(), d.N, d.V, dloss);
  } else {
    crossentropy_slice_backward_inplace(h.logits, h.lse, pass.targets.data(), d.vocab_begin, d.N, d.V, dloss);
  }
  float* dlnf = take_zeroed(model, NC, "d final_norm.out");
  linear_backward(model, dlnf, &model.gradients.lm_head, nullptr, h.logits, h.lnf, model.weights.lm_head, d.N, d.C, d.V);
  tp_sum(model, dlnf, NC);
  give(model, h.logits);
  give(model, h.losses);
  give(model, h.lse);
  float* dres = chunk_output_gradient(model, pass);
  norm_backward(model, d, dres, &model.gradients.final_norm_w, &model.gradients.final_norm_b, dlnf, x,
                model.weights.final_norm_w, h.lnf_mean, h.lnf_rstd);
  give(model, dlnf);
  head_pass_release(model, pass);
}

void head_pass_release(Model& model, ChunkPass& pass) {
  HeadActivations& h = pass.head;
  for (float** buffer : {&h.lnf, &h.lnf_mean, &h.lnf_rstd, &h.logits, &h.losses, &h.lse}) give(model, *buffer);
}

}  // namespace alloy
