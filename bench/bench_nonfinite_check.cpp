// What the step's finiteness check costs, side by side in one run on one CPU rank: the step, its
// optimizer op (where the check sits: the loss rides in the gradient norm's all-reduce and two
// doubles are tested), the norm's pass over the gradients the check reuses, and a separate scan
// of every gradient for NaN or Inf, the price of checking without the norm.
//   bench_nonfinite_check [--steps N] [--rounds R] [--model M]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/threads.hpp"
#include "runtime/trainer.hpp"
#include "spec/error.hpp"

namespace {

using namespace alloy;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

template <typename F>
double seconds_of(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Medians {
  double step = 0, optimizer = 0, norm_pass = 0, scan = 0;  // seconds
};

// `steps` steps after a warm-up one; after each, the norm's pass and a full scan of its gradients.
// tokens: (batch tokens + 1) ids, inputs and targets one apart.
Medians bench_round(RankRuntime& runtime, const std::vector<int32_t>& tokens, int steps) {
  std::vector<double> step, optimizer, norm_pass, scan;
  runtime.step(tokens.data(), tokens.data() + 1);
  for (int i = 0; i < steps; ++i) {
    const RankStepStats stats = runtime.step(tokens.data(), tokens.data() + 1);
    if (stats.update_skipped) throw Error("a benchmark step was not finite");
    step.push_back(stats.step_seconds);
    optimizer.push_back(stats.optimizer_seconds);
    double squares = 0;
    norm_pass.push_back(
        seconds_of([&] { squares = runtime.gradient_square_sum(); }));
    std::string found;
    scan.push_back(seconds_of([&] { found = runtime.gradient_nonfinite_name(); }));
    if (!found.empty() || squares < 0) throw Error("a benchmark gradient was not finite");
  }
  return {median(step), median(optimizer), median(norm_pass), median(scan)};
}

int bench_main(int argc, char** argv) {
  int steps = 20, rounds = 5;
  std::string model_name = "tiny-gpt";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (flag == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else if (flag == "--model")
      model_name = argv[i + 1];
    else
      throw Error("unknown option " + flag, {"", flag}, "use --steps N, --rounds R or --model M");
  }
  if (steps < 1 || rounds < 1)
    throw Error("--steps and --rounds must be at least 1", {"", "--steps"}, "pass e.g. --steps 20");
  runtime_set_threads(1);
  const ModelSpec model = model_load(model_name);
  TrainSpec train;
  train.seq_len = std::min<int64_t>(64, model.max_seq_len);
  train.global_batch_sequences = 8;
  train.steps = 1000;
  TrainerOptions options;
  options.batch_size = train.global_batch_sequences;
  const OneStage one = trainer_one_stage(model, train, options);
  std::unique_ptr<Communicator> comm = communicator_local();
  RankResources resources;
  resources.memory_cap_bytes = int64_t{4} << 30;
  RankRuntime runtime(one.plan, model, train, *comm, resources);
  const int64_t batch_tokens = train.global_batch_sequences * train.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(batch_tokens + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 131 + 7) % model.vocab_size);

  fmt::print("{}: batch {} x {} tokens, 1 thread, {} steps per round (medians)\n", model.name,
             train.global_batch_sequences, train.seq_len, steps);
  fmt::print("{:>5}  {:>10}  {:>12}  {:>14}  {:>14}  {:>10}\n", "round", "step ms", "optimizer ms", "norm pass ms",
             "full scan ms", "scan/step");
  std::vector<Medians> all;
  for (int r = 0; r < rounds; ++r) {
    const Medians m = bench_round(runtime, tokens, steps);
    all.push_back(m);
    fmt::print("{:>5}  {:>10.3f}  {:>12.3f}  {:>14.3f}  {:>14.3f}  {:>9.2f}%\n", r + 1, m.step * 1e3, m.optimizer * 1e3,
               m.norm_pass * 1e3, m.scan * 1e3, 100.0 * m.scan / m.step);
  }
  auto over_rounds = [&](double Medians::*field) {
    std::vector<double> v;
    for (const Medians& m : all) v.push_back(m.*field);
    return median(v);
  };
  fmt::print(
      "median: step {:.3f} ms, optimizer {:.3f} ms, norm pass {:.3f} ms, a separate full scan {:.3f} ms ({:.2f}% of "
      "a step)\n",
      over_rounds(&Medians::step) * 1e3, over_rounds(&Medians::optimizer) * 1e3, over_rounds(&Medians::norm_pass) * 1e3,
      over_rounds(&Medians::scan) * 1e3, 100.0 * over_rounds(&Medians::scan) / over_rounds(&Medians::step));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return bench_main(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_nonfinite_check: %s\n", e.format().c_str());
    return kExitBadInput;
  }
}
