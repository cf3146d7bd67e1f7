// `alloy train --device cuda`: this rank's GPU as the CUDA backend of the one training loop.
#include "cli/gpu_commands.hpp"

#include "spec/error.hpp"

#ifdef ALLOY_WITH_CUDA
#include <algorithm>
#include <cctype>

#include <fmt/core.h>

#include "hw/catalog.hpp"
#include "runtime/cuda/communicator_host_staged.hpp"
#include "runtime/cuda/communicator_nccl.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/cuda/device.hpp"
#include "runtime/parallel/agree.hpp"
#include "spec/units.hpp"
#endif

namespace alloy::cli {

#ifdef ALLOY_WITH_CUDA

namespace {

// Members in this order: the communicator queues work on the stream, so it goes first.
class CudaTraining final : public GpuTraining {
 public:
  CudaStream stream;
  std::unique_ptr<Communicator> data;  // between the ranks' GPUs; nullptr for a single rank
};

// The catalog's entry for the GPU the driver names ("NVIDIA H200" is h200, "NVIDIA H100 80GB
// HBM3" h100), so a run without a plan is planned with its datasheet figures.
const DeviceType* catalog_entry(const std::string& driver_name) {
  std::string name = driver_name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name.rfind("nvidia ", 0) == 0) name = name.substr(7);
  const DeviceCatalog& catalog = catalog_builtin();
  const DeviceType* type = catalog.find(name);
  return type != nullptr ? type : catalog.find(name.substr(0, name.find(' ')));
}

// A GPU the catalog does not know: the driver's name and memory. A run needs no speeds from it
// (it measures its own), but a device type must have positive ones to be valid.
DeviceType driver_device_type(const CudaDeviceInfo& info) {
  DeviceType type;
  type.name = info.name;
  std::transform(type.name.begin(), type.name.end(), type.name.begin(),
                 [](unsigned char c) { return c == ' ' ? '-' : static_cast<char>(std::tolower(c)); });
  type.vendor = "nvidia";
  type.description = info.name + " (as the driver describes it)";
  type.peak_flops_fp32 = 1;
  type.memory_bandwidth_bytes_per_second = 1;
  return type;
}

// Whether the replicas' gradients go over NCCL (every rank of a host has its own GPU) or through
// pinned host memory and MPI (ranks share a GPU, or --gpu-comm host).
bool gradients_over_nccl(const Communicator& comm, int gpus, const std::string& path) {
  if (path != "auto" && path != "nccl" && path != "host")
    throw Error("unknown gradient path '" + path + "'", {"", "--gpu-comm"}, "use auto, nccl or host");
  const bool shared = comm.local_size() > gpus;
  if (path == "host" || (path == "auto" && shared)) return false;
  if (shared) {
    throw Error(fmt::format("{} ranks on host {} share {} GPU(s), and NCCL needs a GPU per rank", comm.local_size(),
                            comm.host_name(), gpus),
                {"", "--gpu-comm"}, "start one rank per GPU, or use --gpu-comm host");
  }
  return true;
}

}  // namespace

std::unique_ptr<GpuTraining> gpu_training_open(Communicator& comm, int gpu, const std::string& gradient_path) {
  const int gpus = cuda_device_count();
  const int local_rank = comm.rank() % comm.local_size();
  const int device = gpu >= 0 ? gpu : (gpus > 0 ? local_rank % gpus : 0);
  CudaDeviceInfo info;
  bool nccl = false;
  // Agreed before the communicator, whose creation is collective: a rank without its GPU must
  // not leave the others waiting there.
  dist_agree_on(comm, [&] {
    info = cuda_device_open(device);
    nccl = gradients_over_nccl(comm, gpus, gradient_path);
  });
  auto training = std::make_unique<CudaTraining>();
  const cudaStream_t stream = training->stream.get();
  if (comm.world_size() > 1) {
    if (!nccl && comm.rank() == 0 && comm.local_size() > gpus) {
      fmt::print("{} ranks share {} GPU(s) on {}: gradients go through host memory "
                 "(slow; start one rank per GPU for NCCL)\n",
                 comm.local_size(), gpus, comm.host_name());
    }
    training->data = nccl ? communicator_nccl_create(comm, device, stream)
                          : communicator_host_staged_create(comm, device, stream);
  }
  training->backend.name = "cuda";
  training->backend.make = [device, stream](const StageRequest& r) { return stage_backend_cuda(r, device, stream); };
  training->backend.data = training->data.get();
  const DeviceType* known = catalog_entry(info.name);
  training->device = known != nullptr ? *known : driver_device_type(info);
  // What the arena may take: the free memory less room for the CUDA context's own allocations
  // (cuBLASLt workspace, NCCL buffers, the matrix-product peak's test buffers).
  training->device.memory_bytes = static_cast<double>(info.free_memory_bytes - (int64_t{1} << 30));
  training->description = fmt::format("{} ({})", info.name, units_format_bytes(static_cast<double>(info.memory_bytes)));
  return training;
}

#else

std::unique_ptr<GpuTraining> gpu_training_open(Communicator&, int, const std::string&) {
  throw Error("this alloy was built without the CUDA backend", {"", "--device"},
              "rebuild with scripts/build.sh cuda (needs nvcc, cuBLAS and NCCL), or train on CPUs with --device cpu");
}

#endif

}  // namespace alloy::cli
