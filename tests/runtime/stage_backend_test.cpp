// The backends' capability query: what each claims of a plan, answered from the plan alone (so
// a build without a GPU checks the CUDA backend's answers too), and the one-line refusal that
// names the stage, the feature, the backend and the plan field.
#include <gtest/gtest.h>

#include "runtime/stage_backend.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

// One stage of 4 blocks on dp devices, or two stages of 2 blocks each.
Plan plan_of(int stages, int dp) {
  Plan plan;
  plan.seq_len = 64;
  plan.global_batch_sequences = 8;
  plan.micro_batch_sequences = 8;
  plan.num_micro_batches = 1;
  const int per_stage = 4 / stages;
  for (int s = 0; s < stages; ++s) {
    PlanStage st;
    st.dp = dp;
    st.chunks = {{s * per_stage, (s + 1) * per_stage}};
    st.has_embedding = s == 0;
    st.has_head = s == stages - 1;
    st.offload.assign(static_cast<size_t>(per_stage), false);
    plan.stages.push_back(st);
  }
  return plan;
}

TEST(StageBackend, BothRunPipelinesWithEvenOrUnevenDataParallelismAndZeroOneOrTwo) {
  Plan zero_one = plan_of(2, 2);
  for (PlanStage& st : zero_one.stages) st.zero = 1;
  Plan zero_two = plan_of(2, 2);
  for (PlanStage& st : zero_two.stages) st.zero = 2;  // gradients kept in full
  Plan interleaved = plan_of(2, 1);
  interleaved.virtual_chunks = 2;
  interleaved.stages[0].chunks = {{0, 1}, {2, 3}};
  interleaved.stages[1].chunks = {{1, 2}, {3, 4}};
  interleaved.stages[0].has_head = false;
  Plan uneven = plan_of(1, 2);
  uneven.stages[0].replicas.resize(2);
  uneven.stages[0].replicas[0].sequences = 5;
  uneven.stages[0].replicas[1].sequences = 3;
  for (const char* backend : {"cpu", "cuda"}) {
    EXPECT_TRUE(stage_backend_supports(backend, uneven, 0).ok) << backend;
    EXPECT_TRUE(stage_backend_supports(backend, plan_of(1, 1), 0).ok) << backend;
    EXPECT_TRUE(stage_backend_supports(backend, plan_of(1, 4), 0).ok) << backend;
    EXPECT_NO_THROW(stage_backend_check_plan(backend, plan_of(1, 4), "plan.json")) << backend;
    for (const Plan& plan : {plan_of(2, 1), zero_one, zero_two, interleaved})
      EXPECT_NO_THROW(stage_backend_check_plan(backend, plan, "plan.json")) << backend;
  }
}

TEST(StageBackend, CudaClaimsOnlyWhatItRuns) {
  struct Case {
    const char* what;
    Plan plan;
    const char* feature;
    const char* field;
  };
  std::vector<Case> cases;
  Plan tp = plan_of(1, 1);
  tp.stages[0].tp = 2;
  cases.push_back({"tensor parallel", tp, "tensor parallelism (tp 2)", "stages[0].tp"});
  Plan zero = plan_of(1, 2);
  zero.stages[0].zero = 2;
  zero.stages[0].shard_gradients = true;
  cases.push_back({"sharded gradients", zero, "sharded gradients", "stages[0].shard_gradients"});
  zero.stages[0].zero = 3;
  zero.stages[0].shard_gradients = false;
  cases.push_back({"ZeRO 3", zero, "ZeRO stage 3", "stages[0].zero"});
  Plan offload = plan_of(1, 1);
  offload.stages[0].offload[1] = true;
  cases.push_back({"offload", offload, "weight offload to host memory", "stages[0].offload"});
  Plan parked = plan_of(1, 1);
  parked.stages[0].offload_activations = {false, true, false, false};
  cases.push_back({"activation offload", parked, "activation offload to host memory", "stages[0].offload_activations"});
  for (const Case& c : cases) {
    EXPECT_TRUE(stage_backend_supports("cpu", c.plan, 0).ok) << c.what;
    const StageSupport cuda = stage_backend_supports("cuda", c.plan, 0);
    EXPECT_FALSE(cuda.ok) << c.what;
    EXPECT_EQ(cuda.feature, c.feature) << c.what;
    EXPECT_EQ(cuda.field, c.field) << c.what;
    try {
      stage_backend_check_plan("cuda", c.plan, "plan.json");
      ADD_FAILURE() << c.what << ": expected a refusal";
    } catch (const Error& e) {
      const std::string text = e.format();
      EXPECT_NE(text.find(std::string("stage 0 asks for ") + c.feature + ", which the cuda backend does not run"),
                std::string::npos) << text;
      EXPECT_EQ(e.where().file, "plan.json");
      EXPECT_EQ(e.where().field, c.field);
      EXPECT_NE(text.find("--device cpu"), std::string::npos) << "the fix names the way out: " << text;
    }
  }
}

TEST(StageBackend, CpuOffloadsWeightsUnderDataParallelismButNotWithShardedGradients) {
  Plan plan = plan_of(1, 2);
  plan.stages[0].offload[0] = true;
  for (int zero = 0; zero <= 3; ++zero) {
    plan.stages[0].zero = zero;
    EXPECT_TRUE(stage_backend_supports("cpu", plan, 0).ok) << "zero " << zero;
  }
  plan.stages[0].shard_gradients = true;
  const StageSupport cpu = stage_backend_supports("cpu", plan, 0);
  EXPECT_FALSE(cpu.ok);
  EXPECT_EQ(cpu.field, "stages[0].shard_gradients");
  EXPECT_NE(cpu.reason.find("set shard_gradients to false"), std::string::npos) << cpu.reason;
}

TEST(StageBackend, APrecisionTheCudaBackendDoesNotComputeInIsNoted) {
  EXPECT_EQ(stage_backend_precision_note("cuda", Precision::Precision_bf16, "plan.json"), "");
  EXPECT_EQ(stage_backend_precision_note("cpu", Precision::Precision_fp8, "plan.json"), "");
  for (Precision p : {Precision::Precision_fp32, Precision::Precision_fp16, Precision::Precision_fp8}) {
    const std::string note = stage_backend_precision_note("cuda", p, "plan.json");
    EXPECT_NE(note.find(fmt::format("plan.json names {}", precision_name(p))), std::string::npos) << note;
    EXPECT_NE(note.find("precision: bf16"), std::string::npos) << note;
  }
}

TEST(StageBackend, UnknownBackendIsNamed) {
  const StageSupport rocm = stage_backend_supports("rocm", plan_of(1, 1), 0);
  EXPECT_FALSE(rocm.ok);
  EXPECT_NE(rocm.reason.find("cpu and cuda"), std::string::npos) << rocm.reason;
}

}  // namespace
}  // namespace alloy
