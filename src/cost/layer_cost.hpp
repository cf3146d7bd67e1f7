// Analytic arithmetic of one model layer (embedding, decoder block, head): parameters, FLOPs,
// memory traffic and stored activations, per tensor-parallel degree and sequence-parallel mode.
#pragma once

#include <cstdint>
#include <vector>

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
  // The part of forward_flops an fp8 run still computes at 16 bits: the attention core's and the
  // output layer's (fp8 recipes cast only the blocks' linear layers). Backward: twice as much.
  double sixteen_bit_forward_flops = 0;
  double matmul_rows = 0;          // M of the dominant matrix products (tokens on the device)
  double matmul_cols = 0;          // N of the dominant matrix products (per tp rank)
};

// How a runtime runs a block's element-wise work. fused: each norm, activation and residual add
// is one kernel that reads its inputs once and writes its output once (Megatron-LM, a compiled
// model, Alloy's GPU runtime). eager: every tensor operation of the model's code is a kernel of
// its own with its own reads and writes, fp32 copies included (eager PyTorch; counted operation
// by operation from torchtitan's Llama, docs/catalog.md).
enum class ElementwiseKernels { ElementwiseKernels_fused, ElementwiseKernels_eager };

// What selective recomputation keeps of a block. attention_core: everything but the attention
// core, which it recomputes (Megatron-LM's and Alloy's). alternate_matmuls: the block's input, the
// outputs of the 1st, 3rd, 5th, ... matrix product in call order and the attention kernel's
// output and log-sum-exp; it recomputes the rest of the block from its input (torchtitan's
// op-level policy).
enum class SelectiveRecompute { SelectiveRecompute_attention_core, SelectiveRecompute_alternate_matmuls };

// How the loss reads the logits. runtime_kernel: the runtime's own cross-entropy reads them as
// they are (AttentionMemory says what it keeps). fp32_copy: they are copied to fp32 and PyTorch's
// cross-entropy (log-softmax, then NLL) runs on the copy: it keeps the fp32 log-probabilities for
// the backward, which writes their fp32 gradient and the logits' (torchtitan).
enum class LossLogits { LossLogits_runtime_kernel, LossLogits_fp32_copy };

// When an fp8 runtime casts a block's weights. every_micro_batch: each forward casts them again
// (torchao's float8 linear layers). once_per_step: the step's first micro-batch casts them and the
// later ones reuse the fp8 copy, as the weights do not change within a step (Transformer Engine's
// is_first_microbatch, which Megatron-LM passes).
enum class Fp8WeightCasts { Fp8WeightCasts_every_micro_batch, Fp8WeightCasts_once_per_step };

// micro_batch: sequences per replica; seq_len: tokens per sequence. `selective` sets
// selective_flops: the matrix products selective recomputation runs again.
LayerWork block_work(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                     bool sequence_parallel, Precision precision,
                     ElementwiseKernels kernels = ElementwiseKernels::ElementwiseKernels_fused,
                     SelectiveRecompute selective = SelectiveRecompute::SelectiveRecompute_attention_core,
                     Fp8WeightCasts weight_casts = Fp8WeightCasts::Fp8WeightCasts_every_micro_batch);
LayerWork embedding_work(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                         Precision precision);
LayerWork head_work(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                    Precision precision, LossLogits loss = LossLogits::LossLogits_runtime_kernel);

// Bytes per token one block's forward moves through eager kernels on one device (tp shares the
// projections' widths; sequence parallelism shares the hidden-sized steps): torchtitan's Llama
// op by op (x: hidden, q: query width, kv: key/value width, f: MLP width, e: element bytes):
//   RMSNorm, twice: x.float() (e in, 4 out), pow (4, 4), mean (4 in), x * rsqrt (4, 4),
//     type_as (4, e), * weight (e, e): (4e + 28) x
//   q, k, v projections read the norm's output: 3e x; write e q + 2e kv
//   rotary on q and k: .float() (e, 4), complex product (4, 4), type_as (4, e): (2e + 16) (q + kv)
//   repeat_kv of k and v: read 2e kv, write 2e q
//   attention kernel: reads q, k, v (3e q), writes its output (e q); output projection: reads
//     e q, writes e x; residual add: 3e x
//   gate and up projections read the norm's output (2e x) and write 2e f; SiLU (e f, e f);
//     product (2e f, e f); down projection reads e f, writes e x; residual add: 3e x
double eager_block_elementwise_bytes_per_token(const ModelSpec& model, int tp, bool sequence_parallel,
                                               Precision precision);

// Bytes one block's forward moves casting its linear layers' inputs and, every_micro_batch, their
// weights to fp8: each product reads its input and weight in bf16 and writes an fp8 copy (3 bytes
// per element, the scale's amax fused into the cast); the backward casts output gradients and
// transposes alike.
double fp8_cast_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                      Fp8WeightCasts weight_casts = Fp8WeightCasts::Fp8WeightCasts_every_micro_batch);
// Bytes one block moves casting its weights to fp8 once per step (Fp8WeightCasts_once_per_step):
// a bf16 read and the fp8 copy for the forward and its transpose for the backward, 4 bytes each.
double fp8_weight_cast_bytes_per_step(const ModelSpec& model, int tp);

// The matrix products of one block in the order its forward calls them (Llama: q, k, v, output,
// gate, up, down; GPT-2: q, k, v, output, up, down): input and output width per tp rank.
struct BlockMatmul {
  double input_width = 0;
  double output_width = 0;
};
std::vector<BlockMatmul> block_matmuls_in_call_order(const ModelSpec& model, int tp);

// Work recomputed in one block's backward under SelectiveRecompute_alternate_matmuls: the
// matrix products whose outputs were not kept (the 2nd, 4th, ...) and all of the block's
// element-wise work but the attention score matrix's.
LayerWork alternate_matmuls_recompute_work(const LayerWork& block);

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
// Under SelectiveRecompute_alternate_matmuls the selective level keeps the block's input, the
// kept matrix products' outputs (a row-parallel product's whole, before its sum over tp) and the
// attention kernel's output and fp32 log-sum-exp per query row.
double block_activation_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                              bool sequence_parallel, Recompute recompute, Precision precision,
                              AttentionMemory attention = AttentionMemory::AttentionMemory_megatron,
                              SelectiveRecompute selective = SelectiveRecompute::SelectiveRecompute_attention_core);
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
// Under LossLogits_fp32_copy the head keeps its norm's output and statistics and the fp32
// log-probabilities, whatever `attention` says.
double head_activation_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                             Precision precision, AttentionMemory attention = AttentionMemory::AttentionMemory_megatron,
                             LossLogits loss = LossLogits::LossLogits_runtime_kernel);
// Buffers the head's backward holds beyond what the head keeps: under LossLogits_fp32_copy the
// gradient of the log-probabilities and the log-softmax's input gradient, both fp32 and whole
// (the log-probabilities themselves are kept until then), and with tp > 1 the exponent of the
// log-probabilities beside them (loss parallelism); 0 for a runtime's own loss kernel.
double head_backward_workspace_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len, int tp,
                                     LossLogits loss);

// Bytes of one hidden-state tensor (micro_batch, seq_len, hidden) in the compute precision:
// what crosses a pipeline stage boundary and what tp collectives move.
double hidden_state_bytes(const ModelSpec& model, int64_t micro_batch, int64_t seq_len,
                          Precision precision);

}  // namespace alloy
