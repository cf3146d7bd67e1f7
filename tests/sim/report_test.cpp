// The HTML report: self-contained structure, and a headless Chromium screenshot that shows the
// timeline (not blank, forward and backward colours present). Skips when Chromium is absent.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plans.hpp"
#include "sim/report.hpp"

namespace alloy {
namespace {

using testing::hand_plan;
using testing::model_with_layers;
using testing::StageSpec;

struct Reported {
  Plan plan;
  SimResult result;
};

Reported reported_plan() {
  const ClusterSpec cluster = testing::cluster("one-node", {testing::a100_80()}, {{0, 1, 8}});
  const ModelSpec model = model_with_layers(8);
  Plan plan = hand_plan(model, 8, std::vector<StageSpec>(4, StageSpec{1, 2, 0, 2, 0.01, 0.02}), 8, 2,
                        Schedule::Schedule_1f1b);
  plan.model_name = "test-gpt";
  plan.cluster_name = "one-node";
  for (PlanStage& st : plan.stages) {
    st.micro_batches_in_flight = 4;
    st.memory = {{"parameters", 20e9}, {"activations", 4 * 5e9}};
    st.memory_capacity_bytes = 80e9;
  }
  plan.runner_ups.push_back({"pp 2 (a100-80 tp1 dp4 | a100-80 tp1 dp4), 1f1b, m 8", 0.5, 1000, "bigger bubble"});
  return {plan, simulate(plan, model, cluster)};
}

TEST(Report, IsOneSelfContainedPageWithEverySection) {
  const Reported r = reported_plan();
  const std::string html = report_html(r.plan, r.result);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char* part : {"<h1>test-gpt on one-node</h1>", "class=\"gantt\"", "class=\"memory\"", "<polyline",
                           "bigger bubble", "Critical path", "forward", "backward", "send / recv", "all-reduce", "optimizer", "idle"})
    EXPECT_NE(html.find(part), std::string::npos) << part;
  EXPECT_NE(html.find(report_color(OpKind::OpKind_forward).hex), std::string::npos);
  EXPECT_NE(html.find(report_color(OpKind::OpKind_all_reduce).hex), std::string::npos);
  for (const char* external : {"<script", "src=", "href=", "@import", "url("})
    EXPECT_EQ(html.find(external), std::string::npos) << external;
  // One table row per stage plus the header.
  size_t rows = 0;
  for (size_t at = html.find("<tr>"); at != std::string::npos; at = html.find("<tr>", at + 1)) ++rows;
  size_t critical_rows = 1;
  for (size_t l = 0; l < r.result.lanes.size(); ++l)
    for (const CriticalStep& c : r.result.critical_path)
      if (c.lane == static_cast<int>(l) && c.end_seconds > c.start_seconds) {
        ++critical_rows;
        break;
      }
  EXPECT_GE(critical_rows, 2u);
  EXPECT_EQ(rows, 1 + r.plan.stages.size() + critical_rows + 1 + r.plan.runner_ups.size());
}

// RGBA pixels of an 8-bit, non-interlaced PNG (RGB or RGBA), as Chromium writes them.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgba;
};

uint32_t be32(const uint8_t* p) { return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3]; }

