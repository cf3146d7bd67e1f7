#include "cost/layer_cost.hpp"

#include <utility>

namespace alloy {

namespace {

int64_t query_width(const ModelSpec& m) { return m.num_heads * m.head_dim; }
int64_t kv_width(const ModelSpec& m) { return m.num_kv_heads * m.head_dim; }
bool is_llama(const ModelSpec& m) { return m.family == ModelFamily::ModelFamily_llama; }
int mlp_matrices(const ModelSpec& m) { return is_llama(m) ? 3 : 2; }

// Weights that take part in matrix products inside one block.
int64_t block_matmul_parameters(const ModelSpec& m) {
  const int64_t c = m.hidden_size;
  const int64_t attention = c * query_width(m) + 2 * c * kv_width(m) + query_width(m) * c;
  return attention + mlp_matrices(m) * c * m.ffn_hidden_size;
}

}  // namespace

int64_t block_parameters(const ModelSpec& m) {
  const int64_t c = m.hidden_size;
  const int64_t f = m.ffn_hidden_size;
  int64_t params = block_matmul_parameters(m);
  if (m.qkv_bias) params += query_width(m) + 2 * kv_width(m);
  if (m.linear_bias) params += c + (is_llama(m) ? 2 * f + c : f + c);
  params += 2 * (m.norm_bias ? 2 * c : c);
  return params;
}

int64_t embedding_parameters(const ModelSpec& m) {
  int64_t params = m.vocab_size * m.hidden_size;
  if (m.family == ModelFamily::ModelFamily_gpt2) params += m.max_seq_len * m.hidden_size;
  return params;
}

int64_t head_parameters(const ModelSpec& m, bool holds_lm_matrix) {
  const int64_t norm = m.norm_bias ? 2 * m.hidden_size : m.hidden_size;
  return norm + (holds_lm_matrix ? m.vocab_size * m.hidden_size : 0);
}

double eager_block_elementwise_bytes_per_token(const ModelSpec& m, int tp, bool sequence_parallel, Precision precision) {
  const double e = precision_bytes(precision);
  const double x = static_cast<double>(m.hidden_size);
  const double q = static_cast<double>(query_width(m)) / tp;
  const double kv = static_cast<double>(kv_width(m)) / tp;
  const double f = static_cast<double>(m.ffn_hidden_size) / tp;
  const double x_share = sequence_parallel ? 1.0 / tp : 1.0;
  // Hidden-sized steps split by sequence parallelism: two norms and two residual adds. The
  // projections read their input whole (gathered) and a row-parallel product writes its whole
  // partial sum.
  const double norms_and_adds = 2.0 * (4.0 * e + 28.0) + 2.0 * 3.0 * e;
  const double projections_x = 3.0 * e + e + 2.0 * e + e;
  const double query = e + (2.0 * e + 16.0) + 2.0 * e + 4.0 * e + e;
  const double key_value = 2.0 * e + (2.0 * e + 16.0) + 2.0 * e;
  const double mlp = 2.0 * e + 2.0 * e + 3.0 * e + e;
  return x * (x_share * norms_and_adds + projections_x) + q * query + kv * key_value + f * mlp;
}

std::vector<BlockMatmul> block_matmuls_in_call_order(const ModelSpec& m, int tp) {
  const double x = static_cast<double>(m.hidden_size);
  const double q = static_cast<double>(query_width(m)) / tp;
  const double kv = static_cast<double>(kv_width(m)) / tp;
  const double f = static_cast<double>(m.ffn_hidden_size) / tp;
  std::vector<BlockMatmul> order = {{x, q}, {x, kv}, {x, kv}, {q, x}};
  if (is_llama(m)) order.insert(order.end(), {{x, f}, {x, f}, {f, x}});
  else order.insert(order.end(), {{x, f}, {f, x}});
  return order;
}

namespace {

// The input widths and the weight elements of a block's linear layers, per tp rank.
std::pair<double, double> block_linear_inputs_and_weights(const ModelSpec& m, int tp) {
  double inputs = 0, weights = 0;
  for (const BlockMatmul& product : block_matmuls_in_call_order(m, tp)) {
    inputs += product.input_width;
    weights += product.input_width * product.output_width;
  }
  return {inputs, weights};
}

}  // namespace

double fp8_cast_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp, Fp8WeightCasts weight_casts) {
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  const auto [inputs, weights] = block_linear_inputs_and_weights(m, tp);
  const bool weights_cast = weight_casts == Fp8WeightCasts::Fp8WeightCasts_every_micro_batch;
  return 3.0 * (tokens * inputs + (weights_cast ? weights : 0.0));
}

