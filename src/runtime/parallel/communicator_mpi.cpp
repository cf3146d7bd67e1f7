// The MPI Communicator: checks each call, names it for timeouts, and queues the MPI calls that
// implement it on the progress engine (mpi_progress.hpp), which makes every MPI call after
// start-up.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "runtime/bf16.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/mpi_progress.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Longer timeouts are refused rather than silently cut: a wait past the clock's range would end
// at once.
constexpr double kCommLongestTimeoutSeconds = 1e6;

bool text_means_no_timeout(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text == "0" || text == "off" || text == "inf" || text == "infinity" || text == "none";
}

}  // namespace

double communicator_timeout_resolve(double timeout_seconds) {
  if (std::isnan(timeout_seconds) || timeout_seconds < 0 || timeout_seconds > kCommLongestTimeoutSeconds) {
    throw Error(fmt::format("communicator timeout {} s is not in (0, {:g}] seconds", timeout_seconds,
                            kCommLongestTimeoutSeconds),
                {"", "--timeout"}, "give a positive number of seconds, or 0 for ALLOY_COMM_TIMEOUT / the 300 s default");
  }
  if (timeout_seconds > 0) return timeout_seconds;
  const char* text = std::getenv("ALLOY_COMM_TIMEOUT");
  if (text == nullptr || *text == '\0') return kCommDefaultTimeoutSeconds;
  if (text_means_no_timeout(text)) return kCommNoTimeout;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(value) || !(value > 0)) {
    throw Error(fmt::format("ALLOY_COMM_TIMEOUT='{}' is not a positive number of seconds", text),
                {"", "ALLOY_COMM_TIMEOUT"},
                "set it to e.g. 600, to 'off' to wait without a limit, or unset it for the 300 s default");
  }
  if (value > kCommLongestTimeoutSeconds) {
    throw Error(fmt::format("ALLOY_COMM_TIMEOUT={} s is longer than the longest timeout, {:g} s ({:.1f} days)", text,
                            kCommLongestTimeoutSeconds, kCommLongestTimeoutSeconds / 86400),
                {"", "ALLOY_COMM_TIMEOUT"}, "give fewer seconds, or set it to 'off' to wait without a limit");
  }
  return value;
}

