// A profile's links between node groups: read and written back unchanged, refused with one clear
// error per bad field, merged into an existing profile without losing any of it, and priced by
// the cost model in place of the cluster file's figures on the paths between those groups.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../support/specs.hpp"
#include "cost/cost_model.hpp"
#include "cost/network_paths.hpp"
#include "cost/profile.hpp"
#include "spec/error.hpp"
#include "spec/topology.hpp"

namespace alloy {
namespace {

// Two groups of two one-device nodes ("group0", "group1") on one 1 GB/s, 10 us network.
ClusterSpec links_cluster() { return testing::cluster("two-groups", {testing::a100_80()}, {{0, 2, 1}, {0, 2, 1}}, 1e9, 10e-6); }

Profile links_profile(const std::string& links_json) {
  return profile_parse(R"({"version": 1, "links": )" + links_json + "}", "links.json");
}

Error parse_error(const std::string& text) {
  try {
    profile_parse(text, "bad.json");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected alloy::Error for:\n" << text;
  return Error("none");
}

TEST(ProfileLinks, WrittenLinksReadBackUnchanged) {
  Profile p;
  p.model_name = "small-gpt";
  p.device_types["cpu"].layers.push_back({LayerKind::LayerKind_block, 2, 64, 1, false, 0.01, 0.02});
  p.links.push_back({"east", "west", 3.5e6, 2.5e-3, 1048576});
  p.links.push_back({"west", "east", 4.5e6, 1.5e-3, 0});
  p.links.push_back({"east", "east", 9e7, 1e-4, 4096});
  const Profile back = profile_parse(profile_to_json(p), "round.json");
  ASSERT_EQ(back.links.size(), 3u);
  for (size_t i = 0; i < p.links.size(); ++i) {
    EXPECT_EQ(back.links[i].from_group, p.links[i].from_group);
    EXPECT_EQ(back.links[i].to_group, p.links[i].to_group);
    EXPECT_DOUBLE_EQ(back.links[i].bandwidth_bytes_per_second, p.links[i].bandwidth_bytes_per_second);
    EXPECT_DOUBLE_EQ(back.links[i].latency_seconds, p.links[i].latency_seconds);
    EXPECT_DOUBLE_EQ(back.links[i].message_bytes, p.links[i].message_bytes);
  }
  EXPECT_EQ(profile_to_json(back), profile_to_json(p));
  EXPECT_EQ(back.device_types.at("cpu").layers.size(), 1u);
}

TEST(ProfileLinks, ProfileOfLinksAloneNeedsNoModelOrDeviceTypes) {
  const Profile p = links_profile(R"([{"from": "a", "to": "b", "bandwidth_bytes_per_second": 1e6, "latency_seconds": 0.001}])");
  EXPECT_TRUE(p.model_name.empty());
  EXPECT_TRUE(p.device_types.empty());
  ASSERT_EQ(p.links.size(), 1u);
  EXPECT_EQ(profile_parse(profile_to_json(p), "again.json").links.size(), 1u);
}

TEST(ProfileLinks, BadFieldsAreNamed) {
  const std::string good_rest = R"("bandwidth_bytes_per_second": 1e6, "latency_seconds": 0.001)";
  for (const auto& [links, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"from": "a"})", "links"},
           {R"([{"to": "b", )" + good_rest + "}]", "links[0]"},
           {R"([{"from": "", "to": "b", )" + good_rest + "}]", "links[0].from"},
           {R"([{"from": "a", "to": 3, )" + good_rest + "}]", "links[0].to"},
           {R"([{"from": "a", "to": "b", "bandwidth_bytes_per_second": -5, "latency_seconds": 0}])",
            "links[0].bandwidth_bytes_per_second"},
           {R"([{"from": "a", "to": "b", "bandwidth_bytes_per_second": 1000, "latency_seconds": 0}])",
            "links[0].bandwidth_bytes_per_second"},
           {R"([{"from": "a", "to": "b", "bandwidth_bytes_per_second": 1e6, "latency_seconds": 30}])",
            "links[0].latency_seconds"},
           {R"([{"from": "a", "to": "b", "bandwidth_bytes_per_second": 1e6}])", "links[0]"},
           {R"([{"from": "a", "to": "b", )" + good_rest + R"(, "message_bytes": 0}])", "links[0].message_bytes"},
           {R"([{"from": "a", "to": "b", )" + good_rest + R"(}, {"from": "a", "to": "b", )" + good_rest + "}]",
            "links[1]"}}) {
    const Error e = parse_error(R"({"version": 1, "links": )" + links + "}");
    EXPECT_EQ(e.where().file, "bad.json") << links;
    EXPECT_EQ(e.where().field, field) << links << "\n" << e.format();
  }
  // A link slower than 1 Mb/s is a unit typo, said so.
  const Error slow = parse_error(R"({"version": 1, "links": [{"from": "a", "to": "b", "bandwidth_bytes_per_second": 1000,
                                     "latency_seconds": 0}]})");
  EXPECT_NE(slow.message().find("slower than 1 Mb/s"), std::string::npos) << slow.format();
  // Layer times without the model they hold for.
  const Error no_model = parse_error(R"({"version": 1, "device_types": {"cpu": {"layers": [{"layer": "block",
      "micro_batch": 1, "seq_len": 64, "tp": 1, "forward_seconds": 0.1, "backward_seconds": 0.2}]}}})");
  EXPECT_EQ(no_model.where().field, "model") << no_model.format();
}

