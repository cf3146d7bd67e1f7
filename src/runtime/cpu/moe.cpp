// Mixture-of-Experts routing, permutation, combine, shared-expert gate and load-balancing loss
// (see moe.hpp). Plain loops: every kernel here is linear in N (E, K, C), far below the experts'
// matmuls.
#include "runtime/cpu/moe.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace alloy {

void moe_route_forward(float* probs, int32_t* expert, float* weight, const float* logits, int N, int E, int K,
                       bool normalize) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float* row = logits + int64_t{n} * E;
    float* p = probs + int64_t{n} * E;
    float best = row[0];
    for (int e = 1; e < E; e++) best = std::max(best, row[e]);
    double sum = 0;
    for (int e = 0; e < E; e++) sum += std::exp(static_cast<double>(row[e] - best));
    for (int e = 0; e < E; e++) p[e] = static_cast<float>(std::exp(static_cast<double>(row[e] - best)) / sum);
    int32_t* picks = expert + int64_t{n} * K;
    float* w = weight + int64_t{n} * K;
    // K rounds of "most probable not yet picked": K is small (1 to 8 in published models).
    double picked_sum = 0;
    for (int k = 0; k < K; k++) {
      int choice = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int j = 0; j < k; j++) taken = taken || picks[j] == e;
        if (!taken && (choice < 0 || p[e] > p[choice])) choice = e;
      }
      picks[k] = choice;
      w[k] = p[choice];
      picked_sum += p[choice];
    }
    if (normalize)
      for (int k = 0; k < K; k++) w[k] = static_cast<float>(w[k] / picked_sum);
  }
}

void moe_route_backward(float* dlogits, const float* dweight, const float* aux_dprobs, const float* probs,
                        const int32_t* expert, const float* weight, int N, int E, int K, bool normalize) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float* p = probs + int64_t{n} * E;
    const int32_t* picks = expert + int64_t{n} * K;
    const float* dw = dweight + int64_t{n} * K;
    const float* w = weight + int64_t{n} * K;
    float* dl = dlogits + int64_t{n} * E;
    // dl holds d(loss)/d(probs) first, then the softmax's backward turns it into d/d(logits).
    for (int e = 0; e < E; e++) dl[e] = aux_dprobs != nullptr ? aux_dprobs[e] : 0.0f;
    if (normalize) {
      // w_k = p_k / S with S the picks' sum: d/dp_j = (dw_j - sum_k dw_k w_k) / S.
      double picked_sum = 0, dot = 0;
      for (int k = 0; k < K; k++) {
        picked_sum += p[picks[k]];
        dot += static_cast<double>(dw[k]) * w[k];
      }
      for (int k = 0; k < K; k++) dl[picks[k]] += static_cast<float>((dw[k] - dot) / picked_sum);
    } else {
      for (int k = 0; k < K; k++) dl[picks[k]] += dw[k];
    }
    double inner = 0;
    for (int e = 0; e < E; e++) inner += static_cast<double>(p[e]) * dl[e];
    for (int e = 0; e < E; e++) dl[e] = static_cast<float>(p[e] * (dl[e] - inner));
  }
}

void moe_permute(int32_t* offsets, int32_t* slots, int64_t* counts, const int32_t* expert, int N, int E, int K) {
  const int NK = N * K;
  for (int e = 0; e <= E; e++) offsets[e] = 0;
  for (int s = 0; s < NK; s++) offsets[expert[s] + 1]++;
  for (int e = 0; e < E; e++) {
    if (counts != nullptr) counts[e] += offsets[e + 1];
    offsets[e + 1] += offsets[e];
  }
  // Slots in ascending order land in ascending order within their expert's rows.
  std::vector<int32_t> next(offsets, offsets + E);
  for (int s = 0; s < NK; s++) slots[next[static_cast<size_t>(expert[s])]++] = s;
}

void moe_gather(float* xp, const float* x, const int32_t* slots, int NK, int K, int C) {
#pragma omp parallel for
  for (int r = 0; r < NK; r++) {
    const float* from = x + int64_t{slots[r] / K} * C;
    float* to = xp + int64_t{r} * C;
    for (int c = 0; c < C; c++) to[c] = from[c];
  }
}

void moe_scatter_add(float* dx, const float* dxp, const int32_t* slots, int NK, int K, int C) {
  // Serial over rows: a token's K rows land in the same row of dx.
  for (int r = 0; r < NK; r++) {
    float* to = dx + int64_t{slots[r] / K} * C;
    const float* from = dxp + int64_t{r} * C;
    for (int c = 0; c < C; c++) to[c] += from[c];
  }
}

void moe_rows_of_slots(int32_t* rows, const int32_t* slots, int NK) {
  for (int r = 0; r < NK; r++) rows[slots[r]] = r;
}