bool png_decode(const std::vector<uint8_t>& file, Image* out, std::string* why) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (file.size() < 8 || !std::equal(kSignature, kSignature + 8, file.begin())) return *why = "not a PNG", false;
  std::vector<uint8_t> idat;
  int channels = 0;
  for (size_t at = 8; at + 12 <= file.size();) {
    const uint32_t length = be32(&file[at]);
    const std::string type(reinterpret_cast<const char*>(&file[at + 4]), 4);
    const uint8_t* data = &file[at + 8];
    if (at + 12 + length > file.size()) return *why = "truncated chunk", false;
    if (type == "IHDR") {
      out->width = static_cast<int>(be32(data));
      out->height = static_cast<int>(be32(data + 4));
      if (data[8] != 8 || data[12] != 0) return *why = "only 8-bit non-interlaced PNGs", false;
      channels = data[9] == 6 ? 4 : data[9] == 2 ? 3 : 0;
      if (channels == 0) return *why = "only RGB and RGBA PNGs", false;
    }
    if (type == "IDAT") idat.insert(idat.end(), data, data + length);
    at += 12 + length;
  }
  const size_t stride = static_cast<size_t>(out->width) * channels;
  std::vector<uint8_t> raw((stride + 1) * out->height);
  uLongf raw_size = raw.size();
  if (uncompress(raw.data(), &raw_size, idat.data(), idat.size()) != Z_OK || raw_size != raw.size())
    return *why = "bad zlib stream", false;
  std::vector<uint8_t> prev(stride, 0), line(stride);
  out->rgba.resize(static_cast<size_t>(out->width) * out->height * 4);
  for (int y = 0; y < out->height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* src = &raw[y * (stride + 1) + 1];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(channels) ? line[i - channels] : 0;
      const int b = prev[i];
      const int c = i >= static_cast<size_t>(channels) ? prev[i - channels] : 0;
      int predictor = 0;
      if (filter == 1) predictor = a;
      if (filter == 2) predictor = b;
      if (filter == 3) predictor = (a + b) / 2;
      if (filter == 4) {
        const int p = a + b - c;
        const int pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        predictor = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      line[i] = static_cast<uint8_t>(src[i] + predictor);
    }
    for (int x = 0; x < out->width; ++x)
      for (int k = 0; k < 4; ++k)
        out->rgba[(static_cast<size_t>(y) * out->width + x) * 4 + k] = k < channels ? line[x * channels + k] : 255;
    prev = line;
  }
  return true;
}

int count_color(const Image& img, const char* hex, int tolerance) {
  const unsigned long value = std::strtoul(hex + 1, nullptr, 16);
  const int r = (value >> 16) & 255, g = (value >> 8) & 255, b = value & 255;
  int n = 0;
  for (size_t i = 0; i + 3 < img.rgba.size(); i += 4)
    n += std::abs(img.rgba[i] - r) <= tolerance && std::abs(img.rgba[i + 1] - g) <= tolerance &&
         std::abs(img.rgba[i + 2] - b) <= tolerance;
  return n;
}

TEST(Report, RendersInHeadlessChromiumWithTheTimelineVisible) {
  const char* chromium = "/usr/bin/chromium";
  if (!std::filesystem::exists(chromium)) GTEST_SKIP() << "chromium is not installed (apt-get install -y chromium)";
  const Reported r = reported_plan();
  char dir_template[] = "/tmp/alloy-report-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::filesystem::path dir(dir_template);
  const std::string html_path = (dir / "report.html").string();
  const std::string png_path = (dir / "shot.png").string();
  report_save(r.plan, r.result, html_path);
  const std::string command = std::string("timeout 120 ") + chromium +
                              " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                              " --disable-background-networking --disable-component-update --disable-sync"
                              " --user-data-dir=" + (dir / "profile").string() + " --screenshot=" + png_path +
                              " --window-size=1400,900 file://" + html_path + " > " + (dir / "chromium.log").string() +
                              " 2>&1";
  const int rc = std::system(command.c_str());
  ASSERT_EQ(rc, 0) << "chromium failed; see " << (dir / "chromium.log").string();
  std::ifstream in(png_path, std::ios::binary);
  ASSERT_TRUE(in) << "no screenshot written";
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Image img;
  std::string why;
  ASSERT_TRUE(png_decode(file, &img, &why)) << why;
  EXPECT_EQ(img.width, 1400);
  EXPECT_EQ(img.height, 900);
  const int total = img.width * img.height;
  const int white = count_color(img, "#ffffff", 3);
  EXPECT_LT(white, total * 0.95) << "the screenshot is (nearly) blank";
  const int forward = count_color(img, report_color(OpKind::OpKind_forward).hex, 6);
  const int backward = count_color(img, report_color(OpKind::OpKind_backward).hex, 6);
  const int idle = count_color(img, report_idle_color().hex, 3);
  EXPECT_GT(forward, 2000) << "forward colour missing from the rendered timeline";
  EXPECT_GT(backward, 2000) << "backward colour missing from the rendered timeline";
  EXPECT_GT(backward, forward) << "backward takes twice the forward time in this plan";
  EXPECT_GT(idle, 500) << "pipeline bubbles should show as idle";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace alloy
