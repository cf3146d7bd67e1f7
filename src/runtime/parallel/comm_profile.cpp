// Collective timing: synchronised repetitions per buffer size, the slowest member's median,
// and a least-squares alpha-beta fit per (op, group size).
#include "runtime/parallel/comm_profile.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace alloy {

namespace {

// Up to 16 MiB: gradient syncs move buffers that large, and on a CPU they no longer fit in
// cache and move at about half the rate of the 4 MiB ones.
constexpr int64_t kBufferBytes[] = {int64_t{16} << 10, int64_t{256} << 10, int64_t{4} << 20, int64_t{16} << 20};

// Any tag MPI allows (at least 32767): the profile's transfers are the only ones in flight.
constexpr int kPingPongTag = 1;

CommHandle post(Communicator& comm, CollectiveOp op, std::vector<float>& buffer, const CommGroup& group) {
  const int64_t count = static_cast<int64_t>(buffer.size());
  const std::vector<int64_t> pieces(static_cast<size_t>(group.size()), count / group.size());
  switch (op) {
    case CollectiveOp::CollectiveOp_all_reduce: return comm.all_reduce(buffer.data(), count, group);
    case CollectiveOp::CollectiveOp_all_gather: return comm.all_gather(buffer.data(), pieces, group);
    case CollectiveOp::CollectiveOp_reduce_scatter: return comm.reduce_scatter(buffer.data(), pieces, group);
  }
  return {};
}

// Median seconds of one op on `group`, the slowest member's; every world rank calls it.
double time_op(Communicator& comm, CollectiveOp op, const CommGroup& group, int64_t bytes, int repeats) {
  double median = 0;
  if (group.my_index >= 0) {
    std::vector<float> buffer(static_cast<size_t>(bytes / 4 / group.size() * group.size()), 1.0f);
    std::vector<double> times;
    for (int r = 0; r <= repeats; ++r) {
      float token = 0;
      comm.all_reduce(&token, 1, group).wait();  // start together
      const auto start = std::chrono::steady_clock::now();
      post(comm, op, buffer, group).wait();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) times.push_back(seconds);
    }
    std::sort(times.begin(), times.end());
    median = times[times.size() / 2];
  }
  comm.all_reduce(&median, 1, comm.world(), ReduceOp::ReduceOp_max).wait();
  return median;
}

struct AlphaBeta {
  double latency_seconds = 0;
  double bandwidth_bytes_per_second = 0;
};

// Least squares of time = latency + bytes / bandwidth on relative residuals (each timing weighted
// by 1 / time^2): plain residuals would let the largest buffer decide the line alone and leave
// the latency at zero.
AlphaBeta fit(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const double w = 1.0 / (seconds[i] * seconds[i]);
    n += w;
    sx += w * bytes[i];
    sy += w * seconds[i];
    sxx += w * bytes[i] * bytes[i];
    sxy += w * bytes[i] * seconds[i];
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  // Noise swamped the size dependence: keep the smallest time as latency and the largest
  // buffer's average rate as bandwidth, which overstates neither.
  if (slope <= 0) return {*std::min_element(seconds.begin(), seconds.end()), bytes.back() / seconds.back()};
  return {std::max(0.0, (sy - slope * sx) / n), 1.0 / slope};
}

// Median seconds of one transfer of `bytes` from world rank `a` to `b` (half a ping-pong's round
// trip, timed on `a`), on every rank; every world rank calls it.
double time_transfer(Communicator& comm, int a, int b, int64_t bytes, int repeats) {
  std::vector<char> buffer(static_cast<size_t>(bytes));
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {
    float token = 0;
    comm.all_reduce(&token, 1, comm.world()).wait();  // start together, the others idle
    const auto start = std::chrono::steady_clock::now();
    if (comm.rank() == a) {
      comm.send(buffer.data(), bytes, b, kPingPongTag).wait();
      comm.recv(buffer.data(), bytes, b, kPingPongTag).wait();
    } else if (comm.rank() == b) {
      comm.recv(buffer.data(), bytes, a, kPingPongTag).wait();
      comm.send(buffer.data(), bytes, a, kPingPongTag).wait();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 2;
    if (r > 0) times.push_back(seconds);
  }
  std::sort(times.begin(), times.end());
  double median = comm.rank() == a ? times[times.size() / 2] : 0.0;
  comm.all_reduce(&median, 1, comm.world(), ReduceOp::ReduceOp_max).wait();
  return median;
}

}  // namespace

std::vector<ProfiledCollective> comm_profile_measure(Communicator& comm, int repeats,
                                                     const std::function<void(const std::string&)>& progress) {
  std::vector<ProfiledCollective> out;
  const bool spans_nodes = comm.local_size() < comm.world_size();
  for (int k = 2; k <= comm.world_size(); ++k) {
    std::vector<int> first(static_cast<size_t>(k));
    for (int r = 0; r < k; ++r) first[static_cast<size_t>(r)] = r;
    const CommGroup group = comm.split({first});
    for (CollectiveOp op : {CollectiveOp::CollectiveOp_all_reduce, CollectiveOp::CollectiveOp_all_gather,
                            CollectiveOp::CollectiveOp_reduce_scatter}) {
      std::vector<double> bytes, seconds;
      for (int64_t b : kBufferBytes) {
        bytes.push_back(static_cast<double>(b));
        seconds.push_back(time_op(comm, op, group, b, repeats));
      }
      const AlphaBeta line = fit(bytes, seconds);
      ProfiledCollective c;
      c.op = op;
      c.group_size = k;
      c.spans_nodes = spans_nodes;
      c.latency_seconds = line.latency_seconds;
      c.bandwidth_bytes_per_second = line.bandwidth_bytes_per_second;
      out.push_back(c);
      for (size_t i = 0; i < bytes.size(); ++i) out.back().samples.push_back({bytes[i], seconds[i]});
      if (progress && comm.rank() == 0)
        progress(fmt::format("{} over {} ranks: {:.1f} us + bytes / {:.2f} GB/s", collective_op_name(op), k,
                             out.back().latency_seconds * 1e6, out.back().bandwidth_bytes_per_second / 1e9));
    }
  }
  return out;
}

std::vector<ProfiledLink> comm_profile_point_to_point(Communicator& comm, int repeats,
                                                     const std::function<void(const std::string&)>& progress) {
  // Ranks fill a node before the next (mpirun's default mapping): 0 and 1 share one, 0 and the
  // first rank of the next node do not.
  std::vector<std::pair<int, bool>> peers;  // (peer of rank 0, spans nodes)
  if (comm.local_size() >= 2) peers.push_back({1, false});
  if (comm.local_size() < comm.world_size()) peers.push_back({comm.local_size(), true});
  std::vector<ProfiledLink> out;
  for (const auto& [peer, spans_nodes] : peers) {
    std::vector<double> bytes, seconds;
    for (int64_t b : kBufferBytes) {
      bytes.push_back(static_cast<double>(b));
      seconds.push_back(time_transfer(comm, 0, peer, b, repeats));
    }
    const AlphaBeta line = fit(bytes, seconds);
    out.push_back({spans_nodes, line.bandwidth_bytes_per_second, line.latency_seconds});
    if (progress && comm.rank() == 0)
      progress(fmt::format("point-to-point {}: {:.1f} us + bytes / {:.2f} GB/s", spans_nodes ? "across nodes" : "in a node",
                           line.latency_seconds * 1e6, line.bandwidth_bytes_per_second / 1e9));
  }
  return out;
}

}  // namespace alloy
