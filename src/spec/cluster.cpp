#include "spec/cluster.hpp"

#include <algorithm>
#include <map>

#include "spec/error.hpp"
#include "spec/field_reader.hpp"
#include "spec/presets.hpp"
#include "spec/text.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

constexpr int64_t kMaxNodesPerGroup = 100000;
constexpr int64_t kMaxDevicesPerNode = 1024;
constexpr int64_t kMaxDevices = 1 << 20;

// Link kind and default latency from a catalog description such as "NVLink 4" or "PCIe 4.0 x16".
Link link_from_device(const DeviceType& type) {
  std::string text = text_lower(type.intra_node_link);
  Link link;
  link.bandwidth_bytes_per_second = type.intra_node_link_bytes_per_second;
  if (text.find("nvlink") != std::string::npos) {
    link.kind = "nvlink";
    link.latency_seconds = 2e-6;
  } else if (text.find("infinity") != std::string::npos || text.find("xgmi") != std::string::npos) {
    link.kind = "xgmi";
    link.latency_seconds = 3e-6;
  } else if (text.find("hccs") != std::string::npos) {
    link.kind = "hccs";
    link.latency_seconds = 3e-6;
  } else if (text.find("shm") != std::string::npos || type.is_cpu) {
    link.kind = "shm";
    link.latency_seconds = 1e-6;
  } else if (text.find("roce") != std::string::npos || text.find("ethernet") != std::string::npos) {
    link.kind = "roce";
    link.latency_seconds = 5e-6;
  } else {
    link.kind = "pcie";
    link.latency_seconds = 5e-6;
  }
  return link;
}

Link read_link(const FieldReader& r, const Link& fallback) {
  r.reject_unknown({"kind", "bandwidth", "latency"});
  Link link;
  link.kind = r.get_string("kind", fallback.kind);
  if (link.kind.empty()) r.fail("kind", "link kind is missing", "write e.g. `kind: infiniband`");
  link.bandwidth_bytes_per_second =
      r.get_bandwidth("bandwidth", fallback.bandwidth_bytes_per_second > 0
                                       ? std::optional<double>(fallback.bandwidth_bytes_per_second)
                                       : std::nullopt);
  link.latency_seconds = r.get_seconds("latency", fallback.latency_seconds);
  if (link.bandwidth_bytes_per_second <= 0) r.fail("bandwidth", "bandwidth must be positive", "write e.g. `bandwidth: 25GB/s`");
  return link;
}

const DeviceType& lookup_type(const FieldReader& r, const std::string& key, const std::string& name,
                              const DeviceCatalog& catalog) {
  const DeviceType* type = catalog.find(name);
  if (!type) {
    std::vector<std::string> near = catalog.nearest_names(name, 3);
    std::string list;
    for (const auto& n : near) list += (list.empty() ? "" : ", ") + n;
    r.fail(key, "unknown device type '" + name + "'",
           "did you mean one of: " + list + "? or define it under `device_types:` (see docs/spec-formats.md, section Clusters)");
  }
  return *type;
}

