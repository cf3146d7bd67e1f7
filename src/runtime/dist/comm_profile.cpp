// Collective timing: synchronised repetitions per buffer size, the slowest member's median,
// and a least-squares alpha-beta fit per (op, group size).
#include "runtime/dist/comm_profile.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace alloy {

namespace {

// Up to 16 MiB: gradient syncs move buffers that large, and on a CPU they no longer fit in
// cache and move at about half the rate of the 4 MiB ones.
constexpr int64_t kBufferBytes[] = {int64_t{16} << 10, int64_t{256} << 10, int64_t{4} << 20, int64_t{16} << 20};

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

// Least squares of time = latency + bytes / bandwidth on relative residuals (each timing weighted
// by 1 / time^2): plain residuals would let the largest buffer decide the line alone and leave
// the latency at zero.
ProfiledCollective fit(CollectiveOp op, int group_size, bool spans_nodes, const std::vector<double>& bytes,
                       const std::vector<double>& seconds) {
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
  ProfiledCollective c;
  c.op = op;
  c.group_size = group_size;
  c.spans_nodes = spans_nodes;
  if (slope <= 0) {
    // Noise swamped the size dependence: keep the smallest time as latency and the largest
    // buffer's average rate as bandwidth, which overstates neither.
    c.latency_seconds = *std::min_element(seconds.begin(), seconds.end());
    c.bandwidth_bytes_per_second = bytes.back() / seconds.back();
    return c;
  }
  c.latency_seconds = std::max(0.0, (sy - slope * sx) / n);
  c.bandwidth_bytes_per_second = 1.0 / slope;
  return c;
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
      out.push_back(fit(op, k, spans_nodes, bytes, seconds));
      for (size_t i = 0; i < bytes.size(); ++i) out.back().samples.push_back({bytes[i], seconds[i]});
      if (progress && comm.rank() == 0)
        progress(fmt::format("{} over {} ranks: {:.1f} us + bytes / {:.2f} GB/s", collective_op_name(op), k,
                             out.back().latency_seconds * 1e6, out.back().bandwidth_bytes_per_second / 1e9));
    }
  }
  return out;
}

}  // namespace alloy
