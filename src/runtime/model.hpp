// The model of one rank: GPT-2 and LLaMA families built from a ModelSpec and a shard (all of it
// on a single rank; some blocks, tensor-parallel slices, embedding and head on a rank of a
// plan), with one flat parameter buffer and one flat gradient buffer in the device arena, a
// table of named views, and forward/backward passes per chunk of blocks and micro-batch whose
// activations live in the arena (per-layer recomputation).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cost/profile.hpp"
#include "runtime/activation_memory.hpp"
#include "runtime/arena.hpp"
#include "runtime/shard.hpp"
#include "spec/model.hpp"

namespace alloy {

// A named tensor inside the flat parameter (and, at the same offset, gradient) buffer.
struct TensorView {
  std::string name;             // e.g. "layers.0.attn.qkv.weight"
  std::vector<int64_t> shape;   // this rank's slice; rows = output features, row-major
  int64_t offset = 0;           // in floats from the start of the flat buffer
  int64_t numel = 0;
  bool weight_decay = false;    // 2-D weights decay; norms and biases do not
};

// Pointers of one block's tensors inside a flat buffer; nullptr where the spec has no such tensor.
struct BlockTensors {
  float* attn_norm_w = nullptr;  // (C)
  float* attn_norm_b = nullptr;  // (C)
  float* qkv_w = nullptr;        // ((Hq + 2 Hkv) D, C)
  float* qkv_b = nullptr;        // ((Hq + 2 Hkv) D)
  float* out_w = nullptr;        // (C, Hq D)
  float* out_b = nullptr;        // (C)
  float* mlp_norm_w = nullptr;   // (C)
  float* mlp_norm_b = nullptr;   // (C)
  float* up_w = nullptr;         // GPT-2: mlp.up (F, C); LLaMA: mlp.gate_up (2F, C)
  float* up_b = nullptr;         // (F), GPT-2 with linear_bias
  float* down_w = nullptr;       // (C, F)
  float* down_b = nullptr;       // (C)
  // Mixture-of-Experts blocks (spec.moe, past its first_dense_layers) have these instead of
  // up_w and down_w. Fe: an expert's width; Fs: the shared experts' widths together.
  float* router_w = nullptr;              // mlp.router (E, C)
  std::vector<float*> expert_gate_up_w;   // mlp.experts.e.gate_up (2 Fe, C), one per expert
  std::vector<float*> expert_down_w;      // mlp.experts.e.down (C, Fe)
  float* shared_gate_up_w = nullptr;      // mlp.shared.gate_up (2 Fs, C)
  float* shared_down_w = nullptr;         // mlp.shared.down (C, Fs)
  float* shared_gate_w = nullptr;         // mlp.shared_gate (1, C), Qwen2-MoE
};

struct ModelTensors {
  float* token = nullptr;         // (V, C)
  float* position = nullptr;      // (max_seq_len, C), GPT-2 family
  std::vector<BlockTensors> blocks;
  float* final_norm_w = nullptr;  // (C)
  float* final_norm_b = nullptr;  // (C)
  float* lm_head = nullptr;       // (V, C); == token when tied
};

// What one block keeps between forward and backward (nullptr when dropped by recomputation).
struct BlockActivations {
  float* ln1 = nullptr;        // (B, T, C)
  float* ln1_mean = nullptr;   // (B, T), LayerNorm only
  float* ln1_rstd = nullptr;   // (B, T)
  float* qkv = nullptr;        // (B, T, (Hq + 2 Hkv) D), after RoPE for LLaMA
  float* probs = nullptr;      // (B, Hq, T, T)
  float* context = nullptr;    // (B, T, Hq D)
  float* residual1 = nullptr;  // (B, T, C)
  float* ln2 = nullptr;        // (B, T, C)
  float* ln2_mean = nullptr;   // (B, T)
  float* ln2_rstd = nullptr;   // (B, T)
  float* mlp_up = nullptr;     // (B, T, F) GPT-2, (B, T, 2F) LLaMA
  float* mlp_act = nullptr;    // (B, T, F)
  float* out = nullptr;        // (B, T, C)
  // MoE blocks, N = B T tokens, K picks each; the int32 tensors live in float-sized buffers.
  float* moe_probs = nullptr;       // (N, E) router softmax
  float* moe_experts = nullptr;     // (N, K) int32 picked experts
  float* moe_weights = nullptr;     // (N, K) routing weights of the picks
  float* moe_slots = nullptr;       // (N K) int32 slot n K + k of each row, grouped by expert
  float* moe_offsets = nullptr;     // (E + 1) int32 first row of each expert
  float* moe_up = nullptr;          // (N K, 2 Fe) experts' gate and up projections, permuted rows
  float* moe_act = nullptr;         // (N K, Fe)
  float* moe_out = nullptr;         // (N K, C) experts' outputs before the weighted combine
  float* shared_up = nullptr;       // (N, 2 Fs)
  float* shared_act = nullptr;      // (N, Fs)
  float* shared_out = nullptr;      // (N, C) before the shared-expert gate, when gated
  float* shared_gate = nullptr;     // (N) sigmoid gate, when gated
  // With an MoeExchange (Model::moe_exchange): the load-balancing loss's sums over every
  // replica's tokens, (2 E + 1) doubles in float-sized buffers (moe_aux_sums); under expert
  // parallelism, the rows each member routes to each expert, (G x E) int64, and this member's
  // experts' R received rows, expert after expert (moe_up, moe_act then hold R rows).
  float* moe_aux_sums = nullptr;
  float* moe_ep_counts = nullptr;
  float* moe_ep_in = nullptr;       // (R, C)
};

struct HeadActivations {
  float* lnf = nullptr;        // (B, T, C)
  float* lnf_mean = nullptr;   // (B, T), LayerNorm only
  float* lnf_rstd = nullptr;   // (B, T)
  float* logits = nullptr;     // (B, T, V / tp); dlogits after backward starts
  float* losses = nullptr;     // (B, T)
  float* lse = nullptr;        // (B, T)
};

// Blocking collectives over the tensor-parallel group of a sharded model.
class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;
  virtual void all_reduce_sum(float* data, int64_t count) = 0;
  virtual void all_reduce_max(float* data, int64_t count) = 0;
  // data: (tp * piece) floats; rank t's piece at [t * piece, (t + 1) * piece).
  virtual void all_gather(float* data, int64_t piece) = 0;      // every piece to every rank
  virtual void reduce_scatter(float* data, int64_t piece) = 0;  // piece t summed over ranks, on rank t
};

