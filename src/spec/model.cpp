#include "spec/model.hpp"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "spec/error.hpp"
#include "spec/field_reader.hpp"
#include "spec/moe.hpp"
#include "spec/presets.hpp"
#include "spec/rope.hpp"
#include "spec/text.hpp"

namespace alloy {

namespace {

// MoE types (mixtral, qwen2_moe, deepseek) are LLaMA blocks with expert MLPs.
const std::vector<std::string> kLlamaTypes = {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "deepseek"};
const std::vector<std::string> kAllTypes = {"gpt2", "llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "deepseek"};

// Upper bounds that keep every product in int64 and catch typos like an extra zero run.
constexpr int64_t kMaxLayers = 10000;
constexpr int64_t kMaxWidth = 1000000;
constexpr int64_t kMaxVocab = 10000000;
constexpr int64_t kMaxSeq = 100000000;

// 4 x the width; a width out of range (refused by model_validate, which names it first) is
// clamped so that the product cannot overflow.
int64_t default_ffn_size(int64_t hidden_size) { return 4 * std::clamp<int64_t>(hidden_size, 0, kMaxWidth); }

std::string stem_of(const std::string& path) {
  std::filesystem::path p(path);
  std::string stem = p.stem().string();
  if (stem == "config") stem = p.parent_path().filename().string();
  return stem.empty() ? "model" : stem;
}

bool is_llama_type(const std::string& type) {
  for (const auto& t : kLlamaTypes)
    if (t == type) return true;
  return false;
}

ModelSpec read_hf_gpt2(const FieldReader& r) {
  ModelSpec m;
  m.family = ModelFamily::ModelFamily_gpt2;
  m.num_layers = r.get_int("n_layer");
  m.hidden_size = r.get_int("n_embd");
  m.num_heads = r.get_int("n_head");
  m.num_kv_heads = m.num_heads;
  m.max_seq_len = r.has("n_positions") ? r.get_int("n_positions") : r.get_int("n_ctx");
  m.vocab_size = r.get_int("vocab_size");
  m.ffn_hidden_size = r.get_int("n_inner", default_ffn_size(m.hidden_size));
  m.norm_eps = r.get_double("layer_norm_epsilon", 1e-5);
  m.tied_embeddings = r.get_bool("tie_word_embeddings", true);
  std::string act = r.get_string("activation_function", "gelu_new");
  if (act.rfind("gelu", 0) != 0) {
    r.fail("activation_function", "activation '" + act + "' is not supported for gpt2 models",
           "use gelu_new (GPT-2's tanh approximation) or gelu");
  }
  m.qkv_bias = m.linear_bias = m.norm_bias = true;
  return m;
}

ModelSpec read_hf_llama(const FieldReader& r, const std::string& type) {
  ModelSpec m;
  m.family = ModelFamily::ModelFamily_llama;
  m.num_layers = r.get_int("num_hidden_layers");
  m.hidden_size = r.get_int("hidden_size");
  m.num_heads = r.get_int("num_attention_heads");
  m.num_kv_heads = r.get_int("num_key_value_heads", m.num_heads);
  m.ffn_hidden_size = r.get_int("intermediate_size");
  m.max_seq_len = r.get_int("max_position_embeddings");
  m.vocab_size = r.get_int("vocab_size");
  m.norm_eps = r.get_double("rms_norm_eps", 1e-6);
  m.rope_theta = r.get_double("rope_theta", 10000.0);
  m.tied_embeddings = r.get_bool("tie_word_embeddings", false);
  if (!r.is_null("head_dim")) m.head_dim = r.get_int("head_dim");
  std::string act = r.get_string("hidden_act", "silu");
  if (act != "silu" && act != "swish") {
    r.fail("hidden_act", "activation '" + act + "' is not supported for the LLaMA family",
           "Alloy's LLaMA blocks use SwiGLU: set hidden_act to silu");
  }
  m.qkv_bias = (type == "qwen2" || type == "qwen2_moe");
  if (r.get_bool("attention_bias", false)) {
    r.fail("attention_bias", "attention projections with biases are not supported for " + type,
           "set attention_bias to false (qwen2's q/k/v biases are implied by model_type qwen2)");
  }
  if (r.get_bool("mlp_bias", false)) {
    r.fail("mlp_bias", "MLP biases are not supported for the LLaMA family", "set mlp_bias to false");
  }
  m.rope_scaling = rope_scaling_read(r, true);
  m.sliding_window = sliding_window_read(r, type, true);
  if (moe_is_hf_type(type)) m.moe = moe_read_hf(r, type);
  return m;
}

ModelSpec read_alloy_yaml(const FieldReader& r) {
  r.reject_unknown({"name", "family", "model_type", "layers", "hidden_size", "heads", "kv_heads", "head_dim",
                    "ffn_hidden_size", "vocab_size", "max_seq_len", "tied_embeddings", "qkv_bias",
                    "linear_bias", "norm_bias", "norm_eps", "rope_theta", "rope_scaling", "sliding_window", "moe"});
  ModelSpec m;
  std::string family = r.get_string("family");
  if (family == "gpt2") {
    m.family = ModelFamily::ModelFamily_gpt2;
  } else if (family == "llama") {
    m.family = ModelFamily::ModelFamily_llama;
  } else {
    r.fail("family", "unknown model family '" + family + "'",
           "use gpt2 or llama (did you mean " + text_nearest(family, {"gpt2", "llama"}) + "?)");
  }
  const bool gpt2 = m.family == ModelFamily::ModelFamily_gpt2;
  m.model_type = r.get_string("model_type", family);
  m.name = r.get_string("name", "");
  m.num_layers = r.get_int("layers");
  m.hidden_size = r.get_int("hidden_size");
  m.num_heads = r.get_int("heads");
  m.num_kv_heads = r.get_int("kv_heads", m.num_heads);
  m.head_dim = r.get_int("head_dim", 0);
  m.ffn_hidden_size = r.get_int("ffn_hidden_size", default_ffn_size(m.hidden_size));
  m.vocab_size = r.get_int("vocab_size");
  m.max_seq_len = r.get_int("max_seq_len");
  m.tied_embeddings = r.get_bool("tied_embeddings", gpt2);
  m.qkv_bias = r.get_bool("qkv_bias", gpt2);
  m.linear_bias = r.get_bool("linear_bias", gpt2);
  m.norm_bias = r.get_bool("norm_bias", gpt2);
  m.norm_eps = r.get_double("norm_eps", 1e-5);
  m.rope_theta = r.get_double("rope_theta", 10000.0);
  m.rope_scaling = rope_scaling_read(r, false);
  if (gpt2 && m.rope_scaling.type != RopeScalingType::RopeScalingType_none)
    r.fail("rope_scaling", "gpt2 models have learned positions, not RoPE", "remove rope_scaling");
  m.sliding_window = sliding_window_read(r, m.model_type, false);
  m.moe = moe_read_yaml(r);
  if (!gpt2 && (m.linear_bias || m.norm_bias)) {
    r.fail(m.linear_bias ? "linear_bias" : "norm_bias", "the llama family has no such biases",
           "remove the field or set it to false");
  }
  return m;
}

void require_range(const ModelSpec& m, const char* field, int64_t value, int64_t max) {
  if (value <= 0) {
    throw Error("must be a positive whole number, got " + std::to_string(value), {m.source_path, field},
                "set it to the model's published value");
  }
  if (value > max) {
    throw Error("value " + std::to_string(value) + " is implausibly large (limit " + std::to_string(max) + ")",
                {m.source_path, field}, "check for a typo in the number");
  }
}

}  // namespace

const char* model_family_name(ModelFamily family) {
  return family == ModelFamily::ModelFamily_gpt2 ? "gpt2" : "llama";
}

void model_validate(const ModelSpec& m) {
  const bool hf = m.source_path.size() > 5 && m.source_path.ends_with(".json");
  const bool gpt2 = m.family == ModelFamily::ModelFamily_gpt2;
  auto field = [&](const char* hf_gpt2, const char* hf_llama, const char* yaml) {
    return hf ? (gpt2 ? hf_gpt2 : hf_llama) : yaml;
  };
  require_range(m, field("n_layer", "num_hidden_layers", "layers"), m.num_layers, kMaxLayers);
  require_range(m, field("n_embd", "hidden_size", "hidden_size"), m.hidden_size, kMaxWidth);
  require_range(m, field("n_head", "num_attention_heads", "heads"), m.num_heads, kMaxWidth);
  require_range(m, field("n_head", "num_key_value_heads", "kv_heads"), m.num_kv_heads, kMaxWidth);
  require_range(m, field("n_inner", "intermediate_size", "ffn_hidden_size"), m.ffn_hidden_size, 10 * kMaxWidth);
  require_range(m, "vocab_size", m.vocab_size, kMaxVocab);
  require_range(m, field("n_positions", "max_position_embeddings", "max_seq_len"), m.max_seq_len, kMaxSeq);
  const char* heads_field = field("n_head", "num_attention_heads", "heads");
  if (m.head_dim == 0 && m.hidden_size % m.num_heads != 0) {
    throw Error("hidden size " + std::to_string(m.hidden_size) + " is not divisible by " +
                    std::to_string(m.num_heads) + " heads",
                {m.source_path, heads_field}, "choose a head count that divides the hidden size");
  }
  require_range(m, field("n_embd", "head_dim", "head_dim"), m.head_dim, kMaxWidth);
  if (gpt2 && m.head_dim * m.num_heads != m.hidden_size) {
    throw Error("gpt2 models need head_dim x heads = hidden size", {m.source_path, heads_field},
                "remove head_dim or make it hidden_size / heads");
  }
  if (m.num_heads % m.num_kv_heads != 0) {
    throw Error(std::to_string(m.num_kv_heads) + " key/value heads do not divide " +
                    std::to_string(m.num_heads) + " attention heads",
                {m.source_path, field("n_head", "num_key_value_heads", "kv_heads")},
                "use a key/value head count that divides the attention heads (e.g. 8 of 32)");
  }
  if (m.family == ModelFamily::ModelFamily_llama && m.head_dim % 2 != 0) {
    throw Error("head dimension " + std::to_string(m.head_dim) + " is odd; RoPE needs an even one",
                {m.source_path, field("", "head_dim", "head_dim")}, "use an even head dimension");
  }
  if (!(m.norm_eps > 0 && m.norm_eps < 1)) {
    throw Error("norm epsilon must be in (0, 1)", {m.source_path, field("layer_norm_epsilon", "rms_norm_eps", "norm_eps")},
                "typical values are 1e-5 or 1e-6");
  }
  if (!(m.rope_theta > 0)) {
    throw Error("rope_theta must be positive", {m.source_path, "rope_theta"}, "typical values are 10000 or 500000");
  }
  moe_validate(m);
}

ModelSpec model_load_file(const std::string& path) { return model_load_text(spec_file_text(path), path); }

ModelSpec model_load_text(const std::string& text, const std::string& path) {
  const bool is_json = path.ends_with(".json");
  FieldReader r(spec_text_parse(text, path, is_json), path);
  ModelSpec m;
  if (is_json) {
    std::string type = r.get_string("model_type");
    moe_refuse_unread_type(r, type);
    if (type == "gpt2") {
      m = read_hf_gpt2(r);
    } else if (is_llama_type(type)) {
      m = read_hf_llama(r, type);
    } else {
      r.fail("model_type", "unknown model_type '" + type + "'",
             "did you mean " + text_nearest(type, kAllTypes) +
                 "? Alloy reads gpt2, llama, mistral and qwen2 configs, and mixtral, qwen2_moe and deepseek (MoE)");
    }
    moe_refuse_experts_in_dense(r, type);
    m.model_type = type;
    m.name = stem_of(path);
  } else {
    m = read_alloy_yaml(r);
    if (m.name.empty()) m.name = stem_of(path);
  }
  m.source_path = path;
  if (m.head_dim == 0 && m.num_heads > 0 && m.hidden_size % m.num_heads == 0) {
    m.head_dim = m.hidden_size / m.num_heads;
  }
  model_validate(m);
  return m;
}

ModelSpec model_load(const std::string& name_or_path) {
  if (presets_is_path(name_or_path)) return model_load_file(name_or_path);
  std::string path = presets_find("models", name_or_path);
  if (path.empty()) {
    throw Error("no model preset named '" + name_or_path + "'", {"", "--model"},
                "nearest presets: " + text_nearest(name_or_path, model_preset_names()) +
                    "; or pass a path to a config.json or .yaml file");
  }
  ModelSpec m = model_load_file(path);
  m.name = name_or_path;
  return m;
}

std::vector<std::string> model_preset_names() { return presets_list("models"); }

std::string model_to_yaml(const ModelSpec& m) {
  // {} writes the shortest text that reads back as the same double.
  return fmt::format(
      "name: {}\nfamily: {}\nmodel_type: {}\nlayers: {}\nhidden_size: {}\nheads: {}\nkv_heads: {}\nhead_dim: {}\n"
      "ffn_hidden_size: {}\nvocab_size: {}\nmax_seq_len: {}\ntied_embeddings: {}\nqkv_bias: {}\nlinear_bias: {}\n"
      "norm_bias: {}\nnorm_eps: {}\nrope_theta: {}\n",
      yaml_quoted(m.name), model_family_name(m.family), yaml_quoted(m.model_type), m.num_layers, m.hidden_size,
      m.num_heads, m.num_kv_heads, m.head_dim, m.ffn_hidden_size, m.vocab_size, m.max_seq_len, m.tied_embeddings,
      m.qkv_bias, m.linear_bias, m.norm_bias, m.norm_eps, m.rope_theta) +
         rope_scaling_yaml(m.rope_scaling) + (m.sliding_window > 0 ? fmt::format("sliding_window: {}\n", m.sliding_window) : "") +
         moe_yaml(m.moe);
}

ModelParameterCounts model_parameter_counts(const ModelSpec& m) {
  ModelParameterCounts c;
  const int64_t C = m.hidden_size, D = m.head_dim, F = m.ffn_hidden_size;
  const int64_t qkv_rows = (m.num_heads + 2 * m.num_kv_heads) * D;
  const int64_t norm = m.norm_bias ? 2 * C : C;
  c.embedding = m.vocab_size * C;
  if (m.family == ModelFamily::ModelFamily_gpt2) c.embedding += m.max_seq_len * C;
  int64_t attention = qkv_rows * C + (m.qkv_bias ? qkv_rows : 0) + m.num_heads * D * C + (m.linear_bias ? C : 0);
  int64_t mlp = 0;
  if (m.family == ModelFamily::ModelFamily_gpt2) {
    mlp = 2 * C * F + (m.linear_bias ? F + C : 0);
  } else {
    mlp = 3 * C * F;
  }
  c.per_block = 2 * norm + attention + mlp;
  int64_t dense_blocks = m.num_layers;
  if (model_is_moe(m)) {
    const MoeMlpParameters experts = moe_mlp_parameters(m);
    c.per_moe_block = 2 * norm + attention + experts.all;
    c.per_moe_block_active = 2 * norm + attention + experts.active;
    dense_blocks = m.moe.first_dense_layers;
  }
  const int64_t moe_blocks = m.num_layers - dense_blocks;
  c.final_norm = norm;
  c.lm_head = m.tied_embeddings ? 0 : m.vocab_size * C;
  const int64_t outside_blocks = c.embedding + c.final_norm + c.lm_head;
  c.total = outside_blocks + dense_blocks * c.per_block + moe_blocks * c.per_moe_block;
  c.active = outside_blocks + dense_blocks * c.per_block + moe_blocks * c.per_moe_block_active;
  return c;
}

ModelFlopsPerToken model_flops_per_token(const ModelSpec& m, int64_t seq_len) {
  const double C = static_cast<double>(m.hidden_size), D = static_cast<double>(m.head_dim);
  const double Hq = static_cast<double>(m.num_heads), Hkv = static_cast<double>(m.num_kv_heads);
  const double F = static_cast<double>(m.ffn_hidden_size), T = static_cast<double>(seq_len);
  const double mlp_matrices = m.family == ModelFamily::ModelFamily_gpt2 ? 2 : 3;
  const double attention_weights = (Hq + 2 * Hkv) * D * C + Hq * D * C;
  const double attention = 2.0 * 2.0 * T * Hq * D;  // QK^T and AV, per token
  const double dense_block = 2.0 * (attention_weights + mlp_matrices * C * F) + attention;
  double blocks = static_cast<double>(m.num_layers) * dense_block;
  if (model_is_moe(m)) {
    // A token multiplies with the router, its top-k routed experts and the shared experts only.
    const double moe_block = 2.0 * (attention_weights + static_cast<double>(moe_mlp_parameters(m).active)) + attention;
    const double dense_blocks = static_cast<double>(m.moe.first_dense_layers);
    blocks = dense_blocks * dense_block + (static_cast<double>(m.num_layers) - dense_blocks) * moe_block;
  }
  ModelFlopsPerToken out;
  out.forward = blocks + 2.0 * static_cast<double>(m.vocab_size) * C;
  out.training = 3.0 * out.forward;
  return out;
}

}  // namespace alloy
