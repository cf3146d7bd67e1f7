// The model on one GPU: the same parameter layout as the CPU model (named views into one flat
// buffer, so checkpoints and exports are interchangeable), with fp32 master weights and
// gradients and a bf16 compute copy of the weights; and forward and backward passes per
// micro-batch through cuBLASLt, the fused attention and the kernels of kernels.hpp, each pass
// keeping its own bf16 activations in the GPU arena (several may be alive at once), with
// per-layer recomputation and a backward that may run in pieces of blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/arena.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/matmul.hpp"
#include "runtime/model.hpp"

namespace alloy {

// What one block keeps between its forward and its backward (nullptr when dropped). N = B T.
struct GpuBlockActivations {
  bf16* ln1 = nullptr;         // (N, C)
  float* ln1_mean = nullptr;   // (N), LayerNorm only
  float* ln1_rstd = nullptr;   // (N)
  bf16* qkv = nullptr;         // (N, R), after RoPE for LLaMA
  bf16* context = nullptr;     // (N, Hq D)
  float* lse = nullptr;        // (B, Hq, T)
  bf16* residual1 = nullptr;   // (N, C)
  bf16* ln2 = nullptr;         // (N, C)
  float* ln2_mean = nullptr;   // (N)
  float* ln2_rstd = nullptr;   // (N)
  bf16* mlp_up = nullptr;      // (N, F) GPT-2, (N, 2F) LLaMA
  bf16* mlp_act = nullptr;     // (N, F)
  bf16* out = nullptr;         // (N, C), kept at every recomputation level
  // MoE blocks instead of mlp_up and mlp_act (gpu_moe.cpp). R = N K, or under expert parallelism
  // the rows this member's experts received.
  float* moe_probs = nullptr;     // (N, E) router probabilities
  int32_t* moe_experts = nullptr; // (N, K) picked experts
  float* moe_weights = nullptr;   // (N, K) their routing weights
  int32_t* moe_slots = nullptr;   // (N K) slot n K + k of each permuted row, grouped by expert
  int32_t* moe_rows = nullptr;    // (N K) permuted row of each slot
  bf16* moe_up = nullptr;         // (R, 2 Fe)
  bf16* moe_act = nullptr;        // (R, Fe)
  bf16* moe_out = nullptr;        // (N K, C) experts' outputs, permuted rows
  bf16* moe_ep_in = nullptr;      // (R, C) received rows, expert-major, under expert parallelism
  bf16* shared_up = nullptr;      // (N, 2 Fs)
  bf16* shared_act = nullptr;     // (N, Fs)
  std::vector<int32_t> moe_offsets;    // (E + 1) host: each expert's first permuted row
  std::vector<int64_t> moe_ep_counts;  // (G x E) host: rows each member routes to each expert
  std::vector<double> moe_aux_sums;    // (2 E + 1) host: per-block balance sums (over the replicas)
};

// Gradient buffers of one backward, shared by its blocks: taken by the top piece, returned by
// the lowest.
struct GpuBackwardScratch {
  bf16* dres = nullptr;      // (N, C) dL/d(residual stream), carried down through the blocks
  bf16* dact = nullptr;      // (N, F)
  bf16* dup = nullptr;       // (N, 2F), LLaMA only
  bf16* dln = nullptr;       // (N, C)
  bf16* dcontext = nullptr;  // (N, Hq D)
  bf16* dqkv = nullptr;      // (N, R)
  void* attention_workspace = nullptr;
};

// The blocks [block_begin, block_end) one pass runs (a pipeline stage's chunk), whether it
// starts from the token ids and whether it ends in the loss.
struct GpuChunk {
  int block_begin = 0;
  int block_end = 0;
  bool embeds = true;
  bool heads = true;
};

// One micro-batch through one chunk of the model, from gpu_activations_begin (or
// gpu_chunk_activations_begin) to gpu_activations_release: what its forward keeps for its backward.
struct GpuActivations {
  int B = 0, T = 0;
  GpuChunk chunk;
  int32_t* tokens = nullptr;    // (B, T) device, when the chunk embeds
  int32_t* targets = nullptr;   // (B, T) device, when the chunk heads
  bf16* input = nullptr;        // (N, C) the first block's input: the embedding's output, or the
                                // hidden state received from the previous stage
  bf16* input_gradient = nullptr;  // (N, C) dL/d(input) after the lowest backward piece of a
                                   // chunk that does not embed, kept until it is sent
  bool forwarded = false;
  std::vector<GpuBlockActivations> blocks;  // L, by layer (the chunk's alone are used)
  bf16* lnf = nullptr;          // (N, C)
  float* lnf_mean = nullptr;    // (N)
  float* lnf_rstd = nullptr;    // (N)
  bf16* logits = nullptr;       // (N, ld); dlogits from the top backward piece on
  float* losses = nullptr;      // (N) per-token losses, after the forward
  GpuBackwardScratch scratch;
  int backward_next = 0;        // blocks [chunk.block_begin, backward_next) still wait for their backward
  // MoE models: the load-balancing loss of the pass (the per-block balance's mean over its MoE
  // blocks, or the pooled one once pooled), and under the pooled balance its sums (2 E + 1): the
  // forwarded blocks' own, then the micro-batch's pooled ones (balance_pooled).
  double aux_loss = 0;
  std::vector<double> balance_sums;
  bool balance_pooled = false;
};

// Events a profiler has the passes record at their phase boundaries (L blocks):
//   forward:  [0] start, [1] after the embedding, [2 + l] after block l, [L + 2] after the head
//   backward: [0] start, [1] after the head, [2 + k] after the k-th block down, [L + 2] after the embedding
struct GpuPhaseEvents {
  std::vector<cudaEvent_t> forward;   // L + 3
  std::vector<cudaEvent_t> backward;  // L + 3
};

struct GpuModel {
  // host: the CPU model whose layout (views), initial weights and per-block recomputation
  // (read at each forward) this follows; it must outlive this. device_arena: GPU memory.
  // host may hold a pipeline stage's blocks (with or without the embedding and the head).
  // Throws alloy::Error when host is split by tensor parallelism.
  GpuModel(const Model& host, Arena& device_arena, cudaStream_t stream);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  const Model* host;
  Arena* arena;
  cudaStream_t stream;
  CudaMatmul matmul;
  int64_t num_parameters = 0;
  float* params = nullptr;         // (num_parameters) fp32 master weights
  float* grads = nullptr;          // (num_parameters) fp32
  bf16* weights = nullptr;         // (num_parameters) bf16 compute copy of params
  bf16* head_weight = nullptr;     // (ld, C) the LM head's bf16 rows, zero past the vocabulary:
                                   // products over an aligned vocabulary run ~7x faster; nullptr
                                   // on a stage without the head
  GpuPhaseEvents* phases = nullptr;  // recorded when set (alloy profile --device cuda)
  MoeRouting* routing = nullptr;     // MoE models: the first forwards' picks counted into it when set

