// The NCCL communicator: one NCCL communicator per group (the world's made from an id that rank 0
// broadcasts over MPI, the others split from it), collectives on one communication stream and
// point-to-point transfers on two more, each operation completed by an event.
#include "runtime/cuda/communicator_nccl.hpp"

#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/core.h>

#include "runtime/cuda/comm_gpu.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

std::string nccl_hint(ncclResult_t status) {
  switch (status) {
    case ncclInvalidUsage:
      return "each rank needs its own GPU (NCCL refuses two ranks on one GPU) and all members must call the "
             "operation with the same arguments; rerun with NCCL_DEBUG=WARN for NCCL's reason";
    case ncclSystemError:
    case ncclRemoteError:
      return "a system call or a peer failed (network, shared memory, a dead rank); rerun with NCCL_DEBUG=WARN";
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: check the GPU with nvidia-smi and that NCCL matches the CUDA driver";
    default:
      return "rerun with NCCL_DEBUG=WARN to see NCCL's reason";
  }
}

void nccl_check(ncclResult_t status, const char* what) {
  if (status == ncclSuccess) return;
  throw Error(fmt::format("{}: {} ({})", what, ncclGetErrorString(status), ncclGetLastError(nullptr)), {},
              nccl_hint(status));
}

template <typename T>
ncclDataType_t nccl_type();
template <>
ncclDataType_t nccl_type<float>() {
  return ncclFloat32;
}
template <>
ncclDataType_t nccl_type<double>() {
  return ncclFloat64;
}

// One group: its NCCL communicator and the matching MPI group (for all_gather_bytes).
struct NcclGroup {
  std::vector<int> members;
  ncclComm_t comm = nullptr;
  CommGroup mpi_group;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& mpi, int device, cudaStream_t producer);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return mpi_.rank(); }
  int world_size() const override { return mpi_.world_size(); }
  int local_size() const override { return mpi_.local_size(); }
  std::string host_name() const override { return mpi_.host_name(); }
  CommGroup split(const std::vector<std::vector<int>>& ranks_of_groups) override;
  const CommGroup& world() const override { return world_; }

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
  CommHandle all_gather_bytes(const void* in, void* out, int64_t bytes, const CommGroup& group) override;
  CommHandle all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                        const std::vector<int64_t>& recv_counts, const CommGroup& group) override;
  double take_busy_seconds() override { return mpi_.take_busy_seconds(); }
  [[noreturn]] void abort(const std::string& message, int exit_code) override;

 private:
  template <typename T>
  CommHandle all_reduce_typed(T* data, int64_t count, const CommGroup& group, ReduceOp op);
  // Selects the device and orders `stream` after the producer; callers of these and of group_of
  // hold post_mutex_.
  void post_begin(cudaStream_t stream);
  CommHandle post_end(cudaStream_t stream, ncclComm_t comm, std::string description);
  const NcclGroup& group_of(const CommGroup& group, const char* kind) const;
  // Checks a send or receive and picks the communicator and stream its direction travels on.
  struct PointRoute {
    ncclComm_t comm;
    cudaStream_t stream;
    std::string description;
  };
  PointRoute point_route(int64_t bytes, int peer, int tag, bool sending) const;

  Communicator& mpi_;
  int device_;
  cudaStream_t producer_;
  double timeout_seconds_;
  CommGroup world_;
  std::vector<NcclGroup> groups_;  // by group id; 0 is the world
  std::vector<std::vector<int>> members_by_id_;
  // Point to point: messages to higher ranks travel on up_, to lower ranks on down_, each with its
  // own stream, so an exchange (both ranks send, then receive) cannot deadlock on one stream.
  ncclComm_t up_comm_ = nullptr;
  ncclComm_t down_comm_ = nullptr;
  cudaStream_t collective_stream_ = nullptr;
  cudaStream_t up_stream_ = nullptr;
  cudaStream_t down_stream_ = nullptr;
  cudaEvent_t order_event_ = nullptr;
  // NCCL calls on one communicator must not interleave between threads.
  std::mutex post_mutex_;
};

