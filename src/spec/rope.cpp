// RoPE scaling and sliding windows: read from Hugging Face configs and Alloy YAML, refused by
// name where Alloy does not implement them, written back (model_to_yaml), and RoPE's inverse
// frequencies as the scaling defines them.
#include "spec/rope.hpp"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

namespace alloy {

namespace {

double positive(const FieldReader& r, const char* key) {
  const double value = r.get_double(key);
  if (!(value > 0) || !std::isfinite(value)) r.fail(key, "must be a positive number", "copy the model's published value");
  return value;
}

}  // namespace

const char* rope_scaling_type_name(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::RopeScalingType_linear: return "linear";
    case RopeScalingType::RopeScalingType_llama3: return "llama3";
    default: return "none";
  }
}

RopeScaling rope_scaling_read(const FieldReader& model, bool hugging_face) {
  RopeScaling scaling;
  if (model.is_null("rope_scaling")) return scaling;
  const FieldReader r = model.child("rope_scaling");
  if (!hugging_face)
    r.reject_unknown({"type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  // Hugging Face names it rope_type (older configs: type).
  const char* type_key = r.has("rope_type") ? "rope_type" : "type";
  const std::string type = r.get_string(type_key, "default");
  if (type == "default") return scaling;
  if (type == "linear") {
    scaling.type = RopeScalingType::RopeScalingType_linear;
    scaling.factor = positive(r, "factor");
    return scaling;
  }
  if (type == "llama3") {
    scaling.type = RopeScalingType::RopeScalingType_llama3;
    scaling.factor = positive(r, "factor");
    scaling.low_freq_factor = positive(r, "low_freq_factor");
    scaling.high_freq_factor = positive(r, "high_freq_factor");
    scaling.original_max_positions = r.get_int("original_max_position_embeddings");
    if (scaling.original_max_positions <= 0)
      r.fail("original_max_position_embeddings", "must be a positive whole number", "copy the model's published value");
    if (scaling.high_freq_factor <= scaling.low_freq_factor)
      r.fail("high_freq_factor", "must be larger than low_freq_factor", "copy the model's published values");
    return scaling;
  }
  r.fail(type_key, fmt::format("rope scaling '{}' is not implemented", type),
         "Alloy implements linear and llama3 rope scaling; a model with another one would train with different "
         "position embeddings, so it is refused");
  return scaling;
}

int64_t sliding_window_read(const FieldReader& model, const std::string& model_type, bool hugging_face) {
  if (hugging_face && (model_type == "qwen2" || model_type == "qwen2_moe")) {
    if (model.get_bool("use_sliding_window", false))
      model.fail("use_sliding_window", model_type + "'s sliding windows (on the layers from max_window_layers on) are not implemented",
                 "set use_sliding_window to false, as the published Qwen2 configs do");
    return 0;
  }
  if (model.is_null("sliding_window")) return 0;
  const int64_t window = model.get_int("sliding_window");
  if (window <= 0) model.fail("sliding_window", "must be a positive whole number", "remove it for full causal attention");
  return window;
}

std::string rope_scaling_yaml(const RopeScaling& s) {
  switch (s.type) {
    case RopeScalingType::RopeScalingType_linear:
      return fmt::format("rope_scaling: {{type: linear, factor: {}}}\n", s.factor);
    case RopeScalingType::RopeScalingType_llama3:
      return fmt::format("rope_scaling: {{type: llama3, factor: {}, low_freq_factor: {}, high_freq_factor: {}, "
                         "original_max_position_embeddings: {}}}\n",
                         s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_positions);
    default: return "";
  }
}

std::vector<double> model_rope_inverse_frequencies(const ModelSpec& m) {
  const int64_t D = m.head_dim;
  const RopeScaling& s = m.rope_scaling;
  std::vector<double> inverse(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) {
    double f = std::pow(m.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    if (s.type == RopeScalingType::RopeScalingType_linear) f /= s.factor;
    if (s.type == RopeScalingType::RopeScalingType_llama3) {
      // Wavelengths shorter than original / high_freq_factor keep their frequency, those longer
      // than original / low_freq_factor are stretched by `factor`, and those between blend the two.
      const double wavelength = 2.0 * std::numbers::pi / f;
      const double original = static_cast<double>(s.original_max_positions);
      if (wavelength > original / s.low_freq_factor) {
        f /= s.factor;
      } else if (wavelength >= original / s.high_freq_factor) {
        const double smooth = (original / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
    inverse[static_cast<size_t>(i)] = f;
  }
  return inverse;
}

}  // namespace alloy
