// The host-staged communicator: device data copied into pooled pinned buffers, moved by the MPI
// communicator, and copied back once MPI is done.
#include "runtime/cuda/communicator_host_staged.hpp"

#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/core.h>

#include "runtime/cuda/comm_gpu.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Smallest pinned buffer; requests round up to a power of two so sizes that vary a little from
// step to step reuse the same buffers.
constexpr size_t kMinPinnedBytes = 4096;

size_t pinned_capacity(int64_t bytes) {
  size_t capacity = kMinPinnedBytes;
  while (capacity < static_cast<size_t>(bytes)) capacity *= 2;
  return capacity;
}

class PinnedPool;

// One pinned buffer lent by the pool; returns to it when released.
struct PinnedBuffer {
  std::shared_ptr<PinnedPool> pool;
  char* data = nullptr;
  size_t capacity = 0;
  ~PinnedBuffer();
};

class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  ~PinnedPool() {
    for (auto& [capacity, data] : free_) cudaFreeHost(data);
  }
  std::shared_ptr<PinnedBuffer> lease(int64_t bytes) {
    auto buffer = std::make_shared<PinnedBuffer>();
    buffer->pool = shared_from_this();
    buffer->capacity = pinned_capacity(bytes);
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(buffer->capacity);
      if (it != free_.end()) {
        buffer->data = it->second;
        free_.erase(it);
        return buffer;
      }
    }
    void* data = nullptr;
    cuda_check(cudaMallocHost(&data, buffer->capacity),
               fmt::format("allocating {} bytes of pinned host memory for staging", buffer->capacity).c_str());
    buffer->data = static_cast<char*>(data);
    return buffer;
  }
  void give_back(char* data, size_t capacity) {
    std::lock_guard lock(mutex_);
    free_.emplace(capacity, data);
  }

 private:
  std::mutex mutex_;
  std::multimap<size_t, char*> free_;  // capacity -> buffer
};

PinnedBuffer::~PinnedBuffer() {
  if (data != nullptr) pool->give_back(data, capacity);
}

// The part of the staging buffer copied back to the device when MPI is done (bytes 0: none).
struct CopyBack {
  char* device = nullptr;
  size_t host_offset_bytes = 0;
  int64_t bytes = 0;
};

class StagedCompletion final : public CommCompletion {
 public:
  StagedCompletion(CommHandle transfer, std::shared_ptr<PinnedBuffer> buffer, CopyBack copy, int device,
                   cudaStream_t copy_stream)
      : transfer_(std::move(transfer)),
        buffer_(std::move(buffer)),
        copy_(copy),
        device_(device),
        copy_stream_(copy_stream) {}
  ~StagedCompletion() override {
    // The buffer goes back to the pool: MPI and the copy back must be done with it first.
    if (!copy_posted_) {
      try {
        transfer_.wait();
      } catch (const Error&) {
        // The failure was the caller's to see through wait(); only the buffer matters here.
      }
    }
    if (event_ != nullptr) {
      cudaEventSynchronize(event_);
      cudaEventDestroy(event_);
    }
  }
  StagedCompletion(const StagedCompletion&) = delete;
  StagedCompletion& operator=(const StagedCompletion&) = delete;

  bool done() override {
    std::lock_guard lock(mutex_);
    if (!copy_posted_) {
      if (!transfer_.done()) return false;
      copy_back_post();
    }
    if (error_ || event_ == nullptr) return true;
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    cuda_check(status, "copying staged data back to the GPU");
    return true;
  }

  void wait() override {
    std::lock_guard lock(mutex_);
    copy_back_post();
    if (error_) std::rethrow_exception(error_);
    if (event_ != nullptr) cuda_check(cudaEventSynchronize(event_), "copying staged data back to the GPU");
  }

