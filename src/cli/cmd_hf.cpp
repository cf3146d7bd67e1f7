// `alloy import-hf` and `alloy export-hf`: Hugging Face weights into a checkpoint any plan resumes
// from (to fine-tune), and a checkpoint of any layout out to config.json + model.safetensors.
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "plan/plan_inputs.hpp"
#include "runtime/io/checkpoint_commit.hpp"
#include "runtime/io/hf_weights.hpp"
#include "runtime/parallel/reshard.hpp"
#include "runtime/shard.hpp"
#include "runtime/trainer.hpp"
#include "spec/error.hpp"
#include "spec/text_file.hpp"
#include "spec/units.hpp"

namespace alloy::cli {

namespace {

namespace fs = std::filesystem;

struct ImportCommand {
  std::string weights;
  std::string config;
  std::string output;
};

struct ExportCommand {
  std::string checkpoint;
  std::string model;
  std::string output;
  std::string shard_size = "5GB";
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The checkpoint of step 0 of one rank holding every tensor whole, with zero AdamW moments: a run
// under any plan resumes from it by resharding (reshard.hpp) and starts its step 1 there.
void checkpoint_write_whole(const std::string& dir, const ModelSpec& model, std::vector<HostTensor>& tensors) {
  std::vector<std::vector<float>> zeros;
  std::vector<TensorRef> parameters, moments;
  GlobalLayout parameter_layout, moment_layout;
  for (HostTensor& t : tensors) {
    parameters.push_back({t.name, t.shape, t.values.data()});
    parameter_layout[t.name] = {{t.name, 0, numel_of(t.shape), 0}};
  }
  for (const char* moment : {"m", "v"})
    for (const HostTensor& t : tensors) {
      zeros.emplace_back(static_cast<size_t>(numel_of(t.shape)), 0.0f);
      const std::string name = fmt::format("adamw.{}.{}", moment, t.name);
      moments.push_back({name, t.shape, zeros.back().data()});
      moment_layout[name] = {{fmt::format("adamw.{}/{}", moment, t.name), 0, numel_of(t.shape), 0}};
    }
  CheckpointState state;
  state.fingerprint = trainer_model_fingerprint(model) + "|imported";
  state.global_layout = global_layout_json(parameter_layout, moment_layout);
  fs::create_directories(dir);
  const CheckpointFileRecords records = checkpoint_save(checkpoint_rank_dir(dir, 0, 0), parameters, moments, state);
  checkpoint_commit(dir, 0, trainer_model_fingerprint(model) + "|plan imported", {records}, 1);
}

void run_import(const ImportCommand& c) {
  std::string config = c.config;
  if (config.empty()) config = (fs::path(c.weights).parent_path() / "config.json").string();
  if (!fs::exists(config))
    throw Error("no config.json beside the weights", {config, ""}, "pass the model's config.json as the second argument");
  const ModelSpec model = model_load(config);
  model_require_dense(model, "`alloy import-hf`");
  std::vector<HostTensor> tensors = hf_weights_import(model, c.weights);
  if (fs::exists(c.output) && !fs::is_empty(c.output))
    throw Error("exists and is not empty: refusing to write a checkpoint into it", {c.output, ""},
                "choose a new folder for the imported checkpoint");
  checkpoint_write_whole(c.output, model, tensors);
  text_file_write(c.output + "/model.yaml", model_to_yaml(model), "model file", "--output");  // keeps the model's name
  int64_t parameters = 0;
  for (const HostTensor& t : tensors) parameters += numel_of(t.shape);
  fmt::print("imported {} ({} parameters in {} tensors) into {}\n"
             "fine-tune from it under any plan of this model: alloy train --plan P --data D --checkpoint {} --resume\n",
             model.name, parameters, tensors.size(), c.output, c.output);
}

// The model the checkpoint holds: --model, else its plan.json's, else the model.yaml of an import.
ModelSpec checkpoint_model(const ExportCommand& c) {
  if (!c.model.empty()) return model_load(c.model);
  const std::string plan = c.checkpoint + "/plan.json";
  if (fs::exists(plan)) return plan_model(plan_load(plan), "", plan);
  const std::string imported = c.checkpoint + "/model.yaml";
  if (fs::exists(imported)) return model_load(imported);
  throw Error("the checkpoint folder has neither plan.json nor model.yaml to say which model it holds",
              {c.checkpoint, ""}, "pass --model (a preset, a model file or a config.json)");
}

void run_export(const ExportCommand& c) {
  const ModelSpec model = checkpoint_model(c);
  model_require_dense(model, "`alloy export-hf`");
  const CheckpointManifest manifest = checkpoint_manifest_read(c.checkpoint);
  if (manifest.fingerprint.rfind(trainer_model_fingerprint(model) + "|", 0) != 0)
    throw Error(fmt::format("the checkpoint is of \"{}\", not of model {}", manifest.fingerprint, model.name),
                {c.checkpoint + "/" + kCheckpointLatest, "fingerprint"}, "pass the model the checkpoint was written for (--model)");
  std::vector<std::string> writers;
  for (int r = 0; r < manifest.ranks; ++r) writers.push_back(checkpoint_rank_dir(c.checkpoint, manifest.step, r));
  ReshardSources sources(writers, [&](int r) { checkpoint_manifest_check_files(manifest, c.checkpoint, r); });
  std::vector<HostTensor> alloy;
  for (const ShardedTensor& t : shard_tensors(model, shard_full(model))) {
    HostTensor whole{t.name, t.full_shape, std::vector<float>(static_cast<size_t>(numel_of(t.full_shape)))};
    sources.read({t.name, 0, numel_of(t.full_shape), 0}, whole.values.data());
    alloy.push_back(std::move(whole));
  }
  const std::vector<HostTensor> hf = hf_weights_export(model, alloy);
  const std::optional<double> limit = units_parse_bytes(c.shard_size);
  if (!limit || *limit < 1)
    throw Error(fmt::format("cannot read '{}' as a size", c.shard_size), {"", "--shard-size"}, "write e.g. 5GB or 500MiB");
  // Shards of at most the limit (a tensor larger than it alone), in transformers' order.
  std::vector<std::vector<TensorRef>> shards(1);
  double bytes = 0, total = 0;
  for (const HostTensor& t : hf) {
    const double size = 4.0 * static_cast<double>(t.values.size());
    if (!shards.back().empty() && bytes + size > *limit) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back({t.name, t.shape, const_cast<float*>(t.values.data())});
    bytes += size;
    total += size;
  }
  fs::create_directories(c.output);
  const SafetensorsMetadata metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    safetensors_save(c.output + "/model.safetensors", shards.front(), metadata);
  } else {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", static_cast<int64_t>(total)}}}, {"weight_map", nlohmann::ordered_json::object()}};
    for (size_t k = 0; k < shards.size(); ++k) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
      safetensors_save(c.output + "/" + file, shards[k], metadata);
      for (const TensorRef& r : shards[k]) index["weight_map"][r.name] = file;
    }
    text_file_write(c.output + "/model.safetensors.index.json", index.dump(2) + "\n", "safetensors index", "--output");
  }
  text_file_write(c.output + "/config.json", hf_config_json(model), "config file", "--output");
  fmt::print("exported step {} of {} ({} tensors, {} file(s), {}) to {}\n", manifest.step, model.name, hf.size(),
             shards.size(), units_format_bytes(total), c.output);
}

}  // namespace

