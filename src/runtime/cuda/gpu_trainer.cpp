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

// How a run splits its batch: over the data-parallel replicas, then into micro-batches.
struct BatchSplit {
  int64_t batch = 0;       // sequences per step, all replicas
  int replicas = 1;
  int replica = 0;         // this rank's index
  int64_t local = 0;       // this replica's sequences per step
  int64_t micro = 0;       // sequences per micro-batch
  int64_t micro_batches = 1;
};

BatchSplit batch_split(const ModelSpec& spec, const TrainSpec& train, const GpuTrainerOptions& o) {
  BatchSplit b;
  b.batch = o.common.batch_size > 0 ? o.common.batch_size : train.global_batch_sequences;
  b.replicas = o.mpi != nullptr ? o.mpi->world_size() : 1;
  b.replica = o.mpi != nullptr ? o.mpi->rank() : 0;
  if (b.batch % b.replicas != 0) {
    throw Error(fmt::format("the batch of {} sequences does not split over {} data-parallel ranks", b.batch, b.replicas),
                {"", "--batch"}, "use a batch that the number of ranks divides");
  }
  b.local = b.batch / b.replicas;
  b.micro = o.micro_batch_sequences > 0 ? o.micro_batch_sequences : b.local;
  if (b.local % b.micro != 0) {
    throw Error(fmt::format("a replica's {} sequences do not split into micro-batches of {}", b.local, b.micro),
                {"", "--micro-batch"}, "pick a micro-batch size that divides the batch per replica");
  }
  b.micro_batches = b.local / b.micro;
  if (!o.layer_recompute.empty() && static_cast<int64_t>(o.layer_recompute.size()) != spec.num_layers) {
    throw Error(fmt::format("{} recomputation levels for {} layers", o.layer_recompute.size(), spec.num_layers), {},
                "give one level per layer");
  }
  trainer_check_seq_len(spec, train);
  return b;
}

double median_after_first(const std::vector<double>& seconds) {
  if (seconds.size() < 2) return seconds.empty() ? 0.0 : seconds.front();
  std::vector<double> warm(seconds.begin() + 1, seconds.end());
  std::nth_element(warm.begin(), warm.begin() + static_cast<std::ptrdiff_t>(warm.size() / 2), warm.end());
  return warm[warm.size() / 2];
}

Model& initialised(Model& model, uint64_t seed) {
  model_init_weights(model, seed);
  return model;
}

// One rank's training run: the host model (layout, initial weights, checkpoints), the GPU model
// and its optimizer state, the data of this replica and the gradient communicator, set up once.
class GpuRun {
 public:
  GpuRun(const ModelSpec& spec, const TrainSpec& train, const GpuTrainerOptions& o, const CudaDeviceInfo& device)
      : spec_(spec),
        train_(train),
        o_(o),
        split_(batch_split(spec, train, o)),
        data_(trainer_data_open(spec, train, o.common, split_.batch, split_.replica * split_.local,
                                (split_.replica + 1) * split_.local)),
        host_arena_(int64_t{1} << 40, "host"),
        host_(spec, host_arena_),
        arena_(o.common.memory_cap_bytes > 0 ? static_cast<int64_t>(o.common.memory_cap_bytes)
                                             : device.free_memory_bytes - (int64_t{1} << 30),
               device.name, cuda_arena_memory()),
        model_(initialised(host_, train.seed), arena_, stream_.get()),
        gradient_comm_(gradient_communicator(o, stream_.get())),
        buckets_(gradient_buckets(host_)),
        decay_(decay_ranges(host_)),
        optimizer_(arena_, model_.num_parameters),
        tokens_(split_.local * train.seq_len),
        inputs_(tokens_),
        targets_(tokens_),
        losses_(tokens_),
        norm_host_(1) {
    model_.recompute = o.layer_recompute.empty()
                           ? std::vector<Recompute>(static_cast<size_t>(spec.num_layers), o.common.recompute)
                           : o.layer_recompute;
    norm_squared_ = arena_.allocate_floats(1, "gradient norm");
  }
  ~GpuRun() { arena_.release(norm_squared_); }
  GpuRun(const GpuRun&) = delete;
  GpuRun& operator=(const GpuRun&) = delete;

  const BatchSplit& split() const { return split_; }
  Arena& arena() { return arena_; }
  GpuModel& model() { return model_; }
  bool lead() const { return split_.replica == 0; }

  // Loads weights, moments, data position and step from o.common.checkpoint_dir; returns the step.
  int64_t resume();
  // Writes a checkpoint of `step` in the CPU trainer's format.
  void save(int64_t step);
  // Mean loss of the validation batches.
  double validate() {
    return gpu_validation_loss(model_, *data_.val, o_.common.val_batches, inputs_.get(), targets_.get(), losses_);
  }
  bool has_validation() const { return data_.val.has_value(); }
  // One optimizer step on the next batch: loss over every replica's tokens, gradient norm,
  // learning rate, time, tokens/s and arena peak (the caller fills in the step and MFU).
  StepReport step();

