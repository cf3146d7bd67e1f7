// Checks the GPU communicators (NCCL and host-staged) under mpirun: every operation on device
// buffers with rank-dependent contents, odd counts and split groups, compared exactly against the
// values each rank can compute alone; then all_reduce bandwidth from 1 MiB to 256 MiB.
// Usage: mpirun -np N comm_check_gpu [all|nccl|host-staged]. Exits 1 on any mismatch, 0 with a
// message where no GPU is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "runtime/cuda/communicator_host_staged.hpp"
#include "runtime/cuda/communicator_nccl.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/device.hpp"
#include "runtime/parallel/communicator.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

// A device array of n elements of T, freed at scope end.
template <typename T>
class GpuArray {
 public:
  explicit GpuArray(int64_t n) : n_(n) {
    cuda_check(cudaMalloc(&data_, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)), "checker cudaMalloc");
  }
  explicit GpuArray(const std::vector<T>& host) : GpuArray(static_cast<int64_t>(host.size())) { upload(host); }
  ~GpuArray() { cudaFree(data_); }
  GpuArray(const GpuArray&) = delete;
  GpuArray& operator=(const GpuArray&) = delete;

  T* get() const { return data_; }
  void upload(const std::vector<T>& host) {
    cuda_check(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "checker upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(static_cast<size_t>(n_));
    cuda_check(cudaMemcpy(host.data(), data_, host.size() * sizeof(T), cudaMemcpyDeviceToHost), "checker download");
    return host;
  }

 private:
  T* data_ = nullptr;
  int64_t n_ = 0;
};

// Element i of member r's input: small integers, so every sum over a few ranks is exact.
double value_sum(int r, int64_t i) { return (r + 1) * 1000.0 + static_cast<double>(i % 997); }
// Signed values whose maximum over ranks changes with i.
double value_max(int r, int64_t i) { return static_cast<double>((i * 31 + r * 17) % 101) - 50.0; }

template <typename T>
std::vector<T> values_make(int64_t n, int r, double (*value)(int, int64_t)) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<T>(value(r, i));
  return v;
}

struct CheckRow {
  std::string op;
  std::string detail;
  int64_t bytes = 0;
  int64_t mismatches = 0;
};

class Checker {
 public:
  Checker(Communicator& comm, std::string impl) : comm_(comm), impl_(std::move(impl)) {}

  void run_all();
  int64_t mismatches() const {
    int64_t total = 0;
    for (const CheckRow& row : rows_) total += row.mismatches;
    return total;
  }
  const std::vector<CheckRow>& rows() const { return rows_; }

 private:
  // Counts positions [begin, end) where got differs from want, printing the first few.
  template <typename T>
  int64_t compare(const std::vector<T>& got, const std::vector<T>& want, int64_t begin, int64_t end,
                  const std::string& what) const {
    int64_t wrong = 0;
    for (int64_t i = begin; i < end; ++i) {
      const auto k = static_cast<size_t>(i);
      if (got[k] == want[k]) continue;
      if (wrong < 3) {
        std::fprintf(stderr, "%s rank %d: %s: element %lld is %.17g, expected %.17g\n", impl_.c_str(), comm_.rank(),
                     what.c_str(), static_cast<long long>(i), static_cast<double>(got[k]),
                     static_cast<double>(want[k]));
      }
      ++wrong;
    }
    return wrong;
  }
  void record(std::string op, std::string detail, int64_t bytes, int64_t mismatches) {
    rows_.push_back(CheckRow{std::move(op), std::move(detail), bytes, mismatches});
  }

  template <typename T>
  void all_reduce_check(const CommGroup& group, int64_t count, ReduceOp op, const std::string& where);
  void reduce_scatter_check(const CommGroup& group, const std::vector<int64_t>& counts, const std::string& where);
  void all_gather_check(const CommGroup& group, const std::vector<int64_t>& counts, const std::string& where);
  void broadcast_check(const CommGroup& group, int64_t bytes, int root_index, const std::string& where);
  void all_to_all_check(const CommGroup& group, int64_t scale, const std::string& where);
  void send_recv_check(int64_t bytes);
  void overlap_check();
  void ordering_check();
  void all_gather_bytes_check();
  void group_checks(const CommGroup& group, const std::string& where);

  Communicator& comm_;
  std::string impl_;
  std::vector<CheckRow> rows_;
};

