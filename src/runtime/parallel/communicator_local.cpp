// The world of one rank: a run on a single device without mpirun. Every group is this rank
// alone, so each collective leaves its data as it is (a sum over one member) and completes at
// once; there is no peer to send to.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <unistd.h>

#include "runtime/bf16.hpp"
#include "runtime/parallel/communicator.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

class Completed final : public CommCompletion {
 public:
  void wait() override {}
  bool done() override { return true; }
};

CommHandle completed() { return CommHandle(std::make_shared<Completed>()); }

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator() {
    world_.id = 0;
    world_.members = {0};
    world_.my_index = 0;
  }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_size() const override { return 1; }
  std::string host_name() const override {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    return name;
  }

  CommGroup split(const std::vector<std::vector<int>>& ranks_of_groups) override {
    CommGroup group;
    group.id = next_group_++;
    for (const std::vector<int>& members : ranks_of_groups) {
      for (int r : members)
        if (r != 0) throw Error(fmt::format("group member {} in a world of one rank", r), {}, "launch with mpirun");
      if (!members.empty()) {
        group.members = members;
        group.my_index = 0;
      }
    }
    return group;
  }
  const CommGroup& world() const override { return world_; }

  CommHandle send(const void*, int64_t, int peer, int) override { throw no_peer("send to", peer); }
  CommHandle recv(void*, int64_t, int peer, int) override { throw no_peer("receive from", peer); }

  CommHandle all_reduce(float*, int64_t, const CommGroup&, ReduceOp) override { return completed(); }
  CommHandle all_reduce(double*, int64_t, const CommGroup&, ReduceOp) override { return completed(); }
  CommHandle reduce_scatter(float*, const std::vector<int64_t>&, const CommGroup&) override { return completed(); }
  CommHandle reduce_scatter_bf16(float* data, const std::vector<int64_t>& counts, const CommGroup&) override {
    for (int64_t i = 0; i < counts.at(0); ++i) data[i] = bf16_to_float(bf16_from_float(data[i]));  // one member's sum
    return completed();
  }
  CommHandle all_gather(float*, const std::vector<int64_t>&, const CommGroup&) override { return completed(); }
  CommHandle broadcast(void*, int64_t, int, const CommGroup&) override { return completed(); }
  CommHandle all_gather_bytes(const void* in, void* out, int64_t bytes, const CommGroup&) override {
    std::memmove(out, in, static_cast<size_t>(bytes));
    return completed();
  }
  // One member: its own piece, from send to recv.
  CommHandle all_to_all(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                        const std::vector<int64_t>& recv_counts, const CommGroup&) override {
    if (send_counts.size() != 1 || recv_counts.size() != 1 || send_counts[0] != recv_counts[0])
      throw Error(fmt::format("all_to_all over one rank given {} send and {} receive counts that differ",
                              send_counts.size(), recv_counts.size()));
    std::memmove(recv, send, static_cast<size_t>(send_counts[0]) * sizeof(float));
    return completed();
  }
  double take_busy_seconds() override { return 0; }

  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    fmt::print(stderr, "alloy: error: {}\n", message);
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(exit_code);
  }

 private:
  static Error no_peer(const char* what, int peer) {
    return Error(fmt::format("cannot {} rank {}: this run has one rank", what, peer), {},
                 "launch a plan with several devices under mpirun");
  }
  CommGroup world_;
  int next_group_ = 1;
};

}  // namespace

CommHandle Communicator::all_to_all(const float*, const std::vector<int64_t>&, float*, const std::vector<int64_t>&,
                                    const CommGroup&) {
  throw Error("this communicator has no all-to-all, which expert parallelism needs", {"", "stages[].ep"},
              "set ep 1 on every stage, or run the plan on CPU ranks under mpirun");
}

std::unique_ptr<Communicator> communicator_local() { return std::make_unique<LocalCommunicator>(); }

}  // namespace alloy