DeviceType read_inline_type(const FieldReader& r, const std::string& name, const DeviceCatalog& catalog) {
  r.reject_unknown({"base", "vendor", "description", "fp32", "tf32", "bf16", "fp16", "fp8", "memory",
                    "memory_bandwidth", "link", "link_bandwidth", "speed", "matmul_efficiency", "source"});
  DeviceType t;
  if (r.has("base")) t = lookup_type(r, "base", r.get_string("base"), catalog);
  t.name = text_lower(name);
  t.aliases.clear();
  t.vendor = r.get_string("vendor", t.vendor);
  t.description = r.get_string("description", t.description.empty() ? name : t.description);
  t.peak_flops_fp32 = r.get_flops("fp32", t.peak_flops_fp32 > 0 ? std::optional<double>(t.peak_flops_fp32) : std::nullopt);
  t.peak_flops_tf32 = r.get_flops("tf32", t.peak_flops_tf32);
  t.peak_flops_bf16 = r.get_flops("bf16", t.peak_flops_bf16);
  t.peak_flops_fp16 = r.get_flops("fp16", t.peak_flops_fp16);
  t.peak_flops_fp8 = r.get_flops("fp8", t.peak_flops_fp8);
  t.memory_bytes = r.get_bytes("memory", t.memory_bytes > 0 ? std::optional<double>(t.memory_bytes) : std::nullopt);
  t.memory_bandwidth_bytes_per_second = r.get_bandwidth(
      "memory_bandwidth", t.memory_bandwidth_bytes_per_second > 0 ? std::optional<double>(t.memory_bandwidth_bytes_per_second)
                                                                  : std::nullopt);
  t.intra_node_link = r.get_string("link", t.intra_node_link.empty() ? "pcie" : t.intra_node_link);
  t.intra_node_link_bytes_per_second = r.get_bandwidth(
      "link_bandwidth", t.intra_node_link_bytes_per_second > 0 ? std::optional<double>(t.intra_node_link_bytes_per_second)
                                                               : std::optional<double>(25e9));
  t.speed = r.get_double("speed", t.speed);
  t.matmul_efficiency = r.get_double("matmul_efficiency", t.matmul_efficiency);
  // A type with peaks or a speed of its own is no longer the device the published figure is of.
  for (const char* key : {"fp32", "tf32", "bf16", "fp16", "fp8", "speed"})
    if (r.has(key)) t.best_published_mfu = 0;
  t.source = r.get_string("source", t.source.empty() ? "defined in " + r.file() : t.source);
  if (t.vendor.empty()) r.fail("vendor", "required field is missing", "write e.g. `vendor: nvidia`");
  if (t.peak_flops_fp32 <= 0) r.fail("fp32", "peak fp32 FLOP/s must be positive", "write e.g. `fp32: 19.5TFLOPS`");
  if (t.memory_bytes <= 0) r.fail("memory", "device memory must be positive", "write e.g. `memory: 80GiB`");
  if (t.memory_bandwidth_bytes_per_second <= 0) {
    r.fail("memory_bandwidth", "memory bandwidth must be positive", "write e.g. `memory_bandwidth: 2TB/s`");
  }
  if (!(t.speed > 0 && t.speed <= 1000)) r.fail("speed", "speed must be in (0, 1000]", "use e.g. `speed: 0.5` for half speed");
  if (r.has("matmul_efficiency") && !(t.matmul_efficiency > 0 && t.matmul_efficiency <= 1)) {
    r.fail("matmul_efficiency", "a fraction of the peak must be in (0, 1]",
           "write e.g. `matmul_efficiency: 0.75`, or leave it out for the calibrated default");
  }
  return t;
}

int type_index_for(ClusterSpec* cluster, const DeviceType& type) {
  for (size_t i = 0; i < cluster->device_types.size(); ++i) {
    if (cluster->device_types[i].name == type.name) return static_cast<int>(i);
  }
  cluster->device_types.push_back(type);
  return static_cast<int>(cluster->device_types.size() - 1);
}

NodeGroup read_node_group(const FieldReader& r, ClusterSpec* cluster, const DeviceCatalog& catalog) {
  r.reject_unknown({"name", "count", "device", "devices_per_node", "host_memory", "host_link", "intra_node",
                    "price_per_device_hour"});
  NodeGroup g;
  std::string device_name = r.get_string("device");
  const DeviceType& type = lookup_type(r, "device", device_name, catalog);
  g.device_type_index = type_index_for(cluster, type);
  g.name = r.get_string("name", type.name);
  int64_t count = r.get_int("count", 1);
  int64_t per_node = r.get_int("devices_per_node");
  if (count <= 0 || count > kMaxNodesPerGroup) {
    r.fail("count", "node count must be between 1 and " + std::to_string(kMaxNodesPerGroup) + ", got " + std::to_string(count),
           "set the number of nodes of this kind");
  }
  if (per_node <= 0 || per_node > kMaxDevicesPerNode) {
    r.fail("devices_per_node", "devices per node must be between 1 and " + std::to_string(kMaxDevicesPerNode) + ", got " +
                                   std::to_string(per_node),
           "set how many devices each node holds, e.g. 8");
  }
  g.count = static_cast<int>(count);
  g.devices_per_node = static_cast<int>(per_node);
  g.host_memory_bytes = r.get_bytes("host_memory", 2.0 * type.memory_bytes * per_node);
  g.host_link_bytes_per_second = r.get_bandwidth("host_link", type.is_cpu ? 10e9 : 25e9);
  Link link = link_from_device(type);
  g.intra_node = r.has("intra_node") ? read_link(r.child("intra_node"), link) : link;
  g.price_per_device_hour = r.get_double("price_per_device_hour", 0.0);
  if (g.price_per_device_hour < 0) r.fail("price_per_device_hour", "price must not be negative", "remove it or give a price >= 0");
  if (g.host_memory_bytes <= 0) r.fail("host_memory", "host memory must be positive", "write e.g. `host_memory: 1TiB`");
  if (g.host_link_bytes_per_second <= 0) r.fail("host_link", "host link bandwidth must be positive", "write e.g. `host_link: 25GB/s`");
  return g;
}

