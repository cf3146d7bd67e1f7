// What CPU ranks that outnumber this machine's cores do to each other's collectives (the CPU
// runtime's time dilation stretches compute, not communication). Under mpirun with 4 ranks on 2
// cores, times a reduce-scatter and an all-gather over the pair {0, 1}, the way training's data
// parallelism posts them through the runtime's communicator, in three surroundings, interleaved
// round by round so that every ratio is measured side by side:
//   alone      ranks 2 and 3 blocked in a wait (their cores free)
//   both pairs {2, 3} runs the same collective at the same time (two data-parallel groups)
//   computing  ranks 2 and 3 compute stretched by the time dilation / speed (--slowdown)
//   asleep     ranks 2 and 3 sleeping (no wait of theirs polled)
// For each it prints the median wall time and the CPU seconds rank 0's process spent on it (its
// progress thread's copies and reductions); run on 2 ranks, "alone" only. With --optimizer N it
// times instead the CPU runtime's optimizer step (gradient norm and AdamW) over N parameters per
// rank, on rank 0 alone or on every rank at once, with its arrays warm in the caches or evicted
// by 512 MiB of other data first, as a training step's passes evict them (docs/catalog.md).
//   mpirun -np 4 bench_cpu_contention [--mib M] [--rounds R] [--slowdown S] [--optimizer N]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/cpu/matmul.hpp"
#include "runtime/cpu/optimizer.hpp"
#include "util/clock.hpp"
#include "runtime/device_speed.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/threads.hpp"

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of this process, every thread (the progress thread's work included).
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

enum class Surrounding { alone, asleep, both_pairs, computing };
const char* surrounding_name(Surrounding s) {
  switch (s) {
    case Surrounding::alone: return "alone";
    case Surrounding::asleep: return "asleep";
    case Surrounding::both_pairs: return "both pairs";
    case Surrounding::computing: return "computing";
  }
  return "?";
}

struct Sample {
  double wall_seconds = 0, cpu_seconds = 0;
};

// A block-sized GEMM (small-gpt's MLP: 128 rows x 512 -> 2048) stretched by `slowdown`, repeated
// until `until` on the steady clock.
void compute_until(double until, double slowdown) {
  static std::vector<float> in(128 * 512, 0.5f), w(2048 * 512, 0.25f), out(128 * 2048);
  while (now_seconds() < until) {
    alloy::ComputeStretch stretch(slowdown);
    alloy::matmul_forward(out.data(), in.data(), w.data(), nullptr, 128, 512, 2048);
    stretch.finish();
  }
}

// CPU nanoseconds per parameter of the gradient norm and AdamW over `params` parameters on every
// rank at once (each stretched by `slowdown`, as training stretches its optimizer), or on rank 0
// alone with the others asleep; evicted: 512 MiB of other data streamed before each step first,
// as a training step's passes do. Rank 0's median.
void optimizer_experiment(alloy::Communicator& comm, int64_t params, int rounds, double slowdown) {
  std::vector<float> p(static_cast<size_t>(params), 0.01f), g(p.size(), 0.001f), m(p.size(), 0.0f), v(p.size(), 0.0f);
  std::vector<float> scratch(size_t{1} << 27, 1.0f);
  int64_t step = 0;
  const auto update = [&](bool evict) {
    if (evict)
      for (float& x : scratch) x = x * 0.5f + 1.0f;
    alloy::ComputeStretch stretch(slowdown);
    const double start = alloy::thread_cpu_seconds();
    alloy::AdamWHyper hyper;
    hyper.grad_scale = static_cast<float>(1.0 / (1.0 + alloy::grad_norm(g.data(), params)));
    alloy::adamw_update(p.data(), m.data(), v.data(), g.data(), params, hyper, ++step);
    const double cpu = alloy::thread_cpu_seconds() - start;
    stretch.finish();
    return cpu;
  };
  const char* names[] = {"rank 0 alone, warm", "rank 0 alone, evicted", "every rank, warm", "every rank, evicted"};
  std::vector<double> ns[4];
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 4; ++k) {
      const bool everyone = k >= 2, evict = k % 2 == 1;
      float token = 0;
      comm.all_reduce(&token, 1, comm.world()).wait();
      if (comm.rank() == 0 || everyone) {
        const double cpu = update(evict);
        if (comm.rank() == 0 && round > 0) ns[k].push_back(1e9 * cpu / static_cast<double>(params));
      } else {
        std::this_thread::sleep_for(std::chrono::duration<double>(0.03));
      }
      comm.all_reduce(&token, 1, comm.world()).wait();
    }
  }
  if (comm.rank() != 0) return;
  std::printf("%d ranks, gradient norm + AdamW over %lld parameters per rank, stretched by %.1f, %d rounds\n",
              comm.world_size(), static_cast<long long>(params), slowdown, rounds);
  for (int k = 0; k < 4; ++k) std::printf("  %-24s %6.2f ns per parameter (CPU)\n", names[k], median(ns[k]));
}

}  // namespace

