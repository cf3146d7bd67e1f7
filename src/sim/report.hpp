// The HTML report of a plan: one self-contained page with the plan table, a Gantt timeline of
// the simulated step (inline SVG, coloured by operation kind, with the transfers on each rack
// uplink and WAN port under the stages), memory over time and runner-ups.
#pragma once

#include <string>

#include "plan/plan.hpp"
#include "sim/simulate.hpp"

namespace alloy {

// Colours of the timeline, also used by tests that look for them in a rendered screenshot.
struct ReportColor {
  const char* name;  // legend label
  const char* hex;   // "#rrggbb"
};
ReportColor report_color(OpKind kind);
ReportColor report_idle_color();
// Under a rack uplink's or WAN port's transfers: where together they asked for more than it carries.
ReportColor report_contended_color();

struct ReportOptions {
  std::string title;      // default: "<model> on <cluster>"
  int max_gantt_lanes = 64;  // stages beyond this are left out of the timeline (said on the page)
};

// A complete HTML document; no scripts, fonts or files from outside.
std::string report_html(const Plan& plan, const SimResult& result, const ReportOptions& options = {});
// Writes report_html to `path`; throws alloy::Error when the file cannot be written.
void report_save(const Plan& plan, const SimResult& result, const std::string& path, const ReportOptions& options = {});

}  // namespace alloy
