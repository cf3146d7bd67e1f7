// The single-rank model: GPT-2 and LLaMA families built from a ModelSpec, with one flat
// parameter buffer and one flat gradient buffer in the device arena, a table of named views, and
// forward/backward passes whose activations live in the arena (per-layer recomputation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/activation_memory.hpp"
#include "runtime/arena.hpp"
#include "spec/model.hpp"

namespace alloy {

// A named tensor inside the flat parameter (and, at the same offset, gradient) buffer.
struct TensorView {
  std::string name;             // e.g. "layers.0.attn.qkv.weight"
  std::vector<int64_t> shape;   // rows = output features, row-major
  int64_t offset = 0;           // in floats from the start of the flat buffer
  int64_t numel = 0;
  bool weight_decay = false;    // 2-D weights decay; norms and biases do not
};

// Pointers of one block's tensors inside a flat buffer; nullptr where the spec has no such tensor.
struct BlockTensors {
  float* attn_norm_w = nullptr;  // (C)
  float* attn_norm_b = nullptr;  // (C)
  float* qkv_w = nullptr;        // ((Hq + 2 Hkv) D, C)
  float* qkv_b = nullptr;        // ((Hq + 2 Hkv) D)
  float* out_w = nullptr;        // (C, Hq D)
  float* out_b = nullptr;        // (C)
  float* mlp_norm_w = nullptr;   // (C)
  float* mlp_norm_b = nullptr;   // (C)
  float* up_w = nullptr;         // GPT-2: mlp.up (F, C); LLaMA: mlp.gate_up (2F, C)
  float* up_b = nullptr;         // (F), GPT-2 with linear_bias
  float* down_w = nullptr;       // (C, F)
  float* down_b = nullptr;       // (C)
};

struct ModelTensors {
  float* token = nullptr;         // (V, C)
  float* position = nullptr;      // (max_seq_len, C), GPT-2 family
  std::vector<BlockTensors> blocks;
  float* final_norm_w = nullptr;  // (C)
  float* final_norm_b = nullptr;  // (C)
  float* lm_head = nullptr;       // (V, C); == token when tied
};

// What one block keeps between forward and backward (nullptr when dropped by recomputation).
struct BlockActivations {
  float* ln1 = nullptr;        // (B, T, C)
  float* ln1_mean = nullptr;   // (B, T), LayerNorm only
  float* ln1_rstd = nullptr;   // (B, T)
  float* qkv = nullptr;        // (B, T, (Hq + 2 Hkv) D), after RoPE for LLaMA
  float* probs = nullptr;      // (B, Hq, T, T)
  float* context = nullptr;    // (B, T, Hq D)
  float* residual1 = nullptr;  // (B, T, C)
  float* ln2 = nullptr;        // (B, T, C)
  float* ln2_mean = nullptr;   // (B, T)
  float* ln2_rstd = nullptr;   // (B, T)
  float* mlp_up = nullptr;     // (B, T, F) GPT-2, (B, T, 2F) LLaMA
  float* mlp_act = nullptr;    // (B, T, F)
  float* out = nullptr;        // (B, T, C)
};

struct HeadActivations {
  float* embedded = nullptr;   // (B, T, C) block 0's input
  float* lnf = nullptr;        // (B, T, C)
  float* lnf_mean = nullptr;   // (B, T), LayerNorm only
  float* lnf_rstd = nullptr;   // (B, T)
  float* logits = nullptr;     // (B, T, V); dlogits after backward starts
  float* losses = nullptr;     // (B, T)
  float* lse = nullptr;        // (B, T)
};

struct Model {
  Model(const ModelSpec& spec, Arena& arena);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  ModelSpec spec;
  Arena* arena;
  std::vector<TensorView> views;
  int64_t num_parameters = 0;
  float* params = nullptr;  // (num_parameters) in the arena
  float* grads = nullptr;   // (num_parameters) in the arena
  ModelTensors weights;     // views into params
  ModelTensors gradients;   // the same views into grads
  std::vector<Recompute> recompute;  // one per block, Recompute_none by default

  // Forward state, alive from model_forward until model_backward.
  int B = 0;
  int T = 0;
  std::vector<int32_t> inputs;   // (B, T)
  std::vector<int32_t> targets;  // (B, T)
  std::vector<BlockActivations> blocks;
  HeadActivations head;
  bool has_activations = false;
};

// GPT-2 initialisation from a seeded deterministic RNG: weights normal(0, 0.02), residual
// projections (attn.out, mlp.down) scaled by 1 / sqrt(2 L), norm weights 1, biases 0.
void model_init_weights(Model& model, uint64_t seed);

const TensorView& model_view(const Model& model, const std::string& name);

// inputs, targets: (B, T) token ids -> mean cross-entropy loss; logits stay in model.head.logits
// until model_backward. Throws alloy::Error for a token id >= V or T > max_seq_len.
float model_forward(Model& model, const int32_t* inputs, const int32_t* targets, int B, int T);

// Adds the gradients of loss_scale * (the last forward's mean loss) into model.grads and frees
// its activations. loss_scale = 1 / k averages k accumulated micro-batches.
void model_backward(Model& model, float loss_scale = 1.0f);

void model_zero_grad(Model& model);

// Frees the activations of a forward that will not be followed by a backward (evaluation).
void model_release_activations(Model& model);

}  // namespace alloy