template <typename T>
void Checker::all_reduce_check(const CommGroup& group, int64_t count, ReduceOp op, const std::string& where) {
  const bool sum = op == ReduceOp::ReduceOp_sum;
  auto value = sum ? value_sum : value_max;
  GpuArray<T> data(values_make<T>(count, group.my_index, value));
  comm_.all_reduce(data.get(), count, group, op).wait();
  std::vector<T> want(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    double expected = sum ? 0.0 : value(0, i);
    for (int m = 0; m < group.size(); ++m) expected = sum ? expected + value(m, i) : std::max(expected, value(m, i));
    want[static_cast<size_t>(i)] = static_cast<T>(expected);
  }
  const std::string op_name = fmt::format("all_reduce {} {}", sum ? "sum" : "max", sizeof(T) == 4 ? "f32" : "f64");
  record(op_name, fmt::format("{} count {}", where, count), count * int64_t{sizeof(T)},
         compare(data.download(), want, 0, count, op_name));
}

void Checker::reduce_scatter_check(const CommGroup& group, const std::vector<int64_t>& counts,
                                   const std::string& where) {
  std::vector<int64_t> offsets(1, 0);
  for (int64_t c : counts) offsets.push_back(offsets.back() + c);
  const int64_t total = offsets.back();
  GpuArray<float> data(values_make<float>(total, group.my_index, value_sum));
  comm_.reduce_scatter(data.get(), counts, group).wait();
  std::vector<float> want(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) {
    double expected = 0;
    for (int m = 0; m < group.size(); ++m) expected += value_sum(m, i);
    want[static_cast<size_t>(i)] = static_cast<float>(expected);
  }
  const auto me = static_cast<size_t>(group.my_index);
  record("reduce_scatter", fmt::format("{} counts {}", where, fmt::join(counts, "/")), total * 4,
         compare(data.download(), want, offsets[me], offsets[me + 1], "reduce_scatter"));
}

void Checker::all_gather_check(const CommGroup& group, const std::vector<int64_t>& counts, const std::string& where) {
  std::vector<int64_t> offsets(1, 0);
  for (int64_t c : counts) offsets.push_back(offsets.back() + c);
  const int64_t total = offsets.back();
  // Piece m of the result holds member m's values; this member starts with only its own piece.
  std::vector<float> want(static_cast<size_t>(total));
  std::vector<float> mine(static_cast<size_t>(total), -1.0f);
  for (int m = 0; m < group.size(); ++m) {
    for (int64_t i = offsets[static_cast<size_t>(m)]; i < offsets[static_cast<size_t>(m) + 1]; ++i) {
      want[static_cast<size_t>(i)] = static_cast<float>(value_sum(m, i));
      if (m == group.my_index) mine[static_cast<size_t>(i)] = want[static_cast<size_t>(i)];
    }
  }
  GpuArray<float> data(mine);
  comm_.all_gather(data.get(), counts, group).wait();
  record("all_gather", fmt::format("{} counts {}", where, fmt::join(counts, "/")), total * 4,
         compare(data.download(), want, 0, total, "all_gather"));
}

void Checker::broadcast_check(const CommGroup& group, int64_t bytes, int root_index, const std::string& where) {
  std::vector<unsigned char> want(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; ++i)
    want[static_cast<size_t>(i)] = static_cast<unsigned char>((i * 7 + root_index * 13 + 1) & 0xff);
  GpuArray<unsigned char> data(group.my_index == root_index ? want : std::vector<unsigned char>(want.size(), 0));
  comm_.broadcast(data.get(), bytes, root_index, group).wait();
  record("broadcast", fmt::format("{} root {}", where, root_index), bytes,
         compare(data.download(), want, 0, bytes, "broadcast"));
}

// Floats member `from` sends member `to`: uneven, and with three or more members some empty.
int64_t all_to_all_count(int from, int to, int64_t scale) {
  return (from + 2 * to) % 3 == 2 ? 0 : scale * (1 + from) + 7 * to;
}
// Element i of the piece member `from` sends member `to`: exact in fp32.
float all_to_all_value(int from, int to, int64_t i) {
  return static_cast<float>(from * 100000 + to * 1000 + i % 997);
}

