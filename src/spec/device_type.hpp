// DeviceType: what an accelerator (or an emulated CPU rank) can do, as the catalog or a
// cluster file describes it. Numbers are dense peaks from datasheets; see docs/catalog.md.
#pragma once

#include <string>
#include <vector>

namespace alloy {

enum class Precision { Precision_fp32, Precision_tf32, Precision_bf16, Precision_fp16, Precision_fp8 };

const char* precision_name(Precision p);
// Parses "fp32", "tf32", "bf16", "fp16", "fp8"; returns false when unknown.
bool precision_parse(const std::string& text, Precision* out);
// Bytes per element of the tensors of a run in this precision. tf32 is stored as fp32, and fp8
// as bf16: an fp8 run casts only its matrix products' inputs to fp8 and keeps weights,
// activations and gradients in bf16 (Transformer Engine, torchao's float8 training).
int precision_bytes(Precision p);

struct DeviceType {
  std::string name;                  // canonical lower-case name, e.g. "a100-80gb-sxm"
  std::vector<std::string> aliases;  // other accepted names, e.g. "a100-80"
  std::string vendor;                // nvidia, amd, huawei, intel, cpu
  std::string description;           // one line for people

  // Dense peak throughput in FLOP/s; 0 where the device has no such mode.
  double peak_flops_fp32 = 0;
  double peak_flops_tf32 = 0;
  double peak_flops_bf16 = 0;
  double peak_flops_fp16 = 0;
  double peak_flops_fp8 = 0;

  double memory_bytes = 0;                       // device memory capacity
  double memory_bandwidth_bytes_per_second = 0;  // device memory bandwidth
  std::string intra_node_link;                   // e.g. "NVLink 3", "PCIe 4.0 x16"
  double intra_node_link_bytes_per_second = 0;   // per device, per direction
  std::string source;                            // citation keys, see docs/catalog.md
  // Fraction of the bf16/fp16 peak that large matrix products of training reach on this device
  // (calibrated against published runs, docs/catalog.md); 0: the runtime's default.
  double matmul_efficiency = 0;
  // The same for fp8 matrix products (the share of the fp8 peak); 0: the runtime's default.
  double matmul_efficiency_fp8 = 0;
  // The highest model FLOPs utilisation published for training on this device (bf16/fp16); a
  // prediction above it is a red flag. 0: none known.
  double best_published_mfu = 0;

  // The training framework whose runtime traits price this device (cost/runtime_traits.hpp):
  // empty for the runtime Alloy runs it with. Set only to price a run of another framework
  // (bench_published); cluster files do not name it.
  std::string framework = "";

  bool is_cpu = false;  // a rank on this machine; speed scales its compute
  double speed = 1.0;   // relative compute rate (cpu emulation); 1 for real devices

  // Peak FLOP/s for a precision, falling back to the next wider mode the device has
  // (fp8 -> bf16 -> fp32). Never 0 for a valid type.
  double peak_flops(Precision p) const;
};

// A set of device types looked up by name or alias, case-insensitively.
class DeviceCatalog {
 public:
  void add(DeviceType type);
  const DeviceType* find(const std::string& name) const;
  const std::vector<DeviceType>& types() const { return types_; }
  // Up to `count` names closest to `name` by edit distance, for "did you mean" hints.
  std::vector<std::string> nearest_names(const std::string& name, int count = 3) const;

 private:
  std::vector<DeviceType> types_;
};

}  // namespace alloy
