// Expert placement on unequal devices, measured with mpirun on emulated CPU devices: two ranks,
// one at full speed and one at half (a cluster file's `speed: 0.5`), run one Mixture-of-Experts
// model with its routed experts split over them (dp 2, ep 2). An even placement gives each rank
// half the experts; a placement-aware one gives the fast rank twice as many as the slow one. The
// same batches run under both, alternating, for --rounds rounds; the step times printed are
// medians over the steps after the first, and the gain is the median of each round's ratio.
// The runs dilate time by 2 (ALLOY_TIME_DILATION, unless set): each rank's compute then takes
// twice its CPU time and so needs half a core, which leaves the two ranks' progress threads and
// anything else on this 2-core machine room. Undilated, each rank needs a whole core, and the
// ratio swung between 0.69x and 2.81x in two runs on an idle machine; dilated it gave 1.37x
// and 1.28x, under the about 1.4x that the experts' share of the compute allows.
//   bench_expert_placement [--steps N] [--rounds R] [--keep]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "hw/catalog.hpp"
#include "mpi_bench_util.hpp"
#include "plan/plan.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"

namespace {

using alloy::bench::median;
using alloy::bench::run;

// Twelve experts of width 512, four per token, on a narrow model: the experts hold most of the
// compute, as in the large MoE models, so where they run sets the step time.
constexpr const char* kModelYaml = R"(name: bench-moe
family: llama
layers: 4
hidden_size: 64
heads: 4
kv_heads: 2
ffn_hidden_size: 256
vocab_size: 256
max_seq_len: 64
tied_embeddings: false
norm_eps: 1.0e-5
rope_theta: 10000
moe:
  experts: 12
  experts_per_token: 4
  expert_ffn_hidden_size: 512
  first_dense_layers: 0
  norm_topk_prob: true
  router_aux_loss_coef: 0.01
)";

constexpr const char* kClusterYaml = R"(name: fast-and-half
device_types:
  cpu-fast: {base: cpu, memory: 2GiB}
  cpu-half: {base: cpu, speed: 0.5, memory: 2GiB}
nodes:
  - {name: fast, count: 1, device: cpu-fast, devices_per_node: 1, host_memory: 8GiB}
  - {name: slow, count: 1, device: cpu-half, devices_per_node: 1, host_memory: 8GiB}
)";

constexpr int64_t kSeqLen = 32;
constexpr int64_t kGlobalBatch = 16;

