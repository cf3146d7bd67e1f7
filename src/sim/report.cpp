// HTML report rendering: tables as HTML, the timeline (stages, then the shared links) and the
// memory chart as inline SVG.
#include "sim/report.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "spec/error.hpp"
#include "spec/text_file.hpp"
#include "spec/units.hpp"

namespace alloy {

namespace {

constexpr double kChartLeftPx = 190;
constexpr double kChartWidthPx = 1150;
constexpr double kComputeRowPx = 20;
constexpr double kCommRowPx = 10;
constexpr double kLaneGapPx = 8;
constexpr double kAxisPx = 24;
constexpr double kLinkRowPx = 7;      // one row of a shared link's transfers
constexpr double kLinkLoadPx = 4;     // the strip marking where the link is oversubscribed
constexpr size_t kMaxLinkRows = 6;    // more overlapping transfers share the last row
constexpr const char* kLanePalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string time_label(double seconds, double span_seconds) {
  if (span_seconds >= 2.0) return fmt::format("{:.2f} s", seconds);
  return fmt::format("{:.1f} ms", seconds * 1e3);
}

// A round tick step giving about `count` ticks over `span`.
double tick_step(double span, int count) {
  const double raw = span / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * magnitude >= raw) return f * magnitude;
  return 10 * magnitude;
}

std::string time_axis(double step_seconds, double y_px, double height_px) {
  std::string svg;
  const double step = tick_step(step_seconds, 8);
  for (double t = 0; t <= step_seconds * 1.0001; t += step) {
    const double x = kChartLeftPx + t / step_seconds * kChartWidthPx;
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"0\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>", x, x, height_px);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\">{}</text>", x,
                       y_px + 14, time_label(t, step_seconds));
  }
  return svg;
}

std::string summary(const Plan& plan, const SimResult& result) {
  double worst_bubble = 0;
  for (const SimLane& l : result.lanes) worst_bubble = std::max(worst_bubble, l.bubble_fraction);
  const double tokens = static_cast<double>(plan.global_batch_sequences) * static_cast<double>(plan.seq_len);
  std::string html = "<p class=\"summary\">";
  html += fmt::format("Simulated step <b>{}</b> (cost model {}); ", units_format_seconds(result.step_seconds),
                      units_format_seconds(plan.step_seconds));
  html += fmt::format("{:.0f} tokens/s; ", result.step_seconds > 0 ? tokens / result.step_seconds : 0.0);
  html += fmt::format("{} schedule, {} micro-batches of {} sequences; ", schedule_name(plan.schedule),
                      plan.num_micro_batches, plan.micro_batch_sequences);
  html += fmt::format("largest bubble {:.1f}%; {} devices in {} stages.</p>\n", 100 * worst_bubble,
                      plan.num_used_devices(), plan.stages.size());
  return html;
}

// `shared_links`: the timeline shows rack uplinks and WAN ports under the stages.
std::string legend(bool shared_links) {
  std::string html = "<div class=\"legend\">";
  const OpKind kinds[] = {OpKind::OpKind_forward, OpKind::OpKind_backward, OpKind::OpKind_send_activation,
                          OpKind::OpKind_all_reduce, OpKind::OpKind_optimizer, OpKind::OpKind_prefetch};
  std::vector<ReportColor> colors;
  for (OpKind k : kinds) colors.push_back(report_color(k));
  colors.push_back(report_idle_color());
  if (shared_links) colors.push_back(report_contended_color());
  for (const ReportColor& c : colors)
    html += fmt::format("<span><i style=\"background:{}\"></i>{}</span>", c.hex, c.name);
  return html + "</div>\n";
}

