// The Mixture-of-Experts MLP of a GPU model's block (gpu_moe.cpp): private to the GPU model.
#pragma once

#include "runtime/cuda/gpu_model.hpp"

namespace alloy {

// Throws alloy::Error naming what of an MoE model the GPU model does not run (nothing for a
// model it runs, or a dense one).
void gpu_moe_check(const Model& host);

// b.ln2: (N, C) -> routing, the experts' and shared experts' activations in b, and with
// `with_output` b.out: (N, C) = b.residual1 + the MoE MLP's output. `counted`: the pass's first
// forward of the block (not a recomputation), whose routing and balance statistics count.
void gpu_moe_forward(GpuModel& m, GpuActivations& pass, int layer, GpuBlockActivations& b, bool with_output,
                     bool counted);
// dout: (N, C) d(block output) -> dln: (N, C) = d(b.ln2) (overwritten), and the MLP's weight
// gradients added; aux_scale: d(objective) / d(this block's load-balancing term).
void gpu_moe_backward(GpuModel& m, const GpuActivations& pass, int layer, const GpuBlockActivations& b,
                      const bf16* dout, bf16* dln, float aux_scale);
// Frees the MoE buffers of b (twice is harmless).
void gpu_moe_release(GpuModel& m, GpuBlockActivations& b);

}  // namespace alloy