void Checker::all_to_all_check(const CommGroup& group, int64_t scale, const std::string& where) {
  const int me = group.my_index;
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<float> send, want;
  for (int j = 0; j < group.size(); ++j) {
    send_counts.push_back(all_to_all_count(me, j, scale));
    recv_counts.push_back(all_to_all_count(j, me, scale));
    for (int64_t i = 0; i < send_counts.back(); ++i) send.push_back(all_to_all_value(me, j, i));
    for (int64_t i = 0; i < recv_counts.back(); ++i) want.push_back(all_to_all_value(j, me, i));
  }
  GpuArray<float> from(send);
  GpuArray<float> to(std::vector<float>(want.size(), -1.0f));
  comm_.all_to_all(from.get(), send_counts, to.get(), recv_counts, group).wait();
  const auto received = static_cast<int64_t>(want.size());
  record("all_to_all", fmt::format("{} receives {}", where, fmt::join(recv_counts, "/")),
         (static_cast<int64_t>(send.size()) + received) * 4, compare(to.download(), want, 0, received, "all_to_all"));
}

// A ring where every rank posts its send before its receive: deadlocks if sends and receives
// share one queue that needs the peer's matching call first.
void Checker::send_recv_check(int64_t bytes) {
  const int n = comm_.world_size();
  const int next = (comm_.rank() + 1) % n;
  const int previous = (comm_.rank() + n - 1) % n;
  auto pattern = [bytes](int sender) {
    std::vector<unsigned char> v(static_cast<size_t>(bytes));
    for (int64_t i = 0; i < bytes; ++i)
      v[static_cast<size_t>(i)] = static_cast<unsigned char>((i + sender * 29) & 0xff);
    return v;
  };
  GpuArray<unsigned char> out(pattern(comm_.rank()));
  GpuArray<unsigned char> in(std::vector<unsigned char>(static_cast<size_t>(bytes), 0));
  CommHandle sent = comm_.send(out.get(), bytes, next, 7);
  CommHandle received = comm_.recv(in.get(), bytes, previous, 7);
  received.wait();
  sent.wait();
  record("send/recv", fmt::format("ring, send first, {} ranks", n), bytes,
         compare(in.download(), pattern(previous), 0, bytes, "recv"));
}

// Several operations in flight before the first wait, waited in reverse order.
void Checker::overlap_check() {
  const CommGroup& world = comm_.world();
  const int64_t count = 300007;
  GpuArray<float> a(values_make<float>(count, world.my_index, value_sum));
  GpuArray<double> b(values_make<double>(count, world.my_index, value_max));
  CommHandle first = comm_.all_reduce(a.get(), count, world, ReduceOp::ReduceOp_sum);
  CommHandle second = comm_.all_reduce(b.get(), count, world, ReduceOp::ReduceOp_max);
  second.wait();
  first.wait();
  bool reported_done = first.done() && second.done();
  std::vector<float> want_a(static_cast<size_t>(count));
  std::vector<double> want_b(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    double max = value_max(0, i);
    for (int m = 0; m < world.size(); ++m) {
      sum += value_sum(m, i);
      max = std::max(max, value_max(m, i));
    }
    want_a[static_cast<size_t>(i)] = static_cast<float>(sum);
    want_b[static_cast<size_t>(i)] = max;
  }
  int64_t wrong = compare(a.download(), want_a, 0, count, "overlapped sum") +
                  compare(b.download(), want_b, 0, count, "overlapped max") + (reported_done ? 0 : 1);
  if (!reported_done) std::fprintf(stderr, "%s rank %d: done() false after wait()\n", impl_.c_str(), comm_.rank());
  record("2 in flight", "f32 sum + f64 max, waited in reverse", count * 12, wrong);
}

// The buffer is cleared on the legacy default stream right before the call, without a host
// synchronisation: the communicator must order its work after it and reduce zeros.
void Checker::ordering_check() {
  const CommGroup& world = comm_.world();
  const int64_t count = int64_t{16} << 20;
  GpuArray<float> data(values_make<float>(count, world.my_index, value_sum));
  cuda_check(cudaMemsetAsync(data.get(), 0, static_cast<size_t>(count) * sizeof(float), cudaStreamLegacy),
             "checker memset");
  comm_.all_reduce(data.get(), count, world, ReduceOp::ReduceOp_sum).wait();
  record("ordering", "after a memset on the default stream", count * 4,
         compare(data.download(), std::vector<float>(static_cast<size_t>(count), 0.0f), 0, count, "ordering"));
}

