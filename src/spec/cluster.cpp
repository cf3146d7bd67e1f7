#include "spec/cluster.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

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
// MPI's shared-memory point-to-point latency under mpirun on the machine the catalog's cpu
// entry measures (docs/catalog.md, [23]).
constexpr double kShmLatencySeconds = 29e-6;

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
    link.latency_seconds = kShmLatencySeconds;
  } else if (text.find("roce") != std::string::npos || text.find("ethernet") != std::string::npos) {
    link.kind = "roce";
    link.latency_seconds = 5e-6;
  } else {
    link.kind = "pcie";
    link.latency_seconds = 5e-6;
  }
  return link;
}

void link_check_bandwidth(const FieldReader& r, const std::string& key, double bytes_per_second) {
  if (bytes_per_second <= 0) r.fail(key, "bandwidth must be positive", "write e.g. `" + key + ": 25GB/s`");
  if (bytes_per_second < kLinkLeastBytesPerSecond)
    r.fail(key, "a link slower than 1 Mb/s (got " + units_format_bandwidth(bytes_per_second) + ")",
           "check the unit: `100Mb/s` is megabits, `100MB/s` megabytes per second");
}

void link_check_latency(const FieldReader& r, const std::string& key, double latency_seconds) {
  if (latency_seconds > kLinkMostLatencySeconds)
    r.fail(key, "a latency above 10 s (got " + units_format_seconds(latency_seconds) + ")",
           "check the unit: write e.g. `latency: 5us` or `latency: 30ms`");
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
  link_check_bandwidth(r, "bandwidth", link.bandwidth_bytes_per_second);
  link_check_latency(r, "latency", link.latency_seconds);
  return link;
}

// Index of `name` among `items` (racks or sites), or a failure at `key` listing the names there are.
template <typename Item>
int hierarchy_index(const FieldReader& r, const std::string& key, const std::vector<Item>& items, const char* what) {
  const std::string name = r.get_string(key);
  std::string names;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].name == name) return static_cast<int>(i);
    names += (names.empty() ? "" : ", ") + items[i].name;
  }
  if (items.empty())
    r.fail(key, std::string("unknown ") + what + " '" + name + "': the cluster defines no " + what + "s",
           std::string("add `") + what + "s:` with an entry named '" + name + "', or remove `" + key + "`");
  r.fail(key, std::string("unknown ") + what + " '" + name + "'", std::string("name one of the ") + what + "s: " + names);
}

std::vector<Site> read_sites(const FieldReader& r) {
  std::vector<Site> sites;
  for (const FieldReader& item : r.list("sites")) {
    item.reject_unknown({"name"});
    Site site;
    site.name = item.get_string("name");
    for (const Site& other : sites)
      if (other.name == site.name) item.fail("name", "two sites are named '" + site.name + "'", "give each site its own name");
    sites.push_back(site);
  }
  return sites;
}

Rack read_rack(const FieldReader& r, const std::vector<Site>& sites) {
  r.reject_unknown({"name", "site", "uplink", "oversubscription", "latency"});
  Rack rack;
  rack.name = r.get_string("name");
  if (r.has("site")) rack.site = hierarchy_index(r, "site", sites, "site");
  else if (!sites.empty())
    r.fail("site", "rack '" + rack.name + "' names no site, but the cluster has sites", "add `site: " + sites.front().name + "` (or another site)");
  if (r.has("uplink") && r.has("oversubscription"))
    r.fail("oversubscription", "rack '" + rack.name + "' gives both `uplink` and `oversubscription`, which may disagree",
           "keep one: `uplink: 400Gb/s` (the uplink itself) or `oversubscription: 2` (nodes' bandwidth : uplink)");
  rack.uplink_bytes_per_second = r.get_bandwidth("uplink", 0.0);
  if (r.has("uplink")) link_check_bandwidth(r, "uplink", rack.uplink_bytes_per_second);
  rack.oversubscription = r.get_double("oversubscription", 1.0);
  if (!(rack.oversubscription >= 1 && rack.oversubscription <= 1000))
    r.fail("oversubscription", fmt::format("an oversubscription ratio must be in [1, 1000], got {:g}", rack.oversubscription),
           "write e.g. `oversubscription: 2` for 2:1 (nodes can send twice what the uplink carries)");
  rack.latency_seconds = r.get_seconds("latency", 0.0);
  link_check_latency(r, "latency", rack.latency_seconds);
  return rack;
}

std::vector<Rack> read_racks(const FieldReader& r, const std::vector<Site>& sites) {
  std::vector<Rack> racks;
  for (const FieldReader& item : r.list("racks")) {
    racks.push_back(read_rack(item, sites));
    for (size_t i = 0; i + 1 < racks.size(); ++i)
      if (racks[i].name == racks.back().name)
        item.fail("name", "two racks are named '" + racks.back().name + "'", "give each rack its own name");
  }
  return racks;
}

