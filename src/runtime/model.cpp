// Model layout (named views into flat buffers) and initialisation.
#include "runtime/model.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "runtime/threads.hpp"
#include "spec/error.hpp"

namespace alloy {

namespace {

// Builds the table of views in buffer order; offsets are resolved to pointers afterwards.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(std::vector<TensorView>& views) : views_(views) {}
  void add(const std::string& name, std::vector<int64_t> shape) {
    int64_t numel = 1;
    for (int64_t extent : shape) numel *= extent;
    const bool decay = shape.size() == 2;
    views_.push_back({name, std::move(shape), offset_, numel, decay});
    offset_ += numel;
  }
  int64_t total() const { return offset_; }

 private:
  std::vector<TensorView>& views_;
  int64_t offset_ = 0;
};

void model_check_spec(const ModelSpec& spec) {
  const bool positive = spec.num_layers > 0 && spec.hidden_size > 0 && spec.num_heads > 0 &&
                        spec.num_kv_heads > 0 && spec.head_dim > 0 && spec.ffn_hidden_size > 0 &&
                        spec.vocab_size > 0 && spec.max_seq_len > 0;
  if (!positive || spec.num_heads % spec.num_kv_heads != 0) {
    throw Error(fmt::format("model '{}' cannot be built: sizes must be positive and kv heads ({}) "
                            "must divide heads ({})",
                            spec.name, spec.num_kv_heads, spec.num_heads),
                {spec.source_path, "num_key_value_heads"}, "fix the model config");
  }
  if (spec.family == ModelFamily::ModelFamily_llama && spec.head_dim % 2 != 0) {
    throw Error(fmt::format("model '{}': RoPE needs an even head_dim, got {}", spec.name,
                            spec.head_dim),
                {spec.source_path, "head_dim"}, "use an even head dimension");
  }
}

ModelTensors model_resolve(const Model& model, float* base) {
  auto at = [&](const std::string& name) -> float* {
    for (const TensorView& view : model.views) {
      if (view.name == name) return base + view.offset;
    }
    return nullptr;
  };
  ModelTensors tensors;
  tensors.token = at("embed.token");
  tensors.position = at("embed.position");
  for (int64_t i = 0; i < model.spec.num_layers; i++) {
    const std::string p = fmt::format("layers.{}.", i);
    BlockTensors block;
    block.attn_norm_w = at(p + "attn_norm.weight");
    block.attn_norm_b = at(p + "attn_norm.bias");
    block.qkv_w = at(p + "attn.qkv.weight");
    block.qkv_b = at(p + "attn.qkv.bias");
    block.out_w = at(p + "attn.out.weight");
    block.out_b = at(p + "attn.out.bias");
    block.mlp_norm_w = at(p + "mlp_norm.weight");
    block.mlp_norm_b = at(p + "mlp_norm.bias");
    block.up_w = model.spec.family == ModelFamily::ModelFamily_gpt2 ? at(p + "mlp.up.weight")
                                                                   : at(p + "mlp.gate_up.weight");
    block.up_b = at(p + "mlp.up.bias");
    block.down_w = at(p + "mlp.down.weight");
    block.down_b = at(p + "mlp.down.bias");
    tensors.blocks.push_back(block);
  }
  tensors.final_norm_w = at("final_norm.weight");
  tensors.final_norm_b = at("final_norm.bias");
  tensors.lm_head = model.spec.tied_embeddings ? tensors.token : at("lm_head.weight");
  return tensors;
}

// splitmix64 stream with Box-Muller normals: deterministic for a seed on every platform.
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : state_(seed) {}
  double next() {
    const double u1 = (static_cast<double>(bits() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(bits() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }

 private:
  uint64_t bits() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

bool ends_with(const std::string& text, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return text.size() >= n && text.compare(text.size() - n, n, suffix) == 0;
}

}  // namespace

Model::Model(const ModelSpec& model_spec, Arena& device_arena)
    : spec(model_spec), arena(&device_arena) {
  model_check_spec(spec);
  runtime_threads();  // applies the thread policy (OpenBLAS single-threaded) if nobody has yet
  const int64_t C = spec.hidden_size;
  const int64_t D = spec.head_dim;
  const int64_t qkv_rows = (spec.num_heads + 2 * spec.num_kv_heads) * D;
  const int64_t F = spec.ffn_hidden_size;
  const bool gpt2 = spec.family == ModelFamily::ModelFamily_gpt2;
  LayoutBuilder layout(views);
  layout.add("embed.token", {spec.vocab_size, C});
  if (gpt2) layout.add("embed.position", {spec.max_seq_len, C});
  for (int64_t i = 0; i < spec.num_layers; i++) {
    const std::string p = fmt::format("layers.{}.", i);
    layout.add(p + "attn_norm.weight", {C});
    if (spec.norm_bias) layout.add(p + "attn_norm.bias", {C});
    layout.add(p + "attn.qkv.weight", {qkv_rows, C});
    if (spec.qkv_bias) layout.add(p + "attn.qkv.bias", {qkv_rows});
    layout.add(p + "attn.out.weight", {C, spec.num_heads * D});
    if (spec.linear_bias) layout.add(p + "attn.out.bias", {C});
    layout.add(p + "mlp_norm.weight", {C});
    if (spec.norm_bias) layout.add(p + "mlp_norm.bias", {C});
    if (gpt2) {
      layout.add(p + "mlp.up.weight", {F, C});
      if (spec.linear_bias) layout.add(p + "mlp.up.bias", {F});
    } else {
      layout.add(p + "mlp.gate_up.weight", {2 * F, C});
    }
    layout.add(p + "mlp.down.weight", {C, F});
    if (spec.linear_bias) layout.add(p + "mlp.down.bias", {C});
  }
  layout.add("final_norm.weight", {C});
  if (spec.norm_bias) layout.add("final_norm.bias", {C});
  if (!spec.tied_embeddings) layout.add("lm_head.weight", {spec.vocab_size, C});
  num_parameters = layout.total();

  params = arena->allocate_floats(num_parameters, "parameters");
  grads = arena->allocate_floats(num_parameters, "gradients");
  std::memset(params, 0, static_cast<size_t>(num_parameters) * sizeof(float));
  std::memset(grads, 0, static_cast<size_t>(num_parameters) * sizeof(float));
  weights = model_resolve(*this, params);
  gradients = model_resolve(*this, grads);
  recompute.assign(static_cast<size_t>(spec.num_layers), Recompute::Recompute_none);
}

Model::~Model() {
  model_release_activations(*this);
  arena->release(grads);
  arena->release(params);
}

void model_init_weights(Model& model, uint64_t seed) {
  NormalRng rng(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(model.spec.num_layers));
  for (const TensorView& view : model.views) {
    float* data = model.params + view.offset;
    if (view.shape.size() == 1) {
      const bool norm_weight = ends_with(view.name, "norm.weight");
      for (int64_t i = 0; i < view.numel; i++) data[i] = norm_weight ? 1.0f : 0.0f;
      continue;
    }
    const bool residual = ends_with(view.name, "attn.out.weight") ||
                          ends_with(view.name, "mlp.down.weight");
    const double stddev = residual ? residual_std : 0.02;
    for (int64_t i = 0; i < view.numel; i++) data[i] = static_cast<float>(stddev * rng.next());
  }
}

const TensorView& model_view(const Model& model, const std::string& name) {
  for (const TensorView& view : model.views) {
    if (view.name == name) return view;
  }
  throw Error(fmt::format("model '{}' has no parameter named '{}'", model.spec.name, name), {},
              "parameter names look like layers.0.attn.qkv.weight (see src/runtime/model.hpp)");
}

void model_zero_grad(Model& model) {
  std::memset(model.grads, 0, static_cast<size_t>(model.num_parameters) * sizeof(float));
}

}  // namespace alloy
