// `alloy profile --device cuda`: layer times and the optimizer rate measured on one GPU, written
// as the profile of the cluster's GPU type for alloy plan --profile.
#include <fmt/core.h>

#include "cli/gpu_commands.hpp"
#include "spec/error.hpp"

#ifdef ALLOY_WITH_CUDA
#include <unistd.h>

#include <cstdio>

#include "hw/catalog.hpp"
#include "runtime/cuda/gpu_profile.hpp"
#include "spec/cluster.hpp"
#include "spec/text_file.hpp"
#include "spec/units.hpp"
#include "util/table.hpp"
#endif

namespace alloy::cli {

#ifdef ALLOY_WITH_CUDA

void profile_on_gpu(const ModelSpec& model, const std::string& cluster_name, const TrainSpec& train, int repeats,
                    int gpu, const std::string& output) {
  const ClusterSpec cluster = cluster_load(cluster_name, catalog_builtin());
  const DeviceType& type = cluster.device_types[static_cast<size_t>(cluster.devices.front().device_type_index)];
  if (type.is_cpu) {
    throw Error(fmt::format("the cluster's first device is a CPU ({}); --device cuda profiles a GPU type", type.name),
                {cluster_name, "nodes"}, "profile CPU clusters without --device cuda");
  }
  const bool terminal = isatty(fileno(stderr)) != 0;
  const GpuProfile measured = gpu_profile_measure(model, train, gpu, repeats, [&](const std::string& line) {
    if (terminal) std::fprintf(stderr, "\r\033[K%s", line.c_str());
  });
  if (terminal) std::fprintf(stderr, "\r\033[K");
  Profile profile;
  profile.model_name = model.name;
  DeviceProfile& entry = profile.device_types[type.name];
  entry.layers = measured.layers;
  entry.optimizer_seconds_per_parameter = measured.optimizer_seconds_per_parameter;
  text_file_write(output, profile_to_json(profile), "profile", "--output");

  TextTable table({"layer", "micro-batch>", "forward>", "backward>"});
  for (const ProfiledLayer& l : measured.layers) {
    table.add_row({layer_kind_name(l.kind), fmt::format("{} x {}", l.micro_batch, l.seq_len),
                   units_format_seconds(l.forward_seconds), units_format_seconds(l.backward_seconds)});
  }
  fmt::print("Profile of {} on {} ({} multiprocessors, {}), as device type {}\n{}", model.name, measured.device.name,
             measured.device.multiprocessors, units_format_bytes(static_cast<double>(measured.device.memory_bytes)),
             type.name, table.render());
  fmt::print("bf16 GEMM {} measured; optimizer step {:.3f} ns per parameter\n", units_format_flops(measured.gemm_peak_flops),
             1e9 * measured.optimizer_seconds_per_parameter);
  for (int b : measured.skipped_micro_batches) fmt::print("micro-batch {}: does not fit in the GPU's memory (not profiled)\n", b);
  fmt::print("wrote {}: use it with alloy plan --profile {}\n", output, output);
}

#else

void profile_on_gpu(const ModelSpec&, const std::string&, const TrainSpec&, int, int, const std::string&) {
  throw Error("this alloy was built without the CUDA backend", {"", "--device"},
              "rebuild with scripts/build.sh cuda (needs nvcc, cuBLAS and NCCL), or profile CPUs without --device");
}

#endif

}  // namespace alloy::cli
