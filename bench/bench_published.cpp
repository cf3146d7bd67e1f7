// Alloy's un-profiled predictions against published, measured training throughputs
// (bench/published/throughputs.yaml). Each row whose model shape, devices and layout are stated
// is planned with every stated choice pinned, on a cluster of the row's devices and a network of
// their generation; prints the published figure, the prediction and the error, then the median
// and worst |error| over the rows compared; the same for per-device memory where the source
// states it; and for every other row why it was not compared (what the source leaves out, what
// Alloy does not model, or, for a layout Alloy's memory model does not fit, the memory it needs
// and its largest terms).
//
// Errors are of speed: predicted over published throughput, less 1 (a step time's ratio is
// inverted), so + means Alloy is optimistic. Rows alternate, per source in table order, between
// the fit set (1st, 3rd, ...) and the held-out set; the summary gives both.
//
// A row that names the framework it ran on (`framework: torchtitan-eager`) is priced with that
// framework's runtime traits (cost/runtime_traits.hpp); the others with Alloy's GPU runtime's.
//
// Usage: bench_published [--table path/to/throughputs.yaml] [--row ID] [--fit]
// --row prints that row's plan (stages, step time by part, memory) after the comparison.
// --fit scans each device generation's matmul_efficiency on the fit rows (the value that
// minimises their mean |log speed ratio|) and prints it beside the catalog's; fp8 rows form a
// generation of their own ("H100/H200 fp8"), whose scan is of matmul_efficiency_fp8.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "cost/runtime_traits.hpp"
#include "hw/catalog.hpp"
#include "search/planner.hpp"
#include "spec/error.hpp"
#include "spec/text.hpp"
#include "spec/units.hpp"

