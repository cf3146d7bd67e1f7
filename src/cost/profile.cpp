#include "cost/profile.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "spec/error.hpp"
#include "spec/json_unique.hpp"

namespace alloy {

namespace {

using nlohmann::json;

constexpr int kProfileVersion = 1;

const json& require(const json& object, const char* key, const std::string& path, const std::string& field) {
  if (!object.is_object() || !object.contains(key))
    throw Error(std::string("missing required field '") + key + "'", {path, field}, "see docs/profile-format.md");
  return object.at(key);
}

double positive_number(const json& object, const char* key, const std::string& path, const std::string& field) {
  const json& v = require(object, key, path, field);
  const std::string where = field + "." + key;
  if (!v.is_number() || v.get<double>() <= 0)
    throw Error("must be a positive number", {path, where}, "measured values are seconds or bytes per second");
  return v.get<double>();
}

double non_negative_number(const json& object, const char* key, const std::string& path, const std::string& field) {
  const json& v = require(object, key, path, field);
  if (!v.is_number() || v.get<double>() < 0)
    throw Error("must be a number >= 0", {path, field + "." + key}, "measured values are seconds or bytes per second");
  return v.get<double>();
}

// "intra_node" or "inter_node": whether the measured ranks were on different nodes.
bool parse_spans_nodes(const json& object, const std::string& path, const std::string& field) {
  const json& placement = require(object, "placement", path, field);
  if (placement == "intra_node") return false;
  if (placement == "inter_node") return true;
  throw Error("unknown placement " + placement.dump(), {path, field + ".placement"}, "use intra_node or inter_node");
}

int positive_int(const json& object, const char* key, const std::string& path, const std::string& field) {
  const json& v = require(object, key, path, field);
  if (!v.is_number_integer() || v.get<int>() <= 0)
    throw Error("must be a positive integer", {path, field + "." + key});
  return v.get<int>();
}

LayerKind parse_layer_kind(const json& v, const std::string& path, const std::string& field) {
  for (LayerKind k : {LayerKind::LayerKind_embedding, LayerKind::LayerKind_block, LayerKind::LayerKind_head})
    if (v.is_string() && v.get<std::string>() == layer_kind_name(k)) return k;
  throw Error("unknown layer kind " + v.dump(), {path, field}, "use embedding, block or head");
}

CollectiveOp parse_op(const json& v, const std::string& path, const std::string& field) {
  for (CollectiveOp op : {CollectiveOp::CollectiveOp_all_reduce, CollectiveOp::CollectiveOp_all_gather,
                          CollectiveOp::CollectiveOp_reduce_scatter})
    if (v.is_string() && v.get<std::string>() == collective_op_name(op)) return op;
  throw Error("unknown collective " + v.dump(), {path, field}, "use all_reduce, all_gather or reduce_scatter");
}

// [[bytes, seconds], ...], at least two, by strictly growing size.
std::vector<CollectiveSample> parse_samples(const json& v, const std::string& path, const std::string& field) {
  const char* hint = "write [[bytes, seconds], ...] with at least two sizes, smallest first, or leave samples out";
  if (!v.is_array() || v.size() < 2) throw Error("must be a list of at least two [bytes, seconds] pairs", {path, field}, hint);
  std::vector<CollectiveSample> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& pair = v[i];
    const std::string where = field + "[" + std::to_string(i) + "]";
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number() || !pair[1].is_number() ||
        pair[0].get<double>() <= 0 || pair[1].get<double>() <= 0)
      throw Error("must be a pair of positive numbers [bytes, seconds]", {path, where}, hint);
    if (!out.empty() && pair[0].get<double>() <= out.back().bytes)
      throw Error("sizes must grow from one sample to the next", {path, where}, hint);
    out.push_back({pair[0].get<double>(), pair[1].get<double>()});
  }
  return out;
}

std::string group_name(const json& object, const char* key, const std::string& path, const std::string& field) {
  const json& v = require(object, key, path, field);
  if (!v.is_string() || v.get<std::string>().empty())
    throw Error("must be a node group's name", {path, field + "." + key}, "write the name the cluster file gives the group");
  return v.get<std::string>();
}