void Checker::all_gather_bytes_check() {
  const CommGroup& world = comm_.world();
  constexpr int64_t kRecordBytes = 24;
  std::vector<unsigned char> mine(kRecordBytes);
  for (int64_t i = 0; i < kRecordBytes; ++i)
    mine[static_cast<size_t>(i)] = static_cast<unsigned char>(comm_.rank() * 40 + i);
  std::vector<unsigned char> all(static_cast<size_t>(kRecordBytes * world.size()), 0);
  comm_.all_gather_bytes(mine.data(), all.data(), kRecordBytes, world).wait();
  std::vector<unsigned char> want(all.size());
  for (int r = 0; r < world.size(); ++r) {
    for (int64_t i = 0; i < kRecordBytes; ++i)
      want[static_cast<size_t>(r * kRecordBytes + i)] = static_cast<unsigned char>(r * 40 + i);
  }
  record("all_gather_bytes", "host memory", kRecordBytes * world.size(),
         compare(all, want, 0, static_cast<int64_t>(all.size()), "all_gather_bytes"));
}

// Every collective on one group, with odd counts; unequal counts include an empty piece.
void Checker::group_checks(const CommGroup& group, const std::string& where) {
  all_reduce_check<float>(group, 1000003, ReduceOp::ReduceOp_sum, where);
  all_reduce_check<float>(group, 4099, ReduceOp::ReduceOp_max, where);
  all_reduce_check<double>(group, 333, ReduceOp::ReduceOp_sum, where);
  all_reduce_check<double>(group, 70001, ReduceOp::ReduceOp_max, where);
  std::vector<int64_t> equal(static_cast<size_t>(group.size()), 1001);
  std::vector<int64_t> unequal;
  for (int m = 0; m < group.size(); ++m) unequal.push_back(m == 1 ? 0 : 101 + 37 * m);
  reduce_scatter_check(group, equal, where);
  reduce_scatter_check(group, unequal, where);
  all_gather_check(group, equal, where);
  all_gather_check(group, unequal, where);
  broadcast_check(group, 12345, group.size() - 1, where);
  broadcast_check(group, 777, 0, where);
  all_to_all_check(group, 1, where);
  all_to_all_check(group, 40961, where);
}

void Checker::run_all() {
  group_checks(comm_.world(), "world");
  // Split into even and odd ranks (one group of one on a single rank).
  const int n = comm_.world_size();
  std::vector<std::vector<int>> parity(n > 1 ? 2 : 1);
  for (int r = 0; r < n; ++r) parity[static_cast<size_t>(r % 2)].push_back(r);
  CommGroup half = comm_.split(parity);
  group_checks(half, comm_.rank() % 2 == 0 ? "even ranks" : "odd ranks");
  // A split that leaves every rank but 0 outside any group.
  CommGroup alone = comm_.split(std::vector<std::vector<int>>{std::vector<int>{0}});
  if (alone.my_index >= 0) all_reduce_check<float>(alone, 12347, ReduceOp::ReduceOp_sum, "rank 0 alone");
  if (n > 1) send_recv_check(100001);
  overlap_check();
  ordering_check();
  all_gather_bytes_check();
}

// all_reduce (sum, f32) time per size, the slowest rank's, from 1 MiB to 256 MiB.
struct BandwidthRow {
  int64_t bytes = 0;
  double seconds = 0;
};

std::vector<BandwidthRow> all_reduce_bandwidth(Communicator& comm, Communicator& mpi) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  constexpr int64_t kLargestBytes = 256 * kMiB;
  GpuArray<float> data(kLargestBytes / 4);
  // Zeros stay zeros however often they are summed.
  cuda_check(cudaMemset(data.get(), 0, static_cast<size_t>(kLargestBytes)), "checker memset");
  std::vector<BandwidthRow> rows;
  for (int64_t bytes = kMiB; bytes <= kLargestBytes; bytes *= 2) {
    const int64_t count = bytes / 4;
    comm.all_reduce(data.get(), count, comm.world(), ReduceOp::ReduceOp_sum).wait();  // warm-up
    double ready = 0;
    mpi.all_reduce(&ready, 1, mpi.world(), ReduceOp::ReduceOp_sum).wait();  // start together
    const int iterations = bytes >= 64 * kMiB ? 3 : 10;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i)
      comm.all_reduce(data.get(), count, comm.world(), ReduceOp::ReduceOp_sum).wait();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
    mpi.all_reduce(&seconds, 1, mpi.world(), ReduceOp::ReduceOp_max).wait();
    rows.push_back(BandwidthRow{bytes, seconds});
  }
  return rows;
}

