// Attention and RoPE kernels (multi-head and grouped-query) against a naive double-precision
// reference and finite differences; optimizer kernels against a hand-written AdamW step.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/cpu/attention.hpp"
#include "runtime/cpu/optimizer.hpp"
#include "runtime/threads.hpp"
#include "gradcheck.hpp"

namespace alloy {
namespace {

using testing::expect_gradient_matches;
using testing::max_relative_difference;
using testing::random_vector;
using testing::weighted_sum;

struct AttentionShape {
  int B, T, Hq, Hkv, D;
  int window = 0;  // sliding window (0: none)
  int first(int t) const { return window > 0 && t >= window ? t - window + 1 : 0; }
  int64_t row() const { return static_cast<int64_t>(Hq + 2 * Hkv) * D; }
};

// Naive causal (and sliding-window) attention in double: out (B, T, Hq D).
std::vector<double> attention_reference(const std::vector<float>& qkv, const AttentionShape& s) {
  const int64_t R = s.row();
  const int group = s.Hq / s.Hkv;
  std::vector<double> out(static_cast<size_t>(s.B) * s.T * s.Hq * s.D, 0.0);
  for (int b = 0; b < s.B; b++) {
    for (int h = 0; h < s.Hq; h++) {
      for (int t = 0; t < s.T; t++) {
        const float* q = qkv.data() + (b * s.T + t) * R + h * s.D;
        std::vector<double> scores(t + 1, 0.0);
        double max_score = -1e300;
        for (int u = s.first(t); u <= t; u++) {
          const float* k = qkv.data() + (b * s.T + u) * R + (s.Hq + h / group) * s.D;
          double dot = 0.0;
          for (int d = 0; d < s.D; d++) dot += static_cast<double>(q[d]) * k[d];
          scores[u] = dot / std::sqrt(static_cast<double>(s.D));
          max_score = std::max(max_score, scores[u]);
        }
        double sum = 0.0;
        for (int u = s.first(t); u <= t; u++) sum += (scores[u] = std::exp(scores[u] - max_score));
        for (int u = s.first(t); u <= t; u++) {
          const float* v = qkv.data() + (b * s.T + u) * R + (s.Hq + s.Hkv + h / group) * s.D;
          for (int d = 0; d < s.D; d++) {
            out[(b * s.T + t) * s.Hq * s.D + h * s.D + d] += scores[u] / sum * v[d];
          }
        }
      }
    }
  }
  return out;
}

void check_attention(const AttentionShape& s, uint32_t seed) {
  auto qkv = random_vector(static_cast<size_t>(s.B) * s.T * s.row(), seed);
  std::vector<float> out(static_cast<size_t>(s.B) * s.T * s.Hq * s.D);
  std::vector<float> probs(static_cast<size_t>(s.B) * s.Hq * s.T * s.T);
  attention_forward(out.data(), probs.data(), qkv.data(), s.B, s.T, s.Hq, s.Hkv, s.D, s.window);
  auto reference = attention_reference(qkv, s);
  EXPECT_LT(max_relative_difference(out.data(), reference.data(), out.size()), 1e-5);
  for (int t = 0; t < s.T; t++) {
    for (int u = t + 1; u < s.T; u++) EXPECT_EQ(probs[t * s.T + u], 0.0f) << "causal mask";
    for (int u = 0; u < s.first(t); u++) EXPECT_EQ(probs[t * s.T + u], 0.0f) << "sliding window";
  }

  auto dout = random_vector(out.size(), seed + 1);
  std::vector<float> dqkv(qkv.size(), 0.25f);
  std::vector<float> scratch(attention_backward_scratch_floats(s.T));
  attention_backward(dqkv.data(), scratch.data(), dout.data(), probs.data(), qkv.data(), s.B, s.T,
                     s.Hq, s.Hkv, s.D, s.window);
  for (float& g : dqkv) g -= 0.25f;
  auto loss = [&] {
    attention_forward(out.data(), probs.data(), qkv.data(), s.B, s.T, s.Hq, s.Hkv, s.D, s.window);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("attention dqkv", qkv, dqkv, loss, 1e-2, 2e-3, 96);
}

TEST(Attention, MultiHeadMatchesReferenceAndFiniteDifferences) {
  runtime_set_threads(2);
  check_attention({2, 5, 3, 3, 4}, 30);
}

TEST(Attention, GroupedQueryMatchesReferenceAndFiniteDifferences) {
  runtime_set_threads(2);
  check_attention({2, 6, 4, 2, 4}, 40);
  check_attention({1, 4, 4, 1, 2}, 50);
}

TEST(Attention, LongSequencesSpanSeveralCausalRowBlocks) {
  runtime_set_threads(2);
  check_attention({1, 150, 2, 1, 8}, 55);  // row blocks of 64: 64 + 64 + 22
}

TEST(Attention, SlidingWindowMatchesReferenceAndFiniteDifferences) {
  runtime_set_threads(2);
  check_attention({2, 9, 4, 2, 4, 3}, 60);
  check_attention({1, 6, 2, 2, 4, 1}, 61);      // each query sees itself alone
  check_attention({1, 150, 2, 1, 8, 70}, 62);   // windows across row blocks
  // A window as long as the sequence is plain causal attention.
  const AttentionShape causal{1, 7, 2, 1, 4}, whole{1, 7, 2, 1, 4, 7};
  auto qkv = random_vector(static_cast<size_t>(7) * causal.row(), 63);
  std::vector<float> a(7 * 2 * 4), b(a.size()), probs(2 * 7 * 7);
  attention_forward(a.data(), probs.data(), qkv.data(), 1, 7, 2, 1, 4, causal.window);
  attention_forward(b.data(), probs.data(), qkv.data(), 1, 7, 2, 1, 4, whole.window);
  EXPECT_EQ(a, b);
}

TEST(Rope, RotatesPairsHalfApartAndBackwardIsTranspose) {
  const int B = 2, T = 5, Hq = 2, Hkv = 1, D = 8;
  const float theta = 10000.0f;
  const int64_t R = (Hq + 2 * Hkv) * D;
  auto qkv = random_vector(B * T * R, 60);
  std::vector<float> rotated(qkv);
  rope_forward(rotated.data(), B, T, Hq, Hkv, D, rope_inverse_frequencies(D, theta).data());
  std::vector<double> reference(qkv.size());
  for (int bt = 0; bt < B * T; bt++) {
    const int t = bt % T;
    for (int h = 0; h < Hq + 2 * Hkv; h++) {
      for (int i = 0; i < D; i++) {
        const int64_t at = bt * R + h * D + i;
        if (h >= Hq + Hkv) {
          reference[at] = qkv[at];  // value heads are not rotated
          continue;
        }
        const int pair = i % (D / 2);
        const double angle = t * std::pow(static_cast<double>(theta), -2.0 * pair / D);
        const double x1 = qkv[bt * R + h * D + pair];
        const double x2 = qkv[bt * R + h * D + pair + D / 2];
        reference[at] = i < D / 2 ? x1 * std::cos(angle) - x2 * std::sin(angle)
                                  : x2 * std::cos(angle) + x1 * std::sin(angle);
      }
    }
  }
  EXPECT_LT(max_relative_difference(rotated.data(), reference.data(), rotated.size()), 1e-6);

  auto dout = random_vector(qkv.size(), 61);
  std::vector<float> dqkv(dout);
  rope_backward(dqkv.data(), B, T, Hq, Hkv, D, rope_inverse_frequencies(D, theta).data());
  auto loss = [&] {
    std::vector<float> out(qkv);
    rope_forward(out.data(), B, T, Hq, Hkv, D, rope_inverse_frequencies(D, theta).data());
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("rope dqkv", qkv, dqkv, loss, 1e-2, 1e-3, 80);
}

// Linear scaling by 2 puts position 2k where unscaled RoPE puts position k.
TEST(Rope, LinearlyScaledFrequenciesStretchPositions) {
  const int T = 8, Hq = 1, Hkv = 1, D = 8;
  const int64_t R = (Hq + 2 * Hkv) * D;
  const std::vector<float> one = random_vector(R, 70);
  std::vector<float> scaled, plain;
  for (int t = 0; t < T; t++) scaled.insert(scaled.end(), one.begin(), one.end());
  plain.assign(scaled.begin(), scaled.begin() + (T / 2) * R);
  std::vector<double> stretched = rope_inverse_frequencies(D, 10000.0);
  for (double& f : stretched) f /= 2;
  rope_forward(scaled.data(), 1, T, Hq, Hkv, D, stretched.data());
  rope_forward(plain.data(), 1, T / 2, Hq, Hkv, D, rope_inverse_frequencies(D, 10000.0).data());
  for (int k = 0; k < T / 2; k++)
    for (int64_t i = 0; i < R; i++) EXPECT_NEAR(scaled[2 * k * R + i], plain[k * R + i], 1e-6) << k << " " << i;
}

TEST(Optimizer, AdamWMatchesHandWrittenSteps) {
  const int n = 6;
  auto params = random_vector(n, 70);
  std::vector<double> p(params.begin(), params.end()), m(n, 0.0), v(n, 0.0);
  std::vector<float> mf(n, 0.0f), vf(n, 0.0f);
  AdamWHyper hyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for (int step = 1; step <= 3; step++) {
    auto grads = random_vector(n, 70 + step);
    adamw_update(params.data(), mf.data(), vf.data(), grads.data(), n, hyper, step);
    for (int i = 0; i < n; i++) {
      p[i] *= 1.0 - 1e-2 * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * grads[i];
      v[i] = 0.95 * v[i] + 0.05 * grads[i] * grads[i];
      const double m_hat = m[i] / (1.0 - std::pow(0.9, step));
      const double v_hat = v[i] / (1.0 - std::pow(0.95, step));
      p[i] -= 1e-2 * m_hat / (std::sqrt(v_hat) + 1e-8);
    }
  }
  for (int i = 0; i < n; i++) EXPECT_NEAR(params[i], p[i], 1e-6) << i;
}

// The gradients' sum of squares the norm is taken from (training's square_sum): over several
// chunks of the vector loops and a ragged end, in double, as a plain double loop sums them.
TEST(Optimizer, SquareSumOverChunksMatchesAPlainDoubleSum) {
  const int64_t n = 3 * 4096 + 123;
  std::vector<float> values(static_cast<size_t>(n));
  double reference = 0;
  for (int64_t i = 0; i < n; i++) {
    values[i] = 0.001f * static_cast<float>((i * 37) % 1001) - 0.5f;
    reference += static_cast<double>(values[i]) * values[i];
  }
  EXPECT_NEAR(square_sum(values.data(), n), reference, 1e-12 * reference);
  EXPECT_DOUBLE_EQ(grad_norm(values.data(), n), std::sqrt(square_sum(values.data(), n)));
  EXPECT_DOUBLE_EQ(square_sum(values.data(), 0), 0.0);
}

TEST(Optimizer, ClippingScalesToMaxNormOnlyWhenAbove) {
  std::vector<float> grads = {3.0f, 4.0f};
  const double norm = grad_norm(grads.data(), 2);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_FLOAT_EQ(grad_clip_scale(norm, 10.0), 1.0f);
  EXPECT_FLOAT_EQ(grad_clip_scale(norm, 0.0), 1.0f);  // disabled
  EXPECT_NEAR(grad_clip_scale(norm, 1.0), 0.2, 1e-6);

  // AdamW on clipped gradients equals AdamW with grad_scale on the raw ones.
  std::vector<float> p1 = {1.0f, -1.0f}, p2 = p1, m1(2, 0.0f), v1(2, 0.0f), m2 = m1, v2 = v1;
  std::vector<float> clipped = {3.0f * 0.2f, 4.0f * 0.2f};
  AdamWHyper hyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f};
  adamw_update(p1.data(), m1.data(), v1.data(), clipped.data(), 2, hyper, 1);
  hyper.grad_scale = grad_clip_scale(norm, 1.0);
  adamw_update(p2.data(), m2.data(), v2.data(), grads.data(), 2, hyper, 1);
  EXPECT_NEAR(p1[0], p2[0], 1e-7);
  EXPECT_NEAR(m1[1], m2[1], 1e-7);
  EXPECT_NEAR(v1[1], v2[1], 1e-7);
}

TEST(Optimizer, ScheduleWarmsUpLinearlyThenFollowsCosineToMin) {
  const double max_lr = 1e-3, min_lr = 1e-4;
  EXPECT_FLOAT_EQ(lr_schedule(0, max_lr, min_lr, 10, 110), 1e-4f);
  EXPECT_FLOAT_EQ(lr_schedule(9, max_lr, min_lr, 10, 110), 1e-3f);
  EXPECT_FLOAT_EQ(lr_schedule(10, max_lr, min_lr, 10, 110), 1e-3f);
  EXPECT_NEAR(lr_schedule(60, max_lr, min_lr, 10, 110), 0.5 * (max_lr + min_lr), 1e-9);
  EXPECT_FLOAT_EQ(lr_schedule(110, max_lr, min_lr, 10, 110), 1e-4f);
  EXPECT_FLOAT_EQ(lr_schedule(500, max_lr, min_lr, 10, 110), 1e-4f);
  float previous = 1.0f;
  for (int step = 10; step <= 110; step++) {
    const float lr = lr_schedule(step, max_lr, min_lr, 10, 110);
    EXPECT_LE(lr, previous);
    previous = lr;
  }
}

}  // namespace
}  // namespace alloy
