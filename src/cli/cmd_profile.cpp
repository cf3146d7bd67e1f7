// `alloy profile`: measures this machine for the planner: layer times of a model at the shapes
// the planner asks about and, under mpirun, collective bandwidth and latency; writes the
// profile that `alloy plan --profile` reads.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/core.h>

#include "cli/commands.hpp"
#include "cli/option_checks.hpp"
#include "cli/gpu_commands.hpp"
#include "cost/profile.hpp"
#include "hw/catalog.hpp"
#include "runtime/device_speed.hpp"
#include "runtime/cpu/blas_core.hpp"
#include "runtime/parallel/comm_profile.hpp"
#include "runtime/parallel/communicator.hpp"
#include "runtime/layer_profile.hpp"
#include "runtime/profile.hpp"
#include "runtime/threads.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"
#include "spec/error.hpp"
#include "spec/text_file.hpp"
#include "spec/units.hpp"
#include "util/table.hpp"

namespace alloy::cli {

namespace {

struct ProfileCommand {
  std::string model;
  std::string cluster;
  std::string train_file;
  std::string output = "profile.json";
  int repeats = 5;
  int rounds = 3;
  int threads = 0;
  std::string device = "cpu";
  int gpu = 0;
};

// One line rewritten in place on a terminal; nothing when stderr is a file or pipe.
void progress_line(const std::string& text) {
  if (!isatty(STDERR_FILENO)) return;
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
}

// Largest tensor-parallel group the cluster's CPU devices can form inside one node.
int cpu_devices_per_node(const ClusterSpec& cluster) {
  int most = 1;
  for (const NodeGroup& g : cluster.node_groups)
    if (cluster.device_types[g.device_type_index].is_cpu) most = std::max(most, g.devices_per_node);
  return most;
}

const char* placement_name(bool spans_nodes) { return spans_nodes ? "across nodes" : "in a node"; }

std::string shape_text(const LayerShape& s) {
  return fmt::format("{} mb {} seq {} tp {}{}", layer_kind_name(s.kind), s.micro_batch, s.seq_len, s.tp,
                     s.sequence_parallel ? " sp" : "");
}

// The cluster's nodes share this host (emulated): a group or a transfer across them runs at
// what was measured here, so each measurement (a collective or a point-to-point link) is also
// recorded as spanning nodes.
template <typename Measured>
void also_across_emulated_nodes(std::vector<Measured>* measurements) {
  const size_t measured = measurements->size();
  for (size_t i = 0; i < measured; ++i) {
    if ((*measurements)[i].spans_nodes) continue;
    Measured across = (*measurements)[i];
    across.spans_nodes = true;
    measurements->push_back(across);
  }
}

// The links between node groups in the profile already at `path` (`alloy comm-check
// --write-profile` records them; this command does not measure them), kept when it is rewritten;
// none when no profile can be read there (such a file is replaced, as it always was).
std::vector<ProfiledGroupLink> links_kept(const std::string& path) {
  if (!std::filesystem::exists(path)) return {};
  try {
    return profile_load(path).links;
  } catch (const Error&) {
    return {};
  }
}

void run_profile(const ProfileCommand& c) {
  const ModelSpec model = model_load(c.model);
  model_require_dense(model, "`alloy profile`");
  const ClusterSpec cluster = cluster_load(c.cluster, catalog_builtin());
  TrainSpec train;
  if (!c.train_file.empty()) train = train_load(c.train_file);
  train.seq_len = std::min(train.seq_len, model.max_seq_len);
  if (c.repeats < 1) throw Error("needs at least one repetition", {"", "--repeats"}, "use --repeats 3");
  if (c.rounds < 1) throw Error("needs at least one round", {"", "--rounds"}, "use --rounds 3");
  if (c.device != "cpu" && c.device != "cuda") throw Error("unknown device '" + c.device + "'", {"", "--device"}, "use cpu or cuda");
  if (c.device == "cuda") {
    profile_on_gpu(model, c.cluster, train, c.repeats, c.gpu, c.output);
    return;
  }
  std::unique_ptr<Communicator> comm = communicator_launched_by_mpi() ? communicator_mpi() : nullptr;
  const bool root = comm == nullptr || comm->rank() == 0;
  const int world = comm ? comm->world_size() : 1;
  const int ranks_on_host =
      emulated_ranks_on_host(cluster, comm ? comm->local_size() : 1, !comm || comm->local_size() == comm->world_size());
  runtime_set_threads(c.threads > 0 ? c.threads : runtime_threads_for_ranks(ranks_on_host));  // as training will

  // Every rank measures the same shapes at once, each pass stretched to its device's emulated
  // speed as training stretches it, so each meets the core sharing and the sleeping it will meet
  // in training. Rank r stands for device r: its times count for that device's type.
  const std::vector<LayerShape> shapes = layer_profile_shapes(model, train, cpu_devices_per_node(cluster));
  const int rank = comm ? comm->rank() : 0;
  if (world > static_cast<int>(cluster.devices.size()))  // the same answer on every rank
    throw Error(fmt::format("{} ranks were started but cluster {} has {} devices", world, cluster.name,
                            cluster.devices.size()),
                {c.cluster, "nodes"}, "start at most one rank per device");
  const int my_type = cluster.devices[static_cast<size_t>(rank)].device_type_index;
  const double my_slowdown =
      device_slowdown(cluster.device_types[static_cast<size_t>(my_type)], ranks_on_host, runtime_threads());
  const size_t types = cluster.device_types.size();
  // [shape][0..1]: forward and backward summed over ranks (unstretched); then per type the
  // stretched sums; then the number of ranks of each type.
  std::vector<double> sums(shapes.size() * 2 * (1 + types) + types, 0.0);
  auto at = [&](size_t shape, size_t slot) -> double& { return sums[shape * 2 * (1 + types) + slot]; };
  const LayerSweep sweep = layer_profile_sweep(model, shapes, {c.repeats, c.rounds, my_slowdown}, [&](int round, size_t i) {
    if (root)
      progress_line(fmt::format("profile round {}/{} [{}/{}] {}", round + 1, c.rounds, i + 1, shapes.size(),
                                shape_text(shapes[i])));
  });
  for (size_t i = 0; i < shapes.size(); ++i) {
    at(i, 0) = sweep.layers[i].forward_seconds / my_slowdown;
    at(i, 1) = sweep.layers[i].backward_seconds / my_slowdown;
    at(i, 2 + 2 * my_type) = sweep.layers[i].forward_seconds;
    at(i, 3 + 2 * my_type) = sweep.layers[i].backward_seconds;
  }
  sums[sums.size() - types + my_type] = 1;
  if (comm) comm->all_reduce(sums.data(), static_cast<int64_t>(sums.size()), comm->world()).wait();
  // The optimizer step's rate: [0] summed over ranks at full speed, [1 + type] stretched per type.
  std::vector<double> optimizer(1 + types, 0.0);
  optimizer[1 + my_type] = sweep.optimizer_seconds_per_parameter;
  optimizer[0] = sweep.optimizer_seconds_per_parameter / my_slowdown;
  if (comm) comm->all_reduce(optimizer.data(), static_cast<int64_t>(optimizer.size()), comm->world()).wait();
  double spread = sweep.reference_spread;  // the widest of any rank
  if (comm) comm->all_reduce(&spread, 1, comm->world(), ReduceOp::ReduceOp_max).wait();
  const double* ranks_of_type = sums.data() + sums.size() - types;
  const double gemm = profile_gemm_flops(512, 3);
  const double bandwidth = profile_memory_bandwidth();
  std::vector<ProfiledCollective> collectives;
  std::vector<ProfiledLink> point_to_point;
  if (comm && world > 1) {
    collectives = comm_profile_measure(*comm, c.repeats, progress_line);
    point_to_point = comm_profile_point_to_point(*comm, c.repeats, progress_line);
  }
  const bool emulated_nodes = comm && world > 1 && comm->local_size() == world && cluster.num_nodes > 1;
  if (emulated_nodes) {
    also_across_emulated_nodes(&collectives);
    also_across_emulated_nodes(&point_to_point);
  }
  if (root) progress_line("");
  if (!root) return;

  Profile profile;
  profile.model_name = model.name;
  std::vector<std::string> skipped;
  for (size_t k = 0; k < types; ++k) {
    const DeviceType& type = cluster.device_types[k];
    if (!type.is_cpu) {
      skipped.push_back(type.name);
      continue;
    }
    DeviceProfile& dp = profile.device_types[type.name];
    for (size_t i = 0; i < shapes.size(); ++i) {
      const LayerShape& s = shapes[i];
      double forward = 0, backward = 0;
      if (ranks_of_type[k] > 0) {  // measured on ranks of this type
        forward = at(i, 2 + 2 * k) / ranks_of_type[k];
        backward = at(i, 3 + 2 * k) / ranks_of_type[k];
      } else {  // no rank had it: this CPU's time at the type's emulated speed
        const double slowdown = device_slowdown(type, ranks_on_host, runtime_threads());
        forward = at(i, 0) / world * slowdown;
        backward = at(i, 1) / world * slowdown;
      }
      dp.layers.push_back({s.kind, s.micro_batch, s.seq_len, s.tp, s.sequence_parallel, forward, backward});
    }
    dp.collectives = collectives;
    dp.point_to_point = point_to_point;
    dp.optimizer_seconds_per_parameter = ranks_of_type[k] > 0 ? optimizer[1 + k] / ranks_of_type[k]
                                                                : optimizer[0] / world *
                                                                      device_slowdown(type, ranks_on_host, runtime_threads());
  }
  profile.links = links_kept(c.output);
  text_file_write(c.output, profile_to_json(profile), "profile", "--output");

  TextTable table({"layer", "forward>", "backward>"});
  for (size_t i = 0; i < shapes.size(); ++i)
    table.add_row({shape_text(shapes[i]), units_format_seconds(at(i, 0) / world), units_format_seconds(at(i, 1) / world)});
  fmt::print("Profile of {} on this machine at full speed ({} rank{} measuring at once, {} thread{} each)\n{}", model.name, world,
             world == 1 ? "" : "s", runtime_threads(), runtime_threads() == 1 ? "" : "s", table.render());
  fmt::print("GEMM peak {}, memory bandwidth {}, optimizer step {:.2f} ns per parameter\n{}\n", units_format_flops(gemm),
             units_format_bandwidth(bandwidth), 1e9 * optimizer[0] / world, blas_core().note);
  if (spread > 1.1)
    fmt::print("a core's speed moved by {:.0f}% during the profile (90th over 10th percentile; other load on this machine); each measurement "
               "was scaled by a reference GEMM timed right after it\n",
               100 * (spread - 1));
  if (!collectives.empty()) {
    TextTable comm_table({"collective", "placement", "ranks>", "latency>", "bandwidth>", "largest buffer timed>"});
    for (const ProfiledCollective& pc : collectives) {
      const std::string largest = pc.samples.empty() ? "-"
                                                     : fmt::format("{} in {}", units_format_bytes(pc.samples.back().bytes),
                                                                   units_format_seconds(pc.samples.back().seconds));
      comm_table.add_row({collective_op_name(pc.op), placement_name(pc.spans_nodes), std::to_string(pc.group_size),
                          units_format_seconds(pc.latency_seconds), units_format_bandwidth(pc.bandwidth_bytes_per_second),
                          largest});
    }
    for (const ProfiledLink& link : point_to_point)
      comm_table.add_row({"point-to-point", placement_name(link.spans_nodes), "2", units_format_seconds(link.latency_seconds),
                          units_format_bandwidth(link.bandwidth_bytes_per_second), "-"});
    fmt::print("{}latency and bandwidth: the line fitted to the timed buffers; the planner follows the timings themselves "
               "between sizes\n",
               comm_table.render());
    if (emulated_nodes)
      fmt::print("every rank ran on this host while cluster {} has {} nodes: they are emulated here, so groups across "
                 "them were recorded with the timings measured on this host\n",
                 cluster.name, cluster.num_nodes);
  } else {
    fmt::print("collectives: not measured (run under mpirun with 2 or more ranks to measure them)\n");
  }
  for (const std::string& name : skipped)
    fmt::print("{}: not a device of this machine; the planner keeps the analytic model for it\n", name);
  fmt::print("wrote {}: each CPU device type's layer times as its ranks measured them at its emulated speed; "
             "use it with alloy plan --profile {}\n",
             c.output, c.output);
  if (!profile.links.empty())
    fmt::print("kept the {} link{} between node groups that {} held (measured by alloy comm-check --write-profile)\n",
               profile.links.size(), profile.links.size() == 1 ? "" : "s", c.output);
}

}  // namespace

void add_profile(CLI::App& app, int* exit_code) {
  auto c = std::make_shared<ProfileCommand>();
  CLI::App* cmd = app.add_subcommand("profile", "Measure layer times (and, under mpirun, collectives) for alloy plan --profile");
  cmd->add_option("--model,-m", c->model, "Model preset or config path")->required();
  cmd->add_option("--cluster,-c", c->cluster, "Cluster preset or path: its CPU device types get the measurements")->required();
  cmd->add_option("--train,-t", c->train_file, "Training setup .yaml (global batch and sequence length to cover)");
  cmd->add_option("--output,-o", c->output, "Profile to write")->capture_default_str();
  cmd->add_option("--repeats", c->repeats, "Timed runs per shape (median; one warm-up run first)")
      ->capture_default_str()
      ->check(option_whole_in(1, 1000));
  cmd->add_option("--rounds", c->rounds, "Sweeps over all shapes (median per shape, each scaled by a reference GEMM timed next to it)")
      ->capture_default_str()
      ->check(option_whole_in(1, 100));
  cmd->add_option("--threads", c->threads, "Threads per rank (default: cores / the cluster's CPU devices on this host, as training uses, or ALLOY_THREADS)")
      ->check(option_whole_in(1, runtime_threads_limit()));
  cmd->add_option("--device", c->device, "cpu, or cuda: measure on a GPU as the cluster's first (GPU) device type")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--gpu", c->gpu, "With --device cuda: the GPU's index")->capture_default_str()->check(option_whole_in(0, 1023));
  cmd->callback([c, exit_code, cmd]() {
    option_refuse_unless(*cmd, "--gpu", c->device == "cuda", "--device cuda");
    run_profile(*c);
    *exit_code = 0;
  });
}

}  // namespace alloy::cli
