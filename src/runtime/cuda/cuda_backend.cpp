// The CUDA backend: the host Model is the stage's layout (views, offsets, per-block
// recomputation) and where its initial weights are made; the GpuModel holds the tensors the
// executor works on. Everything is queued on one stream; the host waits only where it reads a
// value (gradient norm, losses) or hands memory back (copies to and from host buffers).
#include "runtime/cuda/cuda_backend.hpp"

#include <cstring>

#include <fmt/format.h>

#include "runtime/cuda/device.hpp"
#include "runtime/cuda/gpu_model.hpp"
#include "runtime/cpu/moe.hpp"
#include "runtime/cuda/kernels.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

class CudaPass final : public StagePass {
 public:
  explicit CudaPass(GpuModel& model) : gpu(model) {}
  ~CudaPass() override { gpu_activations_release(gpu, activations); }
  CudaPass(const CudaPass&) = delete;
  CudaPass& operator=(const CudaPass&) = delete;
  GpuModel& gpu;
  GpuActivations activations;
};

CudaPass& cuda_pass(StagePass& pass) { return static_cast<CudaPass&>(pass); }
const CudaPass& cuda_pass(const StagePass& pass) { return static_cast<const CudaPass&>(pass); }

// Token ids go to the GPU through page-locked memory, so their upload is queued without waiting
// for the stream. The buffer is refilled once the previous upload has run, which was queued
// ahead of the previous pass's compute: the host stays at most about a pass ahead.
class TokenStaging {
 public:
  TokenStaging() { cuda_check(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming), "creating an event"); }
  ~TokenStaging() {
    cudaEventSynchronize(uploaded_);
    cudaEventDestroy(uploaded_);
    cudaFreeHost(host_);
  }
  TokenStaging(const TokenStaging&) = delete;
  TokenStaging& operator=(const TokenStaging&) = delete;

  // inputs, targets: (n) ids (either may be nullptr: not copied) -> their pinned copies, one
  // after the other: (2 n).
  int32_t* stage(const int32_t* inputs, const int32_t* targets, int64_t n) {
    cuda_check(cudaEventSynchronize(uploaded_), "uploading tokens");
    if (2 * n > capacity_) {
      cuda_check(cudaFreeHost(host_), "freeing pinned host memory");
      host_ = nullptr;
      cuda_check(cudaMallocHost(&host_, static_cast<size_t>(2 * n) * sizeof(int32_t)), "allocating pinned host memory");
      capacity_ = 2 * n;
    }
    if (inputs != nullptr) std::memcpy(host_, inputs, static_cast<size_t>(n) * sizeof(int32_t));
    if (targets != nullptr) std::memcpy(host_ + n, targets, static_cast<size_t>(n) * sizeof(int32_t));
    return host_;
  }
  // After the uploads from the staged copies were queued on `stream`.
  void queued(cudaStream_t stream) { cuda_check(cudaEventRecord(uploaded_, stream), "uploading tokens"); }

 private:
  int32_t* host_ = nullptr;
  int64_t capacity_ = 0;  // int32 ids
  cudaEvent_t uploaded_ = nullptr;
};

// The host side of the layout: an arena that only counts (the whole model lives there once).
constexpr int64_t kHostLayoutBytes = int64_t{1} << 40;

Model& initialised(Model& model, uint64_t seed) {
  model_init_weights(model, seed);
  return model;
}

class CudaBackend final : public StageBackend {
 public:
  CudaBackend(const StageRequest& r, cudaStream_t stream)
      : stream_(stream),
        host_arena_(kHostLayoutBytes, "host"),
        host_(*r.model, host_arena_, r.shard, r.host),
        arena_(r.memory_cap_bytes, r.device_name, cuda_arena_memory()),
        gpu_(initialised(host_, r.seed), arena_, stream) {
    if (model_is_moe(host_.spec)) {
      gpu_.routing = &host_.moe_routing;
    }
    loss_sum_ = static_cast<double*>(arena_.allocate(sizeof(double), "loss sum"));
    squares_ = arena_.allocate_floats(1, "gradient norm");
    cuda_check(cudaMemsetAsync(loss_sum_, 0, sizeof(double), stream_), "zeroing the loss sum");
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);  // nothing queued may outlive the buffers
    arena_.release(squares_);
    arena_.release(loss_sum_);
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  Model& model() override { return host_; }
  Arena& arena() override { return arena_; }
  bool memory_is_host() const override { return false; }
  bool collectives_share_compute() const override { return false; }  // NCCL on its own stream
  bool reports_gradient_writes() const override { return false; }
  bool computes_in_fp16() const override { return false; }  // bf16
  int64_t hidden_element_bytes() const override { return sizeof(bf16); }

