// Alloy against PyTorch on the same model, batch and thread count, side by side: seconds per
// training step (forward + backward + clipping + AdamW), their ratio, and where Alloy's step
// time goes (per-kernel timers). PyTorch runs through bench/torch_step.py with /usr/bin/python3.
//   bench_train_vs_torch [--steps N] [--rounds R] [--threads 1,2] [--no-torch]
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/cpu/blas_core.hpp"
#include "runtime/model.hpp"
#include "runtime/profile.hpp"
#include "runtime/threads.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/parallel/executor.hpp"
#include "runtime/trainer.hpp"
#include "spec/error.hpp"

namespace {

using namespace alloy;

struct BenchCase {
  std::string label;
  ModelSpec spec;
};

struct Timing {
  double min_seconds = 0.0;      // wall clock, best step
  double median_seconds = 0.0;   // wall clock, median step
  double cpu_min_seconds = 0.0;  // process CPU time, best step (all threads together)
  double cpu_mean_seconds = 0.0;
};

double cpu_seconds_now() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

ModelSpec bench_spec(ModelFamily family) {
  ModelSpec spec;
  const bool gpt2 = family == ModelFamily::ModelFamily_gpt2;
  spec.name = gpt2 ? "gpt2-4x256" : "llama-4x256";
  spec.family = family;
  spec.num_layers = 4;
  spec.hidden_size = 256;
  spec.num_heads = 4;
  spec.num_kv_heads = gpt2 ? 4 : 2;
  spec.head_dim = 64;
  spec.ffn_hidden_size = gpt2 ? 1024 : 688;
  spec.vocab_size = 4096;
  spec.max_seq_len = 128;
  spec.tied_embeddings = gpt2;
  spec.qkv_bias = spec.linear_bias = spec.norm_bias = gpt2;
  return spec;
}

Timing timing_of(std::vector<double> seconds, const std::vector<double>& cpu_seconds) {
  std::sort(seconds.begin(), seconds.end());
  double cpu_total = 0.0;
  for (double s : cpu_seconds) cpu_total += s;
  return {seconds.front(), seconds[seconds.size() / 2],
          *std::min_element(cpu_seconds.begin(), cpu_seconds.end()),
          cpu_total / static_cast<double>(cpu_seconds.size())};
}

Timing alloy_run(const ModelSpec& spec, int B, int T, int threads, int steps,
                 KernelProfile& profile) {
  runtime_set_threads(threads);
  // What `alloy train` runs each step: the executor of one rank over the one-stage plan.
  TrainSpec train;
  train.steps = 1000;
  train.seq_len = T;
  train.global_batch_sequences = B;
  train.seed = 1234;
  TrainerOptions options;
  options.batch_size = B;
  const OneStage one = trainer_one_stage(spec, train, options);
  std::unique_ptr<Communicator> comm = communicator_local();
  RankResources resources;
  resources.memory_cap_bytes = int64_t{8} << 30;
  RankRuntime runtime(one.plan, spec, train, *comm, resources);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * (T + 1));
  uint64_t x = 42;
  for (int32_t& token : tokens) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    token = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(spec.vocab_size));
  }
  std::vector<int32_t> inputs, targets;
  for (int b = 0; b < B; b++) {
    const int32_t* row = tokens.data() + static_cast<size_t>(b) * (T + 1);
    inputs.insert(inputs.end(), row, row + T);
    targets.insert(targets.end(), row + 1, row + T + 1);
  }
  for (int warmup = 0; warmup < 2; warmup++) {
    runtime.step(inputs.data(), targets.data());
  }
  std::vector<double> seconds;
  std::vector<double> cpu_seconds;
  profile_reset();
  profile_enable(true);
  for (int step = 0; step < steps; step++) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds_now();
    runtime.step(inputs.data(), targets.data());
    cpu_seconds.push_back(cpu_seconds_now() - cpu_start);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  profile_enable(false);
  profile = profile_read();
  return timing_of(seconds, cpu_seconds);
}

