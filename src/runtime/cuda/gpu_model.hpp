// The model on one GPU: the same parameter layout as the CPU model (named views into one flat
// buffer, so checkpoints and exports are interchangeable), with fp32 master weights and
// gradients, a bf16 compute copy of the weights, bf16 activations in the GPU arena, and forward
// and backward passes per micro-batch through cuBLASLt, the fused attention and the kernels of
// kernels.hpp, with per-layer recomputation.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/arena.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/matmul.hpp"
#include "runtime/model.hpp"

namespace alloy {

// What one block keeps between its forward and its backward (nullptr when dropped).
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
};

// Events a profiler has the passes record at their phase boundaries (L blocks):
//   forward:  [0] start, [1] after the embedding, [2 + l] after block l, [L + 2] after the head
//   backward: [0] start, [1] after the head, [2 + k] after the k-th block down, [L + 2] after the embedding
struct GpuPhaseEvents {
  std::vector<cudaEvent_t> forward;   // L + 3
  std::vector<cudaEvent_t> backward;  // L + 3
};

struct GpuModel {
  // host: the CPU model whose layout (views) and initial weights this copies; it stays the host
  // side of checkpoints and must outlive this. device_arena: GPU memory.
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
                                   // products over an aligned vocabulary run ~7x faster
  std::vector<Recompute> recompute;  // one per block
  GpuPhaseEvents* phases = nullptr;  // recorded when set (alloy profile --device cuda)
  // Called by the backward right after block `layer`'s gradients are queued (on `stream`): lets
  // a data-parallel trainer post their reduction while the blocks below still run.
  std::function<void(int layer)> on_block_gradients;

  // The device copy of one of host's tensors (a pointer into host->params): the bf16 weight or
  // the fp32 gradient at the same offset; nullptr for nullptr.
  bf16* weight(const float* host_tensor) const;
  float* gradient(const float* host_tensor) const;

  // One micro-batch's activations.
  int B = 0, T = 0;
  int32_t* tokens = nullptr;    // (B, T) device
  int32_t* targets = nullptr;   // (B, T) device
  bf16* embedded = nullptr;     // (N, C) the first block's input
  std::vector<GpuBlockActivations> blocks;
  bf16* lnf = nullptr;          // (N, C)
  float* lnf_mean = nullptr;    // (N)
  float* lnf_rstd = nullptr;    // (N)
  bf16* logits = nullptr;       // (N, ld); dlogits after a training forward
  float* losses = nullptr;      // (N)
};

// Copies host->params to the GPU (fp32 and the bf16 copy).
void gpu_model_upload(GpuModel& model);
// Copies the LM head's bf16 weights into head_weight (after every optimizer step).
void gpu_model_refresh_head(GpuModel& model);
// Copies the GPU's fp32 params into host->params (for checkpoints and exports).
void gpu_model_download(GpuModel& model);
void gpu_model_zero_grad(GpuModel& model);
// Frees every activation of the last pass (after a failed one, or a forward without backward).
void gpu_model_release_activations(GpuModel& model);

// inputs, targets: (B, T) host token ids -> per-token losses in model.losses (device, N floats,
// not yet synchronised). training: also turns the logits into dlogits scaled by loss_scale / N,
// ready for gpu_model_backward; otherwise the activations are freed at once. Throws
// alloy::Error for ids outside the vocabulary or T above the model's maximum.
void gpu_model_forward(GpuModel& model, const int32_t* inputs, const int32_t* targets, int B, int T, bool training,
                       float loss_scale);
// Adds the gradients of the last training forward into model.grads and frees its activations.
void gpu_model_backward(GpuModel& model);

// Logits row stride: the vocabulary padded to a multiple of 64 for aligned, efficient products.
int gpu_logits_ld(int64_t vocab_size);

}  // namespace alloy