// The transfers `rows` (from timeline_link_rows) of one shared link, from `y`: one thin row each,
// and under them a strip where they asked for more than the link carries.
std::string link_rows_svg(const SimResult& result, int link, const std::vector<std::vector<int>>& rows, double y,
                          double step) {
  const SimSharedLink& l = result.shared_links[static_cast<size_t>(link)];
  std::string svg = fmt::format("<text x=\"4\" y=\"{:.1f}\" font-size=\"11\">{}</text>", y + 9, html_escape(l.name));
  for (size_t row = 0; row < rows.size(); ++row)
    for (int index : rows[row]) {
      const SimInterval& iv = result.intervals[static_cast<size_t>(index)];
      if (iv.end_seconds <= iv.start_seconds) continue;
      const double x = kChartLeftPx + iv.start_seconds / step * kChartWidthPx;
      const double w = std::max(0.6, (iv.end_seconds - iv.start_seconds) / step * kChartWidthPx);
      const double row_y = y + static_cast<double>(std::min(row, kMaxLinkRows - 1)) * kLinkRowPx;
      svg += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\"><title>stage {} {}: {} to {}"
          "</title></rect>",
          x, row_y, w, kLinkRowPx - 1, report_color(iv.kind).hex, result.lanes[static_cast<size_t>(iv.lane)].stage,
          op_kind_name(iv.kind), time_label(iv.start_seconds, step), time_label(iv.end_seconds, step));
    }
  const double strip_y = y + static_cast<double>(std::min(rows.size(), kMaxLinkRows)) * kLinkRowPx;
  const std::vector<LinkLoadSample> load = timeline_link_load(result, link);
  for (size_t i = 0; i + 1 < load.size(); ++i) {
    if (load[i].share <= 1 + 1e-9) continue;
    const double x = kChartLeftPx + load[i].seconds / step * kChartWidthPx;
    const double w = std::max(0.6, (load[i + 1].seconds - load[i].seconds) / step * kChartWidthPx);
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\"><title>asked for {:.2f}x what {} "
        "carries</title></rect>",
        x, strip_y, w, kLinkLoadPx, report_contended_color().hex, load[i].share, html_escape(l.name));
  }
  return svg;
}

double link_rows_height(const std::vector<std::vector<int>>& rows) {
  return static_cast<double>(std::min(rows.size(), kMaxLinkRows)) * kLinkRowPx + kLinkLoadPx + kLaneGapPx;
}

std::string gantt(const SimResult& result, const ReportOptions& options) {
  const int lanes = std::min(static_cast<int>(result.lanes.size()), options.max_gantt_lanes);
  const double lane_px = kComputeRowPx + kCommRowPx + kLaneGapPx;
  // Below the stages, each shared link that something crossed.
  std::vector<std::pair<int, std::vector<std::vector<int>>>> links;
  double links_px = 0;
  for (size_t l = 0; l < result.shared_links.size(); ++l) {
    std::vector<std::vector<int>> rows = timeline_link_rows(result, static_cast<int>(l));
    if (rows.empty()) continue;
    links_px += link_rows_height(rows);
    links.emplace_back(static_cast<int>(l), std::move(rows));
  }
  const double height = lanes * lane_px + links_px + kAxisPx;
  const double step = result.step_seconds > 0 ? result.step_seconds : 1;
  std::string svg = fmt::format("<svg class=\"gantt\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\">",
                                kChartLeftPx + kChartWidthPx + 10, height, kChartLeftPx + kChartWidthPx + 10, height);
  svg += time_axis(step, lanes * lane_px + links_px, lanes * lane_px + links_px);
  for (int l = 0; l < lanes; ++l) {
    const SimLane& lane = result.lanes[l];
    const double y = l * lane_px;
    svg += fmt::format("<text x=\"4\" y=\"{:.1f}\" font-size=\"12\">stage {} {} (rank {})</text>", y + 14, lane.stage,
                       html_escape(lane.device_type), lane.rank);
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>", kChartLeftPx, y,
                       kChartWidthPx, kComputeRowPx, report_idle_color().hex);
  }
  for (const SimInterval& iv : result.intervals) {
    if (iv.lane >= lanes || iv.stream == SimStream::SimStream_recv) continue;
    const bool compute = iv.stream == SimStream::SimStream_compute;
    const double x = kChartLeftPx + iv.start_seconds / step * kChartWidthPx;
    const double w = std::max(0.6, (iv.end_seconds - iv.start_seconds) / step * kChartWidthPx);
    if (iv.end_seconds <= iv.start_seconds && !compute) continue;
    const double y = iv.lane * lane_px + (compute ? 0 : kComputeRowPx + 1);
    const std::string mb = iv.micro_batch >= 0 ? fmt::format(" mb {}", iv.micro_batch) : "";
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\"><title>{}{} chunk {}: {} to "
        "{}</title></rect>",
        x, y, w, compute ? kComputeRowPx : kCommRowPx - 2, report_color(iv.kind).hex, op_kind_name(iv.kind), mb,
        iv.chunk, time_label(iv.start_seconds, step), time_label(iv.end_seconds, step));
  }
  double y = lanes * lane_px;
  for (const auto& [link, rows] : links) {
    svg += link_rows_svg(result, link, rows, y, step);
    y += link_rows_height(rows);
  }
  svg += "</svg>\n";
  if (lanes < static_cast<int>(result.lanes.size()))
    svg += fmt::format("<p>Timeline shows the first {} of {} stages.</p>\n", lanes, result.lanes.size());
  return svg;
}