// Collectives of the MoE blocks across data-parallel replicas (blocking): the load-balancing
// loss's sums over the tokens of every replica's share of the micro-batch, and expert
// parallelism's exchange of token rows within the expert-parallel group (model.shard's members).
class MoeExchange {
 public:
  virtual ~MoeExchange() = default;
  // data: (count) summed in place over the stage's data-parallel replicas.
  virtual void replicas_sum(double* data, int64_t count) = 0;
  // mine: (count) -> all: (members x count), every expert-parallel member's record in order.
  virtual void members_gather(const int64_t* mine, int64_t* all, int64_t count) = 0;
  // send: send_rows[j] rows of `width` floats for member j, member after member -> recv:
  // recv_rows[j] rows from member j the same way.
  virtual void members_exchange(const float* send, const std::vector<int64_t>& send_rows, float* recv,
                                const std::vector<int64_t>& recv_rows, int64_t width) = 0;
};

// Where the passes get weights that are not resident (ZeRO 3): acquire makes the weights of a
// unit valid in model.weights until release.
inline constexpr int kUnitEmbedding = -1;  // token (and position) embedding
inline constexpr int kUnitHead = -2;       // final norm and LM head
class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  // unit: a block index, kUnitEmbedding or kUnitHead; backward: for a backward pass (which also
  // accumulates into the unit's gradients), else a forward one.
  virtual void acquire(int unit, bool backward) = 0;
  virtual void release(int unit, bool backward) = 0;
};

// Told of every write of parameter gradients during a backward, for a runtime that keeps only
// parts of the gradients at a time (sharded gradients: a part's buffer exists from its first write
// until its reduction). `slot` is the ModelTensors field of Model::gradients being written (a
// tied head's writes come through &gradients.lm_head); rows count along the tensor's first
// dimension. Slots the sink does not manage are left as they are.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // Row boundaries 0 = c0 < c1 < ... = rows at which a (rows, ...) gradient may be written piece
  // by piece; a writer that can, writes [c_k, c_k+1) one after another, last rows first.
  virtual std::vector<int64_t> row_cuts(float* const* slot, int64_t rows) = 0;
  // Before rows [begin, end) are written (end past the last row: to the last row): returns where
  // row `begin` is written, and points *slot at the tensor where the part holds it whole.
  virtual float* writing(float* const* slot, int64_t begin, int64_t end) = 0;
  // After rows [begin, end) are written for this micro-batch.
  virtual void written(float* const* slot, int64_t begin, int64_t end) = 0;
};

struct ChunkPass;
// Where the passes hand the activations a block saved for its backward, when they may wait
// elsewhere (host memory) in between. Every block of every pass is announced; the store picks.
class ActivationStore {
 public:
  virtual ~ActivationStore() = default;
  virtual void saved(ChunkPass& pass, int layer) = 0;   // the block's forward is done
  virtual void needed(ChunkPass& pass, int layer) = 0;  // its backward starts: they must be back
  virtual void dropped(ChunkPass& pass) = 0;            // the pass is being released
};