namespace {
// Largest element count handed to one MPI call; larger transfers are split into pieces that
// every member splits identically.
constexpr int64_t kMaxChunkCount = int64_t{1} << 30;

// Calls fn(offset, count) for consecutive pieces of at most kMaxChunkCount.
template <typename Fn>
void chunks_for_each(int64_t count, Fn fn) {
  for (int64_t offset = 0; offset < count; offset += kMaxChunkCount) {
    fn(offset, static_cast<int>(std::min(kMaxChunkCount, count - offset)));
  }
}

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

// Emulated links: when a send is posted and how long a collective is held (mpi_progress.hpp).
struct LinkDelay {
  std::optional<std::chrono::steady_clock::time_point> post_at;
  double hold_seconds = 0;
  MPI_Comm join_comm = MPI_COMM_NULL;  // a held collective's group (MpiOperation::join_comm)
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_seconds);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_.size(); }
  int local_size() const override { return local_size_; }
  std::string host_name() const override { return host_; }
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
  CommHandle reduce_scatter_bf16(float* data, const std::vector<int64_t>& counts, const CommGroup& group) override;
  CommHandle all_gather(float* data, const std::vector<int64_t>& counts, const CommGroup& group) override;
  CommHandle broadcast(void* data, int64_t bytes, int root_index, const CommGroup& group) override;
  CommHandle all_gather_bytes(const void* in, void* out, int64_t bytes, const CommGroup& group) override;
  CommHandle all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                        const std::vector<int64_t>& recv_counts, const CommGroup& group) override;
  double take_busy_seconds() override { return progress_.take_busy_seconds(); }
  void collective_timing(bool on) override { timing_on_ = on; }
  std::vector<CollectiveTiming> take_collective_timings() override { return progress_.take_collective_timings(); }
  [[noreturn]] void abort(const std::string& message, int exit_code) override;
  void links_pace(std::shared_ptr<const LinkPacing> pacing) override;

 private:
  template <typename T>
  CommHandle all_reduce_typed(T* data, int64_t count, const CommGroup& group, ReduceOp op);
  std::shared_ptr<CommHandle::State> state_make(const char* kind, int64_t bytes);
  std::shared_ptr<const std::vector<int>> group_members(const CommGroup& group, const char* kind) const;
  // Numbers the collective in its group's order and, when `op` is a timed kind and timing is on,
  // marks it for timing from now (on the caller's thread, as alloy profile times a collective
  // from its call). Call it after every check that can refuse the call.
  void collective_count(CommHandle::State& state, const CommGroup& group, std::optional<CollectiveOp> op);
  void point_check(int64_t bytes, int peer, int tag, const char* kind) const;
  std::vector<int> counts_check(const std::vector<int64_t>& counts, const CommGroup& group, const char* kind) const;
  // Reserves the link to `peer` for `bytes` from now or when its last transfer leaves.
  LinkDelay send_delay(int peer, int64_t bytes);
  LinkDelay collective_delay(PacedCollective kind, const CommHandle::State& state, int group_id) const;
  CommHandle enqueue(std::shared_ptr<CommHandle::State> state, std::function<void(MpiPosting&)> post,
                     std::function<void()> finish = {}, LinkDelay delay = {});
  // This rank's answer to a peer's inquiry: collectives posted per group, what it waits for.
  std::string status_describe();
  // "0,2#1": group `id` as every member names it. Call with groups_mutex_ held.
  std::string group_key(size_t id) const;

  double timeout_seconds_ = kCommDefaultTimeoutSeconds;
  int rank_ = 0;
  int local_size_ = 1;
  int tag_upper_bound_ = 32767;
  std::string host_;
  CommGroup world_;
  mutable std::mutex groups_mutex_;
  std::vector<std::shared_ptr<const std::vector<int>>> group_members_;  // by group id
  std::vector<int64_t> group_collectives_;                              // by group id: collectives posted so far
  std::atomic<bool> timing_on_ = false;
  // By group id; 0 is a duplicate of MPI_COMM_WORLD. Touched only by the progress thread
  // (and by the constructor and destructor, before it starts and after it stops).
  std::vector<MPI_Comm> comms_;
  MPI_Comm inquiry_comm_ = MPI_COMM_NULL;  // peers ask this rank where it is (mpi_progress.hpp)
  mutable std::mutex pacing_mutex_;
  std::shared_ptr<const LinkPacing> pacing_;                       // none: no link is paced
  std::vector<std::chrono::steady_clock::time_point> link_free_;  // by peer: when its link is free
  MpiProgress progress_;
};

MpiCommunicator::MpiCommunicator(double timeout_seconds)
    : timeout_seconds_(communicator_timeout_resolve(timeout_seconds)), progress_(this, timeout_seconds_) {
  mpi_acquire();
  MPI_Comm world_comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &world_comm);
  MPI_Comm_set_errhandler(world_comm, MPI_ERRORS_RETURN);
  comms_.push_back(world_comm);
  int size = 1;
  MPI_Comm_rank(world_comm, &rank_);
  MPI_Comm_size(world_comm, &size);
  MPI_Comm node_comm = MPI_COMM_NULL;
  MPI_Comm_split_type(world_comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm);
  MPI_Comm_size(node_comm, &local_size_);
  MPI_Comm_free(&node_comm);
  void* tag_attribute = nullptr;
  int has_tag_attribute = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_attribute, &has_tag_attribute);
  if (has_tag_attribute) tag_upper_bound_ = *static_cast<int*>(tag_attribute);
  char name[MPI_MAX_PROCESSOR_NAME];
  int name_length = 0;
  MPI_Get_processor_name(name, &name_length);
  host_.assign(name, static_cast<size_t>(name_length));

  world_.id = 0;
  for (int r = 0; r < size; ++r) world_.members.push_back(r);
  world_.my_index = rank_;
  group_members_.push_back(std::make_shared<const std::vector<int>>(world_.members));
  MPI_Comm_dup(world_comm, &inquiry_comm_);
  progress_.inquiries_answer(inquiry_comm_, [this] { return status_describe(); });
  progress_.start();
}

std::string MpiCommunicator::group_key(size_t id) const {
  // Group ids differ between ranks (a rank numbers only its own groups), but every member creates
  // the groups it shares with another in the same order: the members and how many groups with
  // the same members came before name a group alike on all of them.
  int earlier = 0;
  for (size_t i = 0; i < id; ++i) earlier += *group_members_[i] == *group_members_[id];
  return fmt::format("{}#{}", fmt::join(*group_members_[id], ","), earlier);
}

