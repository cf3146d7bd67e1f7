// Plan: JSON round trip, validation with errors that name stage and field, identity checks
// against model and cluster, the rank map and the text rendering.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "../support/specs.hpp"
#include "plan/plan.hpp"
#include "search/planner.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

// Two stages of 2 x 2 devices on one 8-device node, 4 layers.
Plan two_stage_plan() {
  Plan p;
  p.model_name = "toy";
  p.model_fingerprint = "f";
  p.num_layers = 4;
  p.cluster_name = "node";
  p.cluster_fingerprint = "c";
  p.num_devices = 8;
  p.seq_len = 128;
  p.global_batch_sequences = 8;
  p.micro_batch_sequences = 2;
  p.num_micro_batches = 4;
  for (int s = 0; s < 2; ++s) {
    PlanStage st;
    st.device_type = "a100-80";
    st.device_ids = {4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3};
    st.tp = 2;
    st.dp = 2;
    st.chunks = {{2 * s, 2 * s + 2}};
    st.has_embedding = s == 0;
    st.has_head = s == 1;
    st.recompute = {Recompute::Recompute_none, Recompute::Recompute_full};
    st.offload = {false, true};
    p.stages.push_back(st);
  }
  return p;
}

void expect_error(const Plan& p, const std::string& field, const std::string& words) {
  try {
    plan_validate(p, "plan.json");
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, field);
    EXPECT_EQ(e.where().file, "plan.json");
    EXPECT_NE(e.message().find(words), std::string::npos) << e.message();
  }
}

TEST(Plan, ValidPlanPasses) { EXPECT_NO_THROW(plan_validate(two_stage_plan())); }

TEST(Plan, ValidationNamesStageAndField) {
  Plan p = two_stage_plan();
  p.stages[1].chunks[0] = {3, 5};
  expect_error(p, "stages[1].chunks[0]", "layer 2");
  p = two_stage_plan();
  p.num_layers = 5;
  expect_error(p, "stages", "model has 5");
  p = two_stage_plan();
  p.stages[1].device_ids[0] = 1;
  expect_error(p, "stages[1].device_ids", "already used by stage 0");
  p = two_stage_plan();
  p.stages[0].dp = 3;
  expect_error(p, "stages[0].device_ids", "tp x dp");
  p = two_stage_plan();
  p.stages[1].recompute.pop_back();
  expect_error(p, "stages[1].recompute", "2 blocks");
  p = two_stage_plan();
  p.num_micro_batches = 3;
  expect_error(p, "global_batch_sequences", "micro_batch_sequences x num_micro_batches");
  p = two_stage_plan();
  p.micro_batch_sequences = 1;
  p.num_micro_batches = 8;
  expect_error(p, "stages[0].dp", "does not split");
  p = two_stage_plan();
  p.stages[0].zero = 4;
  expect_error(p, "stages[0].zero", "ZeRO");
  p = two_stage_plan();
  p.version = 99;
  expect_error(p, "version", "unsupported");
  p = two_stage_plan();
  p.stages[0].device_ids[3] = 8;
  expect_error(p, "stages[0].device_ids", "outside the cluster");
}

TEST(Plan, JsonRoundTripKeepsEverything) {
  Plan p = two_stage_plan();
  p.stages[0].memory = {{"parameters", 1e9}, {"activations", 2e9}};
  p.runner_ups.push_back({"pp 1", 2.0, 100, "slower"});
  p.step_seconds = 1.5;
  const std::string text = plan_to_json(p);
  EXPECT_NE(text.find("\"version\": 1"), std::string::npos);
  const Plan q = plan_from_json(text, "rt.json");
  EXPECT_EQ(plan_to_json(q), text);
  EXPECT_EQ(q.stages[1].recompute[1], Recompute::Recompute_full);
  EXPECT_TRUE(q.stages[1].offload[1]);
  EXPECT_EQ(q.stages[0].memory[1].name, "activations");
  EXPECT_EQ(q.runner_ups.at(0).reason, "slower");

  const std::string path = ::testing::TempDir() + "/plan_rt.json";
  plan_save(p, path);
  EXPECT_EQ(plan_to_json(plan_load(path)), text);
  std::remove(path.c_str());
}

