// Private to the GPU communicators (NCCL and host-staged): the completion of an operation queued
// on a CUDA stream, the checks every communicator makes of its arguments, and the group table.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/parallel/communicator.hpp"

namespace alloy {

// Completion of work queued on a stream: an event recorded after it. wait() polls the event
// (cudaEventSynchronize cannot time out) and aborts the job through `owner` after the timeout or
// when `failure` reports that the transport failed (the peers are stuck in the operation too).
class CudaEventCompletion final : public CommCompletion {
 public:
  // Records the event on `stream` now; `failure` (may be empty) returns "" while all is well.
  CudaEventCompletion(cudaStream_t stream, Communicator& owner, double timeout_seconds, std::string description,
                      std::function<std::string()> failure);
  ~CudaEventCompletion() override;
  CudaEventCompletion(const CudaEventCompletion&) = delete;
  CudaEventCompletion& operator=(const CudaEventCompletion&) = delete;

  void wait() override;
  bool done() override;

 private:
  cudaEvent_t event_ = nullptr;
  Communicator& owner_;
  double timeout_seconds_;
  std::string description_;
  std::function<std::string()> failure_;
};

// Makes `stream` wait (on the GPU) for the work queued so far on `producer`, using `scratch`
// (an event owned by the caller, re-recorded on each call).
void cuda_stream_order_after(cudaStream_t stream, cudaStream_t producer, cudaEvent_t scratch);

// "4.0 MiB over ranks [0, 1]"-style description of an operation for timeout messages.
std::string comm_describe(const char* kind, int64_t bytes, const std::vector<int>& members);

// Throws unless `group` is one this communicator made (same members) and this rank is in it.
void comm_group_check(const std::vector<std::vector<int>>& members_by_id, const CommGroup& group, int rank,
                      const char* kind);

// Throws unless counts has one non-negative entry per member; returns the offsets (size + 1
// entries, the last being the total).
std::vector<int64_t> comm_counts_offsets(const std::vector<int64_t>& counts, const CommGroup& group, const char* kind);

// Throws unless the floats a member sends itself equal those it receives from itself (all_to_all).
void comm_own_piece_check(int64_t send_count, int64_t recv_count, const char* kind);

}  // namespace alloy