double fp8_weight_cast_bytes_per_step(const ModelSpec& m, int tp) {
  return 4.0 * block_linear_inputs_and_weights(m, tp).second;
}

LayerWork alternate_matmuls_recompute_work(const LayerWork& block) {
  LayerWork r;
  r.forward_flops = block.selective_flops;
  r.forward_elementwise_bytes = block.forward_elementwise_bytes - block.forward_score_bytes;
  r.forward_bytes = r.forward_elementwise_bytes;
  r.matmul_rows = block.matmul_rows;
  r.matmul_cols = block.matmul_cols;
  return r;
}

LayerWork block_work(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                     bool sequence_parallel, Precision precision, ElementwiseKernels kernels,
                     SelectiveRecompute selective, Fp8WeightCasts weight_casts) {
  const double e = precision_bytes(precision);
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  const double c = static_cast<double>(m.hidden_size);
  const double f = static_cast<double>(m.ffn_hidden_size);
  const double heads = static_cast<double>(m.num_heads);
  const double scores = static_cast<double>(micro_batch) * heads * static_cast<double>(seq_len) *
                        static_cast<double>(seq_len);  // (b, Hq, s, s)
  const double matmul_flops = 2.0 * tokens * static_cast<double>(block_matmul_parameters(m));
  // Q K^T and scores x V: 2 products of (s x D) by (D x s) per head.
  const double attention_flops = 4.0 * tokens * static_cast<double>(seq_len) * static_cast<double>(query_width(m));
  const double elementwise_share = sequence_parallel ? 1.0 / tp : 1.0;

  LayerWork w;
  w.forward_flops = (matmul_flops + attention_flops) / tp;
  // Weights read once, hidden-sized tensors (norms, residuals, projections) read and written a
  // few times, the score matrix written and read by the softmax.
  const double weight_bytes = static_cast<double>(block_parameters(m)) * e / tp;
  const double hidden_traffic =
      kernels == ElementwiseKernels::ElementwiseKernels_eager
          ? tokens * eager_block_elementwise_bytes_per_token(m, tp, sequence_parallel, precision)
          : tokens * (8.0 * c * elementwise_share + (4.0 * f + 4.0 * c) / tp) * e;
  const double score_traffic = 3.0 * scores * e / tp;
  const double casts = precision == Precision::Precision_fp8 ? fp8_cast_bytes(m, micro_batch, seq_len, tp, weight_casts) : 0.0;
  w.forward_bytes = weight_bytes + hidden_traffic + score_traffic + casts;
  w.forward_elementwise_bytes = hidden_traffic + score_traffic + casts;
  w.forward_score_bytes = score_traffic;
  w.sixteen_bit_forward_flops = attention_flops / tp;
  w.backward_flops = 2.0 * w.forward_flops;
  w.backward_bytes = 2.0 * w.forward_bytes;
  w.selective_flops = attention_flops / tp;
  if (selective == SelectiveRecompute::SelectiveRecompute_alternate_matmuls) {
    const std::vector<BlockMatmul> order = block_matmuls_in_call_order(m, tp);
    w.selective_flops = 0;
    for (size_t i = 1; i < order.size(); i += 2) w.selective_flops += 2.0 * tokens * order[i].input_width * order[i].output_width;
  }
  w.full_recompute_flops = w.forward_flops - 2.0 * tokens * f * c / tp;  // less the (F -> C) projection
  w.selective_bytes = score_traffic + tokens * 3.0 * static_cast<double>(query_width(m)) * e / tp;
  w.matmul_rows = tokens;
  w.matmul_cols = c / tp;
  return w;
}

LayerWork embedding_work(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                         Precision precision) {
  const double e = precision_bytes(precision);
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  LayerWork w;
  // A gather of rows: no FLOPs worth counting, traffic of the output (and the position add).
  w.forward_bytes = 3.0 * tokens * static_cast<double>(m.hidden_size) * e;
  w.forward_elementwise_bytes = w.forward_bytes;
  w.backward_bytes = 2.0 * w.forward_bytes + static_cast<double>(embedding_parameters(m)) * e / tp;
  w.matmul_rows = tokens;
  w.matmul_cols = static_cast<double>(m.hidden_size);
  return w;
}