ProfiledGroupLink parse_link(const json& l, const std::string& path, const std::string& field) {
  ProfiledGroupLink link;
  link.from_group = group_name(l, "from", path, field);
  link.to_group = group_name(l, "to", path, field);
  link.bandwidth_bytes_per_second = positive_number(l, "bandwidth_bytes_per_second", path, field);
  if (link.bandwidth_bytes_per_second < kLinkLeastBytesPerSecond)
    throw Error(fmt::format("a link slower than 1 Mb/s (got {} bytes per second)", link.bandwidth_bytes_per_second),
                {path, field + ".bandwidth_bytes_per_second"}, "the field is in bytes per second, not bits or megabytes");
  link.latency_seconds = non_negative_number(l, "latency_seconds", path, field);
  if (link.latency_seconds > kLinkMostLatencySeconds)
    throw Error(fmt::format("a latency above 10 s (got {} s)", link.latency_seconds), {path, field + ".latency_seconds"},
                "the field is in seconds");
  if (l.contains("message_bytes")) link.message_bytes = positive_number(l, "message_bytes", path, field);
  return link;
}

// [{from, to, bandwidth_bytes_per_second, latency_seconds, message_bytes?}, ...], one per direction.
std::vector<ProfiledGroupLink> parse_links(const json& v, const std::string& path) {
  if (!v.is_array())
    throw Error("must be a list", {path, "links"}, "write [{\"from\": ..., \"to\": ..., \"bandwidth_bytes_per_second\": ..., \"latency_seconds\": ...}]");
  std::vector<ProfiledGroupLink> links;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = "links[" + std::to_string(i) + "]";
    links.push_back(parse_link(v[i], path, field));
    for (size_t k = 0; k + 1 < links.size(); ++k)
      if (links[k].from_group == links.back().from_group && links[k].to_group == links.back().to_group)
        throw Error(fmt::format("a second link from {} to {} (the first is links[{}])", links.back().from_group,
                                links.back().to_group, k),
                    {path, field}, "keep one measurement per direction");
  }
  return links;
}

json link_to_json(const ProfiledGroupLink& link) {
  json out = {{"from", link.from_group}, {"to", link.to_group},
              {"bandwidth_bytes_per_second", link.bandwidth_bytes_per_second}, {"latency_seconds", link.latency_seconds}};
  if (link.message_bytes > 0) out["message_bytes"] = link.message_bytes;
  return out;
}

// Whether `entry` (a link as written) joins the same two groups as `link`, either way round.
bool link_joins_same_groups(const json& entry, const ProfiledGroupLink& link) {
  const std::string from = entry.value("from", ""), to = entry.value("to", "");
  return (from == link.from_group && to == link.to_group) || (from == link.to_group && to == link.from_group);
}

int node_group_index(const ClusterSpec& cluster, const std::string& name) {
  for (size_t g = 0; g < cluster.node_groups.size(); ++g)
    if (cluster.node_groups[g].name == name) return static_cast<int>(g);
  return -1;
}

}  // namespace

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::LayerKind_embedding: return "embedding";
    case LayerKind::LayerKind_block: return "block";
    case LayerKind::LayerKind_head: return "head";
  }
  return "?";
}

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::CollectiveOp_all_reduce: return "all_reduce";
    case CollectiveOp::CollectiveOp_all_gather: return "all_gather";
    case CollectiveOp::CollectiveOp_reduce_scatter: return "reduce_scatter";
  }
  return "?";
}

const ProfiledLayer* Profile::find_layer(const std::string& device_type, LayerKind kind, int micro_batch,
                                         int seq_len, int tp, bool sequence_parallel) const {
  auto it = device_types.find(device_type);
  if (it == device_types.end()) return nullptr;
  for (const auto& l : it->second.layers)
    if (l.kind == kind && l.micro_batch == micro_batch && l.seq_len == seq_len && l.tp == tp &&
        l.sequence_parallel == sequence_parallel)
      return &l;
  return nullptr;
}

