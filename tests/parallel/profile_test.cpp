// `alloy profile` on this machine: every shape the planner asks about is measured, emulated
// slower device types get proportionally longer times, collectives appear under mpirun, and
// `alloy plan --profile` uses the measurements.
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/format.h>

#include "../common/test_util.hpp"
#include "cost/profile.hpp"
#include "dist_plans.hpp"
#include "plan/plan.hpp"

namespace alloy::testing {
namespace {

constexpr const char* kTwoSpeeds = R"(name: two-speeds
device_types:
  cpu-a: {base: cpu, memory: 2GiB}
  cpu-b: {base: cpu, speed: 0.5, memory: 1GiB}
nodes:
  - {name: a, count: 1, device: cpu-a, devices_per_node: 1, host_memory: 4GiB}
  - {name: b, count: 1, device: cpu-b, devices_per_node: 1, host_memory: 4GiB}
)";

constexpr const char* kSmallBatch = R"(seq_len: 16
global_batch: 2
precision: fp32
steps: 10
)";

class ProfileCommandTest : public ::testing::Test {
 protected:
  void SetUp() override { mpi_test_environment_set(); }

  // `alloy profile` of tiny-gpt over `ranks` ranks of `cluster` under mpirun, written to `out`.
  CommandResult profile_under_mpirun(int ranks, const std::string& cluster, const std::string& out) {
    const std::string train = dir_.write("train.yaml", kSmallBatch);
    return run_command(fmt::format("mpirun -np {} {} profile --model tiny-gpt --cluster {} --train {} -o {} --repeats 1",
                                   ranks, ALLOY_BINARY, cluster, train, out),
                       180);
  }

  TempDir dir_;
};