std::string MpiCommunicator::status_describe() {
  std::string text;
  {
    std::lock_guard lock(groups_mutex_);
    for (size_t id = 0; id < group_collectives_.size(); ++id)
      text += fmt::format("group {} {}\n", group_key(id), group_collectives_[id]);
  }
  return text + "wait " + progress_.waiting() + "\n";
}

MpiCommunicator::~MpiCommunicator() {
  progress_.stop();
  if (inquiry_comm_ != MPI_COMM_NULL) MPI_Comm_free(&inquiry_comm_);
  for (MPI_Comm& comm : comms_) {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  mpi_release();
}

void MpiCommunicator::abort(const std::string& message, int exit_code) {
  // With MPI_THREAD_MULTIPLE this is safe while the progress thread is inside MPI; with only
  // SERIALIZED the standard does not cover it, and OpenMPI still ends the job in practice.
  fmt::print(stderr, "alloy: error on rank {} ({}): {}\n", rank_, host_, message);
  std::fflush(stderr);
  std::fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this only guards a broken library
}

std::shared_ptr<CommHandle::State> MpiCommunicator::state_make(const char* kind, int64_t bytes) {
  auto state = std::make_shared<CommHandle::State>();
  state->owner = this;
  state->timeout_seconds = timeout_seconds_;
  state->progress = &progress_;
  state->kind = kind;
  state->bytes = bytes;
  return state;
}

void MpiCommunicator::collective_count(CommHandle::State& state, const CommGroup& group,
                                       std::optional<CollectiveOp> op) {
  std::lock_guard lock(groups_mutex_);
  if (group_collectives_.size() <= static_cast<size_t>(group.id))
    group_collectives_.resize(static_cast<size_t>(group.id) + 1, 0);
  const int64_t sequence = group_collectives_[static_cast<size_t>(group.id)]++;
  state.sequence = sequence;
  state.group_key = group_key(static_cast<size_t>(group.id));
  if (op && timing_on_) {
    state.timing = CollectiveTiming{*op, group.id, sequence, state.bytes, 0.0, false};
    state.posted = std::chrono::steady_clock::now();
  }
}

std::shared_ptr<const std::vector<int>> MpiCommunicator::group_members(const CommGroup& group, const char* kind) const {
  std::lock_guard lock(groups_mutex_);
  if (group.id < 0 || group.id >= static_cast<int>(group_members_.size()) || group.my_index < 0 ||
      *group_members_[static_cast<size_t>(group.id)] != group.members) {
    throw Error(fmt::format("{} on a group this rank ({}) is not a member of (group id {}, members [{}])", kind,
                            rank_, group.id, fmt::join(group.members, ", ")),
                {}, "call collectives only on groups returned by split() with my_index >= 0, or world()");
  }
  return group_members_[static_cast<size_t>(group.id)];
}

void MpiCommunicator::point_check(int64_t bytes, int peer, int tag, const char* kind) const {
  if (peer < 0 || peer >= world_size()) {
    throw Error(fmt::format("{} with peer rank {} outside the world of {} ranks", kind, peer, world_size()));
  }
  if (tag < 0 || tag > tag_upper_bound_) {
    throw Error(fmt::format("{} with tag {} outside [0, {}] (MPI_TAG_UB of this MPI)", kind, tag, tag_upper_bound_),
                {}, "number messages with smaller tags");
  }
  if (bytes < 0) throw Error(fmt::format("{} of {} bytes", kind, bytes));
}

std::vector<int> MpiCommunicator::counts_check(const std::vector<int64_t>& counts, const CommGroup& group,
                                               const char* kind) const {
  if (static_cast<int>(counts.size()) != group.size()) {
    throw Error(fmt::format("{} given {} counts for a group of {} members", kind, counts.size(), group.size()));
  }
  int64_t total = 0;
  std::vector<int> result;
  for (int64_t count : counts) {
    if (count < 0) throw Error(fmt::format("{} given a negative count {}", kind, count));
    total += count;
    result.push_back(static_cast<int>(count));
  }
  if (total > INT_MAX) {
    throw Error(fmt::format("{} of {} elements in total: MPI counts stop at {}", kind, total, INT_MAX), {},
                "split the buffer into several calls of fewer elements");
  }
  return result;
}

void MpiCommunicator::links_pace(std::shared_ptr<const LinkPacing> pacing) {
  if (pacing && pacing->world_size() != world_size())
    throw Error(fmt::format("link pacing for {} ranks in a world of {}", pacing->world_size(), world_size()), {},
                "build the table from the plan's rank map");
  std::lock_guard lock(pacing_mutex_);
  pacing_ = pacing && pacing->paces_any() ? std::move(pacing) : nullptr;
  link_free_.assign(static_cast<size_t>(world_size()), std::chrono::steady_clock::time_point{});
}

LinkDelay MpiCommunicator::send_delay(int peer, int64_t bytes) {
  std::lock_guard lock(pacing_mutex_);
  if (!pacing_ || !pacing_->link(rank_, peer).paced()) return {};
  // The link carries one message at a time: this one leaves when the last has left, and is
  // posted to MPI when its last byte would arrive.
  using Seconds = std::chrono::duration<double>;
  using Clock = std::chrono::steady_clock;
  auto& free = link_free_[static_cast<size_t>(peer)];
  const Clock::time_point leaves = std::max(Clock::now(), free);
  free = leaves + std::chrono::duration_cast<Clock::duration>(Seconds(pacing_->occupy_seconds(rank_, peer, bytes)));
  const double latency_seconds = pacing_->link(rank_, peer).latency_seconds;
  return {free + std::chrono::duration_cast<Clock::duration>(Seconds(latency_seconds)), 0.0};
}

LinkDelay MpiCommunicator::collective_delay(PacedCollective kind, const CommHandle::State& state, int group_id) const {
  std::shared_ptr<const LinkPacing> pacing;
  {
    std::lock_guard lock(pacing_mutex_);
    pacing = pacing_;
  }
  if (!pacing || !state.members) return {};
  return {std::nullopt, pacing->collective_seconds(kind, *state.members, state.bytes), comms_[static_cast<size_t>(group_id)]};
}

CommHandle MpiCommunicator::enqueue(std::shared_ptr<CommHandle::State> state, std::function<void(MpiPosting&)> post,
                                    std::function<void()> finish, LinkDelay delay) {
  auto op = std::make_shared<MpiOperation>();
  op->state = state;
  op->post = std::move(post);
  op->finish = std::move(finish);
  op->post_at = delay.post_at;
  op->hold_seconds = delay.hold_seconds;
  op->hold_key = state->group_key;
  if (delay.hold_seconds > 0) op->join_comm = delay.join_comm;
  progress_.enqueue(std::move(op));
  return CommHandle(std::move(state));
}

CommGroup MpiCommunicator::split(const std::vector<std::vector<int>>& ranks_of_groups) {
  std::vector<int> group_of_rank(static_cast<size_t>(world_size()), -1);
  CommGroup mine;
  for (size_t g = 0; g < ranks_of_groups.size(); ++g) {
    for (int r : ranks_of_groups[g]) {
      if (r < 0 || r >= world_size()) {
        throw Error(fmt::format("split: group {} names rank {} outside the world of {} ranks", g, r, world_size()));
      }
      if (group_of_rank[static_cast<size_t>(r)] >= 0) {
        throw Error(fmt::format("split: rank {} is in group {} and in group {}", r, group_of_rank[static_cast<size_t>(r)], g),
                    {}, "give each rank at most one group");
      }
      group_of_rank[static_cast<size_t>(r)] = static_cast<int>(g);
    }
  }
  int color = group_of_rank[static_cast<size_t>(rank_)];
  if (color >= 0) {
    mine.members = ranks_of_groups[static_cast<size_t>(color)];
    std::sort(mine.members.begin(), mine.members.end());
    mine.my_index = static_cast<int>(std::find(mine.members.begin(), mine.members.end(), rank_) - mine.members.begin());
    std::lock_guard lock(groups_mutex_);
    mine.id = static_cast<int>(group_members_.size());
    group_members_.push_back(std::make_shared<const std::vector<int>>(mine.members));
  }
  auto state = state_make("split", 0);
  state->members = std::make_shared<const std::vector<int>>(world_.members);
  int id = mine.id;
  CommHandle handle = enqueue(state, [this, color, id](MpiPosting&) {
    MPI_Comm comm = MPI_COMM_NULL;
    mpi_check(MPI_Comm_split(comms_[0], color >= 0 ? color : MPI_UNDEFINED, rank_, &comm), "MPI_Comm_split");
    if (id >= 0) {
      if (comms_.size() <= static_cast<size_t>(id)) comms_.resize(static_cast<size_t>(id) + 1, MPI_COMM_NULL);
      comms_[static_cast<size_t>(id)] = comm;
    }
  });
  handle.wait();
  return mine;
}

CommHandle MpiCommunicator::send(const void* data, int64_t bytes, int peer, int tag) {
  point_check(bytes, peer, tag, "send");
  auto state = state_make("send", bytes);
  state->peer = peer;
  state->tag = tag;
  const char* base = static_cast<const char*>(data);
  return enqueue(state, [this, base, bytes, peer, tag](MpiPosting& posting) {
    chunks_for_each(bytes, [&](int64_t offset, int n) {
      MPI_Request request;
      mpi_check(MPI_Isend(base + offset, n, MPI_BYTE, peer, tag, comms_[0], &request), "MPI_Isend");
      posting.add(request);
    });
  }, {}, send_delay(peer, bytes));
}

CommHandle MpiCommunicator::recv(void* data, int64_t bytes, int peer, int tag) {
  point_check(bytes, peer, tag, "recv");
  auto state = state_make("recv", bytes);
  state->peer = peer;
  state->tag = tag;
  char* base = static_cast<char*>(data);
  return enqueue(state, [this, base, bytes, peer, tag](MpiPosting& posting) {
    chunks_for_each(bytes, [&](int64_t offset, int n) {
      MPI_Request request;
      mpi_check(MPI_Irecv(base + offset, n, MPI_BYTE, peer, tag, comms_[0], &request), "MPI_Irecv");
      posting.add(request, n);
    });
  });
}

template <typename T>
CommHandle MpiCommunicator::all_reduce_typed(T* data, int64_t count, const CommGroup& group, ReduceOp op) {
  const char* kind = op == ReduceOp::ReduceOp_sum ? "all_reduce (sum)" : "all_reduce (max)";
  auto state = state_make(kind, count * static_cast<int64_t>(sizeof(T)));
  state->members = group_members(group, kind);
  if (count < 0) throw Error(fmt::format("{} of {} elements", kind, count));
  collective_count(*state, group, CollectiveOp::CollectiveOp_all_reduce);
  MPI_Op mpi_op = op == ReduceOp::ReduceOp_sum ? MPI_SUM : MPI_MAX;
  int id = group.id;
  return enqueue(state, [this, data, count, mpi_op, id](MpiPosting& posting) {
    chunks_for_each(count, [&](int64_t offset, int n) {
      MPI_Request request;
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, data + offset, n, mpi_type<T>(), mpi_op, comms_[static_cast<size_t>(id)],
                               &request),
                "MPI_Iallreduce");
      posting.add(request);
    });
  }, {}, collective_delay(PacedCollective::PacedCollective_all_reduce, *state, id));
}