namespace {

using namespace alloy;

// A row that cannot be compared: why.
struct Skip {
  std::string reason;
};

struct Compared {
  std::string metric;
  double published = 0;
  double predicted = 0;
  std::string assumed;  // what the bench filled in that the source does not state
  double memory_published_gib = 0;  // 0: not stated
  double memory_predicted_gib = 0;  // the plan's largest per-device total less the runtime's context
  std::string generation;
  std::string device_type;  // the catalog type the row's devices were taken as
  Plan plan;
  bool lower_is_faster = false;  // a time, not a rate
  // Predicted over published speed, less 1.
  double error() const { return lower_is_faster ? published / predicted - 1 : predicted / published - 1; }
  double memory_error() const { return memory_predicted_gib / memory_published_gib - 1; }
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The largest per-device memory of the plan's stages, and that stage's two largest terms.
std::pair<double, std::string> plan_peak_memory(const Plan& plan) {
  const PlanStage* largest = &plan.stages.front();
  for (const PlanStage& st : plan.stages)
    if (st.memory_total_bytes() > largest->memory_total_bytes()) largest = &st;
  std::vector<MemoryTerm> terms = largest->memory;
  std::sort(terms.begin(), terms.end(), [](const MemoryTerm& a, const MemoryTerm& b) { return a.bytes > b.bytes; });
  std::string top;
  for (size_t i = 0; i < std::min<size_t>(2, terms.size()); ++i)
    top += fmt::format("{}{} {:.1f} GiB", i > 0 ? ", " : "", terms[i].name, terms[i].bytes / kGiB);
  return {largest->memory_total_bytes(), top};
}

// The largest per-device memory a framework's allocator holds under the plan: its total less the
// runtime's context (the CUDA context), which the published figures leave out (PyTorch's peak
// reserved memory, Alloy's arena peak).
double plan_allocator_peak_bytes(const Plan& plan) {
  double peak = 0;
  for (const PlanStage& st : plan.stages) {
    double context = 0;
    for (const MemoryTerm& t : st.memory)
      if (t.name == "framework_context") context += t.bytes;
    peak = std::max(peak, st.memory_total_bytes() - context);
  }
  return peak;
}

std::optional<double> number(const YAML::Node& map, const char* key) {
  if (!map || !map[key]) return std::nullopt;
  const std::string text = map[key].as<std::string>();
  // MegaScale prints aggregate rates as "39.3k".
  const double scale = text.ends_with("k") ? 1e3 : text.ends_with("M") ? 1e6 : 1.0;
  try {
    return std::stod(scale == 1.0 ? text : text.substr(0, text.size() - 1)) * scale;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The catalog type of a device as the sources name it, and the network of a node of its
// generation (per node, both directions each: DGX A100 8 x 200 Gb/s HDR, DGX H100 8 x 400 Gb/s
// NDR, DGX-2H 8 x 100 Gb/s EDR, Frontier 4 x 200 Gb/s Slingshot).
struct DeviceChoice {
  std::string type;
  std::string network;
  std::string assumed;
  std::string generation;  // devices that share one calibrated matmul efficiency
};

std::optional<DeviceChoice> device_choice(const std::string& published) {
  const std::string d = text_lower(published);
  if (d == "nvidia-ampere") return DeviceChoice{"a100-80gb-sxm", "1600Gb/s", "device: A100 80GB taken for \"Ampere\"", "A100"};
  if (d.starts_with("a100-80")) return DeviceChoice{"a100-80gb-sxm", "1600Gb/s", "", "A100"};
  if (d.starts_with("a100-40")) return DeviceChoice{"a100-40gb-sxm", "1600Gb/s", "", "A100"};
  if (d == "h100-96gb-hbm2e-500w") return DeviceChoice{d, "3200Gb/s", "", "H100 500 W"};
  if (d.starts_with("h100")) return DeviceChoice{"h100-sxm", "3200Gb/s", "", "H100/H200"};
  if (d.starts_with("h200")) return DeviceChoice{"h200-sxm", "3200Gb/s", "", "H100/H200"};
  if (d.starts_with("v100-32")) return DeviceChoice{"v100-32gb", "800Gb/s", "", "V100"};
  if (d.starts_with("mi250x")) return DeviceChoice{"mi250x", "800Gb/s", "", "MI250X"};
  return std::nullopt;
}

ModelSpec row_model(const YAML::Node& m, std::string* assumed) {
  ModelSpec spec;
  spec.name = m["name"].as<std::string>();
  const std::string lower = text_lower(spec.name);
  const bool llama = lower.find("llama") != std::string::npos;
  for (const char* key : {"layers", "hidden_size", "heads", "seq_len"})
    if (!m[key]) throw Skip{fmt::format("model {} not stated", key)};
  spec.family = llama ? ModelFamily::ModelFamily_llama : ModelFamily::ModelFamily_gpt2;
  spec.model_type = llama ? "llama" : "gpt2";
  spec.num_layers = m["layers"].as<int64_t>();
  spec.hidden_size = m["hidden_size"].as<int64_t>();
  spec.num_heads = m["heads"].as<int64_t>();
  spec.num_kv_heads = m["kv_heads"] ? m["kv_heads"].as<int64_t>() : spec.num_heads;
  spec.head_dim = spec.hidden_size / spec.num_heads;
  spec.max_seq_len = m["seq_len"].as<int64_t>();
  if (m["ffn_hidden_size"]) {
    spec.ffn_hidden_size = m["ffn_hidden_size"].as<int64_t>();
  } else if (llama) {
    throw Skip{"model ffn_hidden_size not stated"};
  } else {
    spec.ffn_hidden_size = 4 * spec.hidden_size;
  }
  if (m["vocab_size"]) {
    spec.vocab_size = m["vocab_size"].as<int64_t>();
  } else if (llama) {
    throw Skip{"model vocab_size not stated"};
  } else {
    spec.vocab_size = 51200;
    *assumed += "vocab 51200 (Megatron's padded GPT-2); ";
  }
  spec.tied_embeddings = !llama;
  spec.qkv_bias = spec.linear_bias = spec.norm_bias = !llama;
  return spec;
}

// The published figure the row is compared on, most direct first, and Alloy's prediction of it.
Compared compare(const YAML::Node& measured, const Plan& plan, const ModelSpec& model, int devices) {
  const double tokens = plan.tokens_per_second;
  const double model_tflops = tokens * model_flops_per_token(model, plan.seq_len).training / devices / 1e12;
  const std::pair<const char*, double> metrics[] = {
      {"seconds_per_iteration", plan.step_seconds},
      {"tokens_per_second", tokens},
      {"tokens_per_second_per_gpu", tokens / devices},
      {"samples_per_second", tokens / static_cast<double>(plan.seq_len)},
      {"tflops_per_gpu", model_tflops},
      {"model_tflops_per_gpu", model_tflops},
      {"mfu", plan.mfu},
  };
  for (const auto& [key, predicted] : metrics)
    if (const std::optional<double> published = number(measured, key)) {
      Compared c;
      c.metric = key;
      c.lower_is_faster = std::string(key) == "seconds_per_iteration";
      c.published = *published;
      c.predicted = predicted;
      return c;
    }
  throw Skip{"no step time, throughput or MFU published"};
}

// Plans the row with its stated choices pinned; throws Skip when the row cannot be planned.
// The ZeRO stage of a sharding mode as the sources name it: FSDP's full sharding is ZeRO 3,
// "optimizer states and gradients sharded" ZeRO 2, DeepSpeed's BF16 optimizer ZeRO 1, DDP 0.
int zero_stage_of(const std::string& published) {
  const std::string zero = text_lower(published);
  if (zero.find("offload") != std::string::npos) throw Skip{"ZeRO with CPU offload of the optimizer (not in Alloy)"};
  if (zero.starts_with("none")) return 0;
  if (zero.find("zero-1") != std::string::npos) return 1;
  if (zero.find("gradients sharded") != std::string::npos) return 2;
  if (zero.find("fsdp") != std::string::npos || zero.find("zero-3") != std::string::npos) return 3;
  throw Skip{"ZeRO stage not recognised: " + published};
}

// Each device generation's matmul_efficiency (an fp8 generation's matmul_efficiency_fp8) where it
// replaces the catalog's.
using Efficiencies = std::map<std::string, double>;

Compared row_compare(const YAML::Node& row, const DeviceCatalog& catalog, const Efficiencies& efficiencies) {
  std::string assumed;
  const YAML::Node hardware = row["hardware"], layout = row["layout"], batch = row["batch"], measured = row["measured"];
  if (!row["model"]) throw Skip{"model not stated"};
  const ModelSpec model = row_model(row["model"], &assumed);
  if (!hardware || !hardware["num_devices"]) throw Skip{"device count not stated"};
  const std::optional<DeviceChoice> device = device_choice(hardware["device"].as<std::string>());
  if (!device) throw Skip{fmt::format("device {} not in Alloy's catalog", hardware["device"].as<std::string>())};
  if (!device->assumed.empty()) assumed += device->assumed + "; ";
  if (!layout) throw Skip{"layout not stated"};
  if (layout["cp"] && layout["cp"].as<int>() > 1) throw Skip{"context parallelism (Alloy has none)"};
  const int devices = hardware["num_devices"].as<int>();
  const std::string network =
      hardware["network_per_node"] ? hardware["network_per_node"].as<std::string>() : device->network;
  const int per_node = hardware["devices_per_node"] ? hardware["devices_per_node"].as<int>() : 8;
  SearchOptions o;
  // A degree left out is 1 when the stated ones already use every device; dp fills the rest.
  const auto degree = [&](const char* key) { return layout[key] ? layout[key].as<int>() : 0; };
  o.tp = degree("tp");
  o.pp = degree("pp");
  o.dp = degree("dp");
  const int stated = std::max(1, o.tp) * std::max(1, o.pp) * std::max(1, o.dp);
  if (o.dp == 0 && o.tp > 0 && o.pp > 0) o.dp = devices / stated;
  if (stated == devices) {
    o.tp = std::max(1, o.tp);
    o.pp = std::max(1, o.pp);
    o.dp = std::max(1, o.dp);
  }
  if (o.tp == 0 || o.pp == 0 || o.dp == 0) throw Skip{"tensor or pipeline degree not stated"};
  if (o.tp * o.pp * o.dp != devices) throw Skip{"tp x pp x dp is not the device count"};
  if (layout["zero"]) {
    o.zero = zero_stage_of(layout["zero"].as<std::string>());
  } else {
    assumed += "ZeRO stage chosen by Alloy; ";
  }
  // The global batch: stated, or the tokens of a step over the sequence length.
  int64_t global = batch && batch["global_batch"] ? batch["global_batch"].as<int64_t>() : 0;
  if (global == 0 && number(measured, "tokens_per_batch"))
    global = static_cast<int64_t>(std::llround(*number(measured, "tokens_per_batch") / model.max_seq_len));
  if (global == 0 && number(measured, "tokens_per_second") && number(measured, "seconds_per_iteration")) {
    global = static_cast<int64_t>(std::llround(*number(measured, "tokens_per_second") *
                                               *number(measured, "seconds_per_iteration") / model.max_seq_len));
    assumed += fmt::format("global batch {} from tokens/s x s/iteration; ", global);
  }
  if (global == 0) throw Skip{"global batch not stated"};
  const int64_t micro = batch && batch["micro_batch"] ? batch["micro_batch"].as<int64_t>() : 1;
  if (!(batch && batch["micro_batch"])) assumed += "micro-batch 1; ";
  o.micro_batch_sequences = micro * o.dp;
  if (global % o.micro_batch_sequences != 0) throw Skip{"the global batch does not divide into micro-batches"};
  o.num_micro_batches = static_cast<int>(global / o.micro_batch_sequences);
  if (layout["virtual_pipeline"] && layout["virtual_pipeline"].as<int>() > 1) {
    o.schedule = Schedule::Schedule_interleaved;
    o.virtual_chunks = layout["virtual_pipeline"].as<int>();
  } else if (layout["schedule"] && layout["schedule"].as<std::string>() == "interleaved") {
    o.schedule = Schedule::Schedule_interleaved;
    assumed += "virtual stages chosen by Alloy; ";
  } else {
    o.schedule = Schedule::Schedule_1f1b;
  }
  if (layout["sequence_parallel"]) {
    o.sequence_parallel = layout["sequence_parallel"].as<bool>();
  } else if (o.tp > 1) {
    assumed += "sequence parallelism chosen by Alloy; ";
  }
  if (layout["recompute"]) {
    const std::string level = layout["recompute"].as<std::string>();
    o.recompute = level == "full" ? Recompute::Recompute_full
                  : level == "selective" ? Recompute::Recompute_selective : Recompute::Recompute_none;
  } else {
    assumed += "recomputation chosen by Alloy; ";
  }
  o.allow_offload = false;
  o.allow_uneven_dp = false;
  o.runner_ups = 0;
  const std::string precision_text = text_lower(row["precision"] ? row["precision"].as<std::string>() : "bf16");
  // fp8 rows ("fp8", "bf16 + float8 nn.Linear") cast the linear layers' products to fp8, and
  // calibrate a share of the fp8 peak of their own.
  const bool fp8 = precision_text.find("fp8") != std::string::npos || precision_text.find("float8") != std::string::npos;
  const std::string generation = fp8 ? device->generation + " fp8" : device->generation;

  // The framework the row ran on prices it (its runtime traits); Alloy's own runtime otherwise.
  const std::string framework = row["framework"] ? row["framework"].as<std::string>() : "";
  if (!framework.empty() && framework_runtime_traits(framework) == nullptr)
    throw Error(fmt::format("row {}: no runtime traits for framework \"{}\"", row["id"].as<std::string>(), framework),
                ErrorWhere{"", "framework", 0, 0}, fmt::format("name one of: {}, or leave it out for Alloy's runtime", framework_names()));
  // The row's devices, and the same without a memory limit: what a layout Alloy does not fit
  // would need.
  const auto cluster_of = [&](const std::string& memory) {
    const std::string yaml = fmt::format(
        "name: published\nnetwork: {{kind: infiniband, bandwidth: {}, latency: 5us}}\n"
        "device_types:\n  row-device: {{base: {}{}{}}}\nnodes:\n"
        "  - {{name: nodes, count: {}, device: row-device, devices_per_node: {}}}\n",
        network, device->type, memory.empty() ? "" : ", memory: " + memory,
        efficiencies.contains(generation)
            ? fmt::format(", matmul_efficiency{}: {}", fp8 ? "_fp8" : "", efficiencies.at(generation))
            : "",
        (devices + per_node - 1) / per_node, std::min(per_node, devices));
    ClusterSpec cluster = cluster_load_text(yaml, "published cluster", "published", catalog);
    for (DeviceType& type : cluster.device_types) type.framework = framework;
    return cluster;
  };
  TrainSpec train;
  train.seq_len = model.max_seq_len;
  train.global_batch_sequences = global;
  train.precision = fp8                                        ? Precision::Precision_fp8
                    : precision_text.find("fp16") != std::string::npos ? Precision::Precision_fp16
                                                                       : Precision::Precision_bf16;
  Plan plan;
  try {
    plan = plan_search(CostModel(model, cluster_of(""), train), o).plan;
  } catch (const Error& e) {
    try {
      const Plan roomy = plan_search(CostModel(model, cluster_of("1024TiB"), train), o).plan;
      const auto [need, terms] = plan_peak_memory(roomy);
      const double there = catalog.find(device->type)->memory_bytes;
      throw Skip{fmt::format("infeasible for Alloy: {:.1f} GiB per device needed, {:.0f} GiB there ({}{})", need / kGiB,
                             there / kGiB, terms,
                             device->assumed.empty() ? "" : "; " + device->assumed)};
    } catch (const Error&) {
      throw Skip{"infeasible for Alloy: " + e.message()};
    }
  }
  Compared c = compare(measured, plan, model, devices);
  c.assumed = assumed;
  c.plan = plan;
  c.generation = generation;
  c.device_type = device->type;
  if (const YAML::Node memory = row["memory"]; memory && memory["per_gpu_gib"]) {
    c.memory_published_gib = memory["per_gpu_gib"].as<double>();
    c.memory_predicted_gib = plan_allocator_peak_bytes(plan) / kGiB;
  }
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One row of the table: compared (with whether it is in the fit set) or skipped.
struct RowResult {
  std::string id;
  bool fit = false;
  std::optional<Compared> compared;
  std::string skipped;  // why, when not compared
};

// The source a row comes from: its id up to the first '-' (korthikanti22, mpt, llama3, ...).
std::string row_source(const std::string& id) { return id.substr(0, id.find('-')); }

std::vector<RowResult> compare_rows(const YAML::Node& rows, const DeviceCatalog& catalog, const Efficiencies& efficiencies) {
  std::vector<RowResult> out;
  std::map<std::string, int> seen_per_source;
  for (const YAML::Node& row : rows) {
    RowResult r;
    r.id = row["id"].as<std::string>();
    r.fit = seen_per_source[row_source(r.id)]++ % 2 == 0;
    try {
      r.compared = row_compare(row, catalog, efficiencies);
    } catch (const Skip& s) {
      r.skipped = s.reason;
    }
    out.push_back(std::move(r));
  }
  return out;
}

// "median |error| 7.1%, worst 21.0% over 20 rows" of the errors.
std::string summary(const std::vector<double>& errors) {
  if (errors.empty()) return "no rows";
  return fmt::format("median |error| {:.1f}%, worst {:.1f}% over {} rows", 100 * median(errors),
                     100 * *std::max_element(errors.begin(), errors.end()), errors.size());
}

// The same of the speed of the compared rows `pick` selects.
template <typename Pick>
std::string error_summary(const std::vector<RowResult>& results, Pick pick) {
  std::vector<double> errors;
  for (const RowResult& r : results)
    if (r.compared && pick(r)) errors.push_back(std::abs(r.compared->error()));
  return summary(errors);
}

// The same of the memory of those that state it.
template <typename Pick>
std::string memory_summary(const std::vector<RowResult>& results, Pick pick) {
  std::vector<double> errors;
  for (const RowResult& r : results)
    if (r.compared && r.compared->memory_published_gib > 0 && pick(r)) errors.push_back(std::abs(r.compared->memory_error()));
  return summary(errors);
}

// For each device generation of the fit rows, the matmul_efficiency in [0.30, 0.95] that
// minimises the mean |log speed ratio| of its fit rows (a generation's rows depend on its value
// alone), printed beside the catalog's.
void fit_efficiencies(const YAML::Node& rows, const DeviceCatalog& catalog, const std::vector<RowResult>& as_shipped) {
  std::map<std::string, double> shipped;  // generation -> catalog value, from a compared row's device
  std::set<std::string> generations;
  for (const RowResult& r : as_shipped) {
    if (!r.compared || !r.fit) continue;
    generations.insert(r.compared->generation);
    const DeviceType& type = *catalog.find(r.compared->device_type);
    shipped[r.compared->generation] = r.compared->generation.ends_with(" fp8") ? type.matmul_efficiency_fp8 : type.matmul_efficiency;
  }
  std::printf("\nmatmul_efficiency fitted on the fit rows (mean |log speed ratio|):\n");
  for (const std::string& generation : generations) {
    double best = 0, best_loss = 1e300;
    for (int percent = 30; percent <= 95; ++percent) {
      const double value = percent / 100.0;
      double loss = 0;
      int count = 0;
      for (const RowResult& r : compare_rows(rows, catalog, {{generation, value}})) {
        if (!r.fit || !r.compared || r.compared->generation != generation) continue;
        loss += std::abs(std::log1p(r.compared->error()));
        ++count;
      }
      if (count > 0 && loss / count < best_loss) {
        best_loss = loss / count;
        best = value;
      }
    }
    std::printf("  %-10s %.2f (mean |log ratio| %.3f); the catalog has %.2f\n", generation.c_str(), best, best_loss,
                shipped[generation]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string table = std::string(ALLOY_SOURCE_DIR) + "/bench/published/throughputs.yaml";
  std::string shown_row;
  bool fit = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--fit") fit = true;
    if (arg == "--table" && i + 1 < argc) table = argv[++i];
    if (arg == "--row" && i + 1 < argc) shown_row = argv[++i];
  }
  const YAML::Node rows = YAML::LoadFile(table);
  const DeviceCatalog catalog = catalog_builtin();
  std::vector<RowResult> results;
  try {
    results = compare_rows(rows, catalog, {});
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", table.c_str(), e.format().c_str());
    return kExitBadInput;
  }
  std::printf("Un-profiled predictions against %zu published rows (%s)\n", rows.size(), table.c_str());
  std::printf("error: predicted over published speed, less 1 (+: Alloy optimistic)\n\n");
  std::printf("%-48s %-8s %-22s %12s %12s %8s  %s\n", "row", "set", "metric", "published", "predicted", "error", "assumed");
  std::map<std::string, std::vector<std::string>> skipped;  // reason -> ids
  for (const RowResult& r : results) {
    if (!r.compared) {
      skipped[r.skipped].push_back(r.id);
      continue;
    }
    const Compared& c = *r.compared;
    std::printf("%-48s %-8s %-22s %12.4g %12.4g %+7.1f%%  %s\n", r.id.c_str(), r.fit ? "fit" : "held out",
                c.metric.c_str(), c.published, c.predicted, 100 * c.error(), c.assumed.c_str());
    if (c.memory_published_gib > 0)
      std::printf("%-48s %-8s %-22s %12.4g %12.4g %+7.1f%%\n", "", "", "memory GiB per device", c.memory_published_gib,
                  c.memory_predicted_gib, 100 * c.memory_error());
  }
  const auto fp8 = [](const RowResult& r) { return r.compared->generation.ends_with(" fp8"); };
  std::printf("\nall rows compared: %s\n", error_summary(results, [](const RowResult&) { return true; }).c_str());
  std::printf("  memory:          %s\n", memory_summary(results, [](const RowResult&) { return true; }).c_str());
  std::printf("16-bit rows:       %s\n", error_summary(results, [&](const RowResult& r) { return !fp8(r); }).c_str());
  std::printf("  fit rows:        %s\n", error_summary(results, [&](const RowResult& r) { return !fp8(r) && r.fit; }).c_str());
  std::printf("  held-out rows:   %s\n", error_summary(results, [&](const RowResult& r) { return !fp8(r) && !r.fit; }).c_str());
  std::printf("  memory:          %s\n", memory_summary(results, [&](const RowResult& r) { return !fp8(r); }).c_str());
  std::printf("fp8 rows:          %s\n", error_summary(results, fp8).c_str());
  std::printf("  fit rows:        %s\n", error_summary(results, [&](const RowResult& r) { return fp8(r) && r.fit; }).c_str());
  std::printf("  held-out rows:   %s\n", error_summary(results, [&](const RowResult& r) { return fp8(r) && !r.fit; }).c_str());
  std::printf("  memory:          %s\n", memory_summary(results, fp8).c_str());
  std::printf("\nnot compared (%zu rows):\n", skipped.empty() ? 0 : static_cast<size_t>(std::count_if(
      results.begin(), results.end(), [](const RowResult& r) { return !r.compared; })));
  for (const auto& [reason, ids] : skipped)
    std::printf("  %s: %zu (%s%s)\n", reason.c_str(), ids.size(), ids.front().c_str(), ids.size() > 1 ? ", ..." : "");
  if (fit) fit_efficiencies(rows, catalog, results);
  if (!shown_row.empty()) {
    const auto it = std::find_if(results.begin(), results.end(), [&](const RowResult& r) { return r.id == shown_row; });
    if (it == results.end() || !it->compared)
      std::printf("\nrow %s was not compared\n", shown_row.c_str());
    else
      std::printf("\nplan of %s:\n%s\n", shown_row.c_str(), plan_render_text(it->compared->plan).c_str());
  }
  return 0;
}
