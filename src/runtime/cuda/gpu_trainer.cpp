// The GPU training loop: batches from token files, micro-batches through the GPU model, global
// gradient-norm clipping and AdamW on the device, one synchronisation per step.
#include "runtime/cuda/gpu_trainer.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "hw/catalog.hpp"
#include "runtime/cpu/optimizer.hpp"
#include "runtime/cuda/communicator_host_staged.hpp"
#include "runtime/cuda/communicator_nccl.hpp"
#include "runtime/cuda/gpu_model.hpp"
#include "runtime/cuda/kernels.hpp"
#include "runtime/trainer_common.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

using Clock = std::chrono::steady_clock;

// Page-locked host memory for asynchronous copies, freed at scope end.
template <typename T>
class PinnedBuffer {
 public:
  explicit PinnedBuffer(int64_t count) {
    cuda_check(cudaMallocHost(&data_, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)),
               "allocating pinned host memory");
  }
  ~PinnedBuffer() { cudaFreeHost(data_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
};

// AdamW moments on the GPU, laid out like the parameters.
struct GpuAdamW {
  GpuAdamW(Arena& arena, int64_t n) : arena(&arena), numel(n) {
    m = arena.allocate_floats(n, "adamw.m");
    v = arena.allocate_floats(n, "adamw.v");
    cuda_check(cudaMemset(m, 0, static_cast<size_t>(n) * sizeof(float)), "zeroing adamw.m");
    cuda_check(cudaMemset(v, 0, static_cast<size_t>(n) * sizeof(float)), "zeroing adamw.v");
  }
  ~GpuAdamW() {
    arena->release(v);
    arena->release(m);
  }
  GpuAdamW(const GpuAdamW&) = delete;
  GpuAdamW& operator=(const GpuAdamW&) = delete;
  Arena* arena;
  int64_t numel;
  float* m = nullptr;
  float* v = nullptr;
  int64_t step = 0;
};

// Consecutive views that share a weight-decay setting become one AdamW launch.
struct DecayRange {
  int64_t offset, count;
  bool decay;
};

std::vector<DecayRange> decay_ranges(const Model& host) {
  std::vector<DecayRange> ranges;
  for (const TensorView& v : host.views) {
    if (!ranges.empty() && ranges.back().decay == v.weight_decay && ranges.back().offset + ranges.back().count == v.offset) {
      ranges.back().count += v.numel;
    } else {
      ranges.push_back({v.offset, v.numel, v.weight_decay});
    }
  }
  return ranges;
}

// Gradient ranges summed over replicas: one per block (its tensors are contiguous), then what
// lies before the first block (embeddings) and after the last (final norm, head).
struct GradientBuckets {
  std::vector<DecayRange> blocks;  // by layer; decay unused
  std::vector<DecayRange> edges;
};

GradientBuckets gradient_buckets(const Model& host) {
  GradientBuckets b;
  const size_t L = static_cast<size_t>(host.spec.num_layers);
  b.blocks.assign(L, DecayRange{-1, 0, false});
  for (const TensorView& v : host.views) {
    if (v.name.rfind("layers.", 0) != 0) continue;
    DecayRange& r = b.blocks[static_cast<size_t>(std::stoi(v.name.substr(7)))];
    const int64_t end = std::max(r.offset + r.count, v.offset + v.numel);
    r.offset = r.offset < 0 ? v.offset : std::min(r.offset, v.offset);
    r.count = end - r.offset;
  }
  const int64_t first = b.blocks.front().offset;
  const int64_t last_end = b.blocks.back().offset + b.blocks.back().count;
  if (first > 0) b.edges.push_back({0, first, false});
  if (last_end < host.num_parameters) b.edges.push_back({last_end, host.num_parameters - last_end, false});
  return b;
}

std::unique_ptr<Communicator> gradient_communicator(const GpuTrainerOptions& o, cudaStream_t stream) {
  if (o.mpi == nullptr) return nullptr;
  if (o.gradient_path == GpuGradientPath::GpuGradientPath_nccl) return communicator_nccl_create(*o.mpi, o.device, stream);
  return communicator_host_staged_create(*o.mpi, o.device, stream);
}

double datasheet_bf16_flops(const std::string& device_name) {
  std::string name = device_name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name.rfind("nvidia ", 0) == 0) name = name.substr(7);
  const DeviceCatalog& catalog = catalog_builtin();
  const DeviceType* type = catalog.find(name);
  if (type == nullptr) type = catalog.find(name.substr(0, name.find(' ')));
  return type == nullptr ? 0.0 : type->peak_flops_bf16;
}

