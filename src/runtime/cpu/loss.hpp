// Fused softmax cross-entropy over the vocabulary (fp32, CPU).
#pragma once

#include <cstdint>

namespace alloy {

// logits: (N, V)  targets: (N) -> losses: (N), lse: (N) log-sum-exp kept for backward;
// returns the mean loss over the N tokens.
float crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V);

// Overwrites logits: (N, V) with dlogits = (softmax(logits) - onehot(targets)) * dloss, where
// dloss = 1 / N for the mean loss. In place, unlike the other backward kernels: the logits are
// the largest activation and nothing else reads them after the loss.
void crossentropy_backward_inplace(float* logits, const float* lse, const int32_t* targets, int N,
                                   int V, float dloss);

}  // namespace alloy
