// The name and layout map between transformers' GPT-2 / LLaMA tensors and Alloy's.
#include "runtime/io/hf_weights.hpp"

#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/io/safetensors.hpp"
#include "runtime/shard.hpp"
#include "spec/error.hpp"
#include "spec/field_reader.hpp"
#include "spec/rope.hpp"

namespace alloy {

namespace {

// An Alloy tensor made of Hugging Face tensors stacked along the rows, each transposed or not.
struct Recipe {
  std::string alloy;
  std::vector<std::string> parts;
  bool transposed = false;  // GPT-2's Conv1D matrices are stored [in, out]
};

std::vector<Recipe> recipes(const ModelSpec& model, const std::string& prefix) {
  std::vector<Recipe> out;
  const bool gpt2 = model.family == ModelFamily::ModelFamily_gpt2;
  const auto add = [&](std::string alloy, std::vector<std::string> parts, bool transposed = false) {
    for (std::string& p : parts) p = prefix + p;
    out.push_back({std::move(alloy), std::move(parts), transposed});
  };
  if (gpt2) {
    add("embed.token", {"wte.weight"});
    add("embed.position", {"wpe.weight"});
  } else {
    add("embed.token", {"embed_tokens.weight"});
  }
  for (int64_t i = 0; i < model.num_layers; ++i) {
    const std::string a = fmt::format("layers.{}.", i);
    if (gpt2) {
      const std::string h = fmt::format("h.{}.", i);
      add(a + "attn_norm.weight", {h + "ln_1.weight"});
      add(a + "attn_norm.bias", {h + "ln_1.bias"});
      add(a + "attn.qkv.weight", {h + "attn.c_attn.weight"}, true);
      add(a + "attn.qkv.bias", {h + "attn.c_attn.bias"});
      add(a + "attn.out.weight", {h + "attn.c_proj.weight"}, true);
      add(a + "attn.out.bias", {h + "attn.c_proj.bias"});
      add(a + "mlp_norm.weight", {h + "ln_2.weight"});
      add(a + "mlp_norm.bias", {h + "ln_2.bias"});
      add(a + "mlp.up.weight", {h + "mlp.c_fc.weight"}, true);
      add(a + "mlp.up.bias", {h + "mlp.c_fc.bias"});
      add(a + "mlp.down.weight", {h + "mlp.c_proj.weight"}, true);
      add(a + "mlp.down.bias", {h + "mlp.c_proj.bias"});
      continue;
    }
    const std::string h = fmt::format("layers.{}.", i);
    add(a + "attn_norm.weight", {h + "input_layernorm.weight"});
    add(a + "attn.qkv.weight", {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"});
    if (model.qkv_bias)
      add(a + "attn.qkv.bias", {h + "self_attn.q_proj.bias", h + "self_attn.k_proj.bias", h + "self_attn.v_proj.bias"});
    add(a + "attn.out.weight", {h + "self_attn.o_proj.weight"});
    add(a + "mlp_norm.weight", {h + "post_attention_layernorm.weight"});
    add(a + "mlp.gate_up.weight", {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"});
    add(a + "mlp.down.weight", {h + "mlp.down_proj.weight"});
  }
  add("final_norm.weight", {gpt2 ? "ln_f.weight" : "norm.weight"});
  if (gpt2) add("final_norm.bias", {"ln_f.bias"});
  if (!model.tied_embeddings) out.push_back({"lm_head.weight", {"lm_head.weight"}, false});
  return out;
}

// The files of a single .safetensors, or of an index's shards, opened, with the tensor names each holds.
struct Sources {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsEntry*>> tensors;
};

Sources sources_open(const std::string& path) {
  Sources s;
  std::vector<std::string> paths;
  if (path.ends_with(".json")) {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(spec_file_text(path));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("not a safetensors index: {}", e.what()), {path, "weight_map"},
                  "pass model.safetensors.index.json as transformers writes it, or a .safetensors file");
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error("the index has no weight_map", {path, "weight_map"}, "pass model.safetensors.index.json as transformers writes it");
    std::set<std::string> shards;
    for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
    for (const std::string& shard : shards) paths.push_back((std::filesystem::path(path).parent_path() / shard).string());
  } else {
    paths.push_back(path);
  }
  for (const std::string& p : paths) {
    s.files.push_back(std::make_unique<SafetensorsFile>(safetensors_open(p)));
    for (const SafetensorsEntry& e : s.files.back()->entries()) s.tensors[e.name] = {s.files.back().get(), &e};
  }
  return s;
}

// "transformer." (GPT-2 saved from GPT2LMHeadModel), "model." (LLaMA family) or "" as the file has it.
std::string prefix_of(const ModelSpec& model, const Sources& s) {
  const bool gpt2 = model.family == ModelFamily::ModelFamily_gpt2;
  for (const char* p : gpt2 ? std::vector<const char*>{"", "transformer."} : std::vector<const char*>{"model.", ""})
    if (s.tensors.count(std::string(p) + (gpt2 ? "wte.weight" : "embed_tokens.weight")) > 0) return p;
  return gpt2 ? "" : "model.";
}

// [rows, cols] -> [cols, rows].
std::vector<float> transposed(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<float> out(values.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = values[static_cast<size_t>(r * cols + c)];
  return out;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::vector<HostTensor> hf_weights_import(const ModelSpec& model, const std::string& path) {
  model_require_dense(model, "Hugging Face weight import");
  const Sources s = sources_open(path);
  const std::string prefix = prefix_of(model, s);
  std::map<std::string, Recipe> by_name;
  for (Recipe& r : recipes(model, prefix)) by_name[r.alloy] = r;
  std::set<std::string> used;
  std::vector<HostTensor> out;
  for (const ShardedTensor& t : shard_tensors(model, shard_full(model))) {
    const auto recipe = by_name.find(t.name);
    if (recipe == by_name.end())
      throw Error(fmt::format("model {} has tensor {}, which the {} layout of transformers does not have", model.name,
                              t.name, model.model_type.empty() ? "model's" : model.model_type),
                  {model.source_path, t.name},
                  "describe the model with its config.json (biases as its family has them) to exchange it with transformers");
    const Recipe& r = recipe->second;
    HostTensor tensor{t.name, t.full_shape, {}};
    tensor.values.reserve(static_cast<size_t>(numel_of(t.full_shape)));
    int64_t rows = 0;
    for (const std::string& part : r.parts) {
      const auto found = s.tensors.find(part);
      if (found == s.tensors.end())
        throw Error(fmt::format("tensor {} is missing (it makes Alloy's {})", part, t.name), {path, part},
                    "the weights are of another model than the config: pass the config.json saved with them");
      const auto [file, entry] = found->second;
      std::vector<int64_t> shape = entry->shape;
      if (r.transposed && shape.size() == 2) std::swap(shape[0], shape[1]);
      const int64_t cols = t.full_shape.size() == 2 ? t.full_shape[1] : 1;
      const bool fits = t.full_shape.size() == 2 ? shape.size() == 2 && shape[1] == cols : shape.size() == 1;
      if (!fits)
        throw Error(fmt::format("tensor {} has shape {}, which does not make a part of {}'s {}", part,
                                shape_text(entry->shape), t.name, shape_text(t.full_shape)),
                    {file->path(), part}, "the weights are of another model than the config: pass the config.json saved with them");
      std::vector<float> values(static_cast<size_t>(safetensors_entry_numel(*entry)));
      file->entry_copy(*entry, values.data());
      if (r.transposed && entry->shape.size() == 2) values = transposed(values, entry->shape[0], entry->shape[1]);
      tensor.values.insert(tensor.values.end(), values.begin(), values.end());
      rows += shape[0];
      used.insert(part);
    }
    if (rows != t.full_shape[0])
      throw Error(fmt::format("the parts of {} have {} rows, and the config makes it {}", t.name, rows, shape_text(t.full_shape)),
                  {path, r.parts.front()}, "the weights are of another model than the config: pass the config.json saved with them");
    out.push_back(std::move(tensor));
  }
  for (const auto& [name, where] : s.tensors) {
    const bool buffer = name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name.ends_with("rotary_emb.inv_freq");
    const bool tied_copy = model.tied_embeddings && name == "lm_head.weight";
    if (!used.count(name) && !buffer && !tied_copy)
      throw Error(fmt::format("tensor {} has no place in model {}", name, model.name), {where.first->path(), name},
                  "the weights are of another model than the config: pass the config.json saved with them");
  }
  return out;
}

std::vector<HostTensor> hf_weights_export(const ModelSpec& model, const std::vector<HostTensor>& alloy) {
  model_require_dense(model, "Hugging Face weight export");
  std::map<std::string, const HostTensor*> by_name;
  for (const HostTensor& t : alloy) by_name[t.name] = &t;
  std::vector<HostTensor> out;
  for (const Recipe& r : recipes(model, model.family == ModelFamily::ModelFamily_gpt2 ? "" : "model.")) {
    const auto found = by_name.find(r.alloy);
    if (found == by_name.end())
      throw Error(fmt::format("transformers' {} layout needs tensor {}, which model {} does not have",
                              model.model_type.empty() ? "model's" : model.model_type, r.alloy, model.name),
                  {model.source_path, r.alloy},
                  "describe the model with its config.json (biases as its family has them) to exchange it with transformers");
    const HostTensor& t = *found->second;
    const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
    // Equal parts but for q/k/v under grouped-query attention.
    std::vector<int64_t> rows(r.parts.size(), t.shape[0] / static_cast<int64_t>(r.parts.size()));
    if (r.parts.size() == 3) {
      const int64_t kv = model.num_kv_heads * model.head_dim;
      rows = {model.num_heads * model.head_dim, kv, kv};
    }
    int64_t at = 0;
    for (size_t k = 0; k < r.parts.size(); ++k) {
      HostTensor part{r.parts[k], {}, {}};
      part.values.assign(t.values.begin() + at * cols, t.values.begin() + (at + rows[k]) * cols);
      part.shape = t.shape.size() == 2 ? std::vector<int64_t>{rows[k], cols} : std::vector<int64_t>{rows[k]};
      if (r.transposed) {
        part.values = transposed(part.values, rows[k], cols);
        part.shape = {cols, rows[k]};
      }
      at += rows[k];
      out.push_back(std::move(part));
    }
  }
  return out;
}

std::string hf_config_json(const ModelSpec& m) {
  model_require_dense(m, "Hugging Face config export");
  nlohmann::ordered_json c;
  if (m.family == ModelFamily::ModelFamily_gpt2) {
    c = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"n_embd", m.hidden_size},
         {"n_head", m.num_heads}, {"n_layer", m.num_layers}, {"n_positions", m.max_seq_len}, {"n_ctx", m.max_seq_len},
         {"n_inner", m.ffn_hidden_size}, {"vocab_size", m.vocab_size}, {"layer_norm_epsilon", m.norm_eps},
         {"activation_function", "gelu_new"}, {"tie_word_embeddings", m.tied_embeddings}};
  } else {
    c = {{"architectures", {m.model_type == "qwen2" ? "Qwen2ForCausalLM" : m.model_type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM"}},
         {"model_type", m.model_type.empty() ? "llama" : m.model_type}, {"hidden_size", m.hidden_size},
         {"intermediate_size", m.ffn_hidden_size}, {"num_attention_heads", m.num_heads},
         {"num_key_value_heads", m.num_kv_heads}, {"head_dim", m.head_dim}, {"num_hidden_layers", m.num_layers},
         {"max_position_embeddings", m.max_seq_len}, {"vocab_size", m.vocab_size}, {"rms_norm_eps", m.norm_eps},
         {"rope_theta", m.rope_theta}, {"hidden_act", "silu"}, {"tie_word_embeddings", m.tied_embeddings}};
    if (m.rope_scaling.type != RopeScalingType::RopeScalingType_none) {
      nlohmann::ordered_json s = {{"rope_type", rope_scaling_type_name(m.rope_scaling.type)}, {"factor", m.rope_scaling.factor}};
      if (m.rope_scaling.type == RopeScalingType::RopeScalingType_llama3) {
        s["low_freq_factor"] = m.rope_scaling.low_freq_factor;
        s["high_freq_factor"] = m.rope_scaling.high_freq_factor;
        s["original_max_position_embeddings"] = m.rope_scaling.original_max_positions;
      }
      c["rope_scaling"] = s;
    }
    if (m.sliding_window > 0) c["sliding_window"] = m.sliding_window;
  }
  c["torch_dtype"] = "float32";
  return c.dump(2) + "\n";
}

}  // namespace alloy
