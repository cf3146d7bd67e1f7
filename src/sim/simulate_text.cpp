// The simulated step as text for people: per stage busy, bubble, communication and peak memory;
// per shared link (rack uplink, WAN port) how long it was busy and how long oversubscribed.
#include <fmt/format.h>

#include "sim/simulate.hpp"
#include "spec/units.hpp"
#include "util/table.hpp"

namespace alloy {

namespace {

std::string shared_links_table(const SimResult& result) {
  const double step = result.step_seconds > 0 ? result.step_seconds : 1;
  TextTable table({"shared link", "capacity>", "busy s>", "busy>", "contended s>"});
  for (const SimSharedLink& l : result.shared_links)
    table.add_row({l.name, units_format_bandwidth(l.bytes_per_second), fmt::format("{:.4f}", l.busy_seconds),
                   fmt::format("{:.1f}%", 100 * l.busy_seconds / step), fmt::format("{:.4f}", l.contended_seconds)});
  return table.render();
}

}  // namespace

std::string sim_render_text(const SimResult& result, const Plan& plan) {
  std::string out = fmt::format("simulated step: {:.4f} s (cost model: {:.4f} s, {:+.1f}%)\n", result.step_seconds,
                                plan.step_seconds,
                                plan.step_seconds > 0 ? 100.0 * (result.step_seconds / plan.step_seconds - 1) : 0.0);
  TextTable table({"stage", "rank", "device", "ranks>", "busy s>", "bubble>", "comm s>", "peak memory>", "at s>"});
  for (const SimLane& l : result.lanes)
    table.add_row({std::to_string(l.stage), std::to_string(l.rank), l.device_type, std::to_string(l.represented_ranks),
                   fmt::format("{:.4f}", l.busy_seconds), fmt::format("{:.1f}%", 100 * l.bubble_fraction),
                   fmt::format("{:.4f}", l.communication_seconds), units_format_bytes(l.peak_memory_bytes),
                   fmt::format("{:.4f}", l.peak_memory_seconds)});
  out += table.render();
  if (!result.shared_links.empty()) {
    out += "shared links (per direction; contended: its transfers together asked for more than it carries):\n";
    out += shared_links_table(result);
  }
  return out;
}

}  // namespace alloy
