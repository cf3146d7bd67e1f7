// The Mixture-of-Experts kernels (runtime/cpu/moe.hpp): forward against double-precision
// references written here per token, backward against central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gradcheck.hpp"
#include "runtime/cpu/moe.hpp"

namespace alloy {
namespace {

using testing::expect_gradient_matches;
using testing::random_vector;
using testing::weighted_sum;

constexpr int kTokens = 10, kExperts = 5, kPicks = 2, kWidth = 6;

struct Routed {
  std::vector<float> probs, weight;
  std::vector<int32_t> expert;
};

Routed route(const std::vector<float>& logits, bool normalize) {
  Routed r{std::vector<float>(kTokens * kExperts), std::vector<float>(kTokens * kPicks),
           std::vector<int32_t>(kTokens * kPicks)};
  moe_route_forward(r.probs.data(), r.expert.data(), r.weight.data(), logits.data(), kTokens, kExperts, kPicks,
                    normalize);
  return r;
}

TEST(MoeKernels, RouteForwardMatchesSoftmaxTopK) {
  const std::vector<float> logits = random_vector(kTokens * kExperts, 1, 2.0f);
  for (bool normalize : {false, true}) {
    const Routed r = route(logits, normalize);
    for (int n = 0; n < kTokens; n++) {
      std::vector<double> p(kExperts);
      double sum = 0;
      for (int e = 0; e < kExperts; e++) sum += p[e] = std::exp(static_cast<double>(logits[n * kExperts + e]));
      for (double& value : p) value /= sum;
      std::vector<int> order(kExperts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      const double picked = p[order[0]] + p[order[1]];
      for (int e = 0; e < kExperts; e++) EXPECT_NEAR(r.probs[n * kExperts + e], p[e], 1e-6);
      for (int k = 0; k < kPicks; k++) {
        EXPECT_EQ(r.expert[n * kPicks + k], order[k]) << "token " << n;
        EXPECT_NEAR(r.weight[n * kPicks + k], normalize ? p[order[k]] / picked : p[order[k]], 1e-6);
      }
    }
  }
}

// loss = sum(weight * R) + sum_n sum_e probs[n, e] A[e], with the top-k choice held fixed.
TEST(MoeKernels, RouteBackwardMatchesFiniteDifferences) {
  std::vector<float> logits = random_vector(kTokens * kExperts, 2, 2.0f);
  const std::vector<float> dweight = random_vector(kTokens * kPicks, 3);
  const std::vector<float> aux_dprobs = random_vector(kExperts, 4);
  for (bool normalize : {false, true}) {
    const Routed r = route(logits, normalize);
    std::vector<float> dlogits(logits.size());
    moe_route_backward(dlogits.data(), dweight.data(), aux_dprobs.data(), r.probs.data(), r.expert.data(),
                       r.weight.data(), kTokens, kExperts, kPicks, normalize);
    const auto loss = [&] {
      const Routed now = route(logits, normalize);
      EXPECT_EQ(now.expert, r.expert) << "a probe changed the top-k choice: use a smaller step";
      double sum = weighted_sum(now.weight, dweight);
      for (int n = 0; n < kTokens; n++)
        for (int e = 0; e < kExperts; e++) sum += static_cast<double>(now.probs[n * kExperts + e]) * aux_dprobs[e];
      return sum;
    };
    expect_gradient_matches(normalize ? "route (renormalised)" : "route", logits, dlogits, loss, 1e-3);
  }
}

TEST(MoeKernels, PermuteGroupsSlotsByExpertAndCounts) {
  const std::vector<int32_t> expert = {2, 0, 0, 2, 1, 2};  // 3 tokens, 2 picks
  std::vector<int32_t> offsets(4), slots(6);
  std::vector<int64_t> counts(3, 10);
  moe_permute(offsets.data(), slots.data(), counts.data(), expert.data(), 3, 3, 2);
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 2, 3, 6}));
  EXPECT_EQ(slots, (std::vector<int32_t>{1, 2, 4, 0, 3, 5}));
  EXPECT_EQ(counts, (std::vector<int64_t>{12, 11, 13}));
}

