// Mixture-of-Experts kernels of one MoE MLP (fp32, CPU): the router's softmax and top-k, the
// permutation of token slots grouped by expert, the weighted combine, the shared experts' sigmoid
// gate and the load-balancing loss. The experts' own matmuls and SwiGLU are matmul.hpp's and
// activation.hpp's kernels, run once per expert on its contiguous rows. Routing is dropless:
// every token reaches all of its top-k experts.
#pragma once

#include <cstdint>

namespace alloy {

// logits: (N, E) -> probs: (N, E) softmax over the experts; expert: (N, K) the K most probable
// experts of each token, most probable first (ties: the lower index); weight: (N, K) their
// probabilities, divided by the K picks' sum when normalize (Mixtral; Qwen2-MoE and DeepSeek
// as their norm_topk_prob says).
void moe_route_forward(float* probs, int32_t* expert, float* weight, const float* logits, int N, int E, int K,
                       bool normalize);

// dweight: (N, K) and aux_dprobs: (E), a gradient every token's probs receive (the
// load-balancing loss's; nullptr for none) -> dlogits: (N, E) =, through the softmax. The top-k
// choice is constant: gradients flow through the picked probabilities only.
void moe_route_backward(float* dlogits, const float* dweight, const float* aux_dprobs, const float* probs,
                        const int32_t* expert, const float* weight, int N, int E, int K, bool normalize);

// expert: (N, K) -> offsets: (E + 1) where each expert's rows start in the permuted order
// (offsets[E] = N K); slots: (N K) the slot n K + k of each permuted row, grouped by expert,
// tokens ascending within an expert. counts: (E) += rows per expert (nullptr to skip).
void moe_permute(int32_t* offsets, int32_t* slots, int64_t* counts, const int32_t* expert, int N, int E, int K);

// x: (N, C) -> xp: (N K, C), permuted row r = x[slots[r] / K].
void moe_gather(float* xp, const float* x, const int32_t* slots, int NK, int K, int C);
// dxp: (N K, C) -> dx: (N, C) += each permuted row into its token's row.
void moe_scatter_add(float* dx, const float* dxp, const int32_t* slots, int NK, int K, int C);

// slots: (N K) from moe_permute -> rows: (N K) the permuted row of each slot n K + k (its inverse).
void moe_rows_of_slots(int32_t* rows, const int32_t* slots, int NK);

// yp: (N K, C) expert outputs in permuted order, weight: (N, K) -> out: (N, C) += weight * y.
void moe_combine_forward(float* out, const float* yp, const float* weight, const int32_t* slots, int N, int K, int C);
// dout: (N, C) -> dyp: (N K, C) = weight * dout, dweight: (N, K) = <dout, y>.
void moe_combine_backward(float* dyp, float* dweight, const float* dout, const float* yp, const float* weight,
                          const int32_t* slots, int N, int K, int C);

// The Switch / Mixtral load-balancing loss of one MoE block over its N tokens:
//   aux = E * sum_e f_e P_e,  f_e = (top-k picks of e) / N,  P_e = (1 / N) sum_n probs[n, e]
// (sum_e f_e = K; uniform routing gives aux = K). probs: (N, E), offsets: (E + 1) from moe_permute.
double moe_aux_loss_forward(const float* probs, const int32_t* offsets, int N, int E);
// daux: d(loss)/d(aux) -> aux_dprobs: (E) = daux * E f_e / N, d(loss)/d(probs[n, e]) for every
// token n (f_e is constant, as the top-k choice is).
void moe_aux_loss_backward(float* aux_dprobs, const int32_t* offsets, int N, int E, float daux);

// The same loss over tokens of several replicas: sums: (2 E) += the top-k picks of each expert,
// then its probabilities summed over this replica's N tokens; the loss of the summed sums over
// N_total tokens; and d(loss)/d(probs[n, e]) = daux E f_e / N_local for this replica's tokens
// (its gradients are summed with the other replicas', each scaled by its share of the batch).
void moe_aux_sums_add(double* sums, const float* probs, const int32_t* offsets, int N, int E);
double moe_aux_loss_from_sums(const double* sums, double N_total, int E);
void moe_aux_backward_from_sums(float* aux_dprobs, const double* sums, double N_total, int N_local, int E, float daux);

// x: (N, C), w: (C) -> gate: (N) = sigmoid(x w) (Qwen2-MoE's shared-expert gate).
void moe_gate_forward(float* gate, const float* x, const float* w, int N, int C);
// ys: (N, C), gate: (N) -> out: (N, C) += gate * ys.
void moe_gated_add_forward(float* out, const float* ys, const float* gate, int N, int C);
// dout: (N, C) -> dys: (N, C) = gate * dout, dgate_logit: (N) = <dout, ys> gate (1 - gate).
void moe_gated_add_backward(float* dys, float* dgate_logit, const float* dout, const float* ys, const float* gate,
                            int N, int C);
}  // namespace alloy
