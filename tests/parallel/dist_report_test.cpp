// The end-of-run report's memory-by-term table, on made-up ranks: a row pair per rank up to 8
// ranks, and beyond, one per stage for the rank whose total is predicted worst.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "runtime/memory_terms.hpp"
#include "runtime/parallel/dist_report.hpp"

namespace alloy {
namespace {

using K = MemoryTermKind;

// `stages` stages of `dp` replicas each, every device predicted at 1 MiB of parameters and
// 3 MiB of activations (and 1 GiB of framework context, which no arena holds).
Plan report_plan(int stages, int dp) {
  Plan plan;
  plan.micro_batch_sequences = dp;
  plan.precision = Precision::Precision_fp32;
  for (int s = 0; s < stages; ++s) {
    PlanStage st;
    st.device_type = "cpu-fast";
    st.dp = dp;
    st.memory = {{"parameters", 1 << 20}, {"activations", 3 << 20}, {"framework_context", 1 << 30}};
    plan.stages.push_back(st);
  }
  return plan;
}

// Every rank measured at the prediction but rank `off`, which holds `extra` more activations.
TrainerResult report_result(const Plan& plan, int off, int64_t extra) {
  TrainerResult result;
  int rank = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s)
    for (int d = 0; d < plan.stages[s].dp; ++d, ++rank) {
      RankSummary r;
      r.rank = rank;
      r.stage = static_cast<int>(s);
      r.dp_rank = d;
      r.peak_term_bytes[static_cast<size_t>(K::MemoryTermKind_parameters)] = 1 << 20;
      r.peak_term_bytes[static_cast<size_t>(K::MemoryTermKind_activations)] = (3 << 20) + (rank == off ? extra : 0);
      r.peak_arena_bytes = 4.0 * (1 << 20) + (rank == off ? static_cast<double>(extra) : 0.0);
      result.ranks.push_back(r);
    }
  return result;
}

// The ranks of the table's measured rows, in order.
std::vector<int> measured_rows(const std::string& text) {
  std::vector<int> ranks;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string rank, stage, what;
    words >> rank >> stage >> what;
    if (what == "measured") ranks.push_back(std::stoi(rank));
  }
  return ranks;
}

TEST(DistReport, MemoryByTermHasARowPairPerRankUpToEight) {
  const Plan plan = report_plan(2, 4);
  const std::string text = dist_render_summary(report_result(plan, 5, 1 << 20), plan);
  EXPECT_EQ(measured_rows(text), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7})) << text;
  EXPECT_NE(text.find("optimizer state"), std::string::npos) << text;
  EXPECT_NE(text.find("+0.0%"), std::string::npos) << text;   // the ranks measured at the prediction
  EXPECT_NE(text.find("-20.0%"), std::string::npos) << text;  // rank 5: 4 MiB predicted, 5 MiB held
  EXPECT_EQ(text.find("GiB"), std::string::npos) << text;     // the framework context is no arena's
}

TEST(DistReport, MemoryByTermShowsEachStagesWorstRankBeyondEight) {
  const Plan plan = report_plan(2, 5);
  const std::string text = dist_render_summary(report_result(plan, 7, 1 << 20), plan);
  EXPECT_EQ(measured_rows(text), (std::vector<int>{0, 7})) << text;
  EXPECT_NE(text.find("per stage, its rank with the largest error"), std::string::npos) << text;
}

}  // namespace
}  // namespace alloy
