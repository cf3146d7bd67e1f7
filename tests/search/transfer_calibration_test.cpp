// Fitting the time per stage-boundary transfer that makes a calibrated profile predict its run.
#include "search/transfer_calibration.hpp"

#include <gtest/gtest.h>

#include "../support/specs.hpp"
#include "search/planner.hpp"

namespace alloy {
namespace {

struct Fixture {
  ModelSpec model = testing::llama("toy-8", 8, 1024, 8, 8, 2816, 8000);
  ClusterSpec cluster = testing::cluster("a100x4", {testing::a100_80()}, {{0, 1, 4}});
  TrainSpec train = testing::train(1024, 32);
  Profile profile;  // an entry for the cluster's type, without measurements: the analytic model
  Fixture() {
    profile.model_name = model.name;
    profile.device_types["a100-80"] = DeviceProfile{};
  }
  Plan plan(int pp) const {
    const CostModel cost(model, cluster, train, &profile);
    SearchOptions o;
    o.pp = pp;
    o.tp = 1;
    return plan_search(cost, o).plan;
  }
  double predicted(const Plan& p, const Profile& with) const {
    const CostModel cost(model, cluster, train, &with);
    Plan q = p;
    plan_evaluate(&q, cost);
    return q.step_seconds;
  }
};

TEST(TransferCalibration, FitsThePerTransferTimeThatPredictsTheMeasuredStep) {
  const Fixture f;
  const Plan pipeline = f.plan(4);
  ASSERT_EQ(pipeline.stages.size(), 4u);
  const double model_step = f.predicted(pipeline, f.profile);
  const double measured = 1.2 * model_step;
  const std::optional<TransferCalibration> c =
      transfer_calibration_fit(pipeline, f.model, f.cluster, f.train, f.profile, measured);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->device_types, std::vector<std::string>{"a100-80"});
  EXPECT_NEAR(c->model_step_seconds, model_step, 1e-12 * model_step);
  EXPECT_GT(c->extra_seconds, 0);
  Profile calibrated = f.profile;
  transfer_calibration_apply(&calibrated, *c);
  EXPECT_DOUBLE_EQ(calibrated.boundary_transfer_seconds("a100-80"), c->extra_seconds);
  EXPECT_NEAR(f.predicted(pipeline, calibrated), measured, 0.01 * measured);
  // It survives the profile's file format.
  EXPECT_DOUBLE_EQ(profile_parse(profile_to_json(calibrated), "p.json").boundary_transfer_seconds("a100-80"),
                   c->extra_seconds);
  EXPECT_NE(transfer_calibration_describe(*c).find("1.20x"), std::string::npos) << transfer_calibration_describe(*c);
  // The plan's shape, not the command line's defaults, sets what the run measured.
  TrainSpec defaults = f.train;
  defaults.seq_len = 64;
  defaults.global_batch_sequences = 4;
  const std::optional<TransferCalibration> same =
      transfer_calibration_fit(pipeline, f.model, f.cluster, defaults, f.profile, measured);
  ASSERT_TRUE(same.has_value());
  EXPECT_DOUBLE_EQ(same->model_step_seconds, c->model_step_seconds);
  EXPECT_DOUBLE_EQ(same->extra_seconds, c->extra_seconds);
}

TEST(TransferCalibration, NeverGoesBelowTheLinkModelAndNeedsABoundary) {
  const Fixture f;
  const Plan pipeline = f.plan(2);
  Profile previous = f.profile;
  previous.device_types["a100-80"].boundary_transfer_seconds = 0.5;  // an older calibration's
  const double link_only = f.predicted(pipeline, f.profile);
  const std::optional<TransferCalibration> faster =
      transfer_calibration_fit(pipeline, f.model, f.cluster, f.train, previous, 0.9 * link_only);
  ASSERT_TRUE(faster.has_value());
  EXPECT_EQ(faster->extra_seconds, 0) << "a run faster than the link model keeps the link model";
  EXPECT_NEAR(faster->model_step_seconds, link_only, 1e-12 * link_only) << "fitted afresh, not on top of the old";
  EXPECT_FALSE(transfer_calibration_fit(f.plan(1), f.model, f.cluster, f.train, f.profile, 1.0).has_value())
      << "one stage has no boundaries";
  Profile other;
  other.model_name = f.model.name;
  other.device_types["h100"] = DeviceProfile{};
  EXPECT_FALSE(transfer_calibration_fit(pipeline, f.model, f.cluster, f.train, other, 1.0).has_value())
      << "none of the plan's types is in the profile";
}

TEST(TransferCalibration, ABadTransferTimeInAProfileIsNamed) {
  const std::string text =
      R"({"version": 1, "model": "m", "device_types": {"cpu": {"boundary_transfer_seconds": -1}}})";
  try {
    profile_parse(text, "bad.json");
    FAIL() << "a negative time was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device_types.cpu.boundary_transfer_seconds"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace alloy