CommHandle MpiCommunicator::reduce_scatter(float* data, const std::vector<int64_t>& counts, const CommGroup& group) {
  const char* kind = "reduce_scatter (sum)";
  auto members = group_members(group, kind);
  auto mpi_counts = std::make_shared<std::vector<int>>(counts_check(counts, group, kind));
  int64_t total = 0;
  int64_t my_offset = 0;
  for (int i = 0; i < group.size(); ++i) {
    if (i == group.my_index) my_offset = total;
    total += counts[static_cast<size_t>(i)];
  }
  auto state = state_make(kind, total * static_cast<int64_t>(sizeof(float)));
  state->members = members;
  collective_count(*state, group, CollectiveOp::CollectiveOp_reduce_scatter);
  int id = group.id;
  int64_t my_count = counts[static_cast<size_t>(group.my_index)];
  // In place, MPI leaves this member's piece at the start of the buffer; move it to its offset.
  return enqueue(
      state,
      [this, data, mpi_counts, id](MpiPosting& posting) {
        MPI_Request request;
        mpi_check(MPI_Ireduce_scatter(MPI_IN_PLACE, data, mpi_counts->data(), MPI_FLOAT, MPI_SUM,
                                      comms_[static_cast<size_t>(id)], &request),
                  "MPI_Ireduce_scatter");
        posting.add(request);
      },
      [data, my_offset, my_count] {
        if (my_offset > 0) std::memmove(data + my_offset, data, static_cast<size_t>(my_count) * sizeof(float));
      },
      collective_delay(PacedCollective::PacedCollective_reduce_scatter, *state, id));
}

