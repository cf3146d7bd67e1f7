// `alloy replan`: plans a checkpoint's model and training setup for another cluster (devices came
// or went) and writes a plan the run resumes under; `alloy train --plan P --checkpoint DIR
// --resume` then reshards the checkpoint onto it.
#include <filesystem>
#include <memory>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "cli/search_flags.hpp"
#include "hw/catalog.hpp"
#include "plan/plan_inputs.hpp"
#include "runtime/io/checkpoint_commit.hpp"
#include "runtime/trainer.hpp"
#include "spec/error.hpp"

namespace alloy::cli {

namespace {

struct ReplanCommand {
  std::string checkpoint;
  std::string cluster;
  std::string train;
  std::string output = "replan.json";
  SearchFlags flags;
};

void run_replan(const ReplanCommand& c) {
  const CheckpointManifest manifest = checkpoint_manifest_read(c.checkpoint);
  const std::string written_path = c.checkpoint + "/plan.json";
  if (!std::filesystem::exists(written_path))
    throw Error("the checkpoint folder has no plan.json, so it does not say which model and training setup it holds",
                {written_path, ""}, "replan from a folder written by `alloy train --checkpoint`");
  const Plan written = plan_load(written_path);
  const ModelSpec model = plan_model(written, "", written_path);
  const TrainSpec train = plan_train(written, c.train, written_path);
  if (manifest.fingerprint.rfind(trainer_model_fingerprint(model) + "|plan ", 0) != 0)
    throw Error("the checkpoint's plan.json is of another model than its tensors",
                {c.checkpoint + "/" + kCheckpointLatest, "fingerprint"}, "restore the folder's plan.json from a copy");
  const ClusterSpec cluster = cluster_load(c.cluster, catalog_builtin());
  fmt::print("Re-planning step {} of {} (written by {} rank(s)) for {}\n\n", manifest.step, model.name, manifest.ranks,
             cluster.name);
  const std::optional<Profile> profile = search_flags_profile(c.flags);
  CostModel cost(model, cluster, train, profile ? &*profile : nullptr);
  SearchResult result = search_flags_run(cost, c.flags);
  plan_set_inputs(&result.plan, model, cluster, train);
  plan_save(result.plan, c.output);
  fmt::print("plan written to {}\nresume on it: mpirun -np {} alloy train --plan {} --data DATA --checkpoint {} --resume\n",
             c.output, result.plan.num_used_devices(), c.output, c.checkpoint);
}

}  // namespace

void add_replan(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<ReplanCommand>();
  CLI::App* cmd = app.add_subcommand(
      "replan", "Plan a checkpoint's model and training setup for another cluster, to resume the run there");
  cmd->add_option("--checkpoint", c->checkpoint, "Checkpoint folder of `alloy train --checkpoint`")->required();
  cmd->add_option("--cluster,-c", c->cluster, "The cluster to resume on: preset or .yaml path")->required();
  cmd->add_option("--train,-t", c->train,
                  "Training setup .yaml (default: the checkpoint's; it must keep the sequence length and global batch)");
  cmd->add_option("--output,-o", c->output, "Write the new plan as JSON to this file")->capture_default_str();
  search_flags_add(cmd, c->flags);
  cmd->callback([c, exit_code, cmd]() {
    search_flags_check(*cmd, c->flags);
    run_replan(*c);
    *exit_code = 0;
  });
}

}  // namespace alloy::cli
