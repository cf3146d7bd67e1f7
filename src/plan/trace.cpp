// Chrome trace events from simulation intervals; metadata events name devices and streams.
#include "plan/trace.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "spec/error.hpp"
#include "spec/text_file.hpp"

namespace alloy {

const char* sim_stream_name(SimStream stream) {
  switch (stream) {
    case SimStream::SimStream_compute: return "compute";
    case SimStream::SimStream_send: return "send";
    case SimStream::SimStream_recv: return "recv";
    case SimStream::SimStream_collective: return "collective";
    case SimStream::SimStream_copy: return "copy";
    case SimStream::SimStream_all_to_all: return "all_to_all";
    case SimStream::SimStream_copy_out: return "copy_out";
  }
  return "?";
}


namespace {

constexpr SimStream kStreams[] = {SimStream::SimStream_compute, SimStream::SimStream_send, SimStream::SimStream_recv,
                                  SimStream::SimStream_collective, SimStream::SimStream_copy,
                                  SimStream::SimStream_all_to_all, SimStream::SimStream_copy_out};

std::string event_name(const SimInterval& iv) {
  std::string name = op_kind_name(iv.kind);
  if (iv.stream == SimStream::SimStream_all_to_all) name = "all-to-all " + name;
  if (iv.micro_batch >= 0) name += fmt::format(" mb {}", iv.micro_batch);
  if (iv.kind != OpKind::OpKind_optimizer) name += fmt::format(" c{}", iv.chunk);
  return name;
}

nlohmann::json metadata(const char* name, int pid, int tid, nlohmann::json args) {
  return {{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

double interval_link_share(const SimResult& result, const SimInterval& iv, int link) {
  for (int u = iv.first_link_use; u < iv.first_link_use + iv.num_link_uses; ++u)
    if (result.link_uses[static_cast<size_t>(u)].link == link) return result.link_uses[static_cast<size_t>(u)].share;
  return 0;
}

// One process for the rack uplinks and WAN ports: per link, a thread per row of the transfers
// that crossed it (transfers at the same time on rows of their own) and a counter of the part
// of the link they asked for together (above 1 they slowed each other).
void append_shared_links(const SimResult& result, int pid, nlohmann::json* events) {
  int tid = 0;
  for (size_t l = 0; l < result.shared_links.size(); ++l) {
    const int link = static_cast<int>(l);
    const std::string& name = result.shared_links[l].name;
    const std::vector<std::vector<int>> rows = timeline_link_rows(result, link);
    for (size_t row = 0; row < rows.size(); ++row, ++tid) {
      const std::string thread = row == 0 ? name : fmt::format("{} ({})", name, row + 1);
      events->push_back(metadata("thread_name", pid, tid, {{"name", thread}}));
      events->push_back(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
      for (int index : rows[row]) {
        const SimInterval& iv = result.intervals[static_cast<size_t>(index)];
        const double dur = (iv.end_seconds - iv.start_seconds) * 1e6;
        if (dur <= 0) continue;
        const int stage = result.lanes[static_cast<size_t>(iv.lane)].stage;
        nlohmann::json args = {{"stage", stage}, {"op", iv.op_index}, {"share", interval_link_share(result, iv, link)}};
        events->push_back({{"name", fmt::format("stage {}: {}", stage, event_name(iv))}, {"cat", op_kind_name(iv.kind)},
                           {"ph", "X"}, {"ts", iv.start_seconds * 1e6}, {"dur", dur}, {"pid", pid}, {"tid", tid},
                           {"args", std::move(args)}});
      }
    }
    if (rows.empty()) continue;
    for (const LinkLoadSample& sample : timeline_link_load(result, link))
      events->push_back({{"name", name + " load"}, {"ph", "C"}, {"ts", sample.seconds * 1e6}, {"pid", pid},
                         {"args", {{"share of capacity", sample.share}}}});
  }
  if (tid == 0) return;
  events->push_back(metadata("process_name", pid, 0, {{"name", "shared links (rack uplinks, WAN ports)"}}));
  events->push_back(metadata("process_sort_index", pid, 0, {{"sort_index", pid}}));
}

}  // namespace

std::string trace_json(const SimResult& result, const Plan& plan, const TraceOptions& options) {
  nlohmann::json events = nlohmann::json::array();
  const bool every_rank = plan.num_used_devices() <= options.max_ranks;
  // Processes of each lane: its stage's ranks, or the lane's rank alone.
  std::vector<std::vector<int>> pids(result.lanes.size());
  for (size_t l = 0; l < result.lanes.size(); ++l) {
    const SimLane& lane = result.lanes[l];
    const int count = every_rank ? lane.represented_ranks : 1;
    for (int k = 0; k < count; ++k) {
      const int pid = lane.rank + k;
      pids[l].push_back(pid);
      std::string name = fmt::format("rank {}: {} stage {}", pid, lane.device_type, lane.stage);
      if (!every_rank && lane.represented_ranks > 1)
        name += fmt::format(" (for ranks {}-{})", lane.rank, lane.rank + lane.represented_ranks - 1);
      events.push_back(metadata("process_name", pid, 0, {{"name", name}}));
      events.push_back(metadata("process_sort_index", pid, 0, {{"sort_index", pid}}));
      for (SimStream s : kStreams) {
        const int tid = static_cast<int>(s);
        events.push_back(metadata("thread_name", pid, tid, {{"name", sim_stream_name(s)}}));
        events.push_back(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
      }
    }
  }
  for (const SimInterval& iv : result.intervals) {
    const double dur = (iv.end_seconds - iv.start_seconds) * 1e6;
    if (dur <= 0 && iv.stream != SimStream::SimStream_compute) continue;
    nlohmann::json args = {{"op", iv.op_index}, {"chunk", iv.chunk}};
    if (iv.micro_batch >= 0) args["micro_batch"] = iv.micro_batch;
    const std::string name = event_name(iv);
    for (int pid : pids[iv.lane])
      events.push_back({{"name", name}, {"cat", op_kind_name(iv.kind)}, {"ph", "X"}, {"ts", iv.start_seconds * 1e6},
                        {"dur", dur}, {"pid", pid}, {"tid", static_cast<int>(iv.stream)}, {"args", args}});
  }
  for (size_t l = 0; l < result.lanes.size(); ++l)
    for (const MemorySample& m : result.lanes[l].memory)
      for (int pid : pids[l])
        events.push_back({{"name", "memory"}, {"ph", "C"}, {"ts", m.seconds * 1e6}, {"pid", pid},
                          {"args", {{"GiB", m.bytes / (1024.0 * 1024.0 * 1024.0)}}}});
  int next_pid = 0;
  for (const std::vector<int>& lane_pids : pids)
    for (int pid : lane_pids) next_pid = std::max(next_pid, pid + 1);
  append_shared_links(result, next_pid, &events);
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return doc.dump();
}

void trace_save(const SimResult& result, const Plan& plan, const std::string& path, const TraceOptions& options) {
  text_file_write(path, trace_json(result, plan, options), "trace", "--trace");
}

}  // namespace alloy
