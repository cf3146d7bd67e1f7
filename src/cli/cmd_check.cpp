// `alloy check`: validates a model, a cluster and optionally a training setup, and prints what
// Alloy knows about them.
#include <fmt/core.h>

#include <optional>

#include "cli/commands.hpp"
#include "cost/runtime_traits.hpp"
#include "hw/catalog.hpp"
#include "spec/describe.hpp"
#include "spec/error.hpp"
#include "spec/topology.hpp"

namespace alloy::cli {

namespace {

// The precision each device type of the cluster computes in when `requested` is asked for (a
// plan's stages hold one device type each).
std::string precision_describe(const ClusterSpec& cluster, Precision requested) {
  std::string out = fmt::format("Precision per device type ({} requested):\n", precision_name(requested));
  for (const DeviceType& type : cluster.device_types) {
    const std::string note = precision_fallback_note(type, requested);
    out += fmt::format("  {:<16} {}{}\n", type.name, precision_name(precision_run_on(type, requested)),
                       note.empty() ? "" : "  (" + note + ")");
  }
  return out;
}

struct CheckOptions {
  std::string model;
  std::string cluster;
  std::string train;
};

void run_check(const CheckOptions& o) {
  if (o.model.empty() && o.cluster.empty()) {
    throw Error("nothing to check", {"", "--model/--cluster"}, "give --model M and/or --cluster C (see alloy check --help)");
  }
  TrainSpec train;
  if (!o.train.empty()) train = train_load(o.train);
  if (!o.model.empty()) {
    ModelSpec model = model_load(o.model);
    int64_t seq_len = o.train.empty() ? model.max_seq_len : train.seq_len;
    if (seq_len > model.max_seq_len) {
      throw Error(fmt::format("sequence length {} is longer than model {} allows ({})", seq_len, model.name,
                              model.max_seq_len),
                  {o.train, "seq_len"}, fmt::format("use seq_len <= {}", model.max_seq_len));
    }
    fmt::print("{}\n", model_describe(model, seq_len, train_optimizer_states(train)));
  }
  std::optional<ClusterSpec> cluster;
  if (!o.cluster.empty()) {
    cluster = cluster_load(o.cluster, catalog_builtin());
    fmt::print("{}\n", cluster_describe(*cluster));
    fmt::print("{}\n", topology_describe(*cluster));
  }
  if (!o.train.empty()) fmt::print("{}", train_describe(train));
  if (cluster) fmt::print("{}", precision_describe(*cluster, train.precision));
  fmt::print("check: OK\n");
}
}  // namespace

void add_check(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand("check", "Validate a model, cluster and training setup and print what Alloy knows");
  cmd->add_option("--model,-m", options->model,
                  "Model: a preset name (e.g. llama-2-7b; see examples/models/) or a path to a Hugging Face "
                  "config.json or an Alloy .yaml");
  cmd->add_option("--cluster,-c", options->cluster,
                  "Cluster: a preset name (e.g. a100-v100; see examples/clusters/) or a path to a cluster .yaml");
  cmd->add_option("--train,-t", options->train, "Training setup .yaml (sequence length, batch, precision, optimizer)");
  cmd->callback([options, exit_code]() {
    run_check(*options);
    *exit_code = 0;
  });
}

}  // namespace alloy::cli