// An all-to-all of bf16 pieces: member i receives every member's piece i and sums it in fp32.
CommHandle MpiCommunicator::reduce_scatter_bf16(float* data, const std::vector<int64_t>& counts, const CommGroup& group) {
  const char* kind = "reduce_scatter (sum, bf16 on the wire)";
  auto members = group_members(group, kind);
  auto send_counts = std::make_shared<std::vector<int>>(counts_check(counts, group, kind));
  const int n = group.size();
  const int my_count = (*send_counts)[static_cast<size_t>(group.my_index)];
  auto send_offsets = std::make_shared<std::vector<int>>();
  int64_t total = 0, my_offset = 0;
  for (int i = 0; i < n; ++i) {
    if (i == group.my_index) my_offset = total;
    send_offsets->push_back(static_cast<int>(total));
    total += counts[static_cast<size_t>(i)];
  }
  // This member receives n copies of its piece: with uneven pieces that can pass MPI's int counts.
  if (static_cast<int64_t>(n) * my_count > INT_MAX)
    throw Error(fmt::format("{}: {} members' copies of a {}-element piece pass MPI's limit of {} elements", kind, n,
                            my_count, INT_MAX),
                {}, "use smaller gradient buckets (gradient_bucket_mib)");
  auto receive_counts = std::make_shared<std::vector<int>>(static_cast<size_t>(n), my_count);
  auto receive_offsets = std::make_shared<std::vector<int>>();
  for (int i = 0; i < n; ++i) receive_offsets->push_back(i * my_count);
  auto wire = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(total));
  auto received = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(my_count) * static_cast<size_t>(n));
  auto state = state_make(kind, total * static_cast<int64_t>(sizeof(uint16_t)));
  state->members = members;
  collective_count(*state, group, std::nullopt);  // not an MPI reduce-scatter: kept out of its timings
  const int id = group.id;
  return enqueue(
      state,
      [this, data, total, wire, received, send_counts, send_offsets, receive_counts, receive_offsets, id](MpiPosting& posting) {
        for (int64_t i = 0; i < total; ++i) (*wire)[static_cast<size_t>(i)] = bf16_from_float(data[i]);
        MPI_Request request;
        mpi_check(MPI_Ialltoallv(wire->data(), send_counts->data(), send_offsets->data(), MPI_UINT16_T, received->data(),
                                 receive_counts->data(), receive_offsets->data(), MPI_UINT16_T,
                                 comms_[static_cast<size_t>(id)], &request),
                  "MPI_Ialltoallv");
        posting.add(request);
      },
      [data, received, my_offset, my_count, n] {
        for (int64_t k = 0; k < my_count; ++k) {
          float sum = 0;
          for (int i = 0; i < n; ++i)
            sum += bf16_to_float((*received)[static_cast<size_t>(i) * static_cast<size_t>(my_count) + static_cast<size_t>(k)]);
          data[my_offset + k] = sum;
        }
      },
      collective_delay(PacedCollective::PacedCollective_reduce_scatter, *state, id));
}

