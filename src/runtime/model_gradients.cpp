// The passes' writers of parameter gradients, announced to the model's gradient sink.
#include <limits>
#include <vector>

#include "runtime/cpu/embedding.hpp"
#include "runtime/cpu/matmul.hpp"
#include "runtime/model_internal.hpp"

namespace alloy {

namespace {

constexpr int64_t kAllRows = std::numeric_limits<int64_t>::max();

// Writes the matrix behind `slot` in the sink's row pieces, the last piece first (the flat
// order's reverse, as the backward meets the parameters): write(rows begin, end, where row
// `begin` goes).
template <typename Write>
void write_row_pieces(GradientSink& sink, float* const* slot, int64_t rows, Write&& write) {
  const std::vector<int64_t> cuts = sink.row_cuts(slot, rows);
  for (size_t k = cuts.size() - 1; k > 0; --k) {
    float* at = sink.writing(slot, cuts[k - 1], cuts[k]);
    write(cuts[k - 1], cuts[k], at);
    sink.written(slot, cuts[k - 1], cuts[k]);
  }
}

}  // namespace

void norm_backward(Model& model, const Dims& d, float* dinp, float* const* dw, float* const* db, const float* dout,
                   const float* inp, const float* w, const float* mean, const float* rstd) {
  GradientSink* sink = model.gradient_sink;
  // The bias follows the weight in the flat order: announced first.
  float* db_at = db == nullptr ? nullptr : sink != nullptr ? sink->writing(db, 0, kAllRows) : *db;
  float* dw_at = sink != nullptr ? sink->writing(dw, 0, kAllRows) : *dw;
  if (d.gpt2) {
    layernorm_backward(dinp, dw_at, db_at, dout, inp, w, mean, rstd, d.Nn, d.C);
  } else {
    rmsnorm_backward(dinp, dw_at, dout, inp, w, rstd, d.Nn, d.C);
  }
  if (sink != nullptr) {
    if (db != nullptr) sink->written(db, 0, kAllRows);
    sink->written(dw, 0, kAllRows);
  }
}

void linear_backward(Model& model, float* dinp, float* const* dw, float* const* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC) {
  GradientSink* sink = model.gradient_sink;
  // N == 0: an MoE expert no token picked; its gradient is still announced to the sink.
  if (sink == nullptr) {
    if (N > 0) matmul_backward(dinp, *dw, db != nullptr ? *db : nullptr, dout, inp, w, N, C, OC);
    return;
  }
  if (N > 0) matmul_backward(dinp, nullptr, nullptr, dout, inp, w, N, C, OC);
  // The bias follows its weight in the flat order: written first.
  if (db != nullptr) {
    if (float* db_at = sink->writing(db, 0, kAllRows); db_at != nullptr && N > 0) matmul_backward_bias(db_at, dout, N, OC);
    sink->written(db, 0, kAllRows);
  }
  write_row_pieces(*sink, dw, OC, [&](int64_t begin, int64_t end, float* at) {
    if (N > 0)
      matmul_backward_weight_rows(at, nullptr, dout, inp, N, C, OC, static_cast<int>(begin), static_cast<int>(end));
  });
}

void embedding_gradients(Model& model, const Dims& d, const float* dout, const int32_t* tokens) {
  GradientSink* sink = model.gradient_sink;
  ModelTensors& g = model.gradients;
  if (sink == nullptr) {
    if (d.tp == 1) {
      embedding_backward(g.token, g.position, dout, tokens, d.B, d.T, d.C);
      return;
    }
    for (int n = 0; n < d.N; n++) {
      const float* row = dout + int64_t{n} * d.C;
      const int64_t local = tokens[n] - d.vocab_begin;
      if (local >= 0 && local < d.V) {
        for (int c = 0; c < d.C; c++) g.token[local * d.C + c] += row[c];
      }
    }
    if (g.position != nullptr) embedding_backward_position_rows(g.position, dout, d.B, d.T, d.C, 0, d.T);
    return;
  }
  // Positions follow the table in the flat order: written first.
  if (model.spec.family == ModelFamily::ModelFamily_gpt2) {
    write_row_pieces(*sink, &g.position, model.spec.max_seq_len, [&](int64_t begin, int64_t end, float* at) {
      embedding_backward_position_rows(at, dout, d.B, d.T, d.C, begin, end);
    });
  }
  write_row_pieces(*sink, &g.token, d.V, [&](int64_t begin, int64_t end, float* at) {
    embedding_backward_token_rows(at, dout, tokens, d.N, d.C, d.tp == 1 ? 0 : d.vocab_begin, begin, end);
  });
}

}  // namespace alloy