 private:
  void passes();             // every micro-batch's forward and backward, gradients summed over replicas
  double gradient_norm();    // global L2 norm of the summed gradients (one host read)
  float update(double norm);  // clipping and AdamW; returns the learning rate used

  const ModelSpec& spec_;
  const TrainSpec& train_;
  const GpuTrainerOptions& o_;
  const BatchSplit split_;
  TrainerData data_;
  Arena host_arena_;
  Model host_;
  Arena arena_;
  const CudaStream stream_;
  GpuModel model_;
  const std::unique_ptr<Communicator> gradient_comm_;
  const GradientBuckets buckets_;
  const std::vector<DecayRange> decay_;
  GpuAdamW optimizer_;
  const int64_t tokens_;  // this replica's per step
  // Pinned, so the token uploads of every micro-batch are truly asynchronous.
  PinnedBuffer<int32_t> inputs_, targets_;
  PinnedBuffer<float> losses_;
  PinnedBuffer<float> norm_host_;
  float* norm_squared_ = nullptr;
  std::vector<CommHandle> reductions_;
};

int64_t GpuRun::resume() {
  if (o_.common.checkpoint_dir.empty()) throw Error("--resume needs --checkpoint DIR", {"", "--resume"}, "name the checkpoint folder");
  std::vector<float> m(static_cast<size_t>(model_.num_parameters)), v(m.size());
  CheckpointState state = checkpoint_load(o_.common.checkpoint_dir, trainer_model_fingerprint(spec_),
                                          trainer_parameter_refs(host_, host_.params, ""),
                                          trainer_optimizer_refs(host_, m.data(), v.data()));
  batch_loader_state_restore(data_.train, state.loader_state);
  gpu_model_upload(model_);
  cuda_check(cudaMemcpy(optimizer_.m, m.data(), m.size() * sizeof(float), cudaMemcpyHostToDevice), "uploading adamw.m");
  cuda_check(cudaMemcpy(optimizer_.v, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "uploading adamw.v");
  optimizer_.step = state.step;
  return state.step;
}

void GpuRun::save(int64_t step) {
  gpu_model_download(model_);
  std::vector<float> m(static_cast<size_t>(model_.num_parameters)), v(m.size());
  cuda_check(cudaMemcpy(m.data(), optimizer_.m, m.size() * sizeof(float), cudaMemcpyDeviceToHost), "downloading adamw.m");
  cuda_check(cudaMemcpy(v.data(), optimizer_.v, v.size() * sizeof(float), cudaMemcpyDeviceToHost), "downloading adamw.v");
  CheckpointState state;
  state.step = step;
  state.loader_state = batch_loader_state_save(data_.train);
  state.fingerprint = trainer_model_fingerprint(spec_);
  checkpoint_save(o_.common.checkpoint_dir, trainer_parameter_refs(host_, host_.params, ""),
                  trainer_optimizer_refs(host_, m.data(), v.data()), state);
}

void GpuRun::passes() {
  const int Bm = static_cast<int>(split_.micro), T = static_cast<int>(train_.seq_len);
  const int64_t micro_tokens = int64_t{Bm} * T;
  gpu_model_zero_grad(model_);
  for (int64_t k = 0; k < split_.micro_batches; ++k) {
    const size_t at = static_cast<size_t>(k * micro_tokens);
    // The last micro-batch's backward finishes each block's gradients: sum them over the
    // replicas at once, on the communicator's stream, behind the block's kernels.
    if (gradient_comm_ && k + 1 == split_.micro_batches) {
      model_.on_block_gradients = [this](int layer) {
        const DecayRange& r = buckets_.blocks[static_cast<size_t>(layer)];
        reductions_.push_back(gradient_comm_->all_reduce(model_.grads + r.offset, r.count, gradient_comm_->world(),
                                                         ReduceOp::ReduceOp_sum));
      };
    }
    gpu_model_forward(model_, inputs_.get() + at, targets_.get() + at, Bm, T, true,
                      1.0f / static_cast<float>(split_.micro_batches * split_.replicas));
    cuda_check(cudaMemcpyAsync(losses_.get() + at, model_.losses, static_cast<size_t>(micro_tokens) * sizeof(float),
                               cudaMemcpyDeviceToHost, model_.stream),
               "copying losses");
    gpu_model_backward(model_);
  }
  if (!gradient_comm_) return;
  model_.on_block_gradients = nullptr;
  for (const DecayRange& r : buckets_.edges) {
    reductions_.push_back(
        gradient_comm_->all_reduce(model_.grads + r.offset, r.count, gradient_comm_->world(), ReduceOp::ReduceOp_sum));
  }
  // Each wait returns once its sum is in device memory, so the kernels queued after see it.
  for (const CommHandle& h : reductions_) h.wait();
  reductions_.clear();
}

double GpuRun::gradient_norm() {
  cudaStream_t stream = model_.stream;
  cuda_check(cudaMemsetAsync(norm_squared_, 0, sizeof(float), stream), "gradient norm");
  cuda_sum_squares(norm_squared_, model_.grads, model_.num_parameters, stream);
  cuda_check(cudaMemcpyAsync(norm_host_.get(), norm_squared_, sizeof(float), cudaMemcpyDeviceToHost, stream),
             "gradient norm");
  cuda_check(cudaStreamSynchronize(stream), "the training step");
  return std::sqrt(static_cast<double>(*norm_host_.get()));
}

float GpuRun::update(double norm) {
  const float lr = lr_schedule(optimizer_.step, train_.learning_rate, train_.min_learning_rate, train_.warmup_steps,
                               train_.steps);
  optimizer_.step++;
  const float clip = grad_clip_scale(norm, train_.grad_clip);
  for (const DecayRange& r : decay_) {
    cuda_adamw_update(model_.params + r.offset, model_.weights + r.offset, model_.grads + r.offset,
                      optimizer_.m + r.offset, optimizer_.v + r.offset, r.count, lr, static_cast<float>(train_.beta1),
                      static_cast<float>(train_.beta2), static_cast<float>(train_.adam_eps),
                      r.decay ? static_cast<float>(train_.weight_decay) : 0.0f, clip, optimizer_.step, model_.stream);
  }
  gpu_model_refresh_head(model_);
  cuda_check(cudaStreamSynchronize(model_.stream), "the optimizer step");
  return lr;
}

StepReport GpuRun::step() {
  const auto start = Clock::now();
  batch_loader_next(data_.train, inputs_.get(), targets_.get());
  passes();
  const double norm = gradient_norm();
  const float lr = update(norm);
  double loss_sums[2] = {0, static_cast<double>(tokens_)};  // this replica's sum and tokens
  for (int64_t i = 0; i < tokens_; ++i) loss_sums[0] += losses_.get()[i];
  if (o_.mpi != nullptr) o_.mpi->all_reduce(loss_sums, 2, o_.mpi->world(), ReduceOp::ReduceOp_sum).wait();
  StepReport report;
  report.loss = loss_sums[0] / loss_sums[1];
  report.learning_rate = lr;
  report.grad_norm = norm;
  report.step_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report.tokens_per_second = loss_sums[1] / report.step_seconds;
  report.peak_arena_bytes = arena_.peak_bytes();
  return report;
}

}  // namespace