std::string memory_chart(const Plan& plan, const SimResult& result) {
  const double height = 220;
  double top = 1;
  for (const SimLane& l : result.lanes) top = std::max(top, l.peak_memory_bytes);
  for (const PlanStage& st : plan.stages) top = std::max(top, st.memory_capacity_bytes);
  top *= 1.05;
  const double step = result.step_seconds > 0 ? result.step_seconds : 1;
  // Shifted down a little so the top axis label is not clipped.
  std::string svg = fmt::format("<svg class=\"memory\" width=\"{:.0f}\" height=\"{:.0f}\"><g transform=\"translate(0,10)\">",
                                kChartLeftPx + kChartWidthPx + 10, height + kAxisPx + 10);
  svg += time_axis(step, height, height);
  for (int i = 0; i <= 4; ++i) {
    const double y = height - i / 4.0 * height;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>", kChartLeftPx - 6,
                       y + 4, units_format_bytes(top * i / 4.0));
  }
  auto px = [&](double seconds, double bytes) {
    return fmt::format("{:.1f},{:.1f} ", kChartLeftPx + seconds / step * kChartWidthPx, height - bytes / top * height);
  };
  for (size_t l = 0; l < result.lanes.size(); ++l) {
    const SimLane& lane = result.lanes[l];
    const char* color = kLanePalette[l % std::size(kLanePalette)];
    const double capacity = plan.stages[lane.stage].memory_capacity_bytes;
    if (capacity > 0)
      svg += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-dasharray=\"4 3\"/>",
                         kChartLeftPx, kChartLeftPx + kChartWidthPx, height - capacity / top * height,
                         height - capacity / top * height, color);
    std::string points;
    double previous = lane.memory.empty() ? 0 : lane.memory.front().bytes;
    for (const MemorySample& m : lane.memory) {
      points += px(m.seconds, previous);
      points += px(m.seconds, m.bytes);
      previous = m.bytes;
    }
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"><title>stage {} (rank {}): "
                       "peak {} at {}</title></polyline>",
                       color, points, lane.stage, lane.rank, units_format_bytes(lane.peak_memory_bytes),
                       time_label(lane.peak_memory_seconds, step));
  }
  svg += "</g></svg>\n<div class=\"legend\">";
  for (size_t l = 0; l < result.lanes.size(); ++l)
    svg += fmt::format("<span><i style=\"background:{}\"></i>stage {}</span>", kLanePalette[l % std::size(kLanePalette)],
                       result.lanes[l].stage);
  return svg + " (dashed: capacity)</div>\n";
}

std::string plan_table(const Plan& plan, const SimResult& result) {
  std::string html =
      "<table><tr><th>stage</th><th>device</th><th>devices</th><th>tp</th><th>dp</th><th>ZeRO</th><th>layers</th>"
      "<th>recompute</th><th>offloaded</th><th>forward / mb</th><th>backward / mb</th><th>busy</th><th>bubble</th>"
      "<th>peak memory</th><th>capacity</th></tr>\n";
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& st = plan.stages[s];
    std::string layers;
    for (const LayerRange& r : st.chunks) layers += fmt::format("{}[{}, {})", layers.empty() ? "" : " ", r.begin, r.end);
    int recomputed = 0, offloaded = 0;
    for (Recompute r : st.recompute) recomputed += r != Recompute::Recompute_none;
    for (bool o : st.offload) offloaded += o;
    const SimLane* lane = s < result.lanes.size() ? &result.lanes[s] : nullptr;
    html += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} of {}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
        s, html_escape(st.device_type), st.device_ids.size(), st.tp, st.dp, st.zero, layers, recomputed, st.num_blocks(),
        offloaded, units_format_seconds(st.forward_seconds), units_format_seconds(st.backward_seconds),
        lane ? units_format_seconds(lane->busy_seconds) : "-",
        lane ? fmt::format("{:.1f}%", 100 * lane->bubble_fraction) : "-",
        lane ? units_format_bytes(lane->peak_memory_bytes) : "-", units_format_bytes(st.memory_capacity_bytes));
  }
  return html + "</table>\n";
}

