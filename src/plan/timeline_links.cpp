// Shared links on the timeline: which intervals crossed a link, laid out in rows without
// overlap, and the link's load over time, for the trace and the report.
#include <algorithm>
#include <tuple>

#include "plan/timeline.hpp"

namespace alloy {

namespace {

// (interval index, share) of every interval that crossed `link`, in start order.
std::vector<std::pair<int, double>> timeline_link_crossings(const SimResult& result, int link) {
  std::vector<std::pair<int, double>> out;
  for (size_t i = 0; i < result.intervals.size(); ++i) {
    const SimInterval& iv = result.intervals[i];
    for (int u = iv.first_link_use; u < iv.first_link_use + iv.num_link_uses; ++u)
      if (result.link_uses[static_cast<size_t>(u)].link == link)
        out.emplace_back(static_cast<int>(i), result.link_uses[static_cast<size_t>(u)].share);
  }
  std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
    return result.intervals[static_cast<size_t>(a.first)].start_seconds <
           result.intervals[static_cast<size_t>(b.first)].start_seconds;
  });
  return out;
}

}  // namespace

std::vector<std::vector<int>> timeline_link_rows(const SimResult& result, int link) {
  std::vector<std::vector<int>> rows;
  std::vector<double> row_free_at;
  for (const auto& [index, share] : timeline_link_crossings(result, link)) {
    const SimInterval& iv = result.intervals[static_cast<size_t>(index)];
    size_t row = 0;
    while (row < rows.size() && row_free_at[row] > iv.start_seconds) ++row;
    if (row == rows.size()) {
      rows.emplace_back();
      row_free_at.push_back(0);
    }
    rows[row].push_back(index);
    row_free_at[row] = iv.end_seconds;
  }
  return rows;
}

std::vector<LinkLoadSample> timeline_load_of_spans(std::vector<LinkSpan> spans) {
  std::vector<std::tuple<double, int, double>> changes;  // (seconds, transfers added, share added)
  for (const LinkSpan& span : spans) {
    if (span.end_seconds <= span.start_seconds) continue;  // takes no time on the link
    changes.emplace_back(span.start_seconds, 1, span.share);
    changes.emplace_back(span.end_seconds, -1, -span.share);
  }
  // Ends before starts at one instant: a link handed from one transfer to the next is not shared.
  std::sort(changes.begin(), changes.end());
  std::vector<LinkLoadSample> samples{{0, 0}};
  int active = 0;
  double load = 0;
  for (const auto& [seconds, transfers, share] : changes) {
    active += transfers;
    load = active > 0 ? load + share : 0;  // no rounding left behind once idle
    if (samples.back().seconds == seconds) samples.back().share = load;
    else samples.push_back({seconds, load});
  }
  return samples;
}

std::vector<LinkLoadSample> timeline_link_load(const SimResult& result, int link) {
  std::vector<LinkSpan> spans;
  for (const auto& [index, share] : timeline_link_crossings(result, link)) {
    const SimInterval& iv = result.intervals[static_cast<size_t>(index)];
    spans.push_back({iv.start_seconds, iv.end_seconds, share});
  }
  return timeline_load_of_spans(std::move(spans));
}

}  // namespace alloy