namespace {

std::vector<int32_t> moe_rows_of(const int32_t* slots, int NK) {
  std::vector<int32_t> rows(static_cast<size_t>(NK));
  moe_rows_of_slots(rows.data(), slots, NK);
  return rows;
}

}  // namespace

void moe_combine_forward(float* out, const float* yp, const float* weight, const int32_t* slots, int N, int K, int C) {
  const std::vector<int32_t> rows = moe_rows_of(slots, N * K);
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    float* o = out + int64_t{n} * C;
    for (int k = 0; k < K; k++) {
      const int64_t slot = int64_t{n} * K + k;
      const float* y = yp + int64_t{rows[static_cast<size_t>(slot)]} * C;
      const float w = weight[slot];
      for (int c = 0; c < C; c++) o[c] += w * y[c];
    }
  }
}

void moe_combine_backward(float* dyp, float* dweight, const float* dout, const float* yp, const float* weight,
                          const int32_t* slots, int N, int K, int C) {
  const std::vector<int32_t> rows = moe_rows_of(slots, N * K);
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float* d = dout + int64_t{n} * C;
    for (int k = 0; k < K; k++) {
      const int64_t slot = int64_t{n} * K + k;
      const int64_t row = rows[static_cast<size_t>(slot)];
      const float* y = yp + row * C;
      float* dy = dyp + row * C;
      const float w = weight[slot];
      double dot = 0;
      for (int c = 0; c < C; c++) {
        dot += static_cast<double>(d[c]) * y[c];
        dy[c] = w * d[c];
      }
      dweight[slot] = static_cast<float>(dot);
    }
  }
}

double moe_aux_loss_forward(const float* probs, const int32_t* offsets, int N, int E) {
  std::vector<double> mean_probs(static_cast<size_t>(E), 0.0);
  for (int n = 0; n < N; n++)
    for (int e = 0; e < E; e++) mean_probs[static_cast<size_t>(e)] += probs[int64_t{n} * E + e];
  double sum = 0;
  for (int e = 0; e < E; e++) {
    const double fraction = static_cast<double>(offsets[e + 1] - offsets[e]) / N;
    sum += fraction * mean_probs[static_cast<size_t>(e)] / N;
  }
  return E * sum;
}

void moe_aux_loss_backward(float* aux_dprobs, const int32_t* offsets, int N, int E, float daux) {
  for (int e = 0; e < E; e++) {
    const double fraction = static_cast<double>(offsets[e + 1] - offsets[e]) / N;
    aux_dprobs[e] = static_cast<float>(static_cast<double>(daux) * E * fraction / N);
  }
}

void moe_aux_sums_add(double* sums, const float* probs, const int32_t* offsets, int N, int E) {
  for (int e = 0; e < E; e++) sums[e] += static_cast<double>(offsets[e + 1] - offsets[e]);
  for (int n = 0; n < N; n++)
    for (int e = 0; e < E; e++) sums[E + e] += probs[int64_t{n} * E + e];
}

double moe_aux_loss_from_sums(const double* sums, double N_total, int E) {
  double sum = 0;
  for (int e = 0; e < E; e++) sum += sums[e] / N_total * sums[E + e] / N_total;
  return E * sum;
}

void moe_aux_backward_from_sums(float* aux_dprobs, const double* sums, double N_total, int N_local, int E, float daux) {
  for (int e = 0; e < E; e++)
    aux_dprobs[e] = static_cast<float>(static_cast<double>(daux) * E * (sums[e] / N_total) / N_local);
}

void moe_gate_forward(float* gate, const float* x, const float* w, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float* row = x + int64_t{n} * C;
    double dot = 0;
    for (int c = 0; c < C; c++) dot += static_cast<double>(row[c]) * w[c];
    gate[n] = static_cast<float>(1.0 / (1.0 + std::exp(-dot)));
  }
}

void moe_gated_add_forward(float* out, const float* ys, const float* gate, int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    float* o = out + int64_t{n} * C;
    const float* y = ys + int64_t{n} * C;
    for (int c = 0; c < C; c++) o[c] += gate[n] * y[c];
  }
}

void moe_gated_add_backward(float* dys, float* dgate_logit, const float* dout, const float* ys, const float* gate,
                            int N, int C) {
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const float* d = dout + int64_t{n} * C;
    const float* y = ys + int64_t{n} * C;
    float* dy = dys + int64_t{n} * C;
    double dot = 0;
    for (int c = 0; c < C; c++) {
      dot += static_cast<double>(d[c]) * y[c];
      dy[c] = gate[n] * d[c];
    }
    dgate_logit[n] = static_cast<float>(dot * gate[n] * (1.0 - gate[n]));
  }
}

}  // namespace alloy
