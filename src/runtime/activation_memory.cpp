// Analytic activation bytes per block and recomputation level (see activation_memory.hpp).
#include "runtime/activation_memory.hpp"

#include <fmt/format.h>

#include "runtime/arena.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

void add_tensor(std::vector<ActivationTensor>& tensors, const char* name, int64_t floats) {
  tensors.push_back({name, floats, arena_rounded_bytes(floats * 4)});
}

// Norm statistics: LayerNorm (GPT-2 family) keeps mean and rstd, RMSNorm only rstd.
void add_norm(std::vector<ActivationTensor>& tensors, const ModelSpec& model, const char* out,
              const char* mean, const char* rstd, int64_t N) {
  add_tensor(tensors, out, N * model.hidden_size);
  if (model.family == ModelFamily::ModelFamily_gpt2) add_tensor(tensors, mean, N);
  add_tensor(tensors, rstd, N);
}

// An MoE block's MLP activations, as moe_allocate takes them (N = B T tokens, K picks each).
void add_moe_mlp(std::vector<ActivationTensor>& tensors, const ModelSpec& model, int64_t N) {
  const MixtureOfExperts& moe = model.moe;
  const int64_t NK = N * moe.experts_per_token;
  const int64_t Fs = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size;
  add_tensor(tensors, "moe.probs", N * moe.num_experts);
  add_tensor(tensors, "moe.experts", NK);
  add_tensor(tensors, "moe.weights", NK);
  add_tensor(tensors, "moe.slots", NK);
  add_tensor(tensors, "moe.offsets", moe.num_experts + 1);
  add_tensor(tensors, "moe.up", NK * 2 * moe.expert_ffn_hidden_size);
  add_tensor(tensors, "moe.act", NK * moe.expert_ffn_hidden_size);
  add_tensor(tensors, "moe.out", NK * model.hidden_size);
  if (Fs == 0) return;
  add_tensor(tensors, "moe.shared.up", N * 2 * Fs);
  add_tensor(tensors, "moe.shared.act", N * Fs);
  if (!moe.shared_expert_gate) return;
  add_tensor(tensors, "moe.shared.out", N * model.hidden_size);
  add_tensor(tensors, "moe.shared.gate", N);
}

}  // namespace

std::vector<ActivationTensor> block_activation_tensors(const ModelSpec& model, int64_t B,
                                                       int64_t T, Recompute level, int64_t layer) {
  const int64_t N = B * T;
  const int64_t C = model.hidden_size;
  const int64_t D = model.head_dim;
  const int64_t F = model.ffn_hidden_size;
  const bool gpt2 = model.family == ModelFamily::ModelFamily_gpt2;
  std::vector<ActivationTensor> tensors;
  if (level != Recompute::Recompute_full) {
    add_norm(tensors, model, "attn_norm.out", "attn_norm.mean", "attn_norm.rstd", N);
    add_tensor(tensors, "attn.qkv", N * (model.num_heads + 2 * model.num_kv_heads) * D);
    if (level == Recompute::Recompute_none) {
      add_tensor(tensors, "attn.probs", B * model.num_heads * T * T);
      add_tensor(tensors, "attn.context", N * model.num_heads * D);
    }
    add_tensor(tensors, "attn.residual", N * C);
    add_norm(tensors, model, "mlp_norm.out", "mlp_norm.mean", "mlp_norm.rstd", N);
    if (model_is_moe(model) && layer >= model.moe.first_dense_layers) {
      add_moe_mlp(tensors, model, N);
    } else {
      add_tensor(tensors, gpt2 ? "mlp.up" : "mlp.gate_up", N * (gpt2 ? F : 2 * F));
      add_tensor(tensors, gpt2 ? "mlp.gelu" : "mlp.swiglu", N * F);
    }
  }
  add_tensor(tensors, "output", N * C);
  return tensors;
}

int64_t block_activation_bytes(const ModelSpec& model, int64_t B, int64_t T, Recompute level, int64_t layer) {
  int64_t bytes = 0;
  for (const ActivationTensor& tensor : block_activation_tensors(model, B, T, level, layer)) {
    bytes += tensor.bytes;
  }
  return bytes;
}

int64_t embedding_activation_bytes(const ModelSpec& model, int64_t B, int64_t T) {
  return arena_rounded_bytes(B * T * model.hidden_size * 4);
}

int64_t head_activation_bytes(const ModelSpec& model, int64_t B, int64_t T) {
  const int64_t N = B * T;
  std::vector<ActivationTensor> tensors;
  add_norm(tensors, model, "final_norm.out", "final_norm.mean", "final_norm.rstd", N);
  add_tensor(tensors, "logits", N * model.vocab_size);
  add_tensor(tensors, "losses", N);
  add_tensor(tensors, "lse", N);
  int64_t bytes = 0;
  for (const ActivationTensor& tensor : tensors) bytes += tensor.bytes;
  return bytes;
}

int64_t model_activation_bytes(const ModelSpec& model, int64_t B, int64_t T,
                               const std::vector<Recompute>& levels) {
  int64_t bytes = embedding_activation_bytes(model, B, T) + head_activation_bytes(model, B, T);
  for (size_t layer = 0; layer < levels.size(); ++layer)
    bytes += block_activation_bytes(model, B, T, levels[layer], static_cast<int64_t>(layer));
  return bytes;
}

}  // namespace alloy
