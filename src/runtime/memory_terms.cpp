// Arena buffer names and plan memory terms, each mapped to the terms a rank's memory is reported by.
#include "runtime/memory_terms.hpp"

#include <map>

namespace alloy {

namespace {

using K = MemoryTermKind;

// Every name the runtime allocates device (and host-arena) buffers under. Activation offload
// reloads a saved activation under the name it was first allocated with, so no name is built
// at run time beyond these; activation gradients all start with "d " (see memory_term_of_buffer).
const std::map<std::string, MemoryTermKind>& buffer_terms() {
  static const std::map<std::string, MemoryTermKind> terms = {
      // parameters: the CPU backend's fp32 weights, ZeRO 3's own pieces and the gathered copy in
      // use, the offload window (offloaded blocks' weights and gradients while resident), and
      // the GPU backend's compute copies
      {"parameters", K::MemoryTermKind_parameters},
      {"zero3 parameter pieces", K::MemoryTermKind_parameters},
      {"zero3 gathered weights", K::MemoryTermKind_parameters},
      {"offload window", K::MemoryTermKind_parameters},
      {"offloaded parameters", K::MemoryTermKind_parameters},
      {"weights (bf16 copy)", K::MemoryTermKind_parameters},
      {"lm_head (bf16, padded)", K::MemoryTermKind_parameters},
      // gradients: the stage's full buffer, or under sharding the member's shard and the bucket
      // being reduce-scattered
      {"gradients", K::MemoryTermKind_gradients},
      {"sharded gradients", K::MemoryTermKind_gradients},
      {"gradient bucket", K::MemoryTermKind_gradients},
      {"offloaded gradients", K::MemoryTermKind_gradients},
      {"gradients (fp32)", K::MemoryTermKind_gradients},
      // optimizer state: AdamW moments, and the GPU backend's fp32 master weights
      {"adamw.m", K::MemoryTermKind_optimizer_state},
      {"adamw.v", K::MemoryTermKind_optimizer_state},
      {"offloaded adamw.m", K::MemoryTermKind_optimizer_state},
      {"offloaded adamw.v", K::MemoryTermKind_optimizer_state},
      {"adamw.m (profile)", K::MemoryTermKind_optimizer_state},
      {"adamw.v (profile)", K::MemoryTermKind_optimizer_state},
      {"parameters (fp32)", K::MemoryTermKind_optimizer_state},
      // activations: what blocks, the embedding and the head keep for backward, and the stage's
      // input and output between pipeline stages
      {"attn_norm.out", K::MemoryTermKind_activations},
      {"attn_norm.mean", K::MemoryTermKind_activations},
      {"attn_norm.rstd", K::MemoryTermKind_activations},
      {"attn.qkv", K::MemoryTermKind_activations},
      {"attn.probs", K::MemoryTermKind_activations},
      {"attn.context", K::MemoryTermKind_activations},
      {"attn.lse", K::MemoryTermKind_activations},
      {"attn.residual", K::MemoryTermKind_activations},
      {"mlp_norm.out", K::MemoryTermKind_activations},
      {"mlp_norm.mean", K::MemoryTermKind_activations},
      {"mlp_norm.rstd", K::MemoryTermKind_activations},
      {"mlp.up", K::MemoryTermKind_activations},
      {"mlp.act", K::MemoryTermKind_activations},
      {"moe.probs", K::MemoryTermKind_activations},
      {"moe.experts", K::MemoryTermKind_activations},
      {"moe.weights", K::MemoryTermKind_activations},
      {"moe.slots", K::MemoryTermKind_activations},
      {"moe.offsets", K::MemoryTermKind_activations},
      {"moe.up", K::MemoryTermKind_activations},
      {"moe.act", K::MemoryTermKind_activations},
      {"moe.out", K::MemoryTermKind_activations},
      {"moe.shared.up", K::MemoryTermKind_activations},
      {"moe.shared.act", K::MemoryTermKind_activations},
      {"moe.shared.out", K::MemoryTermKind_activations},
      {"moe.shared.gate", K::MemoryTermKind_activations},
      {"moe.aux sums", K::MemoryTermKind_activations},
      {"moe.ep counts", K::MemoryTermKind_activations},
      {"moe.ep in", K::MemoryTermKind_activations},
      {"output", K::MemoryTermKind_activations},
      {"final_norm.out", K::MemoryTermKind_activations},
      {"final_norm.mean", K::MemoryTermKind_activations},
      {"final_norm.rstd", K::MemoryTermKind_activations},
      {"logits", K::MemoryTermKind_activations},
      {"losses", K::MemoryTermKind_activations},
      {"lse", K::MemoryTermKind_activations},
      {"embedding output", K::MemoryTermKind_activations},
      {"embedding.out", K::MemoryTermKind_activations},
      {"stage input", K::MemoryTermKind_activations},
      {"stage output", K::MemoryTermKind_activations},
      {"token ids", K::MemoryTermKind_activations},
      {"target ids", K::MemoryTermKind_activations},
      {"offloaded activations", K::MemoryTermKind_activations},
      // buffers: scratch of the backward and the attention kernels, tensor-parallel partial sums,
      // and the sums of the optimizer step
      {"attention scratch", K::MemoryTermKind_buffers},
      {"attention workspace", K::MemoryTermKind_buffers},
      {"moe.logits", K::MemoryTermKind_buffers},
      {"moe gathered input", K::MemoryTermKind_buffers},
      {"moe.ep arrived rows", K::MemoryTermKind_buffers},
      {"moe.ep out", K::MemoryTermKind_buffers},
      {"moe output, all rows", K::MemoryTermKind_buffers},
      {"row-parallel partial", K::MemoryTermKind_buffers},
      {"tied embedding gradient sum", K::MemoryTermKind_buffers},
      {"sequence-parallel norm gradients", K::MemoryTermKind_buffers},
      {"gradient norm", K::MemoryTermKind_buffers},
      {"loss sum", K::MemoryTermKind_buffers},
      {"norm (profile)", K::MemoryTermKind_buffers},
  };
  return terms;
}

}  // namespace

const char* memory_term_name(MemoryTermKind kind) {
  switch (kind) {
    case K::MemoryTermKind_parameters: return "parameters";
    case K::MemoryTermKind_gradients: return "gradients";
    case K::MemoryTermKind_optimizer_state: return "optimizer state";
    case K::MemoryTermKind_activations: return "activations";
    case K::MemoryTermKind_buffers: return "buffers";
    case K::MemoryTermKind_other: return "other";
  }
  return "other";
}

const char* memory_term_key(MemoryTermKind kind) {
  return kind == K::MemoryTermKind_optimizer_state ? "optimizer_state" : memory_term_name(kind);
}

MemoryTermKind memory_term_of_buffer(const std::string& name) {
  const auto& terms = buffer_terms();
  auto it = terms.find(name);
  if (it != terms.end()) return it->second;
  // Gradients of activations ("d residual", "d mlp.up", ...) live for one block's backward or
  // one pipeline transfer: the backward workspace the cost model predicts.
  if (name.rfind("d ", 0) == 0) return K::MemoryTermKind_buffers;
  return K::MemoryTermKind_other;
}

MemoryTermBytes memory_terms_measured(const std::vector<std::pair<std::string, int64_t>>& breakdown) {
  MemoryTermBytes bytes{};
  for (const auto& [name, b] : breakdown) bytes[static_cast<size_t>(memory_term_of_buffer(name))] += b;
  return bytes;
}

std::optional<MemoryTermKind> memory_term_of_predicted(const std::string& name, bool offloads_weights) {
  if (name == "parameters" || name == "zero3_gather") return K::MemoryTermKind_parameters;
  if (name == "offload_window") return offloads_weights ? K::MemoryTermKind_parameters : K::MemoryTermKind_activations;
  if (name == "gradients") return K::MemoryTermKind_gradients;
  if (name == "optimizer_states" || name == "master_weights") return K::MemoryTermKind_optimizer_state;
  if (name == "activations") return K::MemoryTermKind_activations;
  if (name == "workspace") return K::MemoryTermKind_buffers;
  if (name == "framework_context" || name == "allocator_margin" || name == "communication_buffers" ||
      name == "host_offload")
    return std::nullopt;
  return K::MemoryTermKind_other;
}

std::array<double, kMemoryTermKinds> memory_terms_predicted(const std::vector<MemoryTerm>& memory,
                                                            bool offloads_weights) {
  std::array<double, kMemoryTermKinds> bytes{};
  for (const MemoryTerm& t : memory)
    if (const std::optional<MemoryTermKind> kind = memory_term_of_predicted(t.name, offloads_weights))
      bytes[static_cast<size_t>(*kind)] += t.bytes;
  return bytes;
}

}  // namespace alloy