TEST(Plan, JsonKeepsTheInputsItWasMadeFor) {
  Plan p = two_stage_plan();
  EXPECT_EQ(plan_to_json(p).find("\"inputs\""), std::string::npos) << "a plan without inputs writes none";
  p.inputs = {"name: m\nfamily: gpt2\n", "name: c\nnodes: []\n", "seq_len: 8\n"};
  const Plan q = plan_from_json(plan_to_json(p), "in.json");
  EXPECT_EQ(q.inputs.model, p.inputs.model);
  EXPECT_EQ(q.inputs.cluster, p.inputs.cluster);
  EXPECT_EQ(q.inputs.train, p.inputs.train);
  std::string partial = plan_to_json(p);
  partial.replace(partial.find("\"train\": \"seq_len"), 7, "\"trains\"");
  try {
    plan_from_json(partial, "in.json");
    FAIL() << "inputs without the training setup";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "inputs.train");
  }
}

TEST(Plan, JsonErrorsNameTheField) {
  const std::string good = plan_to_json(two_stage_plan());
  std::string bad = good;
  bad.replace(bad.find("\"1f1b\""), 6, "\"zigzag\"");
  try {
    plan_from_json(bad, "p.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "schedule");
  }
  bad = good;
  bad.replace(bad.find("\"tp\": 2"), 7, "\"tp\": \"two\"");
  try {
    plan_from_json(bad, "p.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "stages[0].tp");
  }
  EXPECT_THROW(plan_from_json("[1, 2]", "p.json"), Error);
  EXPECT_THROW(plan_from_json("{", "p.json"), Error);
  EXPECT_THROW(plan_load("/nonexistent/plan.json"), Error);
}

// Fields of the wrong type, null, out of range or past 64 bits: an error naming the field, never
// a JSON library exception or a wrapped number.
TEST(Plan, JsonNumbersAreCheckedNotConverted) {
  Plan p = two_stage_plan();
  p.stages[0].offload_exposed_seconds = 0.5;
  p.runner_ups.push_back({"pp 1", 2.0, 100, "slower"});
  const std::string good = plan_to_json(p);
  struct Case {
    const char* from;
    const char* to;
    const char* field;
  };
  const Case cases[] = {
      {"\"seq_len\": 128", "\"seq_len\": -1", "seq_len"},
      {"\"seq_len\": 128", "\"seq_len\": 18446744073709551616", "seq_len"},
      {"\"seq_len\": 128", "\"seq_len\": 18446744073709551615", "seq_len"},
      {"\"seq_len\": 128", "\"seq_len\": 128.5", "seq_len"},
      {"\"seq_len\": 128", "\"seq_len\": null", "seq_len"},
      {"\"num_micro_batches\": 4", "\"num_micro_batches\": 4294967300", "num_micro_batches"},
      {"\"device_ids\": [\n        0", "\"device_ids\": [\n        -7", "stages[0].device_ids[0]"},
      {"\"offload_exposed_seconds\": 0.5", "\"offload_exposed_seconds\": \"soon\"", "stages[0].predicted.offload_exposed_seconds"},
      {"\"offload_exposed_seconds\": 0.5", "\"offload_exposed_seconds\": null", "stages[0].predicted.offload_exposed_seconds"},
      {"\"price_per_million_tokens\": 0.0", "\"price_per_million_tokens\": \"x\"", "predicted.price_per_million_tokens"},
      {"\"reason\": \"slower\"", "\"reason\": 7", "predicted.runner_ups[0].reason"},
      {"\"seq_len\": 128", "\"seq_len\": 128, \"seq_len\": 256", "seq_len"},
  };
  for (const Case& c : cases) {
    std::string bad = good;
    const size_t at = bad.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    bad.replace(at, std::string(c.from).size(), c.to);
    try {
      plan_from_json(bad, "p.json");
      ADD_FAILURE() << "accepted " << c.to;
    } catch (const Error& e) {
      EXPECT_EQ(e.where().field, c.field) << c.to << ": " << e.format();
      EXPECT_EQ(e.where().file, "p.json");
    }
  }
  std::string runner_ups_number = good;
  runner_ups_number.replace(runner_ups_number.find("\"runner_ups\": ["), 15, "\"runner_ups\": 3, \"x\": [");
  EXPECT_THROW(plan_from_json(runner_ups_number, "p.json"), Error);
  EXPECT_THROW(plan_from_json("{\"version\": 1e999}", "p.json"), Error);
}

// two_stage_plan interleaved over 5 layers: stage 0's chunks hold 2 and 1, stage 1's 1 and 1.
Plan unequal_chunks_plan() {
  Plan p = two_stage_plan();
  p.num_layers = 5;
  p.schedule = Schedule::Schedule_interleaved;
  p.virtual_chunks = 2;
  p.stages[0].chunks = {{0, 2}, {3, 4}};
  p.stages[1].chunks = {{2, 3}, {4, 5}};
  p.stages[0].recompute.assign(3, Recompute::Recompute_none);
  p.stages[0].offload.assign(3, false);
  return p;
}

TEST(Plan, InterleavedChunksMayDifferInSizeButNotBeEmpty) {
  EXPECT_NO_THROW(plan_validate(unequal_chunks_plan()));
  Plan p = unequal_chunks_plan();
  p.num_layers = 4;
  p.stages[1].chunks[1] = {4, 4};
  expect_error(p, "stages[1].chunks[1]", "empty layer range [4, 4)");
  // The same read from a file: the error names the file and the chunk.
  try {
    plan_from_json(plan_to_json(p), "plan.json");
    ADD_FAILURE() << "no error for an empty chunk";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().file, "plan.json");
    EXPECT_EQ(e.where().field, "stages[1].chunks[1]");
  }
}

// Stage 1 of two_stage_plan split unevenly: replica 0 takes 3 of each 4 sequences in two passes.
// (A single-stage plan: pieces need one stage.)
Plan uneven_plan() {
  Plan p = two_stage_plan();
  p.stages.pop_back();
  p.stages[0].chunks = {{0, 4}};
  p.stages[0].has_head = true;
  p.stages[0].recompute.assign(4, Recompute::Recompute_none);
  p.stages[0].offload.assign(4, false);
  p.micro_batch_sequences = 4;
  p.num_micro_batches = 2;
  PlanReplica a, b;
  a.device_type = b.device_type = "a100-80";
  a.sequences = 3;
  a.pieces = 2;
  a.memory = {{"activations", 5e8}};
  a.forward_seconds = 0.25;
  b.sequences = 1;
  p.stages[0].replicas = {a, b};
  return p;
}

TEST(Plan, UnevenReplicasRoundTripAndSplitTheMicroBatch) {
  const Plan p = uneven_plan();
  EXPECT_NO_THROW(plan_validate(p));
  const std::string text = plan_to_json(p);
  const Plan q = plan_from_json(text, "uneven.json");
  EXPECT_EQ(plan_to_json(q), text);
  ASSERT_EQ(q.stages[0].replicas.size(), 2u);
  EXPECT_EQ(q.stages[0].replicas[0].pieces, 2);
  EXPECT_EQ(q.stages[0].replicas[0].memory.at(0).bytes, 5e8);
  EXPECT_EQ(q.stages[0].replica_sequences(4, 1), 1);
  EXPECT_EQ(q.stages[0].replica_offset(4, 1), 3);
  EXPECT_EQ(q.stages[0].replicas[0].piece_sequences(0), 2);
  EXPECT_EQ(q.stages[0].replicas[0].piece_sequences(1), 1);
  EXPECT_DOUBLE_EQ(q.stages[0].replica(4, 0).forward_seconds, 0.25);
  // Even stages answer the same questions from dp.
  const Plan even = two_stage_plan();
  EXPECT_EQ(even.stages[0].replica_sequences(2, 1), 1);
  EXPECT_EQ(even.stages[0].replica_offset(2, 1), 1);
  EXPECT_EQ(even.stages[0].replica(2, 1).device_type, "a100-80");
}

TEST(Plan, ZeroPiecesFollowTheReplicasShares) {
  // Shares 3 and 1 of 4 sequences: 10 floats split 7 and 3 (boundary at floor(10 * 3 / 4)),
  // pieces that tile the range whatever its size, even sizes past 2^63 / 4.
  const Plan uneven_shares = uneven_plan();
  const PlanStage& uneven = uneven_shares.stages[0];
  EXPECT_EQ(uneven.zero_piece(4, 10, 0), (std::pair<int64_t, int64_t>{0, 7}));
  EXPECT_EQ(uneven.zero_piece(4, 10, 1), (std::pair<int64_t, int64_t>{7, 10}));
  EXPECT_DOUBLE_EQ(uneven.zero_share(4, 0), 0.75);
  const int64_t huge = (int64_t{1} << 62) + 3;
  EXPECT_EQ(uneven.zero_piece(4, huge, 0).second, uneven.zero_piece(4, huge, 1).first);
  EXPECT_EQ(uneven.zero_piece(4, huge, 1).second, huge);
  EXPECT_EQ(uneven.zero_piece(4, huge, 0).second, huge / 4 * 3 + 2);
  // Even replicas: the first count % dp pieces take one float more.
  const Plan even_shares = two_stage_plan();
  const PlanStage& even = even_shares.stages[0];
  ASSERT_EQ(even.dp, 2);
  EXPECT_EQ(even.zero_piece(2, 5, 0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(even.zero_piece(2, 5, 1), (std::pair<int64_t, int64_t>{3, 5}));
  EXPECT_DOUBLE_EQ(even.zero_share(2, 1), 0.5);
  // Three replicas (shares 5, 2, 1 of 8) over fewer floats than sequences: pieces may be empty,
  // and they still tile the range.
  Plan three = uneven_plan();
  three.stages[0].dp = 3;
  const PlanReplica copy = three.stages[0].replicas[1];
  three.stages[0].replicas.resize(3, copy);
  three.stages[0].replicas[0].sequences = 5;
  three.stages[0].replicas[1].sequences = 2;
  three.stages[0].replicas[2].sequences = 1;
  const PlanStage& st = three.stages[0];
  EXPECT_EQ(st.zero_piece(8, 3, 0), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(st.zero_piece(8, 3, 1), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_EQ(st.zero_piece(8, 3, 2), (std::pair<int64_t, int64_t>{2, 3}));
  EXPECT_EQ(st.zero_piece(8, 1, 1), (std::pair<int64_t, int64_t>{0, 0})) << "an empty piece";
  EXPECT_EQ(st.zero_piece(8, 1, 2), (std::pair<int64_t, int64_t>{0, 1}));
}

TEST(Plan, UnevenReplicasThatDoNotAddUpAreRefused) {
  Plan p = uneven_plan();
  p.stages[0].replicas[1].sequences = 2;
  expect_error(p, "stages[0].replicas", "sum to 5");
  p = uneven_plan();
  p.stages[0].replicas.pop_back();
  expect_error(p, "stages[0].replicas", "1 entries for dp 2");
  p = uneven_plan();
  p.stages[0].replicas[1].sequences = 0;
  p.stages[0].replicas[0].sequences = 4;
  expect_error(p, "stages[0].replicas[1].sequences", "at least one sequence");
  p = uneven_plan();
  p.stages[0].replicas[0].pieces = 4;
  expect_error(p, "stages[0].replicas[0].pieces", "1 to 3");
  p = uneven_plan();
  p.stages[0].zero = 3;
  expect_error(p, "stages[0].replicas[0].pieces", "without ZeRO-3");
  p = uneven_plan();
  p.stages[0].replicas[0].device_type = "v100-32";
  expect_error(p, "stages[0].device_type", "replica 0");
  // Without replicas, the micro-batch must divide over dp.
  p = uneven_plan();
  p.micro_batch_sequences = 3;
  p.global_batch_sequences = 6;
  p.stages[0].replicas.clear();
  expect_error(p, "stages[0].dp", "does not split over dp 2");
}

// The plan text with `from` replaced by `to` fails to load, naming `field`.
void expect_json_error(std::string text, const std::string& from, const std::string& to, const std::string& field) {
  text.replace(text.find(from), from.size(), to);
  try {
    plan_from_json(text, "p.json");
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, field);
  }
}

TEST(Plan, UnevenReplicasJsonErrorsNameTheField) {
  const std::string good = plan_to_json(uneven_plan());
  expect_json_error(good, "\"replicas\": [", "\"replicas\": 3, \"x\": [", "stages[0].replicas");
  expect_json_error(good, "\"sequences\": 3", "\"sequences\": \"3\"", "stages[0].replicas[0].sequences");
}

TEST(Plan, RankMapIsTensorFastestThenData) {
  const Plan p = two_stage_plan();
  const std::vector<RankInfo> ranks = plan_rank_map(p);
  ASSERT_EQ(ranks.size(), 8u);
  EXPECT_EQ(ranks[1].tp_rank, 1);
  EXPECT_EQ(ranks[1].dp_rank, 0);
  EXPECT_EQ(ranks[2].tp_rank, 0);
  EXPECT_EQ(ranks[2].dp_rank, 1);
  EXPECT_EQ(ranks[5].stage, 1);
  EXPECT_EQ(plan_tp_group(p, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(plan_dp_group(p, 5), (std::vector<int>{5, 7}));
}

TEST(Plan, RefusesAnotherModelOrCluster) {
  const ModelSpec model = testing::llama("toy", 4, 256, 4, 4, 768, 512);
  const ClusterSpec cluster = testing::cluster("node", {testing::a100_80()}, {{0, 1, 8}});
  Plan p = two_stage_plan();
  p.model_fingerprint = model_fingerprint(model);
  p.cluster_fingerprint = cluster_fingerprint(cluster);
  EXPECT_NO_THROW(plan_validate_for(p, model, cluster));

  ModelSpec other = model;
  other.hidden_size = 512;
  try {
    plan_validate_for(p, other, cluster);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "model_fingerprint");
  }
  const ClusterSpec two_nodes = testing::cluster("two", {testing::a100_80()}, {{0, 2, 4}});
  EXPECT_THROW(plan_validate_for(p, model, two_nodes), Error);
  // On 4-device nodes a tp group {3, 4} would span two nodes.
  Plan straddle = p;
  straddle.cluster_fingerprint = cluster_fingerprint(two_nodes);
  straddle.stages[0].device_ids = {1, 2, 3, 4};
  straddle.stages[1].device_ids = {0, 5, 6, 7};
  try {
    plan_validate_for(straddle, model, two_nodes);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("spans nodes"), std::string::npos);
  }
}

TEST(Plan, RenderShowsStagesMemoryAndRunnerUps) {
  const ModelSpec model = testing::llama("toy", 4, 256, 4, 4, 768, 512);
  const ClusterSpec cluster = testing::cluster("node", {testing::a100_80(), testing::v100_32()}, {{0, 1, 4}, {1, 1, 4}});
  const TrainSpec train = testing::train(256, 16);
  CostModel cost(model, cluster, train);
  const SearchResult r = plan_search(cost, {});
  const std::string text = plan_render_text(r.plan);
  EXPECT_NE(text.find("tokens/s"), std::string::npos);
  EXPECT_NE(text.find("MFU"), std::string::npos);
  EXPECT_NE(text.find("activations"), std::string::npos);
  EXPECT_NE(text.find("framework_context"), std::string::npos);
  EXPECT_NE(text.find("Runner-ups"), std::string::npos);
  EXPECT_EQ(r.plan.runner_ups.size(), 3u);
  for (const RunnerUp& ru : r.plan.runner_ups) {
    EXPECT_NE(ru.reason.find('%'), std::string::npos) << ru.reason;
    EXPECT_GE(ru.step_seconds * r.plan.tokens_per_second, 0);
  }
  // A saved plan explains the same way after a round trip.
  EXPECT_EQ(plan_render_text(plan_from_json(plan_to_json(r.plan))), text);
}

}  // namespace
}  // namespace alloy