// Runs every check and the bandwidth sweep on one communicator; returns the mismatches over all
// ranks. Rank 0 prints its view; other ranks print their mismatches on stderr.
int64_t implementation_run(Communicator& comm, const std::string& name, Communicator& mpi) {
  Checker checker(comm, name);
  checker.run_all();
  double mismatches = static_cast<double>(checker.mismatches());
  mpi.all_reduce(&mismatches, 1, mpi.world(), ReduceOp::ReduceOp_sum).wait();
  std::vector<BandwidthRow> bandwidth = all_reduce_bandwidth(comm, mpi);
  if (mpi.rank() != 0) return static_cast<int64_t>(mismatches);

  const int n = comm.world_size();
  fmt::print("\n{}: {} rank(s)\n", name, n);
  fmt::print("  {:<18} {:<36} {:>12} {:>10}\n", "op", "case", "bytes", "mismatches");
  for (const CheckRow& row : checker.rows()) {
    fmt::print("  {:<18} {:<36} {:>12} {:>10}\n", row.op, row.detail, row.bytes, row.mismatches);
  }
  fmt::print("  all ranks: {} mismatching element(s)\n", static_cast<int64_t>(mismatches));
  // Bus bandwidth: what each link carries in a ring all_reduce, 2 (n - 1) / n of the data.
  const double bus_factor = 2.0 * (n - 1) / n;
  fmt::print("\n  {:<18} {:>12} {:>10} {:>14} {:>14}\n", "op", "bytes", "ms", "algo GB/s", "bus GB/s");
  for (const BandwidthRow& row : bandwidth) {
    const double algo_gbps = static_cast<double>(row.bytes) / row.seconds / 1e9;
    fmt::print("  {:<18} {:>12} {:>10.3f} {:>14.1f} {:>14.1f}\n", "all_reduce f32", row.bytes, row.seconds * 1e3,
               algo_gbps, algo_gbps * bus_factor);
  }
  if (n == 1) fmt::print("  (one rank: nothing crosses a link, so bus bandwidth is 0)\n");
  std::fflush(stdout);
  return static_cast<int64_t>(mismatches);
}

int local_rank_of(int rank) {
  const char* text = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return text != nullptr ? std::atoi(text) : rank;
}

int checker_main(const std::string& only) {
  std::unique_ptr<Communicator> mpi = communicator_mpi();
  try {
    std::string reason;
    const int gpus = cuda_device_count(&reason);
    const int device = local_rank_of(mpi->rank()) % gpus;
    cuda_device_open(device);
    // NCCL refuses two ranks on one GPU: every rank must agree to skip it, or the others hang.
    double crowded = mpi->local_size() > gpus ? 1 : 0;
    mpi->all_reduce(&crowded, 1, mpi->world(), ReduceOp::ReduceOp_max).wait();
    int64_t mismatches = 0;
    if (only != "host-staged") {
      if (crowded > 0) {
        if (mpi->rank() == 0) {
          fmt::print(
              "nccl: skipped: {} ranks on this host share {} GPU(s), and NCCL needs a GPU per rank "
              "(run with at most {} ranks per host to check it)\n",
              mpi->local_size(), gpus, gpus);
        }
      } else {
        std::unique_ptr<Communicator> nccl = communicator_nccl_create(*mpi, device);
        mismatches += implementation_run(*nccl, "nccl", *mpi);
      }
    }
    if (only != "nccl") {
      std::unique_ptr<Communicator> staged = communicator_host_staged_create(*mpi, device);
      mismatches += implementation_run(*staged, "host-staged", *mpi);
    }
    if (mpi->rank() == 0) {
      fmt::print("\n{}\n", mismatches == 0
                               ? "comm_check_gpu: all results exact"
                               : fmt::format("comm_check_gpu: FAILED, {} mismatching element(s)", mismatches));
    }
    return mismatches == 0 ? 0 : 1;
  } catch (const Error& error) {
    // One rank's failure ends every rank, so none is left waiting in a collective.
    mpi->abort(error.format(), 1);
  }
  return 1;  // abort does not return; the compiler cannot see it through the virtual call
}

}  // namespace
}  // namespace alloy

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "all";
  if (only != "all" && only != "nccl" && only != "host-staged") {
    std::fprintf(stderr, "usage: mpirun -np N comm_check_gpu [all|nccl|host-staged]\n");
    return 2;
  }
  std::string reason;
  if (alloy::cuda_device_count(&reason) == 0) {
    std::printf("comm_check_gpu: no GPU here (%s); nothing to check\n", reason.c_str());
    return 0;
  }
  return alloy::checker_main(only);
}