// Where the step's longest dependency chain spends its time, per stage and kind of work.
std::string critical_path(const SimResult& result) {
  if (result.critical_path.empty()) return "";
  std::vector<double> compute(result.lanes.size(), 0), communication(result.lanes.size(), 0);
  for (const CriticalStep& c : result.critical_path) {
    const double span = c.end_seconds - c.start_seconds;
    (op_kind_is_compute(c.kind) ? compute : communication)[c.lane] += span;
  }
  const double step = result.step_seconds > 0 ? result.step_seconds : 1;
  std::string html = fmt::format("<p>{} operations long. Share of the step per stage:</p>\n", result.critical_path.size());
  html += "<table><tr><th>stage</th><th>device</th><th>compute</th><th>communication</th></tr>\n";
  for (size_t l = 0; l < result.lanes.size(); ++l) {
    if (compute[l] + communication[l] <= 0) continue;
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.1f}%</td><td>{:.1f}%</td></tr>\n", result.lanes[l].stage,
                        html_escape(result.lanes[l].device_type), 100 * compute[l] / step,
                        100 * communication[l] / step);
  }
  return html + "</table>\n";
}

std::string runner_ups(const Plan& plan) {
  if (plan.runner_ups.empty()) return "<p>No runner-ups were kept for this plan.</p>\n";
  std::string html = "<table><tr><th>layout</th><th>step</th><th>tokens/s</th><th>why it lost</th></tr>\n";
  for (const RunnerUp& r : plan.runner_ups)
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.0f}</td><td>{}</td></tr>\n", html_escape(r.shape),
                        units_format_seconds(r.step_seconds), r.tokens_per_second, html_escape(r.reason));
  return html + "</table>\n";
}

}  // namespace

ReportColor report_color(OpKind kind) {
  switch (kind) {
    case OpKind::OpKind_forward: return {"forward", "#3b78c2"};
    case OpKind::OpKind_backward: return {"backward", "#f08a24"};
    case OpKind::OpKind_send_activation:
    case OpKind::OpKind_recv_activation:
    case OpKind::OpKind_send_gradient:
    case OpKind::OpKind_recv_gradient: return {"send / recv", "#3ea34a"};
    case OpKind::OpKind_all_reduce:
    case OpKind::OpKind_reduce_scatter:
    case OpKind::OpKind_all_gather: return {"all-reduce / gather", "#9b59b6"};
    case OpKind::OpKind_optimizer: return {"optimizer", "#d62f2f"};
    case OpKind::OpKind_prefetch:
    case OpKind::OpKind_evict: return {"offload copy", "#17a2a8"};
  }
  return {"?", "#000000"};
}

ReportColor report_idle_color() { return {"idle", "#e4e4e4"}; }
ReportColor report_contended_color() { return {"shared link oversubscribed", "#e0245e"}; }

std::string report_html(const Plan& plan, const SimResult& result, const ReportOptions& options) {
  const std::string title =
      options.title.empty() ? fmt::format("{} on {}", plan.model_name, plan.cluster_name) : options.title;
  std::string html = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html_escape(title) + "</title>\n";
  html +=
      "<style>body{font-family:sans-serif;margin:12px;color:#222}h1{font-size:20px;margin:4px 0}"
      "h2{font-size:16px;margin:14px 0 4px}.summary{margin:4px 0}"
      ".legend span{margin-right:14px;font-size:12px}.legend i{display:inline-block;width:12px;height:12px;"
      "margin-right:4px;vertical-align:middle}table{border-collapse:collapse;font-size:12px}"
      "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#f4f4f4}</style>\n</head><body>\n";
  html += "<h1>" + html_escape(title) + "</h1>\n";
  html += summary(plan, result);
  html += "<h2>Timeline of one step</h2>\n" + legend(!result.shared_links.empty()) + gantt(result, options);
  html += "<h2>Plan</h2>\n" + plan_table(plan, result);
  html += "<h2>Memory per device over the step</h2>\n" + memory_chart(plan, result);
  html += "<h2>Critical path</h2>\n" + critical_path(result);
  html += "<h2>Runner-ups</h2>\n" + runner_ups(plan);
  if (!plan.notes.empty()) {
    html += "<h2>Notes</h2>\n<ul>";
    for (const std::string& n : plan.notes) html += "<li>" + html_escape(n) + "</li>";
    html += "</ul>\n";
  }
  return html + "</body></html>\n";
}

void report_save(const Plan& plan, const SimResult& result, const std::string& path, const ReportOptions& options) {
  text_file_write(path, report_html(plan, result, options), "report");
}

}  // namespace alloy
