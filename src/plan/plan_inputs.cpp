// Plans that carry their model, cluster and training setup, and the checks on what a user
// passes beside them.
#include "plan/plan_inputs.hpp"

#include <fmt/format.h>

#include "spec/error.hpp"
#include "spec/field_reader.hpp"

namespace alloy {

namespace {

// "plan.json: inputs.model": where an input kept in a plan is named in errors.
std::string input_origin(const std::string& source, const char* input) {
  return fmt::format("{} (inputs.{})", source, input);
}

// What makes `given` another model than the plan's, beyond the architecture its fingerprint
// covers: "" when none.
std::string model_difference(const ModelSpec& given, const Plan& plan, const std::string& source) {
  if (!plan.model_fingerprint.empty() && model_fingerprint(given) != plan.model_fingerprint)
    return "the architectures differ";
  if (plan.inputs.model.empty()) return "";
  const ModelSpec own = model_load_text(plan.inputs.model, input_origin(source, "model"));
  if (given.norm_eps != own.norm_eps) return fmt::format("norm_eps {} against {}", given.norm_eps, own.norm_eps);
  if (given.rope_theta != own.rope_theta && given.family == ModelFamily::ModelFamily_llama)
    return fmt::format("rope_theta {} against {}", given.rope_theta, own.rope_theta);
  return "";
}

}  // namespace

void plan_set_inputs(Plan* plan, const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train) {
  plan->inputs.model = model_to_yaml(model);
  plan->inputs.cluster = cluster.source_text;
  plan->inputs.train = train_to_yaml(train);
}

ModelSpec plan_model(const Plan& plan, const std::string& given, const std::string& source) {
  if (given.empty()) {
    if (plan.inputs.model.empty()) return model_load(plan.model_name);
    ModelSpec model = model_load_text(plan.inputs.model, input_origin(source, "model"));
    model.source_path.clear();
    return model;
  }
  ModelSpec model = model_load(given);
  const std::string difference = model_difference(model, plan, source);
  if (!difference.empty()) {
    throw Error(fmt::format("--model {} is not the model the plan was made for ('{}': {})", given, plan.model_name,
                            difference),
                {source, "model"},
                plan.inputs.model.empty() ? "pass the plan's model, or re-run `alloy plan` for this one"
                                          : "drop --model: the plan carries its own; or re-run `alloy plan` for this one");
  }
  return model;
}

ClusterSpec plan_cluster(const Plan& plan, const std::string& given, const DeviceCatalog& catalog,
                         const std::string& source) {
  if (given.empty()) {
    if (plan.inputs.cluster.empty()) return cluster_load(plan.cluster_name, catalog);
    return cluster_load_text(plan.inputs.cluster, input_origin(source, "cluster"), plan.cluster_name, catalog);
  }
  // Host memory is not compared: plan_check_host_memory says whether the plan's offload fits.
  ClusterSpec cluster = cluster_load(given, catalog);
  if (!plan.cluster_fingerprint.empty() && cluster_fingerprint(cluster) != plan.cluster_fingerprint) {
    throw Error(fmt::format("--cluster {} is not the cluster the plan was made for ('{}': devices or links differ)",
                            given, plan.cluster_name),
                {source, "cluster"},
                plan.inputs.cluster.empty() ? "pass the plan's cluster, or re-run `alloy plan` for this one"
                                            : "drop --cluster: the plan carries its own; or re-run `alloy plan` for "
                                              "this one");
  }
  return cluster;
}

namespace {

// A training file beside a plan: what it states of the sequence length and global batch must be
// the plan's (what it leaves out the plan fills in).
void train_file_check(const Plan& plan, const TrainSpec& train, const std::string& given, const std::string& source) {
  const FieldReader stated(spec_file_parse(given), given);
  const auto disagree = [&](const char* field, int64_t file_value, int64_t plan_value, const char* what) {
    if (!stated.has(field) || file_value == plan_value) return;
    throw Error(fmt::format("{} is {} here but {} in the plan {}: the plan fixes {}", field, file_value, plan_value,
                            source, what),
                {given, field}, "drop it (or --train) to use the plan's own setup, or re-run `alloy plan` with this file");
  };
  disagree("seq_len", train.seq_len, plan.seq_len, "the sequence length");
  if (train.min_global_batch > 0 && train.max_global_batch > 0) {
    const bool below = plan.global_batch_sequences < train.min_global_batch;
    if (below || plan.global_batch_sequences > train.max_global_batch)
      throw Error(fmt::format("the plan {} runs a global batch of {} sequences, outside this file's range [{}, {}]",
                              source, plan.global_batch_sequences, train.min_global_batch, train.max_global_batch),
                  {given, below ? "min_global_batch" : "max_global_batch"},
                  "drop --train to use the plan's own setup, or re-run `alloy plan` with this file");
    return;
  }
  disagree("global_batch", train.global_batch_sequences, plan.global_batch_sequences, "the global batch");
  disagree("global_batch_tokens", train.global_batch_sequences * train.seq_len,
           plan.global_batch_sequences * plan.seq_len, "the global batch");
}

}  // namespace

TrainSpec plan_train(const Plan& plan, const std::string& given, const std::string& source) {
  TrainSpec train;
  if (!given.empty()) {
    train = train_load(given);
    train_file_check(plan, train, given, source);
  } else if (!plan.inputs.train.empty()) {
    train = train_load_text(plan.inputs.train, input_origin(source, "train"));
  }
  return plan_train_spec(train, plan);
}

}  // namespace alloy
