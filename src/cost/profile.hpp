// Measured profiles (`--profile`): layer times and collective performance per device type,
// read from JSON (format in docs/profile-format.md). Replaces the analytic curve where measured.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "spec/cluster.hpp"

namespace alloy {

enum class LayerKind { LayerKind_embedding, LayerKind_block, LayerKind_head };
inline constexpr int kLayerKinds = 3;  // LayerKind's values are 0 .. kLayerKinds - 1
const char* layer_kind_name(LayerKind kind);

enum class CollectiveOp { CollectiveOp_all_reduce, CollectiveOp_all_gather, CollectiveOp_reduce_scatter };
const char* collective_op_name(CollectiveOp op);

struct ProfiledLayer {
  LayerKind kind = LayerKind::LayerKind_block;
  int micro_batch = 0;  // sequences per replica
  int seq_len = 0;
  int tp = 1;
  bool sequence_parallel = false;
  double forward_seconds = 0;
  double backward_seconds = 0;  // without recomputation
};

// One timed buffer size of a collective.
struct CollectiveSample {
  double bytes = 0;
  double seconds = 0;
};

struct ProfiledCollective {
  CollectiveOp op = CollectiveOp::CollectiveOp_all_reduce;
  int group_size = 0;
  bool spans_nodes = false;                 // placement: "intra_node" or "inter_node"
  double bandwidth_bytes_per_second = 0;    // algorithm bandwidth: buffer bytes / (time - latency)
  double latency_seconds = 0;
  // The timings the fit came from, by growing size (optional). A CPU's collectives are not one
  // straight line: buffers that stay in cache move about twice as fast as those that do not.
  std::vector<CollectiveSample> samples;

  // Seconds for a buffer of `bytes`: between two samples, the straight line through them; past
  // the largest, its segment's rate continued; below the smallest, the smallest's time scaled
  // down along the fit's rate. Without samples, latency + bytes / bandwidth.
  double seconds(double bytes) const;
};

// A point-to-point transfer between two ranks, timed by ping-pong (half the round trip) and
// fitted to time = latency + bytes / bandwidth.
struct ProfiledLink {
  bool spans_nodes = false;  // placement: "intra_node" or "inter_node"
  double bandwidth_bytes_per_second = 0;
  double latency_seconds = 0;
};

// The link between the nodes of two node groups, measured by `alloy comm-check --cluster`
// between a node of each (two nodes of the group when `from_group` is `to_group`): the median half
// round trip of 8 bytes, and the bandwidth of one send of `message_bytes`. Holds both ways unless
// the other way has an entry of its own.
struct ProfiledGroupLink {
  std::string from_group;  // node group names, as in the cluster file
  std::string to_group;
  double bandwidth_bytes_per_second = 0;
  double latency_seconds = 0;
  double message_bytes = 0;  // the send timed for the bandwidth; 0: not recorded
};

struct DeviceProfile {
  std::vector<ProfiledLayer> layers;
  std::vector<ProfiledCollective> collectives;
  std::vector<ProfiledLink> point_to_point;  // at most one per placement
  double optimizer_seconds_per_parameter = 0;  // gradient norm and AdamW update; 0: not measured
  // Seconds each stage-boundary transfer sent by this type takes beyond the link model, fitted
  // by calibration so that the profile predicts its run's step (a pipeline's waits for its
  // neighbours on shared cores); 0: none.
  double boundary_transfer_seconds = 0;
};

struct Profile {
  std::string source_path;
  std::string model_name;                           // layer times hold for this model only
  std::map<std::string, DeviceProfile> device_types;  // by device type name (lower case)
  std::vector<ProfiledGroupLink> links;             // between node groups; at most one per direction

  const ProfiledLayer* find_layer(const std::string& device_type, LayerKind kind, int micro_batch,
                                  int seq_len, int tp, bool sequence_parallel) const;
  // Seconds of a layer at any micro-batch size from those measured for the same shape: the line
  // a + b x sequences fitted to the measured sizes within a factor of 2 and the nearest on each
  // side (relative residuals; one size's timing on a shared machine moved by 25% between
  // neighbours, where the line holds); with one such size, its time per sequence. Past the
  // largest size, that size's time per sequence; nothing below the smallest.
  std::optional<ProfiledLayer> layer_at(const std::string& device_type, LayerKind kind, int micro_batch, int seq_len,
                                        int tp, bool sequence_parallel) const;
  const ProfiledCollective* find_collective(const std::string& device_type, CollectiveOp op,
                                            int group_size, bool spans_nodes) const;
  // Measured optimizer seconds per parameter of a device type, or 0.
  double optimizer_rate(const std::string& device_type) const;
  // `fallback` (a cluster file's link) with the measured latency and bandwidth of transfers from
  // a device type at that placement, where the profile has them.
  Link point_to_point_link(const std::string& device_type, bool spans_nodes, Link fallback) const;
  // DeviceProfile::boundary_transfer_seconds of a device type, or 0.
  double boundary_transfer_seconds(const std::string& device_type) const;
};

// Reads and validates a profile; throws alloy::Error naming the file and the field.
Profile profile_load(const std::string& path);
Profile profile_parse(const std::string& json_text, const std::string& source_path);
// The JSON that profile_parse reads back unchanged.
std::string profile_to_json(const Profile& profile);

// `cluster` with the profile's links as its measured links (ClusterSpec::measured_links, which the
// network paths of spec/topology.hpp price instead of the file's NICs). Throws alloy::Error naming
// the profile, the field and the cluster's node groups when a link names a group it lacks.
ClusterSpec profile_apply_links(const Profile& profile, const ClusterSpec& cluster);

// The profile `json_text` (read from `path`, validated) with `links` merged into its links: each
// replaces an entry between the same two groups (either way round), the others are kept, and so
// is everything else in the file, fields this version does not read included. The JSON to write.
std::string profile_merge_links(const std::string& json_text, const std::string& path,
                                const std::vector<ProfiledGroupLink>& links);

}  // namespace alloy