CommHandle MpiCommunicator::all_gather(float* data, const std::vector<int64_t>& counts, const CommGroup& group) {
  const char* kind = "all_gather";
  auto members = group_members(group, kind);
  auto mpi_counts = std::make_shared<std::vector<int>>(counts_check(counts, group, kind));
  auto offsets = std::make_shared<std::vector<int>>();
  int total = 0;
  for (int count : *mpi_counts) {
    offsets->push_back(total);
    total += count;
  }
  auto state = state_make(kind, int64_t{total} * static_cast<int64_t>(sizeof(float)));
  state->members = members;
  collective_count(*state, group, CollectiveOp::CollectiveOp_all_gather);
  int id = group.id;
  return enqueue(state, [this, data, mpi_counts, offsets, id](MpiPosting& posting) {
    MPI_Request request;
    mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, mpi_counts->data(), offsets->data(), MPI_FLOAT,
                              comms_[static_cast<size_t>(id)], &request),
              "MPI_Iallgatherv");
    posting.add(request);
  }, {}, collective_delay(PacedCollective::PacedCollective_all_gather, *state, id));
}

CommHandle MpiCommunicator::broadcast(void* data, int64_t bytes, int root_index, const CommGroup& group) {
  const char* kind = "broadcast";
  auto state = state_make(kind, bytes);
  state->members = group_members(group, kind);
  if (root_index < 0 || root_index >= group.size()) {
    throw Error(fmt::format("broadcast from member {} of a group of {}", root_index, group.size()));
  }
  if (bytes < 0) throw Error(fmt::format("broadcast of {} bytes", bytes));
  collective_count(*state, group, std::nullopt);
  char* base = static_cast<char*>(data);
  int id = group.id;
  return enqueue(state, [this, base, bytes, root_index, id](MpiPosting& posting) {
    chunks_for_each(bytes, [&](int64_t offset, int n) {
      MPI_Request request;
      mpi_check(MPI_Ibcast(base + offset, n, MPI_BYTE, root_index, comms_[static_cast<size_t>(id)], &request),
                "MPI_Ibcast");
      posting.add(request);
    });
  }, {}, collective_delay(PacedCollective::PacedCollective_broadcast, *state, id));
}