namespace {

// Seconds = a + b x sequences through the points (sequences, seconds), minimising the relative
// residuals, read at `sequences`; through the origin when the best line falls with size or
// would read zero or less there. Two points or more.
double line_fit_at(const std::vector<std::pair<double, double>>& points, double sequences) {
  // Weighted least squares with weights 1 / seconds^2.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    const double w = 1.0 / (y * y);
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  const double det = sw * sxx - sx * sx;
  if (det > 0) {
    const double b = (sw * sxy - sx * sy) / det;
    const double a = (sy - b * sx) / sw;
    if (b >= 0 && a + b * sequences > 0) return a + b * sequences;
  }
  return sxy / sxx * sequences;
}

// The measured sizes a time at `sequences` is read from: those within a factor of 2 of it and
// the nearest on each side. A line over every size bends away from the largest ones on a GPU,
// whose small sizes are bound by launches (an H200's GPT-2 block: 0.10 ms at 1 sequence, 1.24
// ms at 32, where a line over 1..32 reads 1.16); the neighbours alone still smooth one noisy
// timing.
std::vector<const ProfiledLayer*> neighbours(const std::vector<const ProfiledLayer*>& sorted, double sequences) {
  std::vector<const ProfiledLayer*> out;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const double b = sorted[i]->micro_batch;
    const bool below_nearest = b <= sequences && (i + 1 == sorted.size() || sorted[i + 1]->micro_batch > sequences);
    const bool above_nearest = b >= sequences && (i == 0 || sorted[i - 1]->micro_batch < sequences);
    if ((b >= sequences / 2 && b <= sequences * 2) || below_nearest || above_nearest) out.push_back(sorted[i]);
  }
  return out;
}

}  // namespace

std::optional<ProfiledLayer> Profile::layer_at(const std::string& device_type, LayerKind kind, int micro_batch,
                                               int seq_len, int tp, bool sequence_parallel) const {
  auto it = device_types.find(device_type);
  if (it == device_types.end()) return std::nullopt;
  std::vector<const ProfiledLayer*> same;  // the shape at every measured micro-batch size
  for (const ProfiledLayer& l : it->second.layers)
    if (l.kind == kind && l.seq_len == seq_len && l.tp == tp && l.sequence_parallel == sequence_parallel &&
        l.forward_seconds > 0 && l.backward_seconds > 0)
      same.push_back(&l);
  if (same.empty()) return std::nullopt;
  std::sort(same.begin(), same.end(), [](const ProfiledLayer* x, const ProfiledLayer* y) { return x->micro_batch < y->micro_batch; });
  if (micro_batch < same.front()->micro_batch) return std::nullopt;
  const double x = std::min<double>(micro_batch, same.back()->micro_batch);
  const double beyond = micro_batch / x;  // past the largest size: its time per sequence
  const std::vector<const ProfiledLayer*> near = neighbours(same, x);
  ProfiledLayer out = *near.front();
  out.micro_batch = micro_batch;
  if (near.size() == 1) {
    out.forward_seconds *= beyond;
    out.backward_seconds *= beyond;
    return out;
  }
  std::vector<std::pair<double, double>> forward, backward;
  for (const ProfiledLayer* l : near) {
    forward.emplace_back(l->micro_batch, l->forward_seconds);
    backward.emplace_back(l->micro_batch, l->backward_seconds);
  }
  out.forward_seconds = line_fit_at(forward, x) * beyond;
  out.backward_seconds = line_fit_at(backward, x) * beyond;
  return out;
}

const ProfiledCollective* Profile::find_collective(const std::string& device_type, CollectiveOp op,
                                                   int group_size, bool spans_nodes) const {
  auto it = device_types.find(device_type);
  if (it == device_types.end()) return nullptr;
  for (const auto& c : it->second.collectives)
    if (c.op == op && c.group_size == group_size && c.spans_nodes == spans_nodes) return &c;
  return nullptr;
}

double ProfiledCollective::seconds(double bytes) const {
  if (samples.size() < 2) return latency_seconds + bytes / bandwidth_bytes_per_second;
  if (bytes <= samples.front().bytes)
    return std::max(latency_seconds, samples.front().seconds - (samples.front().bytes - bytes) / bandwidth_bytes_per_second);
  size_t k = 1;  // the segment [k - 1, k] holding `bytes`, or the last one past the largest
  while (k + 1 < samples.size() && bytes > samples[k].bytes) ++k;
  const CollectiveSample& a = samples[k - 1];
  const CollectiveSample& b = samples[k];
  const double per_byte = std::max(0.0, (b.seconds - a.seconds) / (b.bytes - a.bytes));
  return a.seconds + (bytes - a.bytes) * per_byte;
}

double Profile::optimizer_rate(const std::string& device_type) const {
  auto it = device_types.find(device_type);
  return it == device_types.end() ? 0.0 : it->second.optimizer_seconds_per_parameter;
}

Link Profile::point_to_point_link(const std::string& device_type, bool spans_nodes, Link fallback) const {
  auto it = device_types.find(device_type);
  if (it == device_types.end()) return fallback;
  for (const ProfiledLink& link : it->second.point_to_point)
    if (link.spans_nodes == spans_nodes) {
      fallback.bandwidth_bytes_per_second = link.bandwidth_bytes_per_second;
      fallback.latency_seconds = link.latency_seconds;
    }
  return fallback;
}

