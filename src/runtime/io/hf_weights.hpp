// Hugging Face weights both ways: the tensor names and layouts transformers uses for GPT-2
// (Conv1D matrices stored [in, out], an optional "transformer." prefix) and the LLaMA family
// (separate q/k/v and gate/up projections, "model." prefix), against Alloy's full tensors
// (src/runtime/model.hpp: fused qkv and gate_up, [out, in] matrices).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/model.hpp"

namespace alloy {

// One full tensor in host memory.
struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Every tensor of `model` by Alloy name, in its buffer order, read from `path`: a .safetensors
// file, or model.safetensors.index.json and its shards (F32, BF16 or F16). Errors name the file
// and tensor: one missing, of another shape, or left over (a model of another configuration).
std::vector<HostTensor> hf_weights_import(const ModelSpec& model, const std::string& path);

// The Hugging Face tensors of Alloy's full tensors `alloy` (in buffer order), in the names,
// layouts and order transformers saves them.
std::vector<HostTensor> hf_weights_export(const ModelSpec& model, const std::vector<HostTensor>& alloy);

// config.json of `model` as transformers reads it.
std::string hf_config_json(const ModelSpec& model);

}  // namespace alloy