TEST(ProfileLinks, UnknownNodeGroupIsOneErrorNamingTheGroupsThatExist) {
  const Profile p = links_profile(R"([{"from": "group0", "to": "group1", "bandwidth_bytes_per_second": 1e6, "latency_seconds": 0},
      {"from": "group0", "to": "gpu-rack", "bandwidth_bytes_per_second": 1e6, "latency_seconds": 0}])");
  try {
    profile_apply_links(p, links_cluster());
    FAIL() << "a link to a group the cluster lacks was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().file, "links.json");
    EXPECT_EQ(e.where().field, "links[1].to");
    EXPECT_NE(e.message().find("'gpu-rack' is not in cluster two-groups (its node groups: group0, group1)"), std::string::npos)
        << e.format();
  }
  // The cost model refuses it the same way.
  EXPECT_THROW(CostModel(testing::llama2_7b(), links_cluster(), testing::train(4096, 8), &p), Error);
}

TEST(ProfileLinks, MergeReplacesTheSamePairsAndKeepsEverythingElse) {
  const std::string existing = R"({"version": 1, "model": "small-gpt", "comment": "kept as written",
    "device_types": {"cpu": {"optimizer_seconds_per_parameter": 2e-9,
                             "collectives": [{"op": "all_reduce", "group_size": 2, "placement": "intra_node",
                                              "bandwidth_bytes_per_second": 1e9, "latency_seconds": 1e-5}]}},
    "links": [{"from": "east", "to": "west", "bandwidth_bytes_per_second": 1e6, "latency_seconds": 0.01},
              {"from": "west", "to": "east", "bandwidth_bytes_per_second": 2e6, "latency_seconds": 0.01},
              {"from": "north", "to": "north", "bandwidth_bytes_per_second": 5e6, "latency_seconds": 0.002}]})";
  const std::string merged =
      profile_merge_links(existing, "old.json", {{"west", "east", 7e6, 3e-3, 1048576}, {"east", "east", 8e7, 2e-4, 1048576}});
  const nlohmann::json root = nlohmann::json::parse(merged);
  EXPECT_EQ(root.at("comment"), "kept as written");
  const Profile p = profile_parse(merged, "merged.json");
  EXPECT_EQ(p.model_name, "small-gpt");
  EXPECT_DOUBLE_EQ(p.device_types.at("cpu").optimizer_seconds_per_parameter, 2e-9);
  EXPECT_EQ(p.device_types.at("cpu").collectives.size(), 1u);
  // Both directions of east - west were replaced by the one new measurement; north kept.
  ASSERT_EQ(p.links.size(), 3u);
  EXPECT_EQ(p.links[0].from_group, "north");
  EXPECT_DOUBLE_EQ(p.links[1].bandwidth_bytes_per_second, 7e6);
  EXPECT_EQ(p.links[2].to_group, "east");
  EXPECT_DOUBLE_EQ(p.links[2].message_bytes, 1048576);
  // A file that is not a profile is refused before anything is replaced.
  EXPECT_THROW(profile_merge_links(R"({"version": 1, "links": 5})", "broken.json", {}), Error);
}

TEST(ProfileLinks, MeasuredLinkReplacesTheFilesFiguresOnItsPathsOnly) {
  // group0 - group1 measured at 10 MB/s, 2 ms: 100x slower than the file's 1 GB/s.
  const Profile p = links_profile(
      R"([{"from": "group0", "to": "group1", "bandwidth_bytes_per_second": 1e7, "latency_seconds": 0.002}])");
  const ClusterSpec measured = profile_apply_links(p, links_cluster());
  EXPECT_FALSE(topology_is_flat(measured));
  const HopLinks across = topology_hops(measured, {{1, 2}}).front();
  EXPECT_TRUE(across.measured);
  EXPECT_DOUBLE_EQ(across.nic.bandwidth_bytes_per_second, 1e7);
  EXPECT_DOUBLE_EQ(across.nic.latency_seconds, 0.002);
  const HopLinks back = topology_hops(measured, {{3, 0}}).front();  // the other way: the same link
  EXPECT_TRUE(back.measured);
  EXPECT_DOUBLE_EQ(back.nic.bandwidth_bytes_per_second, 1e7);
  const HopLinks inside = topology_hops(measured, {{0, 1}}).front();  // two nodes of group0: the file's
  EXPECT_FALSE(inside.measured);
  EXPECT_DOUBLE_EQ(inside.nic.bandwidth_bytes_per_second, 1e9);
}