void add_import_hf(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<ImportCommand>();
  CLI::App* cmd = app.add_subcommand(
      "import-hf", "Turn Hugging Face weights (GPT-2 or LLaMA family) into a checkpoint any plan fine-tunes from");
  cmd->add_option("weights", c->weights, "model.safetensors, or model.safetensors.index.json of a sharded model")->required();
  cmd->add_option("config", c->config, "The model's config.json (default: the one beside the weights)");
  cmd->add_option("--output,-o", c->output, "Checkpoint folder to write")->required();
  cmd->callback([c, exit_code]() {
    run_import(*c);
    *exit_code = 0;
  });
}

void add_export_hf(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<ExportCommand>();
  CLI::App* cmd = app.add_subcommand(
      "export-hf", "Write a checkpoint (any layout) as Hugging Face config.json and model.safetensors");
  cmd->add_option("checkpoint", c->checkpoint, "Checkpoint folder of `alloy train --checkpoint` or `alloy import-hf`")->required();
  cmd->add_option("--output,-o", c->output, "Folder to write config.json and the weights into")->required();
  cmd->add_option("--model,-m", c->model, "The checkpoint's model (default: from its plan.json or config.json)");
  cmd->add_option("--shard-size", c->shard_size, "Largest weights file; more are written with an index")->capture_default_str();
  cmd->callback([c, exit_code]() {
    run_export(*c);
    *exit_code = 0;
  });
}

}  // namespace alloy::cli
