#include "spec/device_type.hpp"

#include <algorithm>

#include "spec/text.hpp"

namespace alloy {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::Precision_fp32: return "fp32";
    case Precision::Precision_tf32: return "tf32";
    case Precision::Precision_bf16: return "bf16";
    case Precision::Precision_fp16: return "fp16";
    case Precision::Precision_fp8: return "fp8";
  }
  return "?";
}

bool precision_parse(const std::string& text, Precision* out) {
  static const Precision all[] = {Precision::Precision_fp32, Precision::Precision_tf32,
                                  Precision::Precision_bf16, Precision::Precision_fp16,
                                  Precision::Precision_fp8};
  for (Precision p : all) {
    if (text == precision_name(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

int precision_bytes(Precision p) {
  switch (p) {
    case Precision::Precision_fp32:
    case Precision::Precision_tf32: return 4;
    case Precision::Precision_bf16:
    case Precision::Precision_fp16:
    case Precision::Precision_fp8: return 2;
  }
  return 4;
}

double DeviceType::peak_flops(Precision p) const {
  double flops = 0;
  switch (p) {
    case Precision::Precision_fp8: flops = peak_flops_fp8; break;
    case Precision::Precision_bf16: flops = peak_flops_bf16; break;
    case Precision::Precision_fp16: flops = peak_flops_fp16; break;
    case Precision::Precision_tf32: flops = peak_flops_tf32; break;
    case Precision::Precision_fp32: flops = peak_flops_fp32; break;
  }
  if (flops <= 0 && p == Precision::Precision_fp8) flops = peak_flops_bf16;
  if (flops <= 0 && (p == Precision::Precision_bf16 || p == Precision::Precision_fp8)) flops = peak_flops_fp16;
  if (flops <= 0 && p == Precision::Precision_fp16) flops = peak_flops_bf16;
  if (flops <= 0) flops = peak_flops_fp32;
  return flops * speed;
}


void DeviceCatalog::add(DeviceType type) {
  type.name = text_lower(type.name);
  for (auto& alias : type.aliases) alias = text_lower(alias);
  for (auto& existing : types_) {
    if (existing.name == type.name) {
      existing = std::move(type);
      return;
    }
  }
  types_.push_back(std::move(type));
}

const DeviceType* DeviceCatalog::find(const std::string& name) const {
  const std::string key = text_lower(name);
  for (const auto& t : types_) {
    if (t.name == key) return &t;
    for (const auto& alias : t.aliases)
      if (alias == key) return &t;
  }
  return nullptr;
}

std::vector<std::string> DeviceCatalog::nearest_names(const std::string& name, int count) const {
  const std::string key = text_lower(name);
  std::vector<std::pair<int, std::string>> scored;
  for (const auto& t : types_) {
    int best = text_edit_distance(key, t.name);
    for (const auto& alias : t.aliases) best = std::min(best, text_edit_distance(key, alias));
    scored.emplace_back(best, t.name);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (int i = 0; i < count && i < static_cast<int>(scored.size()); ++i) out.push_back(scored[i].second);
  return out;
}

}  // namespace alloy