// One stage over both devices: dp 2, ep 2, `experts_per_member` of the 12 experts on each.
alloy::Plan placement_plan(const alloy::ModelSpec& model, const alloy::ClusterSpec& cluster,
                           const std::vector<int>& experts_per_member) {
  alloy::Plan plan;
  plan.model_name = model.name;
  plan.model_fingerprint = alloy::model_fingerprint(model);
  plan.num_layers = static_cast<int>(model.num_layers);
  plan.cluster_name = cluster.name;
  plan.cluster_fingerprint = alloy::cluster_fingerprint(cluster);
  plan.num_devices = static_cast<int>(cluster.devices.size());
  plan.seq_len = kSeqLen;
  plan.global_batch_sequences = kGlobalBatch;
  plan.micro_batch_sequences = kGlobalBatch / 2;
  plan.num_micro_batches = 2;
  plan.schedule = alloy::Schedule::Schedule_1f1b;
  plan.virtual_chunks = 1;
  plan.precision = alloy::Precision::Precision_fp32;
  alloy::PlanStage st;
  st.device_type = "cpu-fast";
  st.dp = 2;
  st.ep = 2;
  st.experts_per_member = experts_per_member;
  st.device_ids = {0, 1};
  st.has_embedding = true;
  st.has_head = true;
  st.chunks.push_back({0, static_cast<int>(model.num_layers)});
  st.recompute.assign(static_cast<size_t>(model.num_layers), alloy::Recompute::Recompute_none);
  st.offload.assign(static_cast<size_t>(model.num_layers), false);
  st.memory_capacity_bytes = 2.0 * 1024 * 1024 * 1024;
  // One replica on each device type, half of each micro-batch each.
  for (const char* type : {"cpu-fast", "cpu-half"}) {
    alloy::PlanReplica replica;
    replica.device_type = type;
    replica.sequences = plan.micro_batch_sequences / 2;
    st.replicas.push_back(replica);
  }
  plan.stages.push_back(st);
  return plan;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 8, rounds = 3;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--keep") == 0) keep = true;
  }
  alloy::bench::mpi_environment_set();
  setenv("ALLOY_TIME_DILATION", "2", 0);  // mpirun passes it to the local ranks
  const std::string alloy_binary = alloy::bench::alloy_next_to_self();
  char tmpl[] = "/tmp/alloy-expert-placement-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/bench-moe.yaml") << kModelYaml;
  std::ofstream(dir + "/cluster.yaml") << kClusterYaml;
  std::ofstream(dir + "/train.yaml") << fmt::format(
      "seq_len: {}\nglobal_batch: {}\nprecision: fp32\noptimizer: adamw\nsteps: 100\nlearning_rate: 1.0e-3\n"
      "warmup_steps: 2\nseed: 1234\n", kSeqLen, kGlobalBatch);
  if (run(fmt::format("{} tokenize {}/examples/data/fsf_licenses.txt -o {}/data.bin > {}/tokenize.out 2>&1",
                      alloy_binary, ALLOY_SOURCE_DIR, dir, dir)) != 0) {
    std::fprintf(stderr, "alloy tokenize failed (%s/tokenize.out)\n", dir.c_str());
    return 1;
  }
  const alloy::ModelSpec model = alloy::model_load(dir + "/bench-moe.yaml");
  const alloy::ClusterSpec cluster = alloy::cluster_load(dir + "/cluster.yaml", alloy::catalog_builtin());
  struct Placement {
    std::string name;
    std::vector<int> experts_per_member;
    std::vector<double> step_seconds;  // per round
  };
  std::vector<Placement> placements = {{"even (6 + 6 experts)", {6, 6}, {}},
                                       {"placement-aware (8 + 4)", {8, 4}, {}}};
  for (size_t p = 0; p < placements.size(); ++p)
    alloy::plan_save(placement_plan(model, cluster, placements[p].experts_per_member), fmt::format("{}/plan-{}.json", dir, p));
  for (int round = 0; round < rounds; ++round) {
    for (size_t p = 0; p < placements.size(); ++p) {
      const std::string prefix = fmt::format("{}/run-{}-{}", dir, p, round);
      const int code = run(fmt::format("{} {} train --plan {}/plan-{}.json --cluster {}/cluster.yaml --model "
                                       "{}/bench-moe.yaml --data {}/data.bin --train {}/train.yaml --steps {} "
                                       "--no-progress --log {}.jsonl > {}.out 2>&1",
                                       alloy::bench::mpirun(2), alloy_binary, dir, p, dir, dir, dir, dir, steps, prefix,
                                       prefix));
      if (code != 0) {
        std::printf("%s failed:\n%s", placements[p].name.c_str(), alloy::bench::errors_in(prefix + ".out").c_str());
        return 1;
      }
      placements[p].step_seconds.push_back(alloy::bench::run_result_read(prefix + ".jsonl").step_seconds);
    }
  }
  std::vector<double> gains;
  for (int round = 0; round < rounds; ++round)
    gains.push_back(placements[0].step_seconds[static_cast<size_t>(round)] / placements[1].step_seconds[static_cast<size_t>(round)]);
  std::printf("MoE %s on 2 CPU ranks, one at half speed: dp 2, ep 2, %d steps x %d rounds\n", model.name.c_str(), steps,
              rounds);
  std::printf("  %-26s %12s\n", "placement", "step time");
  for (const Placement& p : placements) std::printf("  %-26s %10.1f ms\n", p.name.c_str(), 1e3 * median(p.step_seconds));
  std::printf("  placement-aware / even: %.2fx faster (median of the rounds' ratios)\n", median(gains));
  if (!keep) std::filesystem::remove_all(dir);
  else std::printf("  files kept in %s\n", dir.c_str());
  return 0;
}
