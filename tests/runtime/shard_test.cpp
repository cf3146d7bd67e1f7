// Model shards: tensor-parallel slices partition every split tensor, replicated tensors are
// whole on every rank, and each shard's initial weights are exactly its slice of the full model.
#include <gtest/gtest.h>

#include <map>

#include "runtime/arena.hpp"
#include "runtime/model.hpp"
#include "runtime/shard.hpp"
#include "spec/error.hpp"

namespace alloy {
namespace {

ModelSpec small(ModelFamily family, int kv_heads, int64_t vocab) {
  ModelSpec spec;
  spec.name = family == ModelFamily::ModelFamily_gpt2 ? "shard-gpt" : "shard-llama";
  spec.family = family;
  spec.num_layers = 3;
  spec.hidden_size = 16;
  spec.num_heads = 4;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = 4;
  spec.ffn_hidden_size = 32;
  spec.vocab_size = vocab;
  spec.max_seq_len = 8;
  spec.tied_embeddings = family == ModelFamily::ModelFamily_gpt2;
  const bool gpt2 = family == ModelFamily::ModelFamily_gpt2;
  spec.qkv_bias = spec.linear_bias = spec.norm_bias = gpt2;
  return spec;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

// For every tensor: how often each element is held across the tp ranks of a full-depth shard.
void expect_partition(const ModelSpec& spec, int tp) {
  std::map<std::string, std::vector<int>> held;
  for (int t = 0; t < tp; ++t) {
    ModelShard shard = shard_full(spec);
    shard.tp = tp;
    shard.tp_rank = t;
    for (const ShardedTensor& tensor : shard_tensors(spec, shard)) {
      std::vector<int>& counts = held[tensor.name];
      counts.resize(static_cast<size_t>(numel(tensor.full_shape)));
      int64_t local = 0;
      for (const ShardSegment& seg : tensor.segments) {
        for (int64_t i = 0; i < seg.count; ++i) counts[static_cast<size_t>(seg.full_offset + i)]++;
        local += seg.count;
      }
      EXPECT_EQ(local, numel(tensor.local_shape)) << tensor.name;
    }
  }
  for (const auto& [name, counts] : held) {
    const int expected = shard_split_of(name) == ShardSplit::ShardSplit_replicated ? tp : 1;
    for (size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(counts[i], expected) << name << " element " << i << " tp " << tp;
  }
}

TEST(Shard, TensorParallelSlicesPartitionEveryTensor) {
  for (int tp : {1, 2, 4}) expect_partition(small(ModelFamily::ModelFamily_gpt2, 4, 250), tp);  // 250 % 4 != 0
  for (int tp : {1, 2}) expect_partition(small(ModelFamily::ModelFamily_llama, 2, 256), tp);
}

TEST(Shard, ShardWeightsAreSlicesOfTheFullModel) {
  for (const ModelSpec& spec : {small(ModelFamily::ModelFamily_gpt2, 4, 250), small(ModelFamily::ModelFamily_llama, 2, 256)}) {
    Arena arena(int64_t{256} << 20);
    Model full(spec, arena);
    model_init_weights(full, 42);
    // The last stage of a pipeline, second tp rank: blocks 1-2, head, and (tied) its embedding copy.
    ModelShard shard;
    shard.block_ranges = {{1, 3}};
    shard.has_embedding = false;
    shard.has_head = true;
    shard.tp = 2;
    shard.tp_rank = 1;
    Model part(spec, arena, shard);
    model_init_weights(part, 42);
    const std::vector<ShardedTensor> tensors = shard_tensors(spec, shard);
    ASSERT_EQ(tensors.size(), part.views.size());
    EXPECT_EQ(spec.tied_embeddings, part.weights.lm_head == part.weights.token);
    for (size_t k = 0; k < tensors.size(); ++k) {
      const float* source = full.params + model_view(full, tensors[k].name).offset;
      const float* mine = part.params + part.views[k].offset;
      for (const ShardSegment& seg : tensors[k].segments)
        for (int64_t i = 0; i < seg.count; ++i) ASSERT_EQ(*mine++, source[seg.full_offset + i]) << tensors[k].name;
    }
    EXPECT_EQ(part.weights.blocks[0].qkv_w, nullptr);  // block 0 lives on another stage
    EXPECT_NE(part.weights.blocks[2].qkv_w, nullptr);
  }
}

TEST(Shard, TensorParallelismThatDoesNotDivideIsRefusedByField) {
  try {
    shard_check_tp(small(ModelFamily::ModelFamily_llama, 2, 256), 4);
    FAIL() << "tp 4 with 2 kv heads was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where().field, "num_key_value_heads");
  }
  EXPECT_NO_THROW(shard_check_tp(small(ModelFamily::ModelFamily_gpt2, 4, 250), 4));
}

}  // namespace
}  // namespace alloy
