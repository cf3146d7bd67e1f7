// The seam between the executor and a device: a StageBackend owns one rank's share of a stage
// (its tensors in the device's memory and the kernels that run on them) and offers the executor
// passes, flat parameter and gradient views, the arithmetic on them and copies. The executor
// (schedule, buckets, ZeRO, offload, timing) is written once above it; CPU and CUDA implement it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "plan/runnable.hpp"
#include "runtime/arena.hpp"
#include "runtime/cpu/optimizer.hpp"
#include "runtime/model.hpp"

namespace alloy {


// What the backend is asked to hold: the rank's shard of the model and where its blocks live.
struct StageRequest {
  const ModelSpec* model = nullptr;
  ModelShard shard;
  HostPlacement host;               // blocks whose parameters live in host memory
  int64_t memory_cap_bytes = 0;     // the device arena's hard cap
  std::string device_name;          // for messages ("cpu", "h200")
  uint64_t seed = 0;                // initial weights: every shard gets its slice of one model
};

// `count` floats at `data`, in the backend's memory.
struct FloatSpan {
  const float* data = nullptr;
  int64_t count = 0;
};

// Sums over tokens that passes report (StageBackend::take_loss_sums).
struct PassLossSums {
  double cross_entropy = 0;  // the heading passes' token losses
  double balance = 0;        // MoE models: each pass's share of its micro-batch's load-balancing
                             // loss (ChunkPass::aux_loss, unweighted) times its tokens
};

// One micro-batch through one chunk of blocks on a backend: what the forward keeps until the
// backward lives in the backend's subclass.
class StagePass {
 public:
  virtual ~StagePass() = default;
  // What pass_begin was asked to run.
  void describe(int first_block, int end_block, bool with_embedding, bool with_head, int batch, int tokens) {
    block_begin = first_block;
    block_end = end_block;
    embeds = with_embedding;
    heads = with_head;
    B = batch;
    T = tokens;
  }
  int B = 0;
  int T = 0;
  int block_begin = 0;
  int block_end = 0;
  bool embeds = false;  // starts from token ids
  bool heads = false;   // ends in the loss
};

class StageBackend {
 public:
  virtual ~StageBackend() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"

  // The stage's layout: named views into the flat index, segments, per-block recomputation.
  // Host code reads its metadata (views, offsets, shard, recomputation); the tensors the
  // executor works on are those of parameters_at and gradients_at.
  virtual Model& model() = 0;
  // Device memory, with the hard cap the plan's per-device memory is measured against.
  virtual Arena& arena() = 0;
  // True when host code may read and write the backend's tensors directly (a CPU backend).
  virtual bool memory_is_host() const = 0;
  // True when collectives reduce on the cores that compute (a CPU rank's communicator), so a
  // reduction left in flight behind the next computation hides nothing and only holds memory.
  virtual bool collectives_share_compute() const = 0;
  // True when its passes tell Model::gradient_sink of every gradient write (the CPU passes), so
  // sharded gradients can hold a part of a block at a time instead of whole buckets.
  virtual bool reports_gradient_writes() const = 0;
  // Whether the passes compute in fp16, whose gradients need loss scaling (TrainSpec auto).
  virtual bool computes_in_fp16() const = 0;
  // Bytes of one element of the hidden states that passes hand over (fp32 4, bf16 2).
  virtual int64_t hidden_element_bytes() const = 0;

  // Flat parameters and gradients [offset, offset + count), inside one segment.
  virtual float* parameters_at(int64_t offset, int64_t count) = 0;
  virtual float* gradients_at(int64_t offset, int64_t count) = 0;

  // Passes, as model.hpp's chunk functions describe them. inputs, targets: (B, T) host ids.
  virtual std::unique_ptr<StagePass> pass_begin(int block_begin, int block_end, bool embeds, bool heads,
                                                const int32_t* inputs, const int32_t* targets, int B, int T) = 0;
  virtual void* pass_input(StagePass& pass) = 0;  // (B, T, C) to receive into, when !embeds
  // The chunk's output (B, T, C), alive until its backward; nullptr when it heads.
  virtual const void* pass_forward(StagePass& pass) = 0;
  virtual void* pass_output_gradient(StagePass& pass) = 0;  // zeroed (B, T, C), when !heads
  // Backward of blocks [block_begin, block_end) (top piece first), adding loss_scale x the
  // gradients of the pass's mean loss. Returns dL/d(input) after the lowest piece of a chunk
  // that does not embed, nullptr otherwise.
  virtual const void* pass_backward(StagePass& pass, int block_begin, int block_end, float loss_scale) = 0;
  virtual bool pass_finished(const StagePass& pass) const = 0;  // every piece's backward ran
  virtual void pass_release(StagePass& pass) = 0;
  // The loss sums of the passes run since the last call.
  virtual PassLossSums take_loss_sums() = 0;
  // MoE models with the pooled load-balancing loss: a forwarded pass's balance sums over its MoE
  // blocks and tokens (ChunkPass::balance_sums, 2 E + 1), and the micro-batch's pooled sums
  // handed back before its backward (chunk_balance_pool). Backends that train no MoE model refuse.
  virtual std::vector<double> pass_balance_sums(const StagePass& pass);
  virtual void pass_balance_pool(StagePass& pass, const double* sums);

  // Arithmetic on the flat buffers (all pointers in the backend's memory).
  virtual void zero_gradients() = 0;
  // Sum of the squares of every float of `spans` (the gradient norm's share of this rank).
  virtual double square_sum(const std::vector<FloatSpan>& spans) = 0;
  virtual void adamw_update(float* params, float* m, float* v, const float* grads, int64_t count,
                            const AdamWHyper& hyper, int64_t step) = 0;
  // After the parameters changed (optimizer, gathers, a loaded checkpoint): compute copies follow.
  virtual void parameters_changed() = 0;
  virtual void fill_zero(float* data, int64_t count) = 0;
  virtual void copy(void* to, const void* from, int64_t bytes) = 0;  // inside the backend's memory
  virtual void copy_to_host(void* host, const void* from, int64_t bytes) = 0;
  virtual void copy_from_host(void* to, const void* host, int64_t bytes) = 0;
  // Blocks until every operation queued so far has finished.
  virtual void fence() = 0;
  // Dense matrix-product rate measured on this device: the model FLOPs utilisation's denominator.
  virtual double matmul_peak_flops() = 0;
};

// Whether backend `name` runs stage `stage` of `plan` (its features, not its memory).
StageSupport stage_backend_supports(const std::string& name, const Plan& plan, int stage);

// Throws alloy::Error naming the first stage, feature and backend that does not run: one line,
// before anything is allocated. `source` names the plan file.
void stage_backend_check_plan(const std::string& name, const Plan& plan, const std::string& source);

// A note for a run whose plan (`source`) was priced in a precision backend `name` does not
// compute in, so that its times and memory are not read as that precision's: the cuda backend
// computes in bf16. "" when they agree (the cpu backend computes in fp32, in which the cost model
// prices a cpu device whatever precision the plan names).
std::string stage_backend_precision_note(const std::string& name, Precision asked, const std::string& source);

// Throws alloy::Error naming, in one line, the first thing `plan` asks of an MoE `model` that
// backend `name` does not run with MoE blocks (stage_backend_check_plan answers for the rest);
// nothing for a dense model.
void stage_backend_check_moe(const std::string& name, const ModelSpec& model, const Plan& plan,
                             const std::string& source);

}  // namespace alloy