// Runs bench/torch_step.py on the same OpenBLAS kernel family as Alloy (PyTorch's GEMMs go to
// the same library: Debian builds it with BLAS_INFO=generic); false when PyTorch is missing.
bool torch_run(const ModelSpec& spec, int B, int T, int threads, int steps, Timing& timing) {
  const bool gpt2 = spec.family == ModelFamily::ModelFamily_gpt2;
  const std::string command = fmt::format(
      "OPENBLAS_CORETYPE={} OPENBLAS_NUM_THREADS={} OMP_NUM_THREADS={} /usr/bin/python3 {}/bench/torch_step.py "
      "--family {} --layers {} --hidden {} --heads {} --kv-heads {} --ffn {} --vocab {} --seq {} "
      "--batch {} --threads {} --steps {} 2>&1",
      blas_core().name, threads, threads, ALLOY_SOURCE_DIR, gpt2 ? "gpt2" : "llama", spec.num_layers,
      spec.hidden_size,
      spec.num_heads, spec.num_kv_heads, spec.ffn_hidden_size, spec.vocab_size, T, B, threads,
      steps);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return false;
  std::string output;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  const size_t brace = output.rfind('{');
  if (status != 0 || brace == std::string::npos) {
    std::fprintf(stderr, "PyTorch run failed (%s):\n%s\n", command.c_str(), output.c_str());
    return false;
  }
  const nlohmann::json result = nlohmann::json::parse(output.substr(brace));
  timing.min_seconds = result["seconds_per_step_min"];
  timing.median_seconds = result["seconds_per_step_median"];
  timing.cpu_min_seconds = result["cpu_seconds_per_step_min"];
  const std::string torch_core = result.value("blas_core", "unknown");
  if (torch_core != blas_core().name) {
    std::fprintf(stderr, "warning: PyTorch ran on OpenBLAS %s kernels, Alloy on %s: the ratio compares different GEMMs\n",
                 torch_core.c_str(), blas_core().name.c_str());
  }
  return true;
}

std::vector<int> parse_threads(const char* text) {
  std::vector<int> threads;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const long value = std::strtol(p, &end, 10);
    if (end == p || value < 1) {
      throw Error(fmt::format("bad --threads list '{}'", text), {}, "give e.g. --threads 1,2");
    }
    threads.push_back(static_cast<int>(value));
    p = *end == ',' ? end + 1 : end;
  }
  return threads;
}

void print_profile(const KernelProfile& profile, int steps, double mean_step_cpu_seconds) {
  const double total = profile.total_cpu_seconds();
  std::string line = "      CPU ms per step:";
  for (size_t k = 0; k < profile.seconds.size(); k++) {
    line += fmt::format(" {} {:.1f} ({:.0f}%),", kernel_kind_name(static_cast<KernelKind>(k)),
                        1e3 * profile.cpu_seconds[k] / steps,
                        100.0 * profile.cpu_seconds[k] / total);
  }
  line += fmt::format(" outside kernels {:.1f}", 1e3 * (mean_step_cpu_seconds - total / steps));
  std::printf("%s\n", line.c_str());
}

// Keeps, field by field, the better of two timings (rounds alternate Alloy and PyTorch so both
// see the same spells of load from other users of the machine).
void timing_keep_best(Timing& best, const Timing& next, bool first) {
  if (first) {
    best = next;
    return;
  }
  best.min_seconds = std::min(best.min_seconds, next.min_seconds);
  best.median_seconds = std::min(best.median_seconds, next.median_seconds);
  best.cpu_min_seconds = std::min(best.cpu_min_seconds, next.cpu_min_seconds);
  best.cpu_mean_seconds = std::min(best.cpu_mean_seconds, next.cpu_mean_seconds);
}

struct BenchOptions {
  int steps = 5;
  int rounds = 5;
  std::vector<int> thread_counts = {1, 2};
  bool with_torch = true;
};

