// The CPU backend: the stage's Model in an arena of host memory, fp32 passes through OpenBLAS
// and the kernels of cpu/, and the flat-buffer arithmetic as plain loops.
#include "runtime/cpu_backend.hpp"

#include <cstring>
#include <utility>

#include "runtime/profile.hpp"

namespace alloy {

namespace {

class CpuPass final : public StagePass {
 public:
  ChunkPass chunk;
};

CpuPass& cpu_pass(StagePass& pass) { return static_cast<CpuPass&>(pass); }
const CpuPass& cpu_pass(const StagePass& pass) { return static_cast<const CpuPass&>(pass); }

class CpuBackend final : public StageBackend {
 public:
  explicit CpuBackend(const StageRequest& r)
      : arena_(r.memory_cap_bytes, r.device_name), model_(*r.model, arena_, r.shard, r.host) {
    model_init_weights(model_, r.seed);
  }

  const char* name() const override { return "cpu"; }
  Model& model() override { return model_; }
  Arena& arena() override { return arena_; }
  bool memory_is_host() const override { return true; }
  bool collectives_share_compute() const override { return true; }
  bool reports_gradient_writes() const override { return true; }
  bool computes_in_fp16() const override { return false; }  // fp32
  int64_t hidden_element_bytes() const override { return sizeof(float); }

  float* parameters_at(int64_t offset, int64_t count) override { return model_parameters_at(model_, offset, count); }
  float* gradients_at(int64_t offset, int64_t count) override { return model_gradients_at(model_, offset, count); }

  std::unique_ptr<StagePass> pass_begin(int block_begin, int block_end, bool embeds, bool heads, const int32_t* inputs,
                                        const int32_t* targets, int B, int T) override {
    auto pass = std::make_unique<CpuPass>();
    pass->describe(block_begin, block_end, embeds, heads, B, T);
    chunk_begin(model_, pass->chunk, block_begin, block_end, embeds, heads, inputs, targets, B, T);
    return pass;
  }
  void* pass_input(StagePass& pass) override { return cpu_pass(pass).chunk.input; }
  const void* pass_forward(StagePass& pass) override {
    ChunkPass& chunk = cpu_pass(pass).chunk;
    const float* output = chunk_forward(model_, chunk);
    // The head's chunk holds the cross-entropy. Under the per-block balance every chunk holds its
    // MoE blocks' share of the load-balancing loss now; the pooled one is known once pooled.
    const double tokens = static_cast<double>(chunk.B) * chunk.T;
    if (chunk.heads) loss_sums_.cross_entropy += static_cast<double>(chunk.loss) * tokens;
    if (model_is_moe(model_.spec) && !model_balance_is_pooled(model_.spec))
      loss_sums_.balance += static_cast<double>(chunk.aux_loss) * tokens;
    return output;
  }
  std::vector<double> pass_balance_sums(const StagePass& pass) override { return cpu_pass(pass).chunk.balance_sums; }
  void pass_balance_pool(StagePass& pass, const double* sums) override {
    ChunkPass& chunk = cpu_pass(pass).chunk;
    chunk_balance_pool(model_, chunk, sums);
    // The micro-batch's whole loss, counted once per token: by the heading pass.
    if (chunk.heads) loss_sums_.balance += static_cast<double>(chunk.aux_loss) * (static_cast<double>(chunk.B) * chunk.T);
  }
  void* pass_output_gradient(StagePass& pass) override { return chunk_output_gradient(model_, cpu_pass(pass).chunk); }
  const void* pass_backward(StagePass& pass, int block_begin, int block_end, float loss_scale) override {
    return chunk_backward(model_, cpu_pass(pass).chunk, block_begin, block_end, loss_scale);
  }
  bool pass_finished(const StagePass& pass) const override {
    const ChunkPass& chunk = cpu_pass(pass).chunk;
    return chunk.backward_next == chunk.block_begin;
  }
  void pass_release(StagePass& pass) override { chunk_release(model_, cpu_pass(pass).chunk); }
  PassLossSums take_loss_sums() override { return std::exchange(loss_sums_, PassLossSums{}); }

  void zero_gradients() override { model_zero_grad(model_); }
  double square_sum(const std::vector<FloatSpan>& spans) override {
    double squares = 0;
    for (const FloatSpan& span : spans) squares += alloy::square_sum(span.data, span.count);
    return squares;
  }
  void adamw_update(float* params, float* m, float* v, const float* grads, int64_t count, const AdamWHyper& hyper,
                    int64_t step) override {
    alloy::adamw_update(params, m, v, grads, count, hyper, step);
  }
  void parameters_changed() override {}
  void fill_zero(float* data, int64_t count) override {
    std::memset(data, 0, static_cast<size_t>(count) * sizeof(float));
  }
  void copy(void* to, const void* from, int64_t bytes) override { std::memcpy(to, from, static_cast<size_t>(bytes)); }
  void copy_to_host(void* host, const void* from, int64_t bytes) override { copy(host, from, bytes); }
  void copy_from_host(void* to, const void* host, int64_t bytes) override { copy(to, host, bytes); }
  void fence() override {}
  double matmul_peak_flops() override { return profile_gemm_flops(512, 4); }

 private:
  Arena arena_;
  Model model_;
  PassLossSums loss_sums_;
};

}  // namespace

std::unique_ptr<StageBackend> stage_backend_cpu(const StageRequest& request) {
  return std::make_unique<CpuBackend>(request);
}

}  // namespace alloy