// Adds inline type `name` to `catalog` after the inline type it names as `base`, if any, so types
// can build on each other; `state` marks types being read (1) and read (2) to catch cycles.
void inline_type_add(const FieldReader& types, const std::string& name, std::map<std::string, int>* state,
                     DeviceCatalog* catalog) {
  int& mark = (*state)[name];
  if (mark == 2) return;
  const FieldReader r = types.child(name);
  if (mark == 1)
    r.fail("base", "the inline device types' bases form a cycle through '" + name + "'",
           "base one of them on a catalog type (see docs/catalog.md)");
  mark = 1;
  if (r.has("base")) {
    const std::string base = text_lower(r.get_string("base"));
    for (const std::string& other : types.keys())
      if (other != name && text_lower(other) == base) inline_type_add(types, other, state, catalog);
  }
  catalog->add(read_inline_type(r, name, *catalog));
  (*state)[name] = 2;
}

ClusterSpec cluster_read(const FieldReader& r, const DeviceCatalog& base_catalog) {
  r.reject_unknown({"name", "description", "network", "device_types", "nodes"});
  ClusterSpec cluster;
  cluster.name = r.get_string("name", "");
  DeviceCatalog catalog = base_catalog;
  if (r.has("device_types")) {
    FieldReader types = r.child("device_types");
    std::map<std::string, int> state;
    for (const auto& name : types.keys()) inline_type_add(types, name, &state, &catalog);
  }
  for (const auto& item : r.list("nodes")) cluster.node_groups.push_back(read_node_group(item, &cluster, catalog));
  if (cluster.node_groups.empty()) r.fail("nodes", "the cluster has no nodes", "add at least one entry under `nodes:`");

  int64_t nodes = 0;
  for (const auto& g : cluster.node_groups) nodes += g.count;
  bool all_cpu = std::all_of(cluster.device_types.begin(), cluster.device_types.end(),
                             [](const DeviceType& t) { return t.is_cpu; });
  Link shm{"shm", 3.5e9, 1e-6};
  if (r.has("network")) {
    cluster.network = read_link(r.child("network"), all_cpu ? shm : Link{});
  } else if (nodes > 1 && !all_cpu) {
    r.fail("network", "a cluster of several nodes needs a network",
           "add `network: {kind: infiniband, bandwidth: 25GB/s, latency: 5us}` (bandwidth per node)");
  } else {
    cluster.network = shm;
  }
  return cluster;
}

}  // namespace

void cluster_finalize(ClusterSpec* cluster) {
  cluster->devices.clear();
  int64_t total = 0;
  for (const auto& g : cluster->node_groups) total += static_cast<int64_t>(g.count) * g.devices_per_node;
  if (total <= 0) throw Error("the cluster has no devices", {cluster->source_path, "nodes"}, "add nodes with devices");
  if (total > kMaxDevices) {
    throw Error("the cluster has " + std::to_string(total) + " devices, more than Alloy's limit of " +
                    std::to_string(kMaxDevices),
                {cluster->source_path, "nodes"}, "check the node counts for a typo");
  }
  cluster->devices.reserve(static_cast<size_t>(total));
  int node = 0;
  for (size_t gi = 0; gi < cluster->node_groups.size(); ++gi) {
    const NodeGroup& g = cluster->node_groups[gi];
    for (int n = 0; n < g.count; ++n, ++node) {
      for (int local = 0; local < g.devices_per_node; ++local) {
        Device d;
        d.id = static_cast<int>(cluster->devices.size());
        d.node = node;
        d.local_index = local;
        d.node_group = static_cast<int>(gi);
        d.device_type_index = g.device_type_index;
        cluster->devices.push_back(d);
      }
    }
  }
  cluster->num_nodes = node;
}

ClusterSpec cluster_load(const std::string& name_or_path, const DeviceCatalog& catalog) {
  std::string path = name_or_path;
  if (!presets_is_path(name_or_path)) {
    path = presets_find("clusters", name_or_path);
    if (path.empty()) {
      throw Error("no cluster preset named '" + name_or_path + "'", {"", "--cluster"},
                  "nearest presets: " + text_nearest(name_or_path, cluster_preset_names()) +
                      "; or pass a path to a cluster .yaml file");
    }
  }
  ClusterSpec cluster = cluster_load_text(spec_file_text(path), path, presets_is_path(name_or_path) ? path : name_or_path,
                                          catalog);
  cluster.source_path = path;
  return cluster;
}

ClusterSpec cluster_load_text(const std::string& text, const std::string& path, const std::string& name,
                              const DeviceCatalog& catalog) {
  FieldReader r(spec_text_parse(text, path, false), path);
  ClusterSpec cluster = cluster_read(r, catalog);
  cluster.source_path = path;
  cluster.source_text = text;
  if (cluster.name.empty()) cluster.name = name;
  cluster_finalize(&cluster);
  return cluster;
}

std::vector<std::string> cluster_preset_names() { return presets_list("clusters"); }

}  // namespace alloy