// Gather, a per-row map standing in for the experts, and combine: out[n] = sum_k w[n, k] y(x[n], slot).
TEST(MoeKernels, GatherCombineForwardAndBackward) {
  std::vector<float> logits = random_vector(kTokens * kExperts, 5, 2.0f);
  const Routed r = route(logits, true);
  std::vector<int32_t> offsets(kExperts + 1), slots(kTokens * kPicks);
  moe_permute(offsets.data(), slots.data(), nullptr, r.expert.data(), kTokens, kExperts, kPicks);
  const int NK = kTokens * kPicks;
  std::vector<float> x = random_vector(kTokens * kWidth, 6);
  std::vector<float> xp(NK * kWidth);
  moe_gather(xp.data(), x.data(), slots.data(), NK, kPicks, kWidth);
  for (int row = 0; row < NK; row++)
    for (int c = 0; c < kWidth; c++) EXPECT_EQ(xp[row * kWidth + c], x[(slots[row] / kPicks) * kWidth + c]);

  std::vector<float> yp = random_vector(NK * kWidth, 7);
  std::vector<float> weight = r.weight;
  const std::vector<float> dout = random_vector(kTokens * kWidth, 8);
  const auto combine = [&] {
    std::vector<float> out(kTokens * kWidth, 0.0f);
    moe_combine_forward(out.data(), yp.data(), weight.data(), slots.data(), kTokens, kPicks, kWidth);
    return out;
  };
  const std::vector<float> out = combine();
  for (int n = 0; n < kTokens; n++) {
    for (int c = 0; c < kWidth; c++) {
      double expected = 0;
      for (int row = 0; row < NK; row++)
        if (slots[row] / kPicks == n) expected += static_cast<double>(weight[slots[row]]) * yp[row * kWidth + c];
      EXPECT_NEAR(out[n * kWidth + c], expected, 1e-6);
    }
  }
  std::vector<float> dyp(NK * kWidth), dweight(NK);
  moe_combine_backward(dyp.data(), dweight.data(), dout.data(), yp.data(), weight.data(), slots.data(), kTokens, kPicks,
                       kWidth);
  const auto loss = [&] { return weighted_sum(combine(), dout); };
  expect_gradient_matches("combine: expert outputs", yp, dyp, loss);
  expect_gradient_matches("combine: routing weights", weight, dweight, loss);

  std::vector<float> dx(kTokens * kWidth, 0.0f);
  moe_scatter_add(dx.data(), dyp.data(), slots.data(), NK, kPicks, kWidth);
  for (int n = 0; n < kTokens; n++) {
    for (int c = 0; c < kWidth; c++) {
      double expected = 0;
      for (int row = 0; row < NK; row++)
        if (slots[row] / kPicks == n) expected += dyp[row * kWidth + c];
      EXPECT_NEAR(dx[n * kWidth + c], expected, 1e-6);
    }
  }
}

TEST(MoeKernels, LoadBalancingLossForwardAndBackward) {
  std::vector<float> logits = random_vector(kTokens * kExperts, 9, 2.0f);
  const Routed r = route(logits, true);
  std::vector<int32_t> offsets(kExperts + 1), slots(kTokens * kPicks);
  moe_permute(offsets.data(), slots.data(), nullptr, r.expert.data(), kTokens, kExperts, kPicks);
  std::vector<float> probs = r.probs;
  double expected = 0;
  for (int e = 0; e < kExperts; e++) {
    double picks = 0, mean_prob = 0;
    for (int n = 0; n < kTokens; n++) {
      for (int k = 0; k < kPicks; k++) picks += r.expert[n * kPicks + k] == e ? 1 : 0;
      mean_prob += static_cast<double>(probs[n * kExperts + e]) / kTokens;
    }
    expected += picks / kTokens * mean_prob;
  }
  expected *= kExperts;
  EXPECT_NEAR(moe_aux_loss_forward(probs.data(), offsets.data(), kTokens, kExperts), expected, 1e-9);

  // Uniform routing gives the top-k: every expert picked equally often with equal probability.
  std::vector<float> uniform(kTokens * kExperts, 1.0f / kExperts);
  std::vector<int32_t> even(kExperts + 1);
  for (int e = 0; e <= kExperts; e++) even[e] = e * kTokens * kPicks / kExperts;
  EXPECT_NEAR(moe_aux_loss_forward(uniform.data(), even.data(), kTokens, kExperts), kPicks, 1e-6);

  const float daux = 0.7f;
  std::vector<float> aux_dprobs(kExperts);
  moe_aux_loss_backward(aux_dprobs.data(), offsets.data(), kTokens, kExperts, daux);
  std::vector<float> dprobs(probs.size());
  for (int n = 0; n < kTokens; n++)
    for (int e = 0; e < kExperts; e++) dprobs[n * kExperts + e] = aux_dprobs[e];
  expect_gradient_matches("load-balancing loss", probs, dprobs, [&] {
    return daux * moe_aux_loss_forward(probs.data(), offsets.data(), kTokens, kExperts);
  });
}

TEST(MoeKernels, SharedExpertGateForwardAndBackward) {
  std::vector<float> x = random_vector(kTokens * kWidth, 10);
  const std::vector<float> w = random_vector(kWidth, 11, 0.5f);
  std::vector<float> ys = random_vector(kTokens * kWidth, 12);
  std::vector<float> gate(kTokens);
  moe_gate_forward(gate.data(), x.data(), w.data(), kTokens, kWidth);
  for (int n = 0; n < kTokens; n++) {
    double dot = 0;
    for (int c = 0; c < kWidth; c++) dot += static_cast<double>(x[n * kWidth + c]) * w[c];
    EXPECT_NEAR(gate[n], 1.0 / (1.0 + std::exp(-dot)), 1e-6);
  }
  std::vector<float> gate_logit(kTokens);
  for (int n = 0; n < kTokens; n++) gate_logit[n] = static_cast<float>(std::log(gate[n] / (1.0 - gate[n])));
  const std::vector<float> dout = random_vector(kTokens * kWidth, 13);
  const auto loss = [&] {
    std::vector<float> g(kTokens), out(kTokens * kWidth, 0.0f);
    for (int n = 0; n < kTokens; n++) g[n] = static_cast<float>(1.0 / (1.0 + std::exp(-gate_logit[n])));
    moe_gated_add_forward(out.data(), ys.data(), g.data(), kTokens, kWidth);
    return weighted_sum(out, dout);
  };
  std::vector<float> dys(ys.size()), dgate_logit(kTokens);
  moe_gated_add_backward(dys.data(), dgate_logit.data(), dout.data(), ys.data(), gate.data(), kTokens, kWidth);
  expect_gradient_matches("gated add: shared output", ys, dys, loss);
  expect_gradient_matches("gated add: gate logit", gate_logit, dgate_logit, loss);
}

}  // namespace
}  // namespace alloy