  float* parameters_at(int64_t offset, int64_t count) override { return gpu_.params + checked(offset, count); }
  float* gradients_at(int64_t offset, int64_t count) override { return gpu_.grads + checked(offset, count); }

  std::unique_ptr<StagePass> pass_begin(int block_begin, int block_end, bool embeds, bool heads, const int32_t* inputs,
                                        const int32_t* targets, int B, int T) override {
    auto pass = std::make_unique<CudaPass>(gpu_);
    pass->describe(block_begin, block_end, embeds, heads, B, T);
    const int64_t N = int64_t{B} * T;
    const int32_t* staged = tokens_.stage(embeds ? inputs : nullptr, heads ? targets : nullptr, N);
    gpu_chunk_activations_begin(gpu_, pass->activations, GpuChunk{block_begin, block_end, embeds, heads}, staged,
                                staged + N, B, T);
    tokens_.queued(stream_);
    return pass;
  }
  void* pass_input(StagePass& pass) override {
    GpuActivations& a = cuda_pass(pass).activations;
    if (a.chunk.embeds) throw Error("a pass that embeds receives no hidden state");
    return a.input;
  }
  const void* pass_forward(StagePass& pass) override {
    GpuActivations& a = cuda_pass(pass).activations;
    gpu_model_forward(gpu_, a);
    // Every chunk holds its MoE blocks' share of the per-block balance now; the pooled one is
    // known once pooled (pass_balance_pool).
    if (model_is_moe(host_.spec) && !model_balance_is_pooled(host_.spec)) balance_sum_ += a.aux_loss * tokens_of(a);
    if (!a.chunk.heads) return gpu_chunk_output(a);
    cuda_sum(loss_sum_, a.losses, int64_t{a.B} * a.T, stream_);
    return nullptr;
  }
  std::vector<double> pass_balance_sums(const StagePass& pass) override {
    const GpuActivations& a = cuda_pass(pass).activations;
    if (!a.balance_sums.empty()) return a.balance_sums;
    return std::vector<double>(2 * static_cast<size_t>(host_.spec.moe.num_experts) + 1, 0.0);  // no MoE block ran
  }
  void pass_balance_pool(StagePass& pass, const double* sums) override {
    GpuActivations& a = cuda_pass(pass).activations;
    if (!model_balance_is_pooled(host_.spec)) return;
    const int E = static_cast<int>(host_.spec.moe.num_experts);
    a.balance_sums.assign(sums, sums + 2 * E + 1);
    a.balance_pooled = true;
    a.aux_loss = moe_aux_loss_from_sums(sums, sums[2 * E], E);
    // The micro-batch's whole loss, counted once per token: by the heading pass.
    if (a.chunk.heads) balance_sum_ += a.aux_loss * tokens_of(a);
  }
  void* pass_output_gradient(StagePass& pass) override {
    return gpu_output_gradient(gpu_, cuda_pass(pass).activations);
  }
  const void* pass_backward(StagePass& pass, int block_begin, int block_end, float loss_scale) override {
    return gpu_model_backward(gpu_, cuda_pass(pass).activations, block_begin, block_end, loss_scale);
  }
  bool pass_finished(const StagePass& pass) const override {
    const GpuActivations& a = cuda_pass(pass).activations;
    return a.forwarded && a.backward_next == a.chunk.block_begin;
  }
  void pass_release(StagePass& pass) override { gpu_activations_release(gpu_, cuda_pass(pass).activations); }
  PassLossSums take_loss_sums() override {
    PassLossSums sums;
    sums.balance = balance_sum_;
    balance_sum_ = 0;
    cuda_check(cudaMemcpyAsync(&sums.cross_entropy, loss_sum_, sizeof(double), cudaMemcpyDeviceToHost, stream_),
               "reading the losses");
    fence();
    cuda_check(cudaMemsetAsync(loss_sum_, 0, sizeof(double), stream_), "zeroing the loss sum");
    return sums;
  }

