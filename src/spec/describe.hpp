// Human-readable summaries of a model, a cluster and a training setup, as `alloy check` prints.
#pragma once

#include <cstdint>
#include <string>

#include "spec/cluster.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

// Bytes of model states for one parameter count, by storage precision.
struct ModelStateBytes {
  double weights = 0;           // parameters in that precision
  double gradients = 0;         // accumulated in fp32 beside fp32 master weights, as Alloy's runtimes do
  double master_weights = 0;    // fp32 copy kept by mixed precision (0 for fp32)
  double optimizer_states = 0;  // fp32 optimizer moments
  double total() const { return weights + gradients + master_weights + optimizer_states; }
};
ModelStateBytes model_state_bytes(int64_t parameters, Precision precision, int optimizer_states);

std::string model_describe(const ModelSpec& model, int64_t seq_len, int optimizer_states);
std::string cluster_describe(const ClusterSpec& cluster);
std::string train_describe(const TrainSpec& train);

}  // namespace alloy