// Mean loss over the validation batches (forward only).
double gpu_validation_loss(GpuModel& model, const BatchLoader& val, int64_t batches, int32_t* inputs, int32_t* targets,
                           PinnedBuffer<float>& losses) {
  const int B = static_cast<int>(val.local_batch_size());
  const int T = static_cast<int>(val.options().seq_len);
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(batches, val.batches_per_epoch()));
  double sum = 0;
  for (int64_t k = 0; k < count; ++k) {
    batch_loader_read(val, static_cast<uint64_t>(k), inputs, targets);
    gpu_model_forward(model, inputs, targets, B, T, false, 1.0f);
    cuda_check(cudaMemcpyAsync(losses.get(), model.losses, static_cast<size_t>(B) * T * sizeof(float),
                               cudaMemcpyDeviceToHost, model.stream),
               "copying losses");
    cuda_check(cudaStreamSynchronize(model.stream), "validation");
    double batch_sum = 0;
    for (int64_t i = 0; i < int64_t{B} * T; ++i) batch_sum += losses.get()[i];
    sum += batch_sum / (static_cast<double>(B) * T);
  }
  return sum / static_cast<double>(count);
}

}  // namespace

GpuTrainerResult gpu_trainer_run(const ModelSpec& spec, const TrainSpec& train, const GpuTrainerOptions& o,
                                 const std::function<void(const StepReport&)>& on_step) {
  GpuTrainerResult out;
  out.device = cuda_device_open(o.device);
  out.datasheet_peak_flops = datasheet_bf16_flops(out.device.name);
  const int64_t batch = o.common.batch_size > 0 ? o.common.batch_size : train.global_batch_sequences;
  out.replicas = o.mpi != nullptr ? o.mpi->world_size() : 1;
  const int replica = o.mpi != nullptr ? o.mpi->rank() : 0;
  const bool lead = replica == 0;
  if (batch % out.replicas != 0) {
    throw Error(fmt::format("the batch of {} sequences does not split over {} data-parallel ranks", batch, out.replicas),
                {"", "--batch"}, "use a batch that the number of ranks divides");
  }
  const int64_t local = batch / out.replicas;
  const int64_t micro = o.micro_batch_sequences > 0 ? o.micro_batch_sequences : local;
  if (local % micro != 0) {
    throw Error(fmt::format("a replica's {} sequences do not split into micro-batches of {}", local, micro),
                {"", "--micro-batch"}, "pick a micro-batch size that divides the batch per replica");
  }
  out.micro_batches = local / micro;
  if (!o.layer_recompute.empty() && static_cast<int64_t>(o.layer_recompute.size()) != spec.num_layers) {
    throw Error(fmt::format("{} recomputation levels for {} layers", o.layer_recompute.size(), spec.num_layers), {},
                "give one level per layer");
  }
  trainer_check_seq_len(spec, train);
  TrainerData data = trainer_data_open(spec, train, o.common, batch, replica * local, (replica + 1) * local);

  // The host model holds the layout, the initial weights and the checkpoint side.
  Arena host_arena(int64_t{1} << 40, "host");
  Model host(spec, host_arena);
  model_init_weights(host, train.seed);
  const int64_t capacity = o.common.memory_cap_bytes > 0 ? static_cast<int64_t>(o.common.memory_cap_bytes)
                                                         : out.device.free_memory_bytes - (int64_t{1} << 30);
  Arena arena(capacity, out.device.name, cuda_arena_memory());
  const CudaStream compute_stream;
  cudaStream_t stream = compute_stream.get();

  GpuModel model(host, arena, stream);
  const std::unique_ptr<Communicator> gradient_comm = gradient_communicator(o, stream);
  const GradientBuckets buckets = gradient_buckets(host);
  std::vector<CommHandle> reductions;
  model.recompute = o.layer_recompute.empty() ? std::vector<Recompute>(static_cast<size_t>(spec.num_layers), o.common.recompute)
                                              : o.layer_recompute;
  GpuAdamW optimizer(arena, model.num_parameters);
  TrainerResult& result = out.run;
  const std::string fingerprint = trainer_model_fingerprint(spec);
  std::vector<float> host_m, host_v;
  if (o.common.resume) {
    if (o.common.checkpoint_dir.empty()) throw Error("--resume needs --checkpoint DIR", {"", "--resume"}, "name the checkpoint folder");
    host_m.assign(static_cast<size_t>(model.num_parameters), 0.0f);
    host_v.assign(host_m.size(), 0.0f);
    CheckpointState state = checkpoint_load(o.common.checkpoint_dir, fingerprint,
                                            trainer_parameter_refs(host, host.params, ""),
                                            trainer_optimizer_refs(host, host_m.data(), host_v.data()));
    batch_loader_state_restore(data.train, state.loader_state);
    gpu_model_upload(model);
    const size_t bytes = host_m.size() * sizeof(float);
    cuda_check(cudaMemcpy(optimizer.m, host_m.data(), bytes, cudaMemcpyHostToDevice), "uploading adamw.m");
    cuda_check(cudaMemcpy(optimizer.v, host_v.data(), bytes, cudaMemcpyHostToDevice), "uploading adamw.v");
    optimizer.step = state.step;
    result.first_step = state.step;
  }

  result.gemm_peak_flops = cuda_matmul_peak_flops(model.matmul);
  const double flops_per_token = model_flops_per_token(spec, train.seq_len).training;
  const int Bm = static_cast<int>(micro), T = static_cast<int>(train.seq_len);
  const int64_t step_tokens = local * T;  // this replica's
  // Pinned, so the token uploads of every micro-batch are truly asynchronous.
  PinnedBuffer<int32_t> inputs(step_tokens), targets(step_tokens);
  PinnedBuffer<float> losses(step_tokens);
  float* norm_squared = arena.allocate_floats(1, "gradient norm");
  PinnedBuffer<float> norm_host(1);
  const std::vector<DecayRange> ranges = decay_ranges(host);
  StepLog log(lead ? o.common.log_path : std::string());
  if (data.val && !o.common.resume) {
    result.initial_val_loss = gpu_validation_loss(model, *data.val, o.common.val_batches, inputs.get(), targets.get(), losses);
  }

  auto save = [&](int64_t step) {
    gpu_model_download(model);
    host_m.resize(static_cast<size_t>(model.num_parameters));
    host_v.resize(host_m.size());
    const size_t bytes = host_m.size() * sizeof(float);
    cuda_check(cudaMemcpy(host_m.data(), optimizer.m, bytes, cudaMemcpyDeviceToHost), "downloading adamw.m");
    cuda_check(cudaMemcpy(host_v.data(), optimizer.v, bytes, cudaMemcpyDeviceToHost), "downloading adamw.v");
    CheckpointState state;
    state.step = step;
    state.loader_state = batch_loader_state_save(data.train);
    state.fingerprint = fingerprint;
    checkpoint_save(o.common.checkpoint_dir, trainer_parameter_refs(host, host.params, ""),
                    trainer_optimizer_refs(host, host_m.data(), host_v.data()), state);
  };

  std::vector<double> step_seconds;
  for (int64_t step = result.first_step + 1; step <= train.steps; ++step) {
    const auto start = Clock::now();
    batch_loader_next(data.train, inputs.get(), targets.get());
    gpu_model_zero_grad(model);
    const int64_t micro_tokens = int64_t{Bm} * T;
    for (int64_t k = 0; k < out.micro_batches; ++k) {
      const size_t at = static_cast<size_t>(k * micro_tokens);
      // The last micro-batch's backward finishes each block's gradients: sum them over the
      // replicas at once, on the communicator's stream, behind the block's kernels.
      if (gradient_comm && k + 1 == out.micro_batches) {
        model.on_block_gradients = [&](int layer) {
          const DecayRange& r = buckets.blocks[static_cast<size_t>(layer)];
          reductions.push_back(gradient_comm->all_reduce(model.grads + r.offset, r.count, gradient_comm->world(),
                                                         ReduceOp::ReduceOp_sum));
        };
      }
      gpu_model_forward(model, inputs.get() + at, targets.get() + at, Bm, T, true,
                        1.0f / static_cast<float>(out.micro_batches * out.replicas));
      cuda_check(cudaMemcpyAsync(losses.get() + at, model.losses, static_cast<size_t>(micro_tokens) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream),
                 "copying losses");
      gpu_model_backward(model);
    }
    if (gradient_comm) {
      model.on_block_gradients = nullptr;
      for (const DecayRange& r : buckets.edges) {
        reductions.push_back(
            gradient_comm->all_reduce(model.grads + r.offset, r.count, gradient_comm->world(), ReduceOp::ReduceOp_sum));
      }
      // Each wait returns once its sum is in device memory, so the kernels queued after see it.
      for (const CommHandle& h : reductions) h.wait();
      reductions.clear();
    }
    cuda_check(cudaMemsetAsync(norm_squared, 0, sizeof(float), stream), "gradient norm");
    cuda_sum_squares(norm_squared, model.grads, model.num_parameters, stream);
    cuda_check(cudaMemcpyAsync(norm_host.get(), norm_squared, sizeof(float), cudaMemcpyDeviceToHost, stream),
               "gradient norm");
    cuda_check(cudaStreamSynchronize(stream), "the training step");
    const double norm = std::sqrt(static_cast<double>(*norm_host.get()));
    const float lr = lr_schedule(optimizer.step, train.learning_rate, train.min_learning_rate, train.warmup_steps,
                                 train.steps);
    optimizer.step++;
    const float clip = grad_clip_scale(norm, train.grad_clip);
    for (const DecayRange& r : ranges) {
      cuda_adamw_update(model.params + r.offset, model.weights + r.offset, model.grads + r.offset,
                        optimizer.m + r.offset, optimizer.v + r.offset, r.count, lr, static_cast<float>(train.beta1),
                        static_cast<float>(train.beta2), static_cast<float>(train.adam_eps),
                        r.decay ? static_cast<float>(train.weight_decay) : 0.0f, clip, optimizer.step, stream);
    }
    gpu_model_refresh_head(model);
    cuda_check(cudaStreamSynchronize(stream), "the optimizer step");
    double loss_sums[2] = {0, static_cast<double>(step_tokens)};  // this replica's sum and tokens
    for (int64_t i = 0; i < step_tokens; ++i) loss_sums[0] += losses.get()[i];
    if (o.mpi != nullptr) o.mpi->all_reduce(loss_sums, 2, o.mpi->world(), ReduceOp::ReduceOp_sum).wait();

    StepReport report;
    report.step = step;
    report.loss = loss_sums[0] / loss_sums[1];
    report.learning_rate = lr;
    report.grad_norm = norm;
    report.step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    report.tokens_per_second = loss_sums[1] / report.step_seconds;
    report.mfu = report.tokens_per_second * flops_per_token / (result.gemm_peak_flops * out.replicas);
    report.peak_arena_bytes = arena.peak_bytes();
    step_seconds.push_back(report.step_seconds);
    const bool last = step == train.steps;
    if (data.val && ((o.common.val_every > 0 && step % o.common.val_every == 0) || last)) {
      report.val_loss = gpu_validation_loss(model, *data.val, o.common.val_batches, inputs.get(), targets.get(), losses);
      if (last) result.final_val_loss = report.val_loss;
    }
    if (lead && !o.common.checkpoint_dir.empty() &&
        ((o.common.checkpoint_every > 0 && step % o.common.checkpoint_every == 0) || last)) {
      save(step);  // the replicas hold the same weights
    }
    log.write(report);
    if (o.common.progress && lead) trainer_print_progress(report, train.steps);
    if (on_step) on_step(report);
    result.steps.push_back(report);
  }
  arena.release(norm_squared);
  result.peak_arena_bytes = arena.peak_bytes();
  if (step_seconds.size() > 1) {
    std::vector<double> warm(step_seconds.begin() + 1, step_seconds.end());
    std::nth_element(warm.begin(), warm.begin() + static_cast<std::ptrdiff_t>(warm.size() / 2), warm.end());
    out.median_step_seconds = warm[warm.size() / 2];
  } else if (!step_seconds.empty()) {
    out.median_step_seconds = step_seconds.front();
  }
  return out;
}

}  // namespace alloy