int main(int argc, char** argv) {
  double mib = 13;
  int rounds = 15;
  double slowdown = 4;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--mib") mib = std::atof(argv[i + 1]);
    if (std::string(argv[i]) == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--slowdown") slowdown = std::atof(argv[i + 1]);
  }
  alloy::runtime_set_threads(1);
  auto comm = alloy::communicator_mpi();
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--optimizer") {
      optimizer_experiment(*comm, std::atoll(argv[i + 1]), rounds, slowdown);
      return 0;
    }
  const int world = comm->world_size();
  const int rank = comm->rank();
  std::vector<std::vector<int>> pairs = {{0, 1}};
  if (world >= 4) pairs.push_back({2, 3});
  const alloy::CommGroup pair = comm->split(pairs);
  const int64_t count = static_cast<int64_t>(mib * (1 << 20) / 4) / 2 * 2;
  std::vector<float> buffer(static_cast<size_t>(count), 1.0f);
  const std::vector<int64_t> pieces = {count / 2, count / 2};
  std::vector<Surrounding> surroundings = {Surrounding::alone};
  if (world >= 4) surroundings = {Surrounding::alone, Surrounding::asleep, Surrounding::both_pairs, Surrounding::computing};
  const std::vector<std::string> ops = {"reduce_scatter", "all_gather"};
  // [op][surrounding] -> samples of rank 0.
  std::vector<std::vector<std::vector<Sample>>> samples(ops.size(), std::vector<std::vector<Sample>>(surroundings.size()));
  for (int round = 0; round < rounds; ++round) {
    for (size_t o = 0; o < ops.size(); ++o) {
      for (size_t s = 0; s < surroundings.size(); ++s) {
        float token = 0;
        comm->all_reduce(&token, 1, comm->world()).wait();
        const bool in_first_pair = rank <= 1;
        const bool runs_collective = in_first_pair || surroundings[s] == Surrounding::both_pairs;
        double end = 0;
        const double cpu_start = process_cpu_seconds();
        const double start = now_seconds();
        if (runs_collective) {
          alloy::CommHandle h = o == 0 ? comm->reduce_scatter(buffer.data(), pieces, pair)
                                       : comm->all_gather(buffer.data(), pieces, pair);
          h.wait();
          end = now_seconds();
        }
        const double cpu = process_cpu_seconds() - cpu_start;
        // Ranks 2 and 3 compute or sleep for longer than any collective here took, then all meet.
        if (surroundings[s] == Surrounding::computing && !in_first_pair) compute_until(start + 0.05, slowdown);
        if (surroundings[s] == Surrounding::asleep && !in_first_pair)
          std::this_thread::sleep_for(std::chrono::duration<double>(0.05));
        comm->all_reduce(&token, 1, comm->world()).wait();
        if (rank == 0 && round > 0) samples[o][s].push_back({end - start, cpu});
      }
    }
  }
  if (rank == 0) {
    std::printf("%d ranks, %.1f MiB over ranks {0, 1}, %d rounds (first dropped), others' slowdown %.1f\n", world, mib,
                rounds, slowdown);
    std::printf("%-16s %-12s %10s %12s %10s\n", "collective", "surrounding", "wall ms", "rank 0 cpu ms", "GB/s");
    for (size_t o = 0; o < ops.size(); ++o) {
      for (size_t s = 0; s < surroundings.size(); ++s) {
        std::vector<double> wall, cpu;
        for (const Sample& x : samples[o][s]) {
          wall.push_back(x.wall_seconds);
          cpu.push_back(x.cpu_seconds);
        }
        std::printf("%-16s %-12s %10.2f %12.2f %10.2f\n", ops[o].c_str(), surrounding_name(surroundings[s]),
                    1e3 * median(wall), 1e3 * median(cpu), count * 4.0 / median(wall) / 1e9);
      }
    }
  }
  return 0;
}