NcclCommunicator::NcclCommunicator(Communicator& mpi, int device, cudaStream_t producer)
    : mpi_(mpi), device_(device), producer_(producer), timeout_seconds_(communicator_timeout_resolve(0)) {
  cuda_check(cudaSetDevice(device_), "selecting the GPU for NCCL");
  for (cudaStream_t* stream : {&collective_stream_, &up_stream_, &down_stream_}) {
    cuda_check(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking), "creating a communication stream");
  }
  cuda_check(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming), "creating an ordering event");

  ncclUniqueId id{};
  if (mpi_.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  mpi_.broadcast(&id, sizeof(id), 0, mpi_.world()).wait();
  NcclGroup world_group;
  world_group.members = mpi_.world().members;
  world_group.mpi_group = mpi_.world();
  nccl_check(ncclCommInitRank(&world_group.comm, mpi_.world_size(), id, mpi_.rank()),
             "ncclCommInitRank (the world communicator)");
  groups_.push_back(world_group);
  members_by_id_.push_back(world_group.members);
  world_ = mpi_.world();
  world_.id = 0;
  nccl_check(ncclCommSplit(world_group.comm, 0, mpi_.rank(), &up_comm_, nullptr), "ncclCommSplit (sends up)");
  nccl_check(ncclCommSplit(world_group.comm, 0, mpi_.rank(), &down_comm_, nullptr), "ncclCommSplit (sends down)");
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  for (cudaStream_t stream : {collective_stream_, up_stream_, down_stream_}) cudaStreamSynchronize(stream);
  // Split communicators before the world they came from.
  for (ncclComm_t comm : {up_comm_, down_comm_}) {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
  for (size_t i = groups_.size(); i-- > 0;) {
    if (groups_[i].comm != nullptr) ncclCommDestroy(groups_[i].comm);
  }
  for (cudaStream_t stream : {collective_stream_, up_stream_, down_stream_}) cudaStreamDestroy(stream);
  cudaEventDestroy(order_event_);
}

void NcclCommunicator::abort(const std::string& message, int exit_code) {
  // Aborting NCCL first frees GPU kernels stuck waiting for a peer, so the process can exit.
  for (ncclComm_t comm : {up_comm_, down_comm_}) {
    if (comm != nullptr) ncclCommAbort(comm);
  }
  for (const NcclGroup& group : groups_) {
    if (group.comm != nullptr) ncclCommAbort(group.comm);
  }
  mpi_.abort(message, exit_code);
  std::_Exit(exit_code);  // the compiler cannot see through the virtual call that it never returns
}

CommGroup NcclCommunicator::split(const std::vector<std::vector<int>>& ranks_of_groups) {
  CommGroup mpi_group = mpi_.split(ranks_of_groups);  // validates the partition on every rank
  int color = NCCL_SPLIT_NOCOLOR;
  for (size_t g = 0; g < ranks_of_groups.size(); ++g) {
    const auto& ranks = ranks_of_groups[g];
    if (std::find(ranks.begin(), ranks.end(), rank()) != ranks.end()) color = static_cast<int>(g);
  }
  std::lock_guard lock(post_mutex_);
  cuda_check(cudaSetDevice(device_), "selecting the GPU for NCCL");
  ncclComm_t comm = nullptr;
  // Key = world rank: ranks inside the new communicator are ordered like CommGroup::members.
  nccl_check(ncclCommSplit(groups_[0].comm, color, rank(), &comm, nullptr), "ncclCommSplit");
  CommGroup mine = mpi_group;
  if (mpi_group.my_index < 0) {
    mine.id = -1;
    return mine;
  }
  mine.id = static_cast<int>(groups_.size());
  groups_.push_back(NcclGroup{mpi_group.members, comm, mpi_group});
  members_by_id_.push_back(mpi_group.members);
  return mine;
}

void NcclCommunicator::post_begin(cudaStream_t stream) {
  cuda_check(cudaSetDevice(device_), "selecting the GPU for NCCL");
  cuda_stream_order_after(stream, producer_, order_event_);
}

CommHandle NcclCommunicator::post_end(cudaStream_t stream, ncclComm_t comm, std::string description) {
  auto failure = [comm]() -> std::string {
    ncclResult_t async_status = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async_status) != ncclSuccess) return "ncclCommGetAsyncError failed";
    if (async_status == ncclSuccess || async_status == ncclInProgress) return "";
    return fmt::format("{} ({})", ncclGetErrorString(async_status), ncclGetLastError(comm));
  };
  return CommHandle(std::make_shared<CudaEventCompletion>(stream, *this, timeout_seconds_, std::move(description),
                                                          std::move(failure)));
}

const NcclGroup& NcclCommunicator::group_of(const CommGroup& group, const char* kind) const {
  comm_group_check(members_by_id_, group, rank(), kind);
  return groups_[static_cast<size_t>(group.id)];
}

