// Mixture-of-Experts blocks in the cost model: the routed experts a member holds, their work
// under an assumed routing distribution, the all-to-all dispatch and combine over the links of
// the expert-parallel group, and the groups that reduce the experts' gradients.
#pragma once

#include <cstdint>
#include <vector>

#include "cost/comm.hpp"
#include "cost/layer_cost.hpp"
#include "spec/cluster.hpp"
#include "spec/model.hpp"

namespace alloy {

class CostModel;
struct StageShape;

// An MoE model's blocks as the dense arithmetic of layer_cost.hpp sees them: attention, norms
// and the shared experts as one SwiGLU MLP (width num_shared x shared width; none without
// them). The router and the routed experts are priced apart (moe_routed_work).
ModelSpec moe_dense_part(const ModelSpec& model);
// Weights of one routed expert (gate, up and down: 3 C F_e), and of the router and the shared
// experts' gate (C x E, + C).
int64_t moe_expert_parameters(const ModelSpec& model);
int64_t moe_router_parameters(const ModelSpec& model);
// Parameters of the shared experts a tp rank holds beyond the 1/tp share the dense part counts:
// the runtime replicates the MoE MLP, shared experts included, over tp.
double moe_shared_parameters_beyond_share(const ModelSpec& model, int tp);

// Expected largest routed token load over `members`, relative to the mean, when `picks`
// token-expert picks are routed uniformly at random and each member holds `expert_share` of the
// experts: 1 + z(members) sqrt((1 - p) / (picks p)), the normal approximation of the
// multinomial, z(n) the expected largest of n standard normals (Blom's approximation). 1 for one
// member. Uniform routing is an assumption: a trained router is skewed, which this leaves out.
double moe_expected_imbalance(double picks, double expert_share, int members);
// z(n): the expected largest of n independent standard normals, Blom: Phi^-1((n - 0.375) / (n + 0.25)).
double expected_max_standard_normal(int n);

// Each routed expert's share of the top-k picks from measured counts (TrainSpec::expert_tokens:
// E values, or layers x E summed per expert); empty when none are given. Throws alloy::Error
// when the count does not fit the model's experts.
std::vector<double> moe_expert_shares(const ModelSpec& model, const std::vector<double>& expert_tokens);
// Load of the experts [begin, end) over their even share (1 for uniform routing: `shares` empty).
double moe_routing_skew(const std::vector<double>& shares, int begin, int end);
// The largest such skew over ep members holding even ranges of the experts.
double moe_even_split_skew(const std::vector<double>& shares, int ep);

// The routed part of one MoE block on one member for one micro-batch: the router over the
// member's own tokens and its experts over the rows routed to them by the whole group.
struct MoeRoutedWork {
  LayerWork work;               // router + routed experts, whole on each tp rank (replicated)
  double routed_rows = 0;       // token rows the member's experts run (expected, imbalance included)
  double activation_bytes = 0;  // kept for the backward beyond the dense part (no recomputation)
  double workspace_bytes = 0;   // buffers of the routed part's backward at its peak
  double dispatch_bytes = 0;    // one all-to-all's buffer per member: its tokens x top-k x C
};
MoeRoutedWork moe_routed_work(const ModelSpec& model, const StageShape& shape, int64_t seq_len, Precision precision);

// Seconds of one all-to-all in which every member of `group` sends `bytes_per_member` split
// evenly over all members (itself included, which costs nothing): the part to members on its own
// node over the intra-node fabric, the rest over its share of the NIC (and of the narrowest rack
// uplink or WAN the group crosses), both at once, plus a latency per peer.
double all_to_all_seconds(double bytes_per_member, const GroupPlacement& group);

// Sets the MoE fields of `shape` (a stage over `stage_ids`, tp fastest, then dp) for member
// `dp_rank` holding `held_experts` routed experts in expert-parallel groups of `ep`;
// `group_sequences`: sequences of each micro-batch its group routes (0: micro_batch x ep);
// `routing_skew`: its experts' measured load over their even share (moe_routing_skew).
void moe_shape_set(const CostModel& cost, StageShape* shape, const std::vector<int>& stage_ids, int ep,
                   double held_experts, int dp_rank, double group_sequences, double routing_skew = 1.0);

}  // namespace alloy