 private:
  // Waits for the MPI transfer (its own timeout applies) and queues the copy to the device.
  void copy_back_post() {
    if (copy_posted_) return;
    copy_posted_ = true;
    try {
      transfer_.wait();
    } catch (const Error&) {
      error_ = std::current_exception();
      return;
    }
    if (copy_.bytes == 0) return;
    cuda_check(cudaSetDevice(device_), "selecting the GPU for staging");
    cuda_check(cudaMemcpyAsync(copy_.device, buffer_->data + copy_.host_offset_bytes, static_cast<size_t>(copy_.bytes),
                               cudaMemcpyHostToDevice, copy_stream_),
               "copying staged data back to the GPU");
    cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating a staging event");
    cuda_check(cudaEventRecord(event_, copy_stream_), "recording a staging event");
  }

  std::mutex mutex_;
  CommHandle transfer_;
  std::shared_ptr<PinnedBuffer> buffer_;
  CopyBack copy_;
  int device_;
  cudaStream_t copy_stream_;
  bool copy_posted_ = false;
  std::exception_ptr error_;
  cudaEvent_t event_ = nullptr;
};

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(Communicator& mpi, int device, cudaStream_t producer);
  ~HostStagedCommunicator() override;
  HostStagedCommunicator(const HostStagedCommunicator&) = delete;
  HostStagedCommunicator& operator=(const HostStagedCommunicator&) = delete;

  int rank() const override { return mpi_.rank(); }
  int world_size() const override { return mpi_.world_size(); }
  int local_size() const override { return mpi_.local_size(); }
  std::string host_name() const override { return mpi_.host_name(); }
  CommGroup split(const std::vector<std::vector<int>>& ranks_of_groups) override { return mpi_.split(ranks_of_groups); }
  const CommGroup& world() const override { return mpi_.world(); }

  CommHandle send(const void* data, int64_t bytes, int peer, int tag) override;
  CommHandle recv(void* data, int64_t bytes, int peer, int tag) override;
  CommHandle all_reduce(float* data, int64_t count, const CommGroup& group, ReduceOp op) override {
    return all_reduce_typed(data, count, group, op);
  }
  CommHandle all_reduce(double* data, int64_t count, const CommGroup& group, ReduceOp op) override {
    return all_reduce_typed(data, count, group, op);
  }
  CommHandle reduce_scatter(float* data, const std::vector<int64_t>& counts, const CommGroup& group) override;
  CommHandle all_gather(float* data, const std::vector<int64_t>& counts, const CommGroup& group) override;
  CommHandle broadcast(void* data, int64_t bytes, int root_index, const CommGroup& group) override;
  CommHandle all_gather_bytes(const void* in, void* out, int64_t bytes, const CommGroup& group) override {
    return mpi_.all_gather_bytes(in, out, bytes, group);  // host memory: nothing to stage
  }
  CommHandle all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                        const std::vector<int64_t>& recv_counts, const CommGroup& group) override;
  double take_busy_seconds() override { return mpi_.take_busy_seconds(); }
  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    mpi_.abort(message, exit_code);
    std::_Exit(exit_code);  // the compiler cannot see through the virtual call that it never returns
  }

 private:
  template <typename T>
  CommHandle all_reduce_typed(T* data, int64_t count, const CommGroup& group, ReduceOp op);
  // Copies `bytes` from `device_data` into `buffer` at `offset_bytes` and waits for the copy.
  void stage_in(PinnedBuffer& buffer, size_t offset_bytes, const void* device_data, int64_t bytes);
  // Orders later copies back (on the copy stream) after the work queued on the producer stream
  // so far: a receiver's buffer may still be being written (a pageable upload's DMA returns early).
  void order_after_producer();
  CommHandle handle_make(CommHandle transfer, std::shared_ptr<PinnedBuffer> buffer, CopyBack copy) {
    return CommHandle(
        std::make_shared<StagedCompletion>(std::move(transfer), std::move(buffer), copy, device_, copy_stream_));
  }

  Communicator& mpi_;
  int device_;
  cudaStream_t producer_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t order_event_ = nullptr;
  std::mutex stage_mutex_;  // order_event_ is re-recorded by each staging copy
  std::shared_ptr<PinnedPool> pool_ = std::make_shared<PinnedPool>();
};