TEST_F(ProfileCommandTest, MeasuresEveryShapeAndScalesBySpeed) {
  const std::string cluster = dir_.write("two.yaml", kTwoSpeeds);
  const std::string train = dir_.write("train.yaml", kSmallBatch);
  // A link between the node groups that `alloy comm-check --write-profile` put there before: kept.
  const std::string out = dir_.write("profile.json", R"({"version": 1, "links": [
      {"from": "a", "to": "b", "bandwidth_bytes_per_second": 1e8, "latency_seconds": 1e-4}]})");
  CommandResult r = run_command(fmt::format("{} profile --model tiny-gpt --cluster {} --train {} -o {} --repeats 1",
                                            ALLOY_BINARY, cluster, train, out), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("collectives: not measured"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kept the 1 link between node groups"), std::string::npos) << r.output;
  const Profile p = profile_load(out);
  ASSERT_EQ(p.links.size(), 1u);
  EXPECT_DOUBLE_EQ(p.links[0].bandwidth_bytes_per_second, 1e8);
  EXPECT_EQ(p.model_name, "tiny-gpt");
  ASSERT_EQ(p.device_types.size(), 2u);
  for (const LayerKind kind : {LayerKind::LayerKind_embedding, LayerKind::LayerKind_block, LayerKind::LayerKind_head})
    for (int micro_batch : {1, 2}) {
      const ProfiledLayer* a = p.find_layer("cpu-a", kind, micro_batch, 16, 1, false);
      const ProfiledLayer* b = p.find_layer("cpu-b", kind, micro_batch, 16, 1, false);
      ASSERT_NE(a, nullptr) << layer_kind_name(kind) << " mb " << micro_batch;
      ASSERT_NE(b, nullptr);
      EXPECT_GT(a->forward_seconds, 0);
      EXPECT_NEAR(b->forward_seconds, 2 * a->forward_seconds, 1e-12) << "speed 0.5 doubles the measured time";
      EXPECT_NEAR(b->backward_seconds, 2 * a->backward_seconds, 1e-12);
    }

  // The planner reads it: no block shape of this batch falls back to the analytic model.
  CommandResult plan = run_command(fmt::format("{} plan --model tiny-gpt --cluster {} --train {} --profile {} --no-offload",
                                               ALLOY_BINARY, cluster, train, out), 60);
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_EQ(plan.output.find("block micro-batch"), std::string::npos) << plan.output;
}

TEST_F(ProfileCommandTest, MeasuresCollectivesUnderMpirun) {
  const std::string out = dir_.path() + "/profile.json";
  CommandResult r = profile_under_mpirun(2, "local-cpu-2", out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Profile p = profile_load(out);
  for (const CollectiveOp op : {CollectiveOp::CollectiveOp_all_reduce, CollectiveOp::CollectiveOp_all_gather,
                                CollectiveOp::CollectiveOp_reduce_scatter}) {
    const ProfiledCollective* c = p.find_collective("cpu", op, 2, false);
    ASSERT_NE(c, nullptr) << collective_op_name(op);
    EXPECT_GT(c->bandwidth_bytes_per_second, 1e6) << collective_op_name(op);
    EXPECT_GE(c->latency_seconds, 0);
  }
  EXPECT_NE(p.find_layer("cpu", LayerKind::LayerKind_block, 2, 16, 2, true), nullptr) << "tp 2 with sequence parallelism";
  // Point-to-point in a node, timed by ping-pong; the planner's links then follow it.
  const std::vector<ProfiledLink>& links = p.device_types.at("cpu").point_to_point;
  ASSERT_EQ(links.size(), 1u);
  EXPECT_FALSE(links[0].spans_nodes);
  EXPECT_GT(links[0].bandwidth_bytes_per_second, 1e6);
  EXPECT_GE(links[0].latency_seconds, 0);
  const Link fallback{"shm", 1.0, 1.0};
  const Link measured = p.point_to_point_link("cpu", false, fallback);
  EXPECT_EQ(measured.bandwidth_bytes_per_second, links[0].bandwidth_bytes_per_second);
  EXPECT_EQ(measured.latency_seconds, links[0].latency_seconds);
  EXPECT_EQ(p.point_to_point_link("cpu", true, fallback).bandwidth_bytes_per_second, 1.0) << "none measured across nodes";
  EXPECT_NE(r.output.find("point-to-point"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("in a node"), std::string::npos) << r.output;
}

// Three unequal ranks (speeds 1, 0.5 and 0.25): the groups of 2 and the ping-pong leave a rank
// out, which must still meet every measurement's end, and every type gets both group sizes.
TEST_F(ProfileCommandTest, ProfilesThreeUnequalRanks) {
  const std::string out = dir_.path() + "/profile.json";
  CommandResult r = profile_under_mpirun(3, "local-cpu-3", out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Profile p = profile_load(out);
  ASSERT_EQ(p.device_types.size(), 3u);
  for (const auto& [type, profiled] : p.device_types) {
    for (int ranks : {2, 3}) {
      const ProfiledCollective* c = p.find_collective(type, CollectiveOp::CollectiveOp_all_reduce, ranks, false);
      ASSERT_NE(c, nullptr) << type << " over " << ranks;
      ASSERT_FALSE(c->samples.empty());
      EXPECT_GT(c->samples.front().seconds, 0) << type << " over " << ranks;
    }
    ASSERT_FALSE(profiled.point_to_point.empty()) << type;
    EXPECT_GT(profiled.point_to_point[0].bandwidth_bytes_per_second, 1e6) << type;
  }
}

// Two device types equal on paper; rank 1 runs at a tenth of the speed its type claims. After
// profiling, the planner gives that type fewer layers than it does from the cluster file alone.
TEST_F(ProfileCommandTest, PlannerFollowsMeasurementOfASlowerDevice) {
  const std::string cluster = dir_.write("equal.yaml", R"(name: equal-on-paper
device_types:
  cpu-a: {base: cpu, memory: 2GiB}
  cpu-b: {base: cpu, memory: 2GiB}
nodes:
  - {name: a, count: 1, device: cpu-a, devices_per_node: 1, host_memory: 4GiB}
  - {name: b, count: 1, device: cpu-b, devices_per_node: 1, host_memory: 4GiB}
)");
  const std::string model = dir_.write("gpt-6.yaml", kGpt6Yaml);
  const std::string train = dir_.write("train.yaml", kSmallBatch);
  const std::string out = dir_.path() + "/profile.json";
  const std::string args = fmt::format("profile --model {} --cluster {} --train {} -o {} --repeats 3", model, cluster, train, out);
  // A tenth of the speed, measured rank by rank (dilation above 1), so that other tests running
  // at the same time cannot blur the difference.
  CommandResult r = run_command(fmt::format("env ALLOY_TIME_DILATION=2 mpirun -np 1 {} {} : -np 1 env ALLOY_DEVICE_SPEED=0.1 "
                                            "{} {}",
                                            ALLOY_BINARY, args, ALLOY_BINARY, args),
                                120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Profile p = profile_load(out);
  const ProfiledLayer* a = p.find_layer("cpu-a", LayerKind::LayerKind_block, 2, 16, 1, false);
  const ProfiledLayer* b = p.find_layer("cpu-b", LayerKind::LayerKind_block, 2, 16, 1, false);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_GT(b->forward_seconds + b->backward_seconds, 2 * (a->forward_seconds + a->backward_seconds));

  auto layers_on_b = [&](const std::string& extra) {
    const std::string plan_path = dir_.path() + "/plan.json";
    CommandResult plan = run_command(fmt::format("{} plan --model {} --cluster {} --train {} --pp 2 --tp 1 --dp 1 "
                                                 "--no-offload -o {} {}",
                                                 ALLOY_BINARY, model, cluster, train, plan_path, extra), 60);
    EXPECT_EQ(plan.exit_code, 0) << plan.output;
    for (const PlanStage& st : plan_load(plan_path).stages)
      if (st.device_type == "cpu-b") return st.num_blocks();
    return -1;
  };
  const int on_paper = layers_on_b("");
  const int measured = layers_on_b("--profile " + out);
  EXPECT_EQ(on_paper, 3);
  EXPECT_GE(measured, 1);
  EXPECT_LT(measured, on_paper);
}

// A run of a plan made with a profile writes that profile back with each device type's times
// scaled by measured over predicted: one factor per layer kind for all of its shapes.
TEST_F(ProfileCommandTest, TrainingRunCalibratesTheProfile) {
  const std::string train = dir_.write("train.yaml", kSmallBatch);
  const std::string data = dir_.path() + "/data.bin";
  ASSERT_EQ(run_command(fmt::format("{} tokenize {}/examples/data/fsf_licenses.txt -o {}", ALLOY_BINARY, ALLOY_SOURCE_DIR,
                                    data)).exit_code, 0);
  const std::string profile = dir_.path() + "/profile.json", plan = dir_.path() + "/plan.json";
  const std::string calibrated = dir_.path() + "/calibrated.json";
  ASSERT_EQ(profile_under_mpirun(2, "local-cpu-2", profile).exit_code, 0);
  ASSERT_EQ(run_command(fmt::format("{} plan --model tiny-gpt --cluster local-cpu-2 --train {} --profile {} --pp 2 --no-offload -o {}",
                                    ALLOY_BINARY, train, profile, plan)).exit_code, 0);
  CommandResult r = run_command(fmt::format("mpirun -np 2 {} train --plan {} --model tiny-gpt --data {} --train {} --steps 4 "
                                            "--no-progress --profile {} --calibrated-profile {}",
                                            ALLOY_BINARY, plan, data, train, profile, calibrated), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("measured / predicted on cpu"), std::string::npos) << r.output;
  const Profile before = profile_load(profile), after = profile_load(calibrated);
  const DeviceProfile& b = before.device_types.at("cpu");
  const DeviceProfile& a = after.device_types.at("cpu");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  // The pp-2 plan ran every kind (the embedding on stage 0, the head on stage 1): the run names
  // each kind, with its factor or as too brief for one (how brief depends on this machine's load),
  // and every shape of a kind moved by one factor.
  for (const char* kind : {"embedding ", "blocks ", "head "})
    EXPECT_NE(r.output.find(kind), std::string::npos) << kind << r.output;
  std::array<double, kLayerKinds> factor = {0, 0, 0};
  for (size_t i = 0; i < a.layers.size(); ++i) {
    double& f = factor[static_cast<size_t>(a.layers[i].kind)];
    if (f == 0) f = a.layers[i].forward_seconds / b.layers[i].forward_seconds;
    EXPECT_NEAR(a.layers[i].forward_seconds, b.layers[i].forward_seconds * f, 1e-9 + 1e-9 * f);
    EXPECT_NEAR(a.layers[i].backward_seconds, b.layers[i].backward_seconds * f, 1e-9 + 1e-9 * f);
  }
  // The factors themselves depend on how busy this machine was while profiling and while training
  // (ctest runs other MPI jobs beside both): only that each is a real, positive number is fixed.
  for (double f : factor) {
    EXPECT_GT(f, 0.0);
    EXPECT_TRUE(std::isfinite(f));
  }
  EXPECT_GT(a.optimizer_seconds_per_parameter, 0);
  // The stages all-reduce the tied embedding's gradients and the world the gradient norm: the
  // run times them, and every collective of the profile moves by that one measured factor.
  EXPECT_NE(r.output.find("collectives "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all_reduce over 2 "), std::string::npos) << r.output;
  ASSERT_EQ(a.collectives.size(), b.collectives.size());
  ASSERT_FALSE(a.collectives.empty());
  const double moved = a.collectives[0].samples.back().seconds / b.collectives[0].samples.back().seconds;
  EXPECT_GT(moved, 0.0);
  EXPECT_TRUE(std::isfinite(moved));
  for (size_t i = 0; i < a.collectives.size(); ++i)
    for (size_t k = 0; k < a.collectives[i].samples.size(); ++k)
      EXPECT_NEAR(a.collectives[i].samples[k].seconds, moved * b.collectives[i].samples[k].seconds,
                  1e-9 * b.collectives[i].samples[k].seconds);

  // Without the profile to correct, the option is refused before any work.
  CommandResult refused = run_command(fmt::format("{} train --plan {} --model tiny-gpt --data {} --calibrated-profile {}",
                                                  ALLOY_BINARY, plan, data, calibrated));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--profile"), std::string::npos) << refused.output;
}

TEST_F(ProfileCommandTest, BadInputIsNamed) {
  CommandResult r = run_command(fmt::format("{} profile --model no-such-model --cluster local-cpu-2", ALLOY_BINARY));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no-such-model"), std::string::npos) << r.output;
  // Malformed emulation settings name the variable and the range it takes.
  for (const char* setting : {"ALLOY_DEVICE_SPEED=fast", "ALLOY_DEVICE_SPEED=2", "ALLOY_TIME_DILATION=0.5"}) {
    CommandResult bad = run_command(fmt::format("env {} {} profile --model tiny-gpt --cluster local-cpu-2 -o {}/p.json",
                                                setting, ALLOY_BINARY, dir_.path()));
    EXPECT_EQ(bad.exit_code, 2) << setting << "\n" << bad.output;
    const std::string name = std::string(setting).substr(0, std::string(setting).find('='));
    EXPECT_NE(bad.output.find(name), std::string::npos) << bad.output;
    EXPECT_NE(bad.output.find("fix:"), std::string::npos) << bad.output;
  }
  // Counts below one name the option.
  for (const char* option : {"--repeats", "--rounds"}) {
    CommandResult bad = run_command(fmt::format("{} profile --model tiny-gpt --cluster local-cpu-2 {} 0 -o {}/p.json",
                                                ALLOY_BINARY, option, dir_.path()));
    EXPECT_EQ(bad.exit_code, 2) << option << "\n" << bad.output;
    EXPECT_NE(bad.output.find(option), std::string::npos) << bad.output;
    EXPECT_NE(bad.output.find("fix:"), std::string::npos) << bad.output;
  }
}

}  // namespace
}  // namespace alloy::testing