// The node group's rack and site: named, and consistent with the hierarchy around them.
void read_group_place(const FieldReader& r, const ClusterSpec& cluster, NodeGroup* g) {
  if (r.has("rack")) {
    g->rack = hierarchy_index(r, "rack", cluster.racks, "rack");
    g->site = cluster.racks[g->rack].site;
  } else if (!cluster.racks.empty()) {
    r.fail("rack", "node group '" + g->name + "' names no rack, but the cluster has racks",
           "add `rack: " + cluster.racks.front().name + "` (or another rack)");
  }
  if (r.has("site")) {
    const int site = hierarchy_index(r, "site", cluster.sites, "site");
    if (g->rack >= 0 && site != g->site)
      r.fail("site", "node group '" + g->name + "' names site '" + cluster.sites[site].name + "' but its rack '" +
                         cluster.racks[g->rack].name + "' is in another",
             "remove the group's `site` (it follows its rack) or move the rack");
    g->site = site;
  } else if (!cluster.sites.empty() && g->site < 0) {
    r.fail("site", "node group '" + g->name + "' names no site, but the cluster has sites",
           "add `site: " + cluster.sites.front().name + "` (or put it in a rack of a site)");
  }
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
                    "memory_bandwidth", "link", "link_bandwidth", "speed", "matmul_efficiency",
                    "matmul_efficiency_fp8", "source"});
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
  t.matmul_efficiency_fp8 = r.get_double("matmul_efficiency_fp8", t.matmul_efficiency_fp8);
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
  for (const auto& [key, value] : {std::pair{"matmul_efficiency", t.matmul_efficiency},
                                   std::pair{"matmul_efficiency_fp8", t.matmul_efficiency_fp8}})
    if (r.has(key) && !(value > 0 && value <= 1))
      r.fail(key, "a fraction of the peak must be in (0, 1]",
             fmt::format("write e.g. `{}: 0.75`, or leave it out for the calibrated default", key));
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
                    "price_per_device_hour", "network", "rack", "site"});
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
  read_group_place(r, *cluster, &g);
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

// What needs the cluster's default network: the node groups' own networks and the WAN; and
// racks and sites that hold no node.
void read_network_tiers(const FieldReader& r, ClusterSpec* cluster) {
  const std::vector<FieldReader> items = r.list("nodes");
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].has("network")) cluster->node_groups[i].network = read_link(items[i].child("network"), cluster->network);
  if (cluster->sites.size() >= 2 && !r.has("wan"))
    r.fail("wan", "the cluster has " + std::to_string(cluster->sites.size()) + " sites but no `wan` joining them",
           "add `wan: {kind: ethernet, bandwidth: 10Gb/s, latency: 20ms}` (per site, per direction)");
  if (r.has("wan")) {
    if (cluster->sites.size() < 2)
      r.fail("wan", "a `wan` joins sites, and the cluster has fewer than two", "remove `wan`, or add `sites:` and name them in the node groups");
    cluster->wan = read_link(r.child("wan"), Link{"ethernet", 0, 0});
  }
  for (size_t k = 0; k < cluster->racks.size(); ++k) {
    const bool used = std::any_of(cluster->node_groups.begin(), cluster->node_groups.end(),
                                  [&](const NodeGroup& g) { return g.rack == static_cast<int>(k); });
    if (!used) r.list("racks")[k].fail("name", "rack '" + cluster->racks[k].name + "' holds no node group",
                                       "name it in a node group's `rack:`, or remove it");
  }
  for (size_t k = 0; k < cluster->sites.size(); ++k) {
    const bool used = std::any_of(cluster->node_groups.begin(), cluster->node_groups.end(),
                                  [&](const NodeGroup& g) { return g.site == static_cast<int>(k); });
    if (!used) r.list("sites")[k].fail("name", "site '" + cluster->sites[k].name + "' holds no node group",
                                       "name it in a node group's or rack's `site:`, or remove it");
  }
}

ClusterSpec cluster_read(const FieldReader& r, const DeviceCatalog& base_catalog) {
  r.reject_unknown({"name", "description", "network", "device_types", "nodes", "racks", "sites", "wan"});
  ClusterSpec cluster;
  cluster.name = r.get_string("name", "");
  if (r.has("sites")) cluster.sites = read_sites(r);
  if (r.has("racks")) cluster.racks = read_racks(r, cluster.sites);
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
  // An all-CPU cluster's nodes are ranks of one machine, linked as its devices link their ranks;
  // a single node of other devices never crosses it.
  const Link shm = all_cpu ? link_from_device(cluster.device_types.front()) : Link{"shm", 3.5e9, 1e-6};
  if (r.has("network")) {
    cluster.network = read_link(r.child("network"), all_cpu ? shm : Link{});
  } else if (nodes > 1 && !all_cpu) {
    r.fail("network", "a cluster of several nodes needs a network",
           "add `network: {kind: infiniband, bandwidth: 25GB/s, latency: 5us}` (bandwidth per node)");
  } else {
    cluster.network = shm;
  }
  read_network_tiers(r, &cluster);
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