TEST(ProfileLinks, TenTimesSlowerLinkBetweenGroupsSlowsWhatCrossesIt) {
  const ModelSpec model = testing::llama2_7b();
  const TrainSpec train = testing::train(4096, 8);
  const ClusterSpec cluster = links_cluster();
  const Profile slower = links_profile(
      R"([{"from": "group0", "to": "group1", "bandwidth_bytes_per_second": 1e8, "latency_seconds": 1e-4}])");
  const CostModel file(model, cluster, train);
  const CostModel measured(model, cluster, train, &slower);

  // A pipeline boundary group0 -> group1: 10x the bandwidth term; one inside group0 unchanged.
  const double bytes = 64e6;
  const double file_across = boundary_seconds(bytes, file.boundary_link({1}, {2}));
  const double measured_across = boundary_seconds(bytes, measured.boundary_link({1}, {2}));
  EXPECT_NEAR(measured_across, 1e-4 + bytes / 1e8, 1e-9);
  EXPECT_NEAR(file_across, 10e-6 + bytes / 1e9, 1e-9);
  EXPECT_DOUBLE_EQ(boundary_seconds(bytes, measured.boundary_link({0}, {1})), boundary_seconds(bytes, file.boundary_link({0}, {1})));

  // A data-parallel reduction over all four nodes crosses the slow link; one inside a group does not.
  const StageShape dp4_file = file.stage_shape({0, 1, 2, 3}, 1, 4, 1);
  const StageShape dp4_measured = measured.stage_shape({0, 1, 2, 3}, 1, 4, 1);
  EXPECT_TRUE(dp4_measured.dp_group.crosses_measured_link);
  StageChoice one;
  one.blocks = 1;
  const double sync_file = file.stage_gradient_sync_seconds(dp4_file, file.unit_costs(dp4_file, false), one);
  const double sync_measured =
      measured.stage_gradient_sync_seconds(dp4_measured, measured.unit_costs(dp4_measured, false), one);
  // Not the full 10x: the two-level reduction (inside each group, then across) sends only half
  // the gradients over the slow link.
  EXPECT_GT(sync_measured, 3 * sync_file) << sync_file << " s on the file's links, " << sync_measured << " s measured";
  const StageShape dp2_measured = measured.stage_shape({0, 1}, 1, 2, 1);
  const StageShape dp2_file = file.stage_shape({0, 1}, 1, 2, 1);
  EXPECT_FALSE(dp2_measured.dp_group.crosses_measured_link);
  EXPECT_DOUBLE_EQ(measured.stage_gradient_sync_seconds(dp2_measured, measured.unit_costs(dp2_measured, false), one),
                   file.stage_gradient_sync_seconds(dp2_file, file.unit_costs(dp2_file, false), one));
}

TEST(ProfileLinks, GroupLinkWinsOverTheTypesMeasuredCollectivesAndTransfers) {
  // The profile also holds the type's collectives and point-to-point link, timed on paths it
  // does not name: where a group crosses the measured link, the link prices it.
  const Profile p = profile_parse(R"({"version": 1, "model": "llama-2-7b", "device_types": {"a100-80": {
      "collectives": [{"op": "all_reduce", "group_size": 4, "placement": "inter_node",
                       "bandwidth_bytes_per_second": 1e12, "latency_seconds": 1e-6}],
      "point_to_point": [{"placement": "inter_node", "bandwidth_bytes_per_second": 1e12, "latency_seconds": 1e-6}]}},
    "links": [{"from": "group0", "to": "group1", "bandwidth_bytes_per_second": 1e8, "latency_seconds": 1e-4}]})",
                                  "both.json");
  const CostModel measured(testing::llama2_7b(), links_cluster(), testing::train(4096, 8), &p);
  const double across = boundary_seconds(64e6, measured.boundary_link({1}, {2}));
  EXPECT_NEAR(across, 1e-4 + 64e6 / 1e8, 1e-9);
  // Inside group0 (no measured link there) the type's transfer latency and the file's NIC.
  EXPECT_NEAR(boundary_seconds(64e6, measured.boundary_link({0}, {1})), 1e-6 + 64e6 / 1e9, 1e-9);
  const StageShape dp4 = measured.stage_shape({0, 1, 2, 3}, 1, 4, 1);
  StageChoice one;
  one.blocks = 1;
  const double bucket_bytes = 4.0 * block_parameters(testing::llama2_7b());
  // At 1 TB/s the profile's all-reduce would take ~ bucket / 1e12; over 100 MB/s hops far longer.
  EXPECT_GT(measured.stage_gradient_sync_seconds(dp4, measured.unit_costs(dp4, false), one), 100 * bucket_bytes / 1e12);
}

}  // namespace
}  // namespace alloy