CommHandle MpiCommunicator::all_gather_bytes(const void* in, void* out, int64_t bytes, const CommGroup& group) {
  const char* kind = "all_gather_bytes";
  auto state = state_make(kind, bytes * group.size());
  state->members = group_members(group, kind);
  if (bytes < 0 || bytes * group.size() > INT_MAX) {
    throw Error(fmt::format("all_gather_bytes of {} bytes per member over {} members: MPI counts stop at {} in total",
                            bytes, group.size(), INT_MAX),
                {}, "gather smaller records");
  }
  collective_count(*state, group, std::nullopt);
  int id = group.id;
  return enqueue(state, [this, in, out, bytes, id](MpiPosting& posting) {
    MPI_Request request;
    mpi_check(MPI_Iallgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE,
                             comms_[static_cast<size_t>(id)], &request),
              "MPI_Iallgather");
    posting.add(request);
  }, {}, collective_delay(PacedCollective::PacedCollective_all_gather, *state, id));
}

// Held for the pairwise rounds this member takes part in: its own row and column of the byte matrix
// (the rest is the other members' business, and each holds for its own).
CommHandle MpiCommunicator::all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                       const std::vector<int64_t>& recv_counts, const CommGroup& group) {
  const char* kind = "all_to_all";
  auto members = group_members(group, kind);
  auto sends = std::make_shared<std::vector<int>>(counts_check(send_counts, group, kind));
  auto receives = std::make_shared<std::vector<int>>(counts_check(recv_counts, group, kind));
  auto send_offsets = std::make_shared<std::vector<int>>();
  auto receive_offsets = std::make_shared<std::vector<int>>();
  int sent = 0, received = 0;
  const size_t n = static_cast<size_t>(group.size());
  std::vector<std::vector<int64_t>> bytes(n, std::vector<int64_t>(n, 0));
  for (size_t j = 0; j < n; ++j) {
    send_offsets->push_back(sent);
    receive_offsets->push_back(received);
    sent += (*sends)[j];
    received += (*receives)[j];
    bytes[static_cast<size_t>(group.my_index)][j] = send_counts[j] * static_cast<int64_t>(sizeof(float));
    bytes[j][static_cast<size_t>(group.my_index)] = recv_counts[j] * static_cast<int64_t>(sizeof(float));
  }
  auto state = state_make(kind, (int64_t{sent} + received) * static_cast<int64_t>(sizeof(float)));
  state->members = members;
  collective_count(*state, group, std::nullopt);
  LinkDelay delay;
  {
    std::lock_guard lock(pacing_mutex_);
    if (pacing_) delay.hold_seconds = pacing_->all_to_all_seconds(*members, bytes);
  }
  const int id = group.id;
  delay.join_comm = comms_[static_cast<size_t>(id)];
  return enqueue(state, [this, send, recv, sends, receives, send_offsets, receive_offsets, id](MpiPosting& posting) {
    MPI_Request request;
    mpi_check(MPI_Ialltoallv(send, sends->data(), send_offsets->data(), MPI_FLOAT, recv, receives->data(),
                             receive_offsets->data(), MPI_FLOAT, comms_[static_cast<size_t>(id)], &request),
              "MPI_Ialltoallv");
    posting.add(request);
  }, {}, delay);
}

}  // namespace

std::unique_ptr<Communicator> communicator_mpi(double timeout_seconds) {
  return std::make_unique<MpiCommunicator>(timeout_seconds);
}

bool communicator_launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::atoi(value) > 1) return true;
  }
  return false;
}

}  // namespace alloy