LayerWork head_work(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                    Precision precision, LossLogits loss) {
  const double e = precision_bytes(precision);
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  const double c = static_cast<double>(m.hidden_size);
  const double v = static_cast<double>(m.vocab_size);
  LayerWork w;
  w.forward_flops = 2.0 * tokens * c * v / tp;
  w.sixteen_bit_forward_flops = w.forward_flops;
  // Logits written in the compute precision, read back by an fp32 softmax cross-entropy.
  w.forward_bytes = v * c * e / tp + tokens * v * (e + 4.0) / tp + tokens * c * e;
  w.forward_elementwise_bytes = tokens * v * (e + 4.0) / tp;
  if (loss == LossLogits::LossLogits_fp32_copy) {
    // Logits written, copied to fp32 (e in, 4 out), log-softmax over the copy (4 in, 4 out).
    const double copied = tokens * v * (e + (e + 4.0) + 8.0) / tp;
    w.forward_bytes += copied - w.forward_elementwise_bytes;
    w.forward_elementwise_bytes = copied;
  }
  w.backward_flops = 2.0 * w.forward_flops;
  w.backward_bytes = 2.0 * w.forward_bytes;
  w.matmul_rows = tokens;
  w.matmul_cols = v / tp;
  return w;
}

double recompute_forward_share(const LayerWork& block, Recompute recompute) {
  if (block.forward_flops <= 0) return 0;
  switch (recompute) {
    case Recompute::Recompute_none:
      return 0;
    case Recompute::Recompute_selective:
      return block.selective_flops / block.forward_flops;
    case Recompute::Recompute_full:
      return block.full_recompute_flops / block.forward_flops;
  }
  return 0;
}

double model_flops_per_sequence(const ModelSpec& m, int64_t seq_len) {
  // MoE: the router, the top-k routed and the shared experts a token passes through.
  if (model_is_moe(m)) return model_flops_per_token(m, seq_len).training * static_cast<double>(seq_len);
  const double s = static_cast<double>(seq_len);
  const double per_block = 2.0 * s * static_cast<double>(block_matmul_parameters(m)) +
                           4.0 * s * s * static_cast<double>(query_width(m));
  const double head = 2.0 * s * static_cast<double>(m.hidden_size) * static_cast<double>(m.vocab_size);
  return 3.0 * (per_block * static_cast<double>(m.num_layers) + head);
}

double block_activation_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                              bool sequence_parallel, Recompute recompute, Precision precision,
                              AttentionMemory attention, SelectiveRecompute selective) {
  const bool megatron = attention == AttentionMemory::AttentionMemory_megatron;
  const double e = precision_bytes(precision);
  const double sb = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  const double c = static_cast<double>(m.hidden_size);
  const double f = static_cast<double>(m.ffn_hidden_size);
  const double q = static_cast<double>(query_width(m));
  const double kv = static_cast<double>(kv_width(m));
  const double scores = static_cast<double>(micro_batch) * static_cast<double>(m.num_heads) *
                        static_cast<double>(seq_len) * static_cast<double>(seq_len);
  const bool dropout = megatron && m.family == ModelFamily::ModelFamily_gpt2;
  // Tensors at the tp region boundaries are replicated unless sequence parallelism splits them.
  const double boundary_share = sequence_parallel ? 1.0 / tp : 1.0;

  if (recompute == Recompute::Recompute_full) return sb * c * e * boundary_share;
  if (recompute == Recompute::Recompute_selective && selective == SelectiveRecompute::SelectiveRecompute_alternate_matmuls) {
    const std::vector<BlockMatmul> order = block_matmuls_in_call_order(m, tp);
    double kept_width = 0;
    for (size_t i = 0; i < order.size(); i += 2) kept_width += order[i].output_width;
    const double log_sum_exp = scores / static_cast<double>(seq_len) * 4.0 / tp;
    return sb * c * e * boundary_share + sb * (kept_width + q / tp) * e + log_sum_exp;
  }

  // Replicated across tp without sequence parallelism: two norm inputs, the attention and MLP
  // inputs (the norms' outputs), and (Megatron, GPT-2) the two dropout masks (1 byte per element).
  // Under sequence parallelism Megatron keeps its shard of each norm output and gathers it again
  // in the backward; Alloy's CPU runtime keeps the gathered output whole for the backward's
  // weight gradient, so there only the norm inputs split.
  const bool whole_norm_outputs = attention == AttentionMemory::AttentionMemory_scores;
  double boundary = sb * c * e * (whole_norm_outputs ? 2.0 : 4.0);
  const double norm_outputs = whole_norm_outputs ? sb * c * e * 2.0 : 0.0;
  if (dropout) boundary += 2.0 * sb * c;
  // Alloy's runtimes keep each norm's fp32 statistics (LayerNorm: mean and rstd; RMSNorm: rstd).
  if (!megatron) boundary += sb * 2.0 * (m.family == ModelFamily::ModelFamily_gpt2 ? 8.0 : 4.0);
  // Split across tp: Q, K, V, the attention output projection input and the MLP intermediates
  // (GELU: its input and output; SwiGLU: gate, up and their product).
  const double mlp_tensors = is_llama(m) ? 3.0 : 2.0;
  const double inner = sb * (q + 2.0 * kv + q + mlp_tensors * f) * e;
  double stored = boundary * boundary_share + norm_outputs + inner / tp;
  switch (attention) {
    case AttentionMemory::AttentionMemory_fused:
      // The log-sum-exp of each query row (fp32); selective recomputation has nothing to drop.
      return stored + scores / static_cast<double>(seq_len) * 4.0 / tp;
    case AttentionMemory::AttentionMemory_scores:
      // Selective recomputation drops the scores and the attention context.
      if (recompute == Recompute::Recompute_selective) return stored - sb * q * e / tp;
      return stored + scores * e / tp;
    case AttentionMemory::AttentionMemory_megatron:
      // Softmax output, plus (GPT-2) the attention dropout mask and its output.
      if (recompute == Recompute::Recompute_none) stored += scores * (dropout ? 2.0 * e + 1.0 : e) / tp;
      return stored;
  }
  return stored;
}

