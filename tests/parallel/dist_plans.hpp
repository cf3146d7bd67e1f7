// Plans for the distributed-runtime tests: small GPT-2 and LLaMA models on a one-node CPU
// cluster, stage shapes given directly, devices taken in order.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/test_util.hpp"
#include "plan/plan.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"

namespace alloy::testing {

// A six-block GPT-2 model with tied embeddings and a four-block LLaMA model with grouped-query
// attention; both small enough for 20 steps on 8 oversubscribed ranks in seconds.
inline const char* kGpt6Yaml = R"(name: gpt-6
family: gpt2
layers: 6
hidden_size: 32
heads: 4
ffn_hidden_size: 128
vocab_size: 256
max_seq_len: 64
tied_embeddings: true
norm_eps: 1.0e-5
)";

inline const char* kLlama4Yaml = R"(name: llama-4
family: llama
layers: 4
hidden_size: 32
heads: 4
kv_heads: 2
ffn_hidden_size: 96
vocab_size: 256
max_seq_len: 64
tied_embeddings: false
norm_eps: 1.0e-5
rope_theta: 10000
)";

inline const char* kCpu8Yaml = R"(name: local-cpu-8
device_types:
  cpu-fast: {base: cpu, memory: 2GiB}
nodes:
  - {name: host, count: 1, device: cpu-fast, devices_per_node: 8, host_memory: 16GiB}
)";

struct TestStage {
  int tp = 1;
  int dp = 1;
  int zero = 0;
  std::vector<int> chunk_blocks;           // blocks per virtual chunk (one entry unless interleaved)
  std::vector<Recompute> recompute = {};   // per block of the stage; empty: none
  bool sequence_parallel = false;
};

// What every distributed test suite starts with: mpirun allowed here, one thread per rank, and
// the shipped text as a byte-level token file in `dir`. Returns its path ("" if tokenizing failed).
inline std::string dist_test_setup(const TempDir& dir) {
  mpi_test_environment_set();
  setenv("ALLOY_THREADS", "1", 0);
  // examples/train/tiny-cpu.yaml at the test plans' sequence length and batch (kTestSeqLen,
  // kTestGlobalBatch): a training file given beside a plan must agree with it.
  dir.write("dist-train.yaml", "seq_len: 32\nglobal_batch: 8\nprecision: fp32\noptimizer: adamw\nsteps: 200\n"
                               "learning_rate: 1.0e-3\nmin_learning_rate: 1.0e-4\nwarmup_steps: 10\n"
                               "weight_decay: 0.1\ngrad_clip: 1.0\nseed: 1234\n");
  const std::string data = dir.path() + "/data.bin";
  const CommandResult r = run_command(std::string(ALLOY_BINARY) + " tokenize " + ALLOY_SOURCE_DIR +
                                      "/examples/data/fsf_licenses.txt -o " + data);
  return r.exit_code == 0 ? data : "";
}

// A suite of 4-rank runs of gpt-6 on the eight-device CPU cluster: the files are written once per
// suite (`Suite` gives each suite its own). Suites that need more call SetUpTestSuite first.
template <class Suite>
class DistGptSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    gpt_path_ = dir_->write("gpt-6.yaml", kGpt6Yaml);
    cluster_path_ = dir_->write("local-cpu-8.yaml", kCpu8Yaml);
    data_ = dist_test_setup(*dir_);
    ASSERT_FALSE(data_.empty()) << "alloy tokenize failed";
  }
  static void TearDownTestSuite() { delete dir_; }

  static inline TempDir* dir_ = nullptr;
  static inline std::string gpt_path_, cluster_path_, data_;
};

inline constexpr int64_t kTestSeqLen = 32;
inline constexpr int64_t kTestGlobalBatch = 8;

// Chunks are laid out in pipeline order: chunk 0 of every stage, then chunk 1, ...
inline Plan test_plan(const ModelSpec& model, const ClusterSpec& cluster, const std::vector<TestStage>& stages,
                      Schedule schedule, int micro_batches) {
  Plan plan;
  plan.model_name = model.name;
  plan.model_fingerprint = model_fingerprint(model);
  plan.num_layers = static_cast<int>(model.num_layers);
  plan.cluster_name = cluster.name;
  plan.cluster_fingerprint = cluster_fingerprint(cluster);
  plan.num_devices = static_cast<int>(cluster.devices.size());
  plan.seq_len = kTestSeqLen;
  plan.global_batch_sequences = kTestGlobalBatch;
  plan.micro_batch_sequences = kTestGlobalBatch / micro_batches;
  plan.num_micro_batches = micro_batches;
  plan.schedule = schedule;
  plan.virtual_chunks = static_cast<int>(stages.front().chunk_blocks.size());
  plan.precision = Precision::Precision_fp32;
  int device = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    PlanStage st;
    st.device_type = "cpu-fast";
    st.tp = stages[s].tp;
    st.dp = stages[s].dp;
    st.zero = stages[s].zero;
    st.sequence_parallel = stages[s].sequence_parallel;
    for (int i = 0; i < st.tp * st.dp; ++i) st.device_ids.push_back(device++);
    st.has_embedding = s == 0;
    st.has_head = s + 1 == stages.size();
    plan.stages.push_back(st);
  }
  int layer = 0;
  for (int c = 0; c < plan.virtual_chunks; ++c)
    for (size_t s = 0; s < stages.size(); ++s) {
      plan.stages[s].chunks.push_back({layer, layer + stages[s].chunk_blocks[c]});
      layer += stages[s].chunk_blocks[c];
    }
  for (size_t s = 0; s < stages.size(); ++s) {
    PlanStage& st = plan.stages[s];
    st.recompute = stages[s].recompute;
    st.recompute.resize(static_cast<size_t>(st.num_blocks()), Recompute::Recompute_none);
    st.offload.assign(static_cast<size_t>(st.num_blocks()), false);
    st.memory_capacity_bytes = 2.0 * 1024 * 1024 * 1024;
  }
  return plan;
}

// Uneven data parallelism on stage `s`: replica r takes shares[r] sequences of each micro-batch,
// in pieces[r] passes (empty: one each).
inline Plan with_uneven_replicas(Plan plan, size_t s, const std::vector<int64_t>& shares,
                                 const std::vector<int>& pieces = {}) {
  PlanStage& st = plan.stages[s];
  st.replicas.clear();
  for (size_t r = 0; r < shares.size(); ++r) {
    PlanReplica replica;
    replica.device_type = st.device_type;
    replica.sequences = shares[r];
    replica.pieces = pieces.empty() ? 1 : pieces[r];
    st.replicas.push_back(replica);
  }
  return plan;
}

}  // namespace alloy::testing