HostStagedCommunicator::HostStagedCommunicator(Communicator& mpi, int device, cudaStream_t producer)
    : mpi_(mpi), device_(device), producer_(producer) {
  cuda_check(cudaSetDevice(device_), "selecting the GPU for staging");
  cuda_check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "creating the staging copy stream");
  cuda_check(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming), "creating an ordering event");
}

HostStagedCommunicator::~HostStagedCommunicator() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(copy_stream_);
  cudaStreamDestroy(copy_stream_);
  cudaEventDestroy(order_event_);
}

void HostStagedCommunicator::stage_in(PinnedBuffer& buffer, size_t offset_bytes, const void* device_data,
                                      int64_t bytes) {
  std::lock_guard lock(stage_mutex_);
  cuda_check(cudaSetDevice(device_), "selecting the GPU for staging");
  cuda_stream_order_after(copy_stream_, producer_, order_event_);  // also when nothing is staged:
  if (bytes == 0) return;                                          // copies back follow it
  cuda_check(cudaMemcpyAsync(buffer.data + offset_bytes, device_data, static_cast<size_t>(bytes),
                             cudaMemcpyDeviceToHost, copy_stream_),
             "copying device data to the staging buffer");
  cuda_check(cudaStreamSynchronize(copy_stream_), "copying device data to the staging buffer");
}

void HostStagedCommunicator::order_after_producer() {
  std::lock_guard lock(stage_mutex_);
  cuda_check(cudaSetDevice(device_), "selecting the GPU for staging");
  cuda_stream_order_after(copy_stream_, producer_, order_event_);
}

void group_member_check(const CommGroup& group, const char* kind) {
  if (group.my_index < 0 || group.my_index >= group.size()) {
    throw Error(fmt::format("{} on a group this rank is not a member of (my_index {})", kind, group.my_index), {},
                "call collectives only on groups returned by split() with my_index >= 0, or world()");
  }
}

CommHandle HostStagedCommunicator::send(const void* data, int64_t bytes, int peer, int tag) {
  if (bytes < 0) throw Error(fmt::format("send of {} bytes", bytes));
  auto buffer = pool_->lease(bytes);
  stage_in(*buffer, 0, data, bytes);
  return handle_make(mpi_.send(buffer->data, bytes, peer, tag), buffer, CopyBack{});
}

CommHandle HostStagedCommunicator::recv(void* data, int64_t bytes, int peer, int tag) {
  if (bytes < 0) throw Error(fmt::format("recv of {} bytes", bytes));
  auto buffer = pool_->lease(bytes);
  order_after_producer();
  CommHandle transfer = mpi_.recv(buffer->data, bytes, peer, tag);
  return handle_make(std::move(transfer), buffer, CopyBack{static_cast<char*>(data), 0, bytes});
}

template <typename T>
CommHandle HostStagedCommunicator::all_reduce_typed(T* data, int64_t count, const CommGroup& group, ReduceOp op) {
  if (count < 0) throw Error(fmt::format("all_reduce of {} elements", count));
  const int64_t bytes = count * int64_t{sizeof(T)};
  auto buffer = pool_->lease(bytes);
  stage_in(*buffer, 0, data, bytes);
  CommHandle transfer = mpi_.all_reduce(reinterpret_cast<T*>(buffer->data), count, group, op);
  return handle_make(std::move(transfer), buffer, CopyBack{reinterpret_cast<char*>(data), 0, bytes});
}