double embedding_activation_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                                  bool sequence_parallel, Precision precision) {
  const double out = hidden_state_bytes(m, micro_batch, seq_len, precision);
  return sequence_parallel ? out / tp : out;
}

double block_backward_workspace_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                                      Precision precision) {
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  const double c = static_cast<double>(m.hidden_size);
  const double f = static_cast<double>(m.ffn_hidden_size) / tp;
  const double q = static_cast<double>(query_width(m)) / tp;
  const double kv = static_cast<double>(kv_width(m)) / tp;
  const double mlp = is_llama(m) ? 3.0 * f : f;  // SwiGLU keeps d(act) and d(gate, up)
  return tokens * ((2.0 * c + mlp + q + q + 2.0 * kv) * precision_bytes(precision) + 4.0 * q);
}

double cpu_block_backward_workspace_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                                          bool sequence_parallel, Precision precision) {
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  const double f = static_cast<double>(m.ffn_hidden_size) / tp;
  const double up = is_llama(m) ? 2.0 * f : f;
  const double gathered = sequence_parallel ? static_cast<double>(m.hidden_size) : 0.0;
  return tokens * (f + up + gathered) * precision_bytes(precision);
}

double head_activation_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                             Precision precision, AttentionMemory attention, LossLogits loss) {
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  const double logits = tokens * static_cast<double>(m.vocab_size) * precision_bytes(precision) / tp;
  const double norm_out = hidden_state_bytes(m, micro_batch, seq_len, precision);
  const double statistics = tokens * (m.family == ModelFamily::ModelFamily_gpt2 ? 8.0 : 4.0);
  if (loss == LossLogits::LossLogits_fp32_copy)
    return norm_out + statistics + tokens * static_cast<double>(m.vocab_size) * 4.0 / tp;
  switch (attention) {
    case AttentionMemory::AttentionMemory_fused:  // the loss works in place; one fp32 loss per token
      return norm_out + statistics + logits + tokens * 4.0;
    case AttentionMemory::AttentionMemory_scores:  // fp32 loss and log-sum-exp per token
      return norm_out + statistics + logits + tokens * 8.0;
    case AttentionMemory::AttentionMemory_megatron:  // logits and their fp32 softmax
      return norm_out + logits + tokens * static_cast<double>(m.vocab_size) * 4.0 / tp;
  }
  return norm_out + logits;
}

double head_backward_workspace_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, int tp,
                                     LossLogits loss) {
  if (loss != LossLogits::LossLogits_fp32_copy) return 0;
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq_len);
  // Over a vocabulary split across tensor-parallel ranks PyTorch's loss parallelism runs the
  // backward of NLL and log-softmax as one decomposed expression: the one-hot gradient, the
  // exponent of the log-probabilities and their sum live together, a third fp32 copy.
  const double copies = tp > 1 ? 3.0 : 2.0;
  return copies * tokens * static_cast<double>(m.vocab_size) * 4.0 / tp;
}

double hidden_state_bytes(const ModelSpec& m, int64_t micro_batch, int64_t seq_len, Precision precision) {
  return static_cast<double>(micro_batch) * static_cast<double>(seq_len) *
         static_cast<double>(m.hidden_size) * precision_bytes(precision);
}

}  // namespace alloy