NcclCommunicator::PointRoute NcclCommunicator::point_route(int64_t bytes, int peer, int tag, bool sending) const {
  const char* kind = sending ? "send" : "recv";
  if (peer < 0 || peer >= world_size()) {
    throw Error(fmt::format("{} with peer rank {} outside the world of {} ranks", kind, peer, world_size()));
  }
  if (peer == rank()) {
    throw Error(fmt::format("{} with rank {} as its own peer: NCCL cannot pair it without a group call", kind, peer),
                {}, "copy the data on the device instead of sending it to this rank");
  }
  if (tag < 0) throw Error(fmt::format("{} with negative tag {}", kind, tag));
  if (bytes < 0) throw Error(fmt::format("{} of {} bytes", kind, bytes));
  // The message travels up when the sender's rank is below the receiver's.
  const bool upward = sending ? peer > rank() : peer < rank();
  const std::vector<int> pair = {std::min(rank(), peer), std::max(rank(), peer)};
  return PointRoute{upward ? up_comm_ : down_comm_, upward ? up_stream_ : down_stream_,
                    comm_describe(kind, bytes, pair) + fmt::format(" (tag {})", tag)};
}

CommHandle NcclCommunicator::send(const void* data, int64_t bytes, int peer, int tag) {
  PointRoute route = point_route(bytes, peer, tag, true);
  std::lock_guard lock(post_mutex_);
  post_begin(route.stream);
  if (bytes > 0) {
    nccl_check(ncclSend(data, static_cast<size_t>(bytes), ncclUint8, peer, route.comm, route.stream), "ncclSend");
  }
  return post_end(route.stream, route.comm, std::move(route.description));
}

CommHandle NcclCommunicator::recv(void* data, int64_t bytes, int peer, int tag) {
  PointRoute route = point_route(bytes, peer, tag, false);
  std::lock_guard lock(post_mutex_);
  post_begin(route.stream);
  if (bytes > 0) {
    nccl_check(ncclRecv(data, static_cast<size_t>(bytes), ncclUint8, peer, route.comm, route.stream), "ncclRecv");
  }
  return post_end(route.stream, route.comm, std::move(route.description));
}

template <typename T>
CommHandle NcclCommunicator::all_reduce_typed(T* data, int64_t count, const CommGroup& group, ReduceOp op) {
  const char* kind = op == ReduceOp::ReduceOp_sum ? "all_reduce (sum)" : "all_reduce (max)";
  std::lock_guard lock(post_mutex_);
  const NcclGroup& g = group_of(group, kind);
  if (count < 0) throw Error(fmt::format("{} of {} elements", kind, count));
  post_begin(collective_stream_);
  if (count > 0) {
    nccl_check(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type<T>(),
                             op == ReduceOp::ReduceOp_sum ? ncclSum : ncclMax, g.comm, collective_stream_),
               "ncclAllReduce");
  }
  return post_end(collective_stream_, g.comm, comm_describe(kind, count * int64_t{sizeof(T)}, g.members));
}

CommHandle NcclCommunicator::reduce_scatter(float* data, const std::vector<int64_t>& counts, const CommGroup& group) {
  const char* kind = "reduce_scatter (sum)";
  std::lock_guard lock(post_mutex_);
  const NcclGroup& g = group_of(group, kind);
  const std::vector<int64_t> offsets = comm_counts_offsets(counts, group, kind);
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
  post_begin(collective_stream_);
  if (offsets.back() == 0) {
    // Nothing to move; the event still orders the handle after the producer.
  } else if (equal) {
    // In place: NCCL writes this member's piece where it lies, at data + my_index * count.
    const int64_t piece = counts[0];
    nccl_check(ncclReduceScatter(data, data + group.my_index * piece, static_cast<size_t>(piece), ncclFloat32, ncclSum,
                                 g.comm, collective_stream_),
               "ncclReduceScatter");
  } else {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int i = 0; i < group.size(); ++i) {
      const int64_t count = counts[static_cast<size_t>(i)];
      if (count == 0) continue;
      float* piece = data + offsets[static_cast<size_t>(i)];
      nccl_check(
          ncclReduce(piece, piece, static_cast<size_t>(count), ncclFloat32, ncclSum, i, g.comm, collective_stream_),
          "ncclReduce (a reduce_scatter piece)");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd (reduce_scatter)");
  }
  return post_end(collective_stream_, g.comm, comm_describe(kind, offsets.back() * int64_t{sizeof(float)}, g.members));
}

