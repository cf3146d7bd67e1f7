// RoPE scaling and sliding-window attention in model specs (the types are ModelSpec's, in
// spec/model.hpp): reading them from a config, writing them back.
#pragma once

#include <cstdint>
#include <string>

#include "spec/field_reader.hpp"
#include "spec/model.hpp"

namespace alloy {

// `rope_scaling` of a config (Hugging Face: rope_type or type; Alloy YAML: type), or none when
// absent or null. Types other than linear and llama3 are refused, naming the field.
RopeScaling rope_scaling_read(const FieldReader& model, bool hugging_face);

// The sliding window of a config of `model_type` (0: none). In a Hugging Face config, Qwen2's
// per-layer windows are refused when switched on (use_sliding_window) and ignored otherwise.
int64_t sliding_window_read(const FieldReader& model, const std::string& model_type, bool hugging_face);

// "rope_scaling: {type: llama3, ...}\n" for Alloy YAML, or "" without scaling.
std::string rope_scaling_yaml(const RopeScaling& scaling);

}  // namespace alloy
