// Analytic arithmetic of one model layer (embedding, decoder block, head): parameters, FLOPs,
// memory traffic and stored activations, per tensor-parallel degree and sequence-parallel mode.
#pragma once

#include <cstdint>

#include "spec/device_type.hpp"
#include "spec/model.hpp"
#include "spec/parallel.hpp"

namespace alloy {

// Parameters of one decoder block, of the embedding (token + learned positions) and of the
// head (final norm, plus the LM head matrix when untied or when it lives on another stage).
int64_t block_parameters(const ModelSpec& model);
int64_t embedding_parameters(const ModelSpec& model);
int64_t head_parameters(const ModelSpec& model, bool holds_lm_matrix);

// Work of one layer for one micro-batch on one device of a tp group (already divided by tp).
struct LayerWork {
  double forward_flops = 0;
  double forward_bytes = 0;        // device-memory traffic of the forward pass
  double backward_flops = 0;       // input and weight gradients
  double backward_bytes = 0;
  // The part of the traffic above that element-wise work (norms, activations, residual adds,
  // softmax and cross-entropy) moves, and of that the attention score matrix's, which a fused
  // attention never writes. Backward moves twice the forward's.
  double forward_elementwise_bytes = 0;
  double forward_score_bytes = 0;
  double selective_flops = 0;      // extra forward work recomputed under selective recompute
  double selective_bytes = 0;
  // Forward work recomputed under full recompute: all of it but the MLP's output projection, as
  // the block's output is kept (the next block's input) and backward never reads it again.
  double full_recompute_flops = 0;
  double matmul_rows = 0;          // M of the dominant matrix products (tokens on the device)
  double matmul_cols = 0;          // N of the dominant matrix products (per tp rank)
};

// micro_batch: sequences per replica; seq_len: tokens per sequence.
LayerWork block_work(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                     bool sequence_parallel, Precision precision);
LayerWork embedding_work(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                         Precision precision);
LayerWork head_work(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                    Precision precision);

// The share of a block's forward time that `recompute` runs again in its backward.
double recompute_forward_share(const LayerWork& block, Recompute recompute);

// Model FLOPs of one sequence through forward and backward (no recomputation), all layers.
double model_flops_per_sequence(const ModelSpec& model, int64_t seq_len);

// How a runtime keeps its activations. megatron: the Megatron-LM accounting (arXiv 2205.05198,
// sbh(34 + 5as/h) at 16 bits without recompute): softmax scores and, for GPT-2, dropout masks.
// Alloy's runtimes have no dropout and keep fp32 norm statistics: scores (the CPU runtime) keeps
// the softmax scores once in the compute precision and an fp32 copy of nothing else; fused (the
// GPU runtime) keeps only each query row's log-sum-exp and computes the loss in place.
enum class AttentionMemory { AttentionMemory_megatron, AttentionMemory_scores, AttentionMemory_fused };

// Bytes of activations one block keeps between its forward and backward for one micro-batch,
// on one device: the single place that defines activation memory, generalised to grouped-query
// attention and SwiGLU; fp32 runs scale element sizes.
double block_activation_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                              bool sequence_parallel, Recompute recompute, Precision precision,
                              AttentionMemory attention = AttentionMemory::AttentionMemory_megatron);
// Gradient buffers one block's backward holds while it runs (fused runtime): the residual, MLP,
// norm, attention-context and q/k/v gradients in the compute precision, and the fp32 query
// gradient accumulator of the fused attention.
double block_backward_workspace_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                                      Precision precision);
// The same for Alloy's CPU runtime at its largest, the start of the MLP's backward: the
// gradients of the MLP's activation and of its up projection (SwiGLU: gate and up), and under
// sequence parallelism the output gradient gathered to all rows.
double cpu_block_backward_workspace_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                                          bool sequence_parallel, Precision precision);
// Activations kept by the embedding (its output) and by the head (logits for the loss).
double embedding_activation_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len,
                                  int tp, bool sequence_parallel, Precision precision);
double head_activation_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                             Precision precision, AttentionMemory attention = AttentionMemory::AttentionMemory_megatron);

// Bytes of one hidden-state tensor (micro_batch, seq_len, hidden) in the compute precision:
// what crosses a pipeline stage boundary and what tp collectives move.
double hidden_state_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len,
                          Precision precision);

}  // namespace alloy