// One micro-batch through one chunk of consecutive blocks [block_begin, block_end): what the
// forward keeps until the backward.
struct ChunkPass {
  int B = 0;
  int T = 0;
  int block_begin = 0;
  int block_end = 0;
  bool embeds = false;           // starts from token ids (the pipeline's first chunk)
  bool heads = false;            // ends in the loss (the pipeline's last chunk)
  std::vector<int32_t> inputs;   // (B, T) when embeds
  std::vector<int32_t> targets;  // (B, T) when heads
  float* input = nullptr;        // (B, T, C): the embedding output or the received hidden state
  std::vector<BlockActivations> blocks;  // block_end - block_begin
  HeadActivations head;
  float* output = nullptr;       // (B, T, C): the gathered output under sequence parallelism
  float* gradient = nullptr;     // (B, T, C): dL/d(hidden state) between backward pieces
  int backward_next = -1;        // blocks [block_begin, backward_next) still wait for backward
  float loss = 0.0f;             // mean cross-entropy of the micro-batch's local tokens, when heads
  // MoE: the chunk's share of the micro-batch's load-balancing loss (unweighted; the training
  // objective adds router_aux_loss_coef x it to the cross-entropy). Per block: its MoE blocks'
  // terms over the count of MoE blocks, after the forward. Pooled: the whole loss, once
  // balance_pooled.
  float aux_loss = 0.0f;
  // MoE, pooled balance: (2 E + 1) the top-k picks of each expert, the router probabilities of
  // each expert summed, and the rows routed (tokens x blocks), over the chunk's MoE blocks and
  // this rank's tokens after its forward; over every MoE block and replica of the micro-batch
  // once balance_pooled (chunk_balance_pool), which its backward needs.
  std::vector<double> balance_sums;
  bool balance_pooled = false;
  bool active = false;
};

// floats [offset, offset + count) of the rank's flat parameter (and gradient) buffer.
struct FlatRange {
  int64_t offset = 0;
  int64_t count = 0;
};

// A contiguous range of the flat parameter index and where its parameters and gradients live:
// the device arena, or host memory for a block offloaded there (weights reach the device only
// through the model's parameter source, a block at a time).
struct ParameterSegment {
  int64_t offset = 0;       // floats, into the flat index of model.views
  int64_t count = 0;
  float* params = nullptr;  // (count)
  float* grads = nullptr;   // (count)
  int host_block = -1;      // the offloaded block held in host memory; -1: in the device arena
};

// Blocks whose parameters and gradients live in host memory (per global block), allocated from
// `arena`, the host memory's accounting.
struct HostPlacement {
  std::vector<bool> blocks;
  Arena* arena = nullptr;
};

// What the MoE blocks' forwards routed since the last model_moe_routing_reset (recomputation
// excluded): for load-imbalance figures and the step log.
struct MoeRouting {
  std::vector<int64_t> expert_tokens;  // (num_layers x E) top-k picks of each expert; dense blocks 0
};

struct Model {
  Model(const ModelSpec& spec, Arena& arena, const ModelShard& shard, const HostPlacement& host = {});
  Model(const ModelSpec& spec, Arena& arena) : Model(spec, arena, shard_full(spec)) {}
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  ModelSpec spec;
  ModelShard shard;
  Arena* arena;
  std::vector<TensorView> views;
  int64_t num_parameters = 0;  // on this rank
  // (num_parameters) in the arena when every parameter is there; nullptr when blocks live in
  // host memory (use the segments, or model_parameters_at / model_gradients_at).
  float* params = nullptr;
  float* grads = nullptr;
  std::vector<ParameterSegment> segments;  // ascending, covering [0, num_parameters)
  Arena* host_arena = nullptr;  // where host segments come from (nullptr: none)
  ModelTensors weights;     // views into params; blocks indexed by global layer (nullptr when elsewhere)
  ModelTensors gradients;   // the same views into grads
  std::vector<Recompute> recompute;  // one per global block, Recompute_none by default
  TensorParallelOps* tp_ops = nullptr;  // set when shard.tp > 1
  MoeExchange* moe_exchange = nullptr;  // set for MoE models with data or expert parallelism
  ParameterSource* parameter_source = nullptr;  // set when the weights are gathered for each use
  ActivationStore* activation_store = nullptr;  // set when saved activations may leave the device
  GradientSink* gradient_sink = nullptr;        // set when gradients are held a part at a time
  std::vector<double> rope_frequencies;         // (head_dim / 2) RoPE inverse frequencies, LLaMA family
  // When set, the passes add the thread CPU seconds of each layer they run here, by LayerKind
  // (embedding, block, head): where a step's compute went, for calibration.
  std::array<double, kLayerKinds>* layer_cpu_seconds = nullptr;