CommHandle NcclCommunicator::all_gather(float* data, const std::vector<int64_t>& counts, const CommGroup& group) {
  const char* kind = "all_gather";
  std::lock_guard lock(post_mutex_);
  const NcclGroup& g = group_of(group, kind);
  const std::vector<int64_t> offsets = comm_counts_offsets(counts, group, kind);
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
  post_begin(collective_stream_);
  if (offsets.back() == 0) {
    // Nothing to move; the event still orders the handle after the producer.
  } else if (equal) {
    // In place: this member's piece already lies at data + my_index * count.
    const int64_t piece = counts[0];
    nccl_check(ncclAllGather(data + group.my_index * piece, data, static_cast<size_t>(piece), ncclFloat32, g.comm,
                             collective_stream_),
               "ncclAllGather");
  } else {
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int i = 0; i < group.size(); ++i) {
      const int64_t count = counts[static_cast<size_t>(i)];
      if (count == 0) continue;
      float* piece = data + offsets[static_cast<size_t>(i)];
      nccl_check(ncclBroadcast(piece, piece, static_cast<size_t>(count), ncclFloat32, i, g.comm, collective_stream_),
                 "ncclBroadcast (an all_gather piece)");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd (all_gather)");
  }
  return post_end(collective_stream_, g.comm, comm_describe(kind, offsets.back() * int64_t{sizeof(float)}, g.members));
}

CommHandle NcclCommunicator::broadcast(void* data, int64_t bytes, int root_index, const CommGroup& group) {
  const char* kind = "broadcast";
  std::lock_guard lock(post_mutex_);
  const NcclGroup& g = group_of(group, kind);
  if (root_index < 0 || root_index >= group.size()) {
    throw Error(fmt::format("broadcast from member {} of a group of {}", root_index, group.size()));
  }
  if (bytes < 0) throw Error(fmt::format("broadcast of {} bytes", bytes));
  post_begin(collective_stream_);
  if (bytes > 0) {
    nccl_check(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root_index, g.comm, collective_stream_),
               "ncclBroadcast");
  }
  return post_end(collective_stream_, g.comm, comm_describe(kind, bytes, g.members));
}

CommHandle NcclCommunicator::all_gather_bytes(const void* in, void* out, int64_t bytes, const CommGroup& group) {
  // Host memory through MPI: these are small records, and MPI needs no device round trip.
  CommGroup mpi_group;
  {
    std::lock_guard lock(post_mutex_);
    mpi_group = group_of(group, "all_gather_bytes").mpi_group;
  }
  return mpi_.all_gather_bytes(in, out, bytes, mpi_group);
}

// One grouped call of a send and a receive per other member; this member's own piece is a copy on
// the same stream, so no peer pairs with itself.
CommHandle NcclCommunicator::all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                        const std::vector<int64_t>& recv_counts, const CommGroup& group) {
  const char* kind = "all_to_all";
  std::lock_guard lock(post_mutex_);
  const NcclGroup& g = group_of(group, kind);
  const std::vector<int64_t> send_offsets = comm_counts_offsets(send_counts, group, kind);
  const std::vector<int64_t> recv_offsets = comm_counts_offsets(recv_counts, group, kind);
  const auto me = static_cast<size_t>(group.my_index);
  comm_own_piece_check(send_counts[me], recv_counts[me], kind);
  post_begin(collective_stream_);
  if (send_counts[me] > 0) {
    cuda_check(cudaMemcpyAsync(recv + recv_offsets[me], send + send_offsets[me],
                               static_cast<size_t>(send_counts[me]) * sizeof(float), cudaMemcpyDeviceToDevice,
                               collective_stream_),
               "copying this member's own all_to_all piece");
  }
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (size_t j = 0; j < send_counts.size(); ++j) {
    if (j == me) continue;
    const int peer = static_cast<int>(j);
    if (send_counts[j] > 0) {
      nccl_check(ncclSend(send + send_offsets[j], static_cast<size_t>(send_counts[j]), ncclFloat32, peer, g.comm,
                          collective_stream_),
                 "ncclSend (an all_to_all piece)");
    }
    if (recv_counts[j] > 0) {
      nccl_check(ncclRecv(recv + recv_offsets[j], static_cast<size_t>(recv_counts[j]), ncclFloat32, peer, g.comm,
                          collective_stream_),
                 "ncclRecv (an all_to_all piece)");
    }
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd (all_to_all)");
  const int64_t bytes = (send_offsets.back() + recv_offsets.back()) * int64_t{sizeof(float)};
  return post_end(collective_stream_, g.comm, comm_describe(kind, bytes, g.members));
}

}  // namespace

std::unique_ptr<Communicator> communicator_nccl_create(Communicator& mpi, int device, cudaStream_t producer) {
  return std::make_unique<NcclCommunicator>(mpi, device, producer);
}

}  // namespace alloy