CommHandle HostStagedCommunicator::reduce_scatter(float* data, const std::vector<int64_t>& counts,
                                                  const CommGroup& group) {
  const char* kind = "reduce_scatter (sum)";
  group_member_check(group, kind);
  const std::vector<int64_t> offsets = comm_counts_offsets(counts, group, kind);
  const int64_t total_bytes = offsets.back() * int64_t{sizeof(float)};
  auto buffer = pool_->lease(total_bytes);
  stage_in(*buffer, 0, data, total_bytes);
  CommHandle transfer = mpi_.reduce_scatter(reinterpret_cast<float*>(buffer->data), counts, group);
  // Only this member's piece holds the reduced sum.
  const auto me = static_cast<size_t>(group.my_index);
  const auto offset_bytes = static_cast<size_t>(offsets[me]) * sizeof(float);
  return handle_make(
      std::move(transfer), buffer,
      CopyBack{reinterpret_cast<char*>(data) + offset_bytes, offset_bytes, counts[me] * int64_t{sizeof(float)}});
}

CommHandle HostStagedCommunicator::all_gather(float* data, const std::vector<int64_t>& counts, const CommGroup& group) {
  const char* kind = "all_gather";
  group_member_check(group, kind);
  const std::vector<int64_t> offsets = comm_counts_offsets(counts, group, kind);
  const int64_t total_bytes = offsets.back() * int64_t{sizeof(float)};
  auto buffer = pool_->lease(total_bytes);
  // Only this member's piece is its input.
  const auto me = static_cast<size_t>(group.my_index);
  const auto offset_bytes = static_cast<size_t>(offsets[me]) * sizeof(float);
  stage_in(*buffer, offset_bytes, data + offsets[me], counts[me] * int64_t{sizeof(float)});
  CommHandle transfer = mpi_.all_gather(reinterpret_cast<float*>(buffer->data), counts, group);
  return handle_make(std::move(transfer), buffer, CopyBack{reinterpret_cast<char*>(data), 0, total_bytes});
}

CommHandle HostStagedCommunicator::broadcast(void* data, int64_t bytes, int root_index, const CommGroup& group) {
  group_member_check(group, "broadcast");
  if (bytes < 0) throw Error(fmt::format("broadcast of {} bytes", bytes));
  auto buffer = pool_->lease(bytes);
  const bool root = group.my_index == root_index;
  if (root) {
    stage_in(*buffer, 0, data, bytes);
  } else {
    order_after_producer();
  }
  CommHandle transfer = mpi_.broadcast(buffer->data, bytes, root_index, group);
  return handle_make(std::move(transfer), buffer, root ? CopyBack{} : CopyBack{static_cast<char*>(data), 0, bytes});
}

// One pinned buffer holds the pieces to send, then the pieces received; only the received ones
// go back to the device.
CommHandle HostStagedCommunicator::all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                              const std::vector<int64_t>& recv_counts, const CommGroup& group) {
  const char* kind = "all_to_all";
  group_member_check(group, kind);
  const int64_t send_total = comm_counts_offsets(send_counts, group, kind).back();
  const int64_t recv_total = comm_counts_offsets(recv_counts, group, kind).back();
  const auto me = static_cast<size_t>(group.my_index);
  comm_own_piece_check(send_counts[me], recv_counts[me], kind);
  const int64_t send_bytes = send_total * int64_t{sizeof(float)};
  auto buffer = pool_->lease(send_bytes + recv_total * int64_t{sizeof(float)});
  stage_in(*buffer, 0, send, send_bytes);
  float* host_send = reinterpret_cast<float*>(buffer->data);
  CommHandle transfer = mpi_.all_to_all(host_send, send_counts, host_send + send_total, recv_counts, group);
  return handle_make(std::move(transfer), buffer,
                     CopyBack{reinterpret_cast<char*>(recv), static_cast<size_t>(send_bytes),
                              recv_total * int64_t{sizeof(float)}});
}

}  // namespace

std::unique_ptr<Communicator> communicator_host_staged_create(Communicator& mpi, int device, cudaStream_t producer) {
  return std::make_unique<HostStagedCommunicator>(mpi, device, producer);
}

}  // namespace alloy
