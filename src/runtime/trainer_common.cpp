// The step log, the progress line and the one-device plan of the training loop.
#include "runtime/trainer_common.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "spec/error.hpp"
#include "spec/text_file.hpp"
#include "spec/units.hpp"

namespace alloy {

void trainer_check_seq_len(const ModelSpec& spec, const TrainSpec& train) {
  if (train.seq_len > spec.max_seq_len) {
    throw Error(fmt::format("sequence length {} is longer than model {} allows ({})", train.seq_len, spec.name,
                            spec.max_seq_len),
                {train.source_path, "seq_len"}, fmt::format("use seq_len <= {}", spec.max_seq_len));
  }
}

StepLog::StepLog(const std::string& path) : path_(path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(fmt::format("cannot open the log file for writing: {}", std::strerror(errno)), {path, "--log"},
                "check the folder exists and is writable");
}

StepLog::~StepLog() {
  if (fd_ >= 0) ::close(fd_);
}

void StepLog::write(const StepReport& r, const std::vector<RankStepStats>* ranks) {
  if (fd_ < 0) return;
  nlohmann::json j = {{"step", r.step},       {"loss", r.loss},
                      {"lr", r.learning_rate}, {"grad_norm", r.grad_norm},
                      {"step_seconds", r.step_seconds}, {"tokens_per_second", r.tokens_per_second},
                      {"mfu", r.mfu},         {"peak_arena_bytes", r.peak_arena_bytes},
                      {"peak_host_arena_bytes", r.peak_host_arena_bytes}};
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  if (r.aux_loss) j["aux_loss"] = *r.aux_loss;
  if (!r.expert_tokens.empty()) j["expert_tokens"] = r.expert_tokens;
  if (r.loss_scale != 1 || r.loss_scale_overflow) {
    j["loss_scale"] = r.loss_scale;
    j["loss_scale_overflow"] = r.loss_scale_overflow;
  }
  if (ranks != nullptr) {
    for (const RankStepStats& rank : *ranks) {
      nlohmann::json by_term = nlohmann::json::object();
      for (int k = 0; k < kMemoryTermKinds; ++k)
        by_term[memory_term_key(static_cast<MemoryTermKind>(k))] = rank.peak_term_bytes[static_cast<size_t>(k)];
      j["ranks"].push_back({{"step_seconds", rank.step_seconds}, {"compute_seconds", rank.compute_seconds},
                            {"wait_seconds", rank.wait_seconds}, {"communication_seconds", rank.communication_seconds},
                            {"peak_arena_bytes", rank.peak_arena_bytes}, {"peak_by_term", by_term},
                            {"peak_host_arena_bytes", rank.peak_host_arena_bytes}});
    }
  }
  text_fd_append(fd_, path_, j.dump() + "\n", "log file", "--log");
}

void trainer_print_progress(const StepReport& r, int64_t total_steps) {
  std::string line = fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  gnorm {:.3f}  {:.0f} tok/s  mfu {:.1f}%  peak {}",
                                 r.step, total_steps, r.loss, r.learning_rate, r.grad_norm, r.tokens_per_second,
                                 100.0 * r.mfu, units_format_bytes(static_cast<double>(r.peak_arena_bytes)));
  if (r.peak_host_arena_bytes > 0) line += fmt::format("  host {}", units_format_bytes(static_cast<double>(r.peak_host_arena_bytes)));
  if (r.val_loss) line += fmt::format("  val {:.4f}", *r.val_loss);
  if (r.aux_loss) line += fmt::format("  aux {:.4f}", *r.aux_loss);
  std::fprintf(stderr, "%s\n", line.c_str());
}

OneStage trainer_one_stage(const ModelSpec& model, const TrainSpec& train, const TrainerOptions& o,
                           const DeviceType* device, int replicas) {
  trainer_check_seq_len(model, train);
  DeviceType type;
  if (device != nullptr) {
    type = *device;
  } else {  // this machine's cores as one device: only its memory matters to a run
    type.name = "cpu";
    type.vendor = "cpu";
    type.description = "this machine's cores";
    type.peak_flops_fp32 = 1;
    type.memory_bandwidth_bytes_per_second = 1;
    type.memory_bytes = static_cast<double>(int64_t{64} << 30);
    type.is_cpu = true;
  }
  if (o.memory_cap_bytes > 0) type.memory_bytes = o.memory_cap_bytes;
  if (replicas < 1) replicas = 1;
  OneStage one;
  ClusterSpec& cluster = one.cluster;
  cluster.name = "one-" + type.name;
  cluster.device_types = {type};
  NodeGroup node;
  node.name = "this host";
  node.count = 1;
  node.devices_per_node = replicas;
  node.device_type_index = 0;
  node.host_memory_bytes = type.memory_bytes * replicas;
  node.intra_node.kind = "shm";
  cluster.node_groups = {node};
  cluster_finalize(&cluster);

  Plan& plan = one.plan;
  const int L = static_cast<int>(model.num_layers);
  plan.model_name = model.name;
  plan.model_fingerprint = model_fingerprint(model);
  plan.num_layers = L;
  plan.cluster_name = cluster.name;
  plan.cluster_fingerprint = cluster_fingerprint(cluster);
  plan.num_devices = replicas;
  plan.seq_len = train.seq_len;
  plan.global_batch_sequences = o.batch_size > 0 ? o.batch_size : train.global_batch_sequences;
  if (plan.global_batch_sequences % replicas != 0)
    throw Error(fmt::format("the batch of {} sequences does not split over {} data-parallel ranks",
                            plan.global_batch_sequences, replicas),
                {"", "--batch"}, "use a batch that the number of ranks divides");
  plan.micro_batch_sequences = plan.global_batch_sequences;
  plan.num_micro_batches = 1;
  plan.precision = train.precision;
  PlanStage stage;
  stage.device_type = type.name;
  stage.dp = replicas;
  for (int d = 0; d < replicas; ++d) stage.device_ids.push_back(d);
  stage.chunks = {{0, L}};
  stage.has_embedding = true;
  stage.has_head = true;
  stage.recompute.assign(static_cast<size_t>(L), o.recompute);
  stage.offload.assign(static_cast<size_t>(L), false);
  stage.memory_capacity_bytes = type.memory_bytes;
  plan.stages = {stage};
  plan_validate(plan);
  return one;
}

}  // namespace alloy
