// Model layout (named views into flat buffers) and initialisation.
#include "runtime/model.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "runtime/threads.hpp"
#include "spec/error.hpp"
#include "spec/moe.hpp"

namespace alloy {

namespace {

void model_check_spec(const ModelSpec& spec, const ModelShard& shard) {
  const bool positive = spec.num_layers > 0 && spec.hidden_size > 0 && spec.num_heads > 0 &&
                        spec.num_kv_heads > 0 && spec.head_dim > 0 && spec.ffn_hidden_size > 0 &&
                        spec.vocab_size > 0 && spec.max_seq_len > 0;
  if (!positive || spec.num_heads % spec.num_kv_heads != 0) {
    throw Error(fmt::format("model '{}' cannot be built: sizes must be positive and kv heads ({}) "
                            "must divide heads ({})",
                            spec.name, spec.num_kv_heads, spec.num_heads),
                {spec.source_path, "num_key_value_heads"}, "fix the model config");
  }
  if (model_is_moe(spec) && spec.moe.aux_per_sequence && spec.moe.router_aux_loss_coef > 0) {
    throw Error(fmt::format("model '{}': a load-balancing loss over each sequence's routing (seq_aux) is not "
                            "implemented; Alloy balances over each micro-batch's tokens",
                            spec.name),
                {spec.source_path, spec.source_path.ends_with(".json") ? "seq_aux" : "moe.aux_per_sequence"},
                "set it to false to balance over the micro-batch, or the loss weight to 0");
  }
  if (spec.family == ModelFamily::ModelFamily_llama && spec.head_dim % 2 != 0) {
    throw Error(fmt::format("model '{}': RoPE needs an even head_dim, got {}", spec.name,
                            spec.head_dim),
                {spec.source_path, "head_dim"}, "use an even head dimension");
  }
}

// The field of an MoE block's tensors that points at its MLP view `field` ("mlp.router.weight",
// "mlp.experts.3.down.weight", ...), or nullptr.
float** moe_tensor_slot(BlockTensors& b, const std::string& field) {
  if (field == "mlp.router.weight") return &b.router_w;
  if (field == "mlp.shared.gate_up.weight") return &b.shared_gate_up_w;
  if (field == "mlp.shared.down.weight") return &b.shared_down_w;
  if (field == "mlp.shared_gate.weight") return &b.shared_gate_w;
  const std::string experts = "mlp.experts.";
  if (field.rfind(experts, 0) != 0) return nullptr;
  const size_t dot = field.find('.', experts.size());
  const size_t e = static_cast<size_t>(std::stoi(field.substr(experts.size(), dot - experts.size())));
  const std::string tensor = field.substr(dot + 1);
  if (tensor == "gate_up.weight" && e < b.expert_gate_up_w.size()) return &b.expert_gate_up_w[e];
  if (tensor == "down.weight" && e < b.expert_down_w.size()) return &b.expert_down_w[e];
  return nullptr;
}

// The field of `tensors` that points at the view called `name`, or nullptr.
float** tensor_slot(const ModelSpec& spec, ModelTensors& tensors, const std::string& name) {
  if (name == "embed.token") return &tensors.token;
  if (name == "embed.position") return &tensors.position;
  if (name == "final_norm.weight") return &tensors.final_norm_w;
  if (name == "final_norm.bias") return &tensors.final_norm_b;
  if (name == "lm_head.weight") return &tensors.lm_head;
  if (name.rfind("layers.", 0) != 0) return nullptr;
  const size_t dot = name.find('.', 7);
  BlockTensors& b = tensors.blocks[static_cast<size_t>(std::stoi(name.substr(7, dot - 7)))];
  const std::string field = name.substr(dot + 1);
  const bool gpt2 = spec.family == ModelFamily::ModelFamily_gpt2;
  const std::pair<const char*, float**> fields[] = {
      {"attn_norm.weight", &b.attn_norm_w}, {"attn_norm.bias", &b.attn_norm_b}, {"attn.qkv.weight", &b.qkv_w},
      {"attn.qkv.bias", &b.qkv_b},          {"attn.out.weight", &b.out_w},      {"attn.out.bias", &b.out_b},
      {"mlp_norm.weight", &b.mlp_norm_w},   {"mlp_norm.bias", &b.mlp_norm_b},   {gpt2 ? "mlp.up.weight" : "mlp.gate_up.weight", &b.up_w},
      {"mlp.up.bias", &b.up_b},             {"mlp.down.weight", &b.down_w},     {"mlp.down.bias", &b.down_b}};
  for (const auto& [suffix, slot] : fields)
    if (field == suffix) return slot;
  return moe_tensor_slot(b, field);
}

// The views' pointers into the parameters (or gradients) where they live on the device; views of
// blocks in host memory stay nullptr until the parameter source brings them in.
ModelTensors model_resolve(const Model& model, bool gradients) {
  ModelTensors tensors;
  tensors.blocks.resize(static_cast<size_t>(model.spec.num_layers));
  for (int64_t layer = 0; layer < model.spec.num_layers; ++layer) {
    if (!model_block_is_moe(model.spec, layer)) continue;
    BlockTensors& b = tensors.blocks[static_cast<size_t>(layer)];
    b.expert_gate_up_w.assign(static_cast<size_t>(model.spec.moe.num_experts), nullptr);
    b.expert_down_w.assign(static_cast<size_t>(model.spec.moe.num_experts), nullptr);
  }
  for (const TensorView& view : model.views) {
    float** slot = tensor_slot(model.spec, tensors, view.name);
    if (slot == nullptr) continue;
    for (const ParameterSegment& segment : model.segments)
      if (segment.host_block < 0 && view.offset >= segment.offset && view.offset < segment.offset + segment.count)
        *slot = (gradients ? segment.grads : segment.params) + (view.offset - segment.offset);
  }
  if (model.spec.tied_embeddings) tensors.lm_head = tensors.token;
  return tensors;
}

// The block a view belongs to, or -1 for the embedding, final norm and head.
int view_block(const TensorView& view) {
  return view.name.rfind("layers.", 0) == 0 ? std::stoi(view.name.substr(7)) : -1;
}

// Consecutive views share a segment while they live in the same place: one segment for the
// device's parameters between offloaded blocks, one per offloaded block.
std::vector<ParameterSegment> model_segments(const std::vector<TensorView>& views, const HostPlacement& host) {
  std::vector<ParameterSegment> segments;
  for (const TensorView& view : views) {
    const int block = view_block(view);
    const bool on_host = block >= 0 && static_cast<size_t>(block) < host.blocks.size() && host.blocks[static_cast<size_t>(block)];
    const int place = on_host ? block : -1;
    if (segments.empty() || segments.back().host_block != place) segments.push_back({view.offset, 0, nullptr, nullptr, place});
    segments.back().count += view.numel;
  }
  return segments;
}

float* segment_pointer(const Model& model, int64_t offset, int64_t count, bool gradients) {
  for (const ParameterSegment& segment : model.segments) {
    if (offset < segment.offset || offset >= segment.offset + segment.count) continue;
    if (offset + count > segment.offset + segment.count) break;
    float* base = gradients ? segment.grads : segment.params;
    if (base == nullptr)  // released: ZeRO 3 keeps the weights, sharded gradients the gradients
      throw Error(fmt::format("the {} [{}, {}) of model '{}' are not held in the model's buffer",
                              gradients ? "gradients" : "parameters", offset, offset + count, model.spec.name));
    return base + (offset - segment.offset);
  }
  throw Error(fmt::format("parameters [{}, {}) of model '{}' do not lie in one place (device or host)", offset,
                          offset + count, model.spec.name));
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

}  // namespace

Model::Model(const ModelSpec& model_spec, Arena& device_arena, const ModelShard& model_shard, const HostPlacement& host)
    : spec(model_spec), shard(model_shard), arena(&device_arena), host_arena(host.arena) {
  model_check_spec(spec, shard);
  if (spec.family == ModelFamily::ModelFamily_llama) rope_frequencies = model_rope_inverse_frequencies(spec);
  runtime_threads();  // applies the thread policy (OpenBLAS single-threaded) if nobody has yet
  for (const ShardedTensor& t : shard_tensors(spec, shard)) {
    int64_t numel = 1;
    for (int64_t extent : t.local_shape) numel *= extent;
    views.push_back({t.name, t.local_shape, num_parameters, numel, t.local_shape.size() == 2});
    num_parameters += numel;
  }

  segments = model_segments(views, host);
  for (ParameterSegment& segment : segments) {
    const bool on_host = segment.host_block >= 0;
    if (on_host && host_arena == nullptr) throw Error("blocks placed in host memory without a host arena");
    Arena& from = on_host ? *host_arena : *arena;
    segment.params = from.allocate_floats(segment.count, on_host ? "offloaded parameters" : "parameters");
    segment.grads = from.allocate_floats(segment.count, on_host ? "offloaded gradients" : "gradients");
    std::memset(segment.params, 0, static_cast<size_t>(segment.count) * sizeof(float));
    std::memset(segment.grads, 0, static_cast<size_t>(segment.count) * sizeof(float));
  }
  if (segments.size() == 1 && segments.front().host_block < 0) {
    params = segments.front().params;
    grads = segments.front().grads;
  }
  weights = model_resolve(*this, false);
  gradients = model_resolve(*this, true);
  recompute.assign(static_cast<size_t>(spec.num_layers), Recompute::Recompute_none);
  model_moe_routing_reset(*this);
}

Model::~Model() {
  chunk_release(*this, pass);
  for (ParameterSegment& segment : segments) {
    Arena& from = segment.host_block >= 0 ? *host_arena : *arena;
    from.release(segment.grads);
    from.release(segment.params);
  }
}

void model_init_weights(Model& model, uint64_t seed) {
  // The full model's tensors draw from one stream in buffer order; a shard copies its slices.
  NormalRng rng(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(model.spec.num_layers));
  const std::vector<ShardedTensor> mine = shard_tensors(model.spec, model.shard);
  std::vector<float> full;
  for (const ShardedTensor& t : shard_tensors(model.spec, shard_full(model.spec))) {
    const bool random = t.full_shape.size() == 2;
    // Residual projections: attn.out, and every MLP's down (dense, routed and shared experts).
    const bool residual = t.name.ends_with("attn.out.weight") || t.name.ends_with("down.weight");
    const double stddev = residual ? residual_std : 0.02;
    const float constant = t.name.ends_with("norm.weight") ? 1.0f : 0.0f;
    int64_t numel = 1;
    for (int64_t extent : t.full_shape) numel *= extent;
    size_t k = 0;
    while (k < mine.size() && mine[k].name != t.name) k++;
    if (k == mine.size()) {  // held by other ranks: keep the stream in step
      if (random) for (int64_t i = 0; i < numel; i++) rng.next();
      continue;
    }
    full.resize(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; i++) full[i] = random ? static_cast<float>(stddev * rng.next()) : constant;
    float* out = model_parameters_at(model, model.views[k].offset, model.views[k].numel);
    for (const ShardSegment& segment : mine[k].segments) {
      std::memcpy(out, full.data() + segment.full_offset, static_cast<size_t>(segment.count) * sizeof(float));
      out += segment.count;
    }
  }
}

std::vector<float**> model_weight_slots(Model& model) {
  std::vector<float**> slots;
  for (const TensorView& view : model.views) slots.push_back(tensor_slot(model.spec, model.weights, view.name));
  return slots;
}

std::vector<float**> model_gradient_slots(Model& model) {
  std::vector<float**> slots;
  for (const TensorView& view : model.views) slots.push_back(tensor_slot(model.spec, model.gradients, view.name));
  return slots;
}

const TensorView& model_view(const Model& model, const std::string& name) {
  for (const TensorView& view : model.views) {
    if (view.name == name) return view;
  }
  throw Error(fmt::format("model '{}' has no parameter named '{}'", model.spec.name, name), {},
              "parameter names look like layers.0.attn.qkv.weight (see src/runtime/model.hpp)");
}

float* model_parameters_at(const Model& model, int64_t offset, int64_t count) {
  return segment_pointer(model, offset, count, false);
}

float* model_gradients_at(const Model& model, int64_t offset, int64_t count) {
  return segment_pointer(model, offset, count, true);
}

bool model_offset_on_host(const Model& model, int64_t offset) {
  for (const ParameterSegment& segment : model.segments)
    if (offset >= segment.offset && offset < segment.offset + segment.count) return segment.host_block >= 0;
  return false;
}

void model_moe_routing_reset(Model& model) {
  model.moe_routing.expert_tokens.assign(static_cast<size_t>(model.spec.num_layers * model.spec.moe.num_experts), 0);
}

void model_zero_grad(Model& model) {
  // An offloaded block's first backward of a step starts from a zeroed device slot and its
  // write-back replaces the host copy whole: nothing to clear there. Sharded gradients have
  // released the device's buffer (nullptr): they live in the runtime's shard instead.
  for (const ParameterSegment& segment : model.segments)
    if (segment.host_block < 0 && segment.grads != nullptr) std::memset(segment.grads, 0, static_cast<size_t>(segment.count) * sizeof(float));
}

}  // namespace alloy