double Profile::boundary_transfer_seconds(const std::string& device_type) const {
  auto it = device_types.find(device_type);
  return it == device_types.end() ? 0.0 : it->second.boundary_transfer_seconds;
}

Profile profile_parse(const std::string& json_text, const std::string& path) {
  json root;
  try {
    root = json_parse_unique_keys<json>(json_text, path);
  } catch (const json::parse_error& e) {
    throw Error(std::string("not valid JSON: ") + e.what(), {path, ""}, "see docs/profile-format.md");
  }
  Profile profile;
  profile.source_path = path;
  const json& version = require(root, "version", path, "");
  if (!version.is_number_integer() || version.get<int>() != kProfileVersion)
    throw Error("unsupported profile version " + version.dump(), {path, "version"},
                "this Alloy reads version " + std::to_string(kProfileVersion));
  // A profile of links alone (`alloy comm-check --write-profile`) has no model and no device types.
  if (root.contains("model") && !root.at("model").is_string()) throw Error("must be a model name", {path, "model"});
  profile.model_name = root.value("model", "");
  if (root.contains("links")) profile.links = parse_links(root.at("links"), path);
  const json types = root.value("device_types", json::object());
  if (!types.is_object()) throw Error("must be an object keyed by device type", {path, "device_types"});
  for (const auto& [type_name, entry] : types.items()) {
    const std::string base = "device_types." + type_name;
    DeviceProfile dp;
    if (entry.contains("layers")) {
      const json& layers = entry.at("layers");
      if (!layers.is_array()) throw Error("must be a list", {path, base + ".layers"});
      if (!layers.empty() && profile.model_name.empty())
        throw Error("layer times without the model they were measured on", {path, "model"},
                    "write the model's name, as `alloy profile` does");
      for (size_t i = 0; i < layers.size(); ++i) {
        const std::string field = base + ".layers[" + std::to_string(i) + "]";
        const json& l = layers[i];
        ProfiledLayer pl;
        pl.kind = parse_layer_kind(require(l, "layer", path, field), path, field + ".layer");
        pl.micro_batch = positive_int(l, "micro_batch", path, field);
        pl.seq_len = positive_int(l, "seq_len", path, field);
        pl.tp = positive_int(l, "tp", path, field);
        pl.sequence_parallel = l.value("sequence_parallel", false);
        pl.forward_seconds = positive_number(l, "forward_seconds", path, field);
        pl.backward_seconds = positive_number(l, "backward_seconds", path, field);
        dp.layers.push_back(pl);
      }
    }
    if (entry.contains("collectives")) {
      const json& collectives = entry.at("collectives");
      if (!collectives.is_array()) throw Error("must be a list", {path, base + ".collectives"});
      for (size_t i = 0; i < collectives.size(); ++i) {
        const std::string field = base + ".collectives[" + std::to_string(i) + "]";
        const json& c = collectives[i];
        ProfiledCollective pc;
        pc.op = parse_op(require(c, "op", path, field), path, field + ".op");
        pc.group_size = positive_int(c, "group_size", path, field);
        pc.spans_nodes = parse_spans_nodes(c, path, field);
        pc.bandwidth_bytes_per_second = positive_number(c, "bandwidth_bytes_per_second", path, field);
        pc.latency_seconds = non_negative_number(c, "latency_seconds", path, field);
        if (c.contains("samples")) pc.samples = parse_samples(c.at("samples"), path, field + ".samples");
        dp.collectives.push_back(pc);
      }
    }
    if (entry.contains("optimizer_seconds_per_parameter"))
      dp.optimizer_seconds_per_parameter = positive_number(entry, "optimizer_seconds_per_parameter", path, base);
    if (entry.contains("point_to_point")) {
      const json& links = entry.at("point_to_point");
      if (!links.is_array()) throw Error("must be a list", {path, base + ".point_to_point"});
      for (size_t i = 0; i < links.size(); ++i) {
        const std::string field = base + ".point_to_point[" + std::to_string(i) + "]";
        ProfiledLink link;
        link.spans_nodes = parse_spans_nodes(links[i], path, field);
        link.bandwidth_bytes_per_second = positive_number(links[i], "bandwidth_bytes_per_second", path, field);
        link.latency_seconds = non_negative_number(links[i], "latency_seconds", path, field);
        dp.point_to_point.push_back(link);
      }
    }
    if (entry.contains("boundary_transfer_seconds"))
      dp.boundary_transfer_seconds = non_negative_number(entry, "boundary_transfer_seconds", path, base);
    profile.device_types[type_name] = std::move(dp);
  }
  return profile;
}