  void zero_gradients() override { gpu_model_zero_grad(gpu_); }
  double square_sum(const std::vector<FloatSpan>& spans) override {
    cuda_check(cudaMemsetAsync(squares_, 0, sizeof(float), stream_), "gradient norm");
    for (const FloatSpan& span : spans) cuda_sum_squares(squares_, span.data, span.count, stream_);
    float squares = 0;
    cuda_check(cudaMemcpyAsync(&squares, squares_, sizeof(float), cudaMemcpyDeviceToHost, stream_), "gradient norm");
    fence();
    return squares;
  }
  // Also writes the bf16 copy of the updated parameters, at the same offset.
  void adamw_update(float* params, float* m, float* v, const float* grads, int64_t count, const AdamWHyper& hyper,
                    int64_t step) override {
    const int64_t offset = checked(params - gpu_.params, count);
    cuda_adamw_update(params, gpu_.weights + offset, grads, m, v, count, hyper.learning_rate, hyper.beta1, hyper.beta2,
                      hyper.eps, hyper.weight_decay, hyper.grad_scale, step, stream_);
  }
  // Whatever wrote the fp32 parameters (the optimizer, a checkpoint, a collective), the bf16
  // copy and the padded head follow them.
  void parameters_changed() override {
    cuda_float_to_bf16(gpu_.weights, gpu_.params, gpu_.num_parameters, stream_);
    gpu_model_refresh_head(gpu_);
  }
  void fill_zero(float* data, int64_t count) override {
    cuda_check(cudaMemsetAsync(data, 0, static_cast<size_t>(count) * sizeof(float), stream_), "zeroing a buffer");
  }
  void copy(void* to, const void* from, int64_t bytes) override {
    cuda_check(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_), "copying");
  }
  void copy_to_host(void* host, const void* from, int64_t bytes) override {
    cuda_check(cudaMemcpyAsync(host, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
               "copying to host memory");
    fence();
  }
  // Waits, so that the caller may reuse or free `host` at once.
  void copy_from_host(void* to, const void* host, int64_t bytes) override {
    cuda_check(cudaMemcpyAsync(to, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_),
               "copying from host memory");
    fence();
  }
  void fence() override { cuda_check(cudaStreamSynchronize(stream_), "the GPU's queued work"); }
  // The measurement runs on another stream and shares the matmul's workspace: the queue drains first.
  double matmul_peak_flops() override {
    fence();
    return cuda_matmul_peak_flops(gpu_.matmul);
  }

 private:
  // offset, checked to start a range of count floats inside the flat buffers.
  int64_t checked(int64_t offset, int64_t count) const {
    if (offset < 0 || count < 0 || offset + count > gpu_.num_parameters)
      throw Error(fmt::format("floats [{}, {}) lie outside the GPU's {} parameters", offset, offset + count,
                              gpu_.num_parameters));
    return offset;
  }
  static double tokens_of(const GpuActivations& a) { return static_cast<double>(a.B) * a.T; }

  cudaStream_t stream_;
  Arena host_arena_;
  Model host_;
  Arena arena_;
  GpuModel gpu_;
  TokenStaging tokens_;
  double* loss_sum_ = nullptr;  // (1) the heading passes' token losses since take_loss_sums
  float* squares_ = nullptr;    // (1) square_sum's
  double balance_sum_ = 0;      // MoE: the passes' load-balancing losses times their tokens since take_loss_sums
};

}  // namespace

std::unique_ptr<StageBackend> stage_backend_cuda(const StageRequest& request, int device, cudaStream_t stream) {
  cuda_check(cudaSetDevice(device), "selecting the GPU");
  return std::make_unique<CudaBackend>(request, stream);
}

}  // namespace alloy
