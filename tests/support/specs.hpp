// Specs built in code for planner and cost-model tests: device types shaped like common
// accelerators (datasheet-order numbers), models and clusters, without the file loaders.
#pragma once

#include <string>
#include <vector>

#include "hw/catalog.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy::testing {

inline DeviceType device(const std::string& name, const std::string& vendor, double bf16_flops, double fp32_flops,
                         double memory_gib, double memory_bw, double link_bw) {
  DeviceType t;
  t.name = name;
  t.vendor = vendor;
  t.peak_flops_bf16 = bf16_flops;
  t.peak_flops_fp16 = bf16_flops;
  t.peak_flops_fp32 = fp32_flops;
  t.memory_bytes = memory_gib * 1024.0 * 1024.0 * 1024.0;
  t.memory_bandwidth_bytes_per_second = memory_bw;
  t.intra_node_link_bytes_per_second = link_bw;
  return t;
}

inline DeviceType a100_80() { return device("a100-80", "nvidia", 312e12, 19.5e12, 80, 2.0e12, 300e9); }
inline DeviceType a100_40() { return device("a100-40", "nvidia", 312e12, 19.5e12, 40, 1.55e12, 300e9); }
inline DeviceType v100_32() {
  DeviceType t = device("v100-32", "nvidia", 0, 15.7e12, 32, 900e9, 150e9);
  t.peak_flops_fp16 = 125e12;
  return t;
}
inline DeviceType v100_16() {
  DeviceType t = v100_32();
  t.name = "v100-16";
  t.memory_bytes = 16.0 * 1024 * 1024 * 1024;
  return t;
}
inline DeviceType h100() { return device("h100", "nvidia", 989e12, 67e12, 80, 3.35e12, 450e9); }
inline DeviceType mi250x() { return device("mi250x", "amd", 383e12, 47.9e12, 128, 3.2e12, 200e9); }
inline DeviceType l4() { return device("l4", "nvidia", 121e12, 30e12, 24, 300e9, 32e9); }

struct GroupSpec {
  int type = 0;
  int nodes = 1;
  int per_node = 8;
  double price = 0;
};

// Nodes in the order given; devices numbered node-major. InfiniBand-like network by default.
inline ClusterSpec cluster(const std::string& name, std::vector<DeviceType> types, const std::vector<GroupSpec>& groups,
                           double network_bw = 25e9, double network_latency = 5e-6) {
  ClusterSpec c;
  c.name = name;
  c.device_types = std::move(types);
  c.network = {"infiniband", network_bw, network_latency};
  for (size_t i = 0; i < groups.size(); ++i) {
    NodeGroup g;
    g.name = "group" + std::to_string(i);
    g.count = groups[i].nodes;
    g.devices_per_node = groups[i].per_node;
    g.device_type_index = groups[i].type;
    g.host_memory_bytes = 1024.0 * 1024 * 1024 * 1024;
    g.host_link_bytes_per_second = 25e9;
    const DeviceType& t = c.device_types[groups[i].type];
    g.intra_node = {"nvlink", t.intra_node_link_bytes_per_second, 5e-6};
    g.price_per_device_hour = groups[i].price;
    c.node_groups.push_back(g);
  }
  int node = 0;
  for (size_t gi = 0; gi < c.node_groups.size(); ++gi) {
    const NodeGroup& g = c.node_groups[gi];
    for (int n = 0; n < g.count; ++n, ++node)
      for (int d = 0; d < g.devices_per_node; ++d) {
        Device dev;
        dev.id = static_cast<int>(c.devices.size());
        dev.node = node;
        dev.local_index = d;
        dev.node_group = static_cast<int>(gi);
        dev.device_type_index = g.device_type_index;
        c.devices.push_back(dev);
      }
  }
  c.num_nodes = node;
  return c;
}

inline ModelSpec llama(const std::string& name, int layers, int hidden, int heads, int kv_heads, int ffn, int vocab) {
  ModelSpec m;
  m.name = name;
  m.model_type = "llama";
  m.family = ModelFamily::ModelFamily_llama;
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_heads = heads;
  m.num_kv_heads = kv_heads;
  m.head_dim = hidden / heads;
  m.ffn_hidden_size = ffn;
  m.vocab_size = vocab;
  m.max_seq_len = 4096;
  m.tied_embeddings = false;
  return m;
}

inline ModelSpec llama2_7b() { return llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000); }
inline ModelSpec llama3_70b() {
  ModelSpec m = llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256);
  m.max_seq_len = 8192;
  return m;
}

inline ModelSpec gpt2(const std::string& name, int layers, int hidden, int heads, int vocab, int max_seq) {
  ModelSpec m;
  m.name = name;
  m.model_type = "gpt2";
  m.family = ModelFamily::ModelFamily_gpt2;
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_heads = heads;
  m.num_kv_heads = heads;
  m.head_dim = hidden / heads;
  m.ffn_hidden_size = 4 * hidden;
  m.vocab_size = vocab;
  m.max_seq_len = max_seq;
  m.tied_embeddings = true;
  m.qkv_bias = true;
  m.linear_bias = true;
  m.norm_bias = true;
  return m;
}

inline ModelSpec gpt_neo_2_7b() { return gpt2("gpt-neo-2.7b", 32, 2560, 20, 50257, 2048); }

inline TrainSpec train(int64_t seq_len, int64_t global_batch, Precision precision = Precision::Precision_bf16) {
  TrainSpec t;
  t.seq_len = seq_len;
  t.global_batch_sequences = global_batch;
  t.precision = precision;
  return t;
}

// One node of `devices` of the catalog's `device`, run by `framework` ("": Alloy's runtime).
inline ClusterSpec catalog_cluster(const std::string& device, const std::string& framework, int devices) {
  DeviceType type = *catalog_builtin().find(device);
  type.framework = framework;
  return cluster(device + "x" + std::to_string(devices), {type}, {{0, 1, devices, 0}});
}

}  // namespace alloy::testing