std::string profile_to_json(const Profile& profile) {
  json root = {{"version", kProfileVersion}, {"model", profile.model_name}, {"device_types", json::object()}};
  for (const auto& [name, dp] : profile.device_types) {
    json entry = {{"layers", json::array()}, {"collectives", json::array()}};
    for (const ProfiledLayer& l : dp.layers) {
      entry["layers"].push_back({{"layer", layer_kind_name(l.kind)}, {"micro_batch", l.micro_batch},
                                 {"seq_len", l.seq_len}, {"tp", l.tp}, {"sequence_parallel", l.sequence_parallel},
                                 {"forward_seconds", l.forward_seconds}, {"backward_seconds", l.backward_seconds}});
    }
    for (const ProfiledCollective& c : dp.collectives) {
      json collective = {{"op", collective_op_name(c.op)}, {"group_size", c.group_size},
                         {"placement", c.spans_nodes ? "inter_node" : "intra_node"},
                         {"bandwidth_bytes_per_second", c.bandwidth_bytes_per_second},
                         {"latency_seconds", c.latency_seconds}};
      if (!c.samples.empty()) {
        collective["samples"] = json::array();
        for (const CollectiveSample& sample : c.samples) collective["samples"].push_back({sample.bytes, sample.seconds});
      }
      entry["collectives"].push_back(std::move(collective));
    }
    if (dp.optimizer_seconds_per_parameter > 0) entry["optimizer_seconds_per_parameter"] = dp.optimizer_seconds_per_parameter;
    for (const ProfiledLink& link : dp.point_to_point)
      entry["point_to_point"].push_back({{"placement", link.spans_nodes ? "inter_node" : "intra_node"},
                                         {"bandwidth_bytes_per_second", link.bandwidth_bytes_per_second},
                                         {"latency_seconds", link.latency_seconds}});
    if (dp.boundary_transfer_seconds > 0) entry["boundary_transfer_seconds"] = dp.boundary_transfer_seconds;
    root["device_types"][name] = std::move(entry);
  }
  if (!profile.links.empty()) {
    root["links"] = json::array();
    for (const ProfiledGroupLink& link : profile.links) root["links"].push_back(link_to_json(link));
  }
  return root.dump(2) + "\n";
}

ClusterSpec profile_apply_links(const Profile& profile, const ClusterSpec& cluster) {
  ClusterSpec out = cluster;
  out.measured_links.clear();
  out.measured_links_source = profile.source_path;
  std::string names;
  for (const NodeGroup& g : cluster.node_groups) names += (names.empty() ? "" : ", ") + g.name;
  for (size_t i = 0; i < profile.links.size(); ++i) {
    const ProfiledGroupLink& link = profile.links[i];
    auto group = [&](const std::string& name, const char* end) {
      const int g = node_group_index(cluster, name);
      if (g < 0)
        throw Error(fmt::format("node group '{}' is not in cluster {} (its node groups: {})", name, cluster.name, names),
                    {profile.source_path, fmt::format("links[{}].{}", i, end)},
                    "measure this cluster's links with `alloy comm-check --cluster ... --write-profile`, or remove the entry");
      return g;
    };
    out.measured_links.push_back(MeasuredLink{group(link.from_group, "from"), group(link.to_group, "to"),
                                              link.bandwidth_bytes_per_second, link.latency_seconds});
  }
  return out;
}

std::string profile_merge_links(const std::string& json_text, const std::string& path,
                                const std::vector<ProfiledGroupLink>& links) {
  profile_parse(json_text, path);  // refuses a file that is not a profile before anything is replaced
  json root = json_parse_unique_keys<json>(json_text, path);
  json merged = json::array();
  for (const json& entry : root.value("links", json::array())) {
    const bool replaced = std::any_of(links.begin(), links.end(),
                                      [&](const ProfiledGroupLink& link) { return link_joins_same_groups(entry, link); });
    if (!replaced) merged.push_back(entry);
  }
  for (const ProfiledGroupLink& link : links) merged.push_back(link_to_json(link));
  root["links"] = std::move(merged);
  return root.dump(2) + "\n";
}

Profile profile_load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open profile", {path, ""}, "check the path given to --profile");
  std::stringstream text;
  text << in.rdbuf();
  return profile_parse(text.str(), path);
}

}  // namespace alloy