  MoeRouting moe_routing;  // MoE models only

  ChunkPass pass;  // the single-rank passes (model_forward / model_backward)
};

// Clears model.moe_routing (sized for the model's blocks and experts).
void model_moe_routing_reset(Model& model);

// GPT-2 initialisation from a seeded deterministic RNG: weights normal(0, 0.02), residual
// projections (attn.out, mlp.down) scaled by 1 / sqrt(2 L), norm weights 1, biases 0. Every
// shard gets exactly its slice of the full model's initial weights.
void model_init_weights(Model& model, uint64_t seed);

const TensorView& model_view(const Model& model, const std::string& name);

// Parameters (or gradients) [offset, offset + count) of the flat index, wherever they live; the
// range must lie inside one segment (a view always does). Throws alloy::Error otherwise.
float* model_parameters_at(const Model& model, int64_t offset, int64_t count);
float* model_gradients_at(const Model& model, int64_t offset, int64_t count);
// Whether flat parameter `offset` lives in host memory (an offloaded block's segment).
bool model_offset_on_host(const Model& model, int64_t offset);

// For each view (in order), the field of model.weights that points at it: lets a runtime that
// keeps parameters elsewhere (ZeRO 3) point the passes at gathered copies.
std::vector<float**> model_weight_slots(Model& model);
// The same for model.gradients (offload binds a block's gradients to its device slot).
std::vector<float**> model_gradient_slots(Model& model);

// Starts `pass` through blocks [block_begin, block_end) for a micro-batch of (B, T) tokens.
// embeds: the chunk starts from `inputs` (B, T); otherwise pass.input (B, T, C) is allocated here
// for the caller to fill. heads: the chunk ends in the loss against `targets` (B, T).
// Throws alloy::Error for a token id >= V or T > max_seq_len.
void chunk_begin(Model& model, ChunkPass& pass, int block_begin, int block_end, bool embeds, bool heads,
                 const int32_t* inputs, const int32_t* targets, int B, int T);
// Runs the forward. Returns the chunk's output (B, T, C), alive until the chunk's backward, or
// nullptr when the chunk heads (pass.loss then holds the mean cross-entropy of its tokens).
const float* chunk_forward(Model& model, ChunkPass& pass);
// MoE models with the pooled balance: gives the forwarded pass the micro-batch's sums, (2 E + 1)
// as pass.balance_sums over every MoE block and replica (the sum of every chunk's
// balance_sums, counting each replica once), which its backward needs; sets pass.aux_loss to the
// micro-batch's load-balancing loss.
void chunk_balance_pool(const Model& model, ChunkPass& pass, const double* sums);
// The zeroed gradient buffer of the chunk's output (B, T, C), for the caller to fill before the
// backward of a chunk that does not head.
float* chunk_output_gradient(Model& model, ChunkPass& pass);
// Backward of blocks [block_begin, block_end): the top piece first (block_end == the chunk's
// end), then lower pieces down to the chunk's first block, adding loss_scale * d(objective)
// into model.grads (the mean cross-entropy, plus router_aux_loss_coef x the load-balancing loss
// for MoE models). Returns dL/d(chunk input) (B, T, C) after the lowest piece of a chunk that
// does not embed (valid until chunk_release), nullptr otherwise.
const float* chunk_backward(Model& model, ChunkPass& pass, int block_begin, int block_end, float loss_scale);
// Frees every buffer of the pass.
void chunk_release(Model& model, ChunkPass& pass);

// The single-rank model: inputs, targets: (B, T) token ids -> mean cross-entropy loss; logits
// stay in model.pass.head.logits until model_backward. An MoE model's load-balancing loss is in
// model.pass.aux_loss; the backward's objective adds router_aux_loss_coef x it.
float model_forward(Model& model, const int32_t* inputs, const int32_t* targets, int B, int T);

// Adds the gradients of loss_scale * (the last forward's objective) into model.grads and frees
// its activations. loss_scale = 1 / k averages k accumulated micro-batches.
void model_backward(Model& model, float loss_scale = 1.0f);

// Zeroes the gradients in the device arena (an offloaded block's are replaced by its first backward;
// a released buffer, nullptr, is skipped).
void model_zero_grad(Model& model);

// Frees the activations of a forward that will not be followed by a backward (evaluation).
void model_release_activations(Model& model);

}  // namespace alloy
