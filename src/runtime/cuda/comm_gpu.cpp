// The pieces the GPU communicators share: event completions with a timeout, argument checks and
// operation descriptions.
#include "runtime/cuda/comm_gpu.hpp"

#include <chrono>
#include <thread>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "runtime/cuda/cuda_check.hpp"
#include "spec/error.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {
using Clock = std::chrono::steady_clock;

// Polls that only yield before wait() starts sleeping between polls: short operations finish
// with spin latency, long ones do not take a core from the ranks sharing it.
constexpr int kSpinPolls = 2000;
constexpr auto kPollInterval = std::chrono::microseconds(50);
}  // namespace

CudaEventCompletion::CudaEventCompletion(cudaStream_t stream, Communicator& owner, double timeout_seconds,
                                         std::string description, std::function<std::string()> failure)
    : owner_(owner),
      timeout_seconds_(timeout_seconds),
      description_(std::move(description)),
      failure_(std::move(failure)) {
  cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating a communication event");
  const cudaError_t status = cudaEventRecord(event_, stream);
  if (status != cudaSuccess) {
    cudaEventDestroy(event_);
    cuda_check(status, "recording a communication event");
  }
}

// An event still pending is released by CUDA once it completes.
CudaEventCompletion::~CudaEventCompletion() { cudaEventDestroy(event_); }

bool CudaEventCompletion::done() {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  cuda_check(status, fmt::format("{} on the GPU", description_).c_str());
  return true;
}

void CudaEventCompletion::wait() {
  const Clock::time_point start = Clock::now();
  for (int poll = 0;; ++poll) {
    if (done()) return;
    if (failure_) {
      std::string message = failure_();
      if (!message.empty()) owner_.abort(fmt::format("{} failed: {}", description_, message), 1);
    }
    const double waited_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (waited_seconds > timeout_seconds_) {
      owner_.abort(fmt::format("timed out after {:.1f} s waiting for {}; a peer never joined it (it failed, hangs, or "
                               "posts its operations in another order); if it is only slow, raise "
                               "ALLOY_COMM_TIMEOUT (seconds)",
                               waited_seconds, description_),
                   kExitCommTimeout);
    }
    if (poll < kSpinPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollInterval);
    }
  }
}

void cuda_stream_order_after(cudaStream_t stream, cudaStream_t producer, cudaEvent_t scratch) {
  cuda_check(cudaEventRecord(scratch, producer), "marking the data's producer stream");
  cuda_check(cudaStreamWaitEvent(stream, scratch, 0), "ordering communication after the producer stream");
}

std::string comm_describe(const char* kind, int64_t bytes, const std::vector<int>& members) {
  return fmt::format("{} of {} over ranks [{}]", kind, units_format_bytes(static_cast<double>(bytes)),
                     fmt::join(members, ", "));
}

void comm_group_check(const std::vector<std::vector<int>>& members_by_id, const CommGroup& group, int rank,
                      const char* kind) {
  if (group.id < 0 || group.id >= static_cast<int>(members_by_id.size()) || group.my_index < 0 ||
      members_by_id[static_cast<size_t>(group.id)] != group.members) {
    throw Error(fmt::format("{} on a group this rank ({}) is not a member of (group id {}, members [{}])", kind, rank,
                            group.id, fmt::join(group.members, ", ")),
                {}, "call collectives only on groups returned by this communicator's split() or world()");
  }
}

std::vector<int64_t> comm_counts_offsets(const std::vector<int64_t>& counts, const CommGroup& group, const char* kind) {
  if (static_cast<int>(counts.size()) != group.size()) {
    throw Error(fmt::format("{} given {} counts for a group of {} members", kind, counts.size(), group.size()), {},
                "give one count per member of the group");
  }
  std::vector<int64_t> offsets(1, 0);
  for (int64_t count : counts) {
    if (count < 0) throw Error(fmt::format("{} given a negative count {}", kind, count));
    offsets.push_back(offsets.back() + count);
  }
  return offsets;
}

void comm_own_piece_check(int64_t send_count, int64_t recv_count, const char* kind) {
  if (send_count == recv_count) return;
  throw Error(fmt::format("{} sends this member {} floats of its own and expects {} back", kind, send_count, recv_count),
              {}, "recv_counts[j] must equal member j's send_counts[my_index], this member's own piece included");
}

}  // namespace alloy
