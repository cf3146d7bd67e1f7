// Activation memory of the single-rank model, analytic from the ModelSpec alone: what each layer
// keeps from its forward until its backward, per recomputation level. The runtime's arena
// measures exactly these bytes (tests/runtime/model_test.cpp); the planner's cost model uses the
// same functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spec/model.hpp"
#include "spec/parallel.hpp"

namespace alloy {

struct ActivationTensor {
  std::string name;   // e.g. "attn.probs"
  int64_t floats = 0;
  int64_t bytes = 0;  // fp32, rounded up to the arena's 64-byte alignment
};

// Tensors decoder block `layer` keeps for micro-batch (B, T) at the given level, in allocation
// order (the layer matters only to an MoE model: its dense and MoE blocks differ).
std::vector<ActivationTensor> block_activation_tensors(const ModelSpec& model, int64_t B,
                                                       int64_t T, Recompute level, int64_t layer = 0);
int64_t block_activation_bytes(const ModelSpec& model, int64_t B, int64_t T, Recompute level,
                               int64_t layer = 0);

// The embedding output (block 0's input), kept until the embedding's backward.
int64_t embedding_activation_bytes(const ModelSpec& model, int64_t B, int64_t T);
// Final norm output and statistics, logits (B, T, V), per-token losses and log-sum-exp.
int64_t head_activation_bytes(const ModelSpec& model, int64_t B, int64_t T);

// Everything a forward keeps: embedding + every block at its level + head. levels: one per block.
int64_t model_activation_bytes(const ModelSpec& model, int64_t B, int64_t T,
                               const std::vector<Recompute>& levels);

}  // namespace alloy