GpuTrainerResult gpu_trainer_run(const ModelSpec& spec, const TrainSpec& train, const GpuTrainerOptions& o,
                                 const std::function<void(const StepReport&)>& on_step) {
  GpuTrainerResult out;
  out.device = cuda_device_open(o.device);
  out.datasheet_peak_flops = datasheet_bf16_flops(out.device.name);
  GpuRun run(spec, train, o, out.device);
  out.replicas = run.split().replicas;
  out.micro_batches = run.split().micro_batches;
  TrainerResult& result = out.run;
  if (o.common.resume) result.first_step = run.resume();
  result.gemm_peak_flops = cuda_matmul_peak_flops(run.model().matmul);
  const double flops_per_token = model_flops_per_token(spec, train.seq_len).training;
  StepLog log(run.lead() ? o.common.log_path : std::string());
  if (run.has_validation() && !o.common.resume) result.initial_val_loss = run.validate();

  std::vector<double> step_seconds;
  for (int64_t step = result.first_step + 1; step <= train.steps; ++step) {
    StepReport report = run.step();
    report.step = step;
    report.mfu = report.tokens_per_second * flops_per_token / (result.gemm_peak_flops * out.replicas);
    step_seconds.push_back(report.step_seconds);
    const bool last = step == train.steps;
    if (run.has_validation() && ((o.common.val_every > 0 && step % o.common.val_every == 0) || last)) {
      report.val_loss = run.validate();
      if (last) result.final_val_loss = report.val_loss;
    }
    if (run.lead() && !o.common.checkpoint_dir.empty() &&
        ((o.common.checkpoint_every > 0 && step % o.common.checkpoint_every == 0) || last)) {
      run.save(step);  // the replicas hold the same weights
    }
    log.write(report);
    if (o.common.progress && run.lead()) trainer_print_progress(report, train.steps);
    if (on_step) on_step(report);
    result.steps.push_back(report);
  }
  result.peak_arena_bytes = run.arena().peak_bytes();
  out.median_step_seconds = median_after_first(step_seconds);
  return out;
}

}  // namespace alloy
