// Host memory of offloaded blocks at run time against the cost model: each offloading rank's host
// arena peak (its offloaded blocks' weights, gradients and AdamW moments, as the runtime lays them
// out) must be within a few percent of the plan's host_offload term, for dense blocks and for MoE
// blocks under expert parallelism, with the moments whole (ZeRO 0) and sharded (ZeRO 2 and 3).
#include <gtest/gtest.h>

#include "moe_dist_fixture.hpp"
#include "runtime/parallel/dist_report.hpp"

namespace alloy::testing {
namespace {

// The 64-byte rounding of the arena's buffers is all that should separate the two.
constexpr double kHostTolerance = 0.02;

class HostMemoryTest : public MoeDistFixture {
 protected:
  // `plan` (of the model at model_path_) with `blocks` of stage 0 offloaded.
  static Plan offloading(Plan plan, const std::vector<bool>& blocks) {
    plan.stages[0].offload = blocks;
    plan.stages[0].offload_prefetch_depth = 1;
    return plan;
  }

  // Trains `plan`, priced by the cost model, for two steps; expects every offloading rank's host
  // arena peak of the last step within kHostTolerance of its replica's predicted host_offload
  // bytes, and the end-of-run table that sets them side by side.
  static void expect_host_peak_as_predicted(Plan plan, const std::string& name) {
    plan_evaluate(&plan, CostModel(moe(), cluster(), train_load(dir_->path() + "/dist-train.yaml")));
    const std::string log = dir_->path() + "/" + name + ".jsonl";
    const CommandResult r = run_command(train_command(plan, name, 2, "--log " + log), 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const size_t table = r.output.find("host memory of the offloading ranks");
    ASSERT_NE(table, std::string::npos) << r.output;
    std::printf("%s: %s", name.c_str(), r.output.substr(table).c_str());
    std::istringstream in(read_text(log));
    std::string line, last;
    while (std::getline(in, line)) last = line;
    const nlohmann::json ranks = nlohmann::json::parse(last).at("ranks");
    const std::vector<RankInfo> map = plan_rank_map(plan);
    ASSERT_EQ(ranks.size(), map.size());
    int checked = 0;
    for (size_t rank = 0; rank < map.size(); ++rank) {
      const PlanStage& st = plan.stages[static_cast<size_t>(map[rank].stage)];
      if (!flags_any(st.offload)) continue;
      const double predicted = dist_predicted_host_bytes(st.replica(plan.micro_batch_sequences, map[rank].dp_rank).memory);
      const double measured = ranks[rank].at("peak_host_arena_bytes").get<double>();
      std::printf("%-22s rank %zu host peak: measured %.0f bytes, predicted %.0f, %+.2f%%\n", name.c_str(), rank,
                  measured, predicted, 100.0 * (predicted / measured - 1.0));
      ASSERT_GT(measured, 0) << name << " rank " << rank;
      EXPECT_NEAR(predicted / measured, 1.0, kHostTolerance) << name << " rank " << rank;
      ++checked;
    }
    EXPECT_GT(checked, 0) << name;
  }
};

// gpt-6 on one stage of two replicas, blocks 1-3 offloaded: the moments whole on each member
// (ZeRO 0), then a member's pieces of them (ZeRO 2, gradients accumulated in full).
TEST_F(HostMemoryTest, DenseOffloadedBlocksHostPeakMatchesThePrediction) {
  model_path_ = dir_->write("gpt-6.yaml", kGpt6Yaml);
  const std::vector<bool> blocks = {false, true, true, true, false, false};
  expect_host_peak_as_predicted(offloading(moe_plan({{1, 2, 0, {6}}}, 2, 1), blocks), "dense-dp2-zero0");
  expect_host_peak_as_predicted(offloading(moe_plan({{1, 2, 2, {6}}}, 2, 1), blocks), "dense-dp2-zero2");
  model_path_ = tiny_moe_path();
}

// tiny-moe's two MoE blocks (1 and 2) offloaded under ep 2: each member holds its own experts in
// host memory, their moments whole (dp 2, ZeRO 0) or shared with the member holding the same ones
// (dp 4, ZeRO 2; ZeRO 3 with block 1 offloaded and block 2 gathered). Then the leading dense block
// offloaded with the first MoE block: each in host memory at its own size.
TEST_F(HostMemoryTest, MoeOffloadedBlocksUnderExpertParallelismHostPeakMatchesThePrediction) {
  expect_host_peak_as_predicted(offloading(moe_plan({{1, 2, 0, {3}}}, 2, 2), {false, true, true}), "moe-dp2-ep2-zero0");
  expect_host_peak_as_predicted(offloading(moe_plan({{1, 2, 0, {3}}}, 2, 2), {true, true, false}), "moe-dense-dp2-ep2-zero0");
  expect_host_peak_as_predicted(offloading(moe_plan({{1, 4, 2, {3}}}, 2, 2), {false, true, true}), "moe-dp4-ep2-zero2");
  expect_host_peak_as_predicted(offloading(moe_plan({{1, 4, 3, {3}}}, 2, 2), {false, true, false}), "moe-dp4-ep2-zero3");
}

}  // namespace
}  // namespace alloy::testing