  // The device copy of one of host's tensors (a pointer into host->params): the bf16 weight or
  // the fp32 gradient at the same offset; nullptr for nullptr.
  bf16* weight(const float* host_tensor) const;
  float* gradient(const float* host_tensor) const;
};

// `count` elements of T from the model's device arena (`what` names them in its reports), and
// their release (the pointer is cleared).
template <typename T>
T* gpu_take(GpuModel& m, int64_t count, const char* what) {
  return static_cast<T*>(m.arena->allocate(count * static_cast<int64_t>(sizeof(T)), what));
}
template <typename T>
void gpu_give(GpuModel& m, T*& buffer) {
  m.arena->release(buffer);
  buffer = nullptr;
}

// Copies the LM head's bf16 weights into head_weight (after every change of the weights).
void gpu_model_refresh_head(GpuModel& model);
void gpu_model_zero_grad(GpuModel& model);

// Starts a pass of (B, T) tokens through `chunk`: checks the ids it uses (inputs when it embeds,
// targets when it heads; host ids, either may be nullptr otherwise) and queues their upload on
// model.stream, so they must stay unchanged until the stream has run the copies (pinned memory)
// or the call returns (pageable memory); takes the chunk's input buffer. Throws alloy::Error for
// ids outside the vocabulary, T above the model's maximum, or a chunk outside the stage's blocks.
void gpu_chunk_activations_begin(GpuModel& model, GpuActivations& pass, const GpuChunk& chunk, const int32_t* inputs,
                                 const int32_t* targets, int B, int T);
// The same through the whole model (which the GPU model must hold).
void gpu_activations_begin(GpuModel& model, GpuActivations& pass, const int32_t* inputs, const int32_t* targets, int B,
                           int T);
// The forward: the embedding when the chunk embeds (else pass.input holds the received hidden
// state), its blocks, and when it heads the per-token losses in pass.losses (device, N floats,
// not yet synchronised); every activation its backward needs (as model.host->recompute asks per
// block). A chunk that does not head hands on its last block's output: gpu_chunk_output.
void gpu_model_forward(GpuModel& model, GpuActivations& pass);
// (N, C) the output of a forwarded chunk that does not head, alive until its backward.
const bf16* gpu_chunk_output(const GpuActivations& pass);
// (N, C) the zeroed buffer that receives dL/d(output) of a chunk that does not head, before its
// backward.
bf16* gpu_output_gradient(GpuModel& model, GpuActivations& pass);
// Backward of blocks [block_begin, block_end), top piece (block_end == chunk end, with the head
// when the chunk heads) first, down to the lowest (block_begin == chunk begin, with the embedding
// when it embeds): adds loss_scale x the gradients of the pass's mean loss into model.grads,
// freeing each block's activations once used. Returns pass.input_gradient after the lowest piece
// of a chunk that does not embed, nullptr otherwise.
const bf16* gpu_model_backward(GpuModel& model, GpuActivations& pass, int block_begin, int block_end, float loss_scale);
// Frees whatever the pass still holds (any time after begin; twice is harmless).
void gpu_activations_release(GpuModel& model, GpuActivations& pass);

// Logits row stride: the vocabulary padded to a multiple of 64 for aligned, efficient products.
int gpu_logits_ld(int64_t vocab_size);

}  // namespace alloy