void bench_case(const BenchCase& bench, int threads, const BenchOptions& options) {
  const int B = 8, T = 128;
  Timing alloy, torch, alloy_last;
  KernelProfile profile;  // of the last round, printed with that round's CPU time
  bool have_torch = options.with_torch;
  for (int round = 0; round < options.rounds; round++) {
    alloy_last = alloy_run(bench.spec, B, T, threads, options.steps, profile);
    timing_keep_best(alloy, alloy_last, round == 0);
    Timing torch_round;
    if (have_torch) {
      have_torch = torch_run(bench.spec, B, T, threads, options.steps, torch_round);
      timing_keep_best(torch, torch_round, round == 0);
    }
  }
  const double total = profile.total_cpu_seconds();
  const double matmul_share =
      profile.cpu_seconds[static_cast<size_t>(KernelKind::KernelKind_matmul)] / total;
  const double attention_share =
      profile.cpu_seconds[static_cast<size_t>(KernelKind::KernelKind_attention)] / total;
  auto number = [&](double value) {
    return have_torch ? fmt::format("{:.3f}", value) : std::string("-");
  };
  std::printf("%-30s %3d | %7.3f (%6.3f) %7s (%6s) %5s (%5s) | %9.3f %9s %7s | %5.0f%% %5.0f%%\n",
              bench.label.c_str(), threads, alloy.min_seconds, alloy.median_seconds,
              number(torch.min_seconds).c_str(), number(torch.median_seconds).c_str(),
              number(alloy.min_seconds / torch.min_seconds).c_str(),
              number(alloy.median_seconds / torch.median_seconds).c_str(),
              alloy.cpu_min_seconds, number(torch.cpu_min_seconds).c_str(),
              number(alloy.cpu_min_seconds / torch.cpu_min_seconds).c_str(),
              100.0 * matmul_share, 100.0 * attention_share);
  print_profile(profile, options.steps, alloy_last.cpu_mean_seconds);
}

int bench_main(int argc, char** argv) {
  BenchOptions options;
  const char* usage =
      "usage: bench_train_vs_torch [--steps N] [--rounds R] [--threads 1,2] [--no-torch]";
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      options.steps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      options.rounds = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      options.thread_counts = parse_threads(argv[++i]);
    } else if (std::strcmp(argv[i], "--no-torch") == 0) {
      options.with_torch = false;
    } else {
      throw Error(fmt::format("unknown argument '{}'", argv[i]), {}, usage);
    }
  }
  const std::vector<BenchCase> cases = {
      {"gpt2 L4 C256 H4 F1024 V4096", bench_spec(ModelFamily::ModelFamily_gpt2)},
      {"llama L4 C256 H4/2 F688 V4096", bench_spec(ModelFamily::ModelFamily_llama)}};
  std::printf("training step = forward + backward + clip + AdamW, fp32, B=8 T=128; per side the "
              "best of %d rounds of %d steps, Alloy and PyTorch alternating; "
              "OMP_WAIT_POLICY=%s\n%s, for both\n",
              options.rounds, options.steps, std::getenv("OMP_WAIT_POLICY"), blas_core().note.c_str());
  std::printf("%-30s %3s | %16s %16s %13s | %9s %9s %7s | %6s %6s\n", "model", "thr",
              "alloy s (median)", "torch s (median)", "alloy/torch", "alloy cpu", "torch cpu",
              "ratio", "matmul", "attn");
  for (const BenchCase& bench : cases) {
    for (int threads : options.thread_counts) bench_case(bench, threads, options);
  }
  std::printf("s: wall seconds per step, best step (median step); cpu: process CPU seconds per "
              "step, best, all threads (robust to other load at 1 thread);\nmatmul: share of "
              "Alloy's kernel CPU time in linear-layer GEMMs; attn: attention (its GEMMs plus "
              "softmax)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Idle OpenMP workers that spin (libgomp's default) steal the cores from the busy threads when
  // other users load the machine: 2-thread steps ran 2.5x slower than with passive waiting here.
  // libgomp reads OMP_WAIT_POLICY when it loads, hence the re-run; PyTorch inherits the setting.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    char path[4096];
    const ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
    if (length > 0) {
      path[length] = '\0';
      execv(path, argv);  // returns only on failure: then run on with the default policy
    }
  }
  try {
    return bench_main(argc, argv);
  } catch (const alloy::Error& error) {
    std::fprintf(stderr, "%s\n", error.format().c_str());
    return alloy::kExitBadInput;
  }
}
