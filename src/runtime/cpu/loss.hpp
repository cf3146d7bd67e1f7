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

// The same over a slice of the vocabulary (a tensor-parallel rank's: ids [vocab_begin,
// vocab_begin + V)), in three steps around the tensor-parallel max and sum.
// logits: (N, V) -> maxima: (N), each row's largest logit in the slice.
void crossentropy_slice_maxima(float* maxima, const float* logits, int N, int V);
// logits: (N, V), maxima: (N) over the whole vocabulary -> sums: (N) of exp(logit - max) over the
// slice; target_logits: (N) the target's logit where the slice holds it, else 0.
void crossentropy_slice_sums(float* sums, float* target_logits, const float* logits, const float* maxima,
                             const int32_t* targets, int64_t vocab_begin, int N, int V);
// Overwrites logits: (N, V) with the slice's dlogits, lse: (N) over the whole vocabulary.
void crossentropy_slice_backward_inplace(float* logits, const float* lse, const int32_t* targets, int64_t vocab_begin,
                                         int N, int V, float dloss);

}  // namespace alloy
