// Plans for people who keep their runtime: Megatron-LM command-line arguments and a DeepSpeed
// configuration, for the plans those systems can express, with a plain list of what they cannot.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "spec/model.hpp"
#include "spec/train.hpp"

namespace alloy {

struct PlanExport {
  std::string text;                       // arguments (Megatron) or JSON (DeepSpeed)
  std::vector<std::string> unsupported;   // features of the plan the target cannot express
  std::vector<std::string> notes;         // what the user must still do by hand
  bool exact() const { return unsupported.empty(); }
};

PlanExport plan_export_megatron(const Plan& plan, const ModelSpec& model, const TrainSpec& train);
PlanExport plan_export_deepspeed(const Plan& plan, const ModelSpec& model, const TrainSpec& train);

// The export followed by its notes and unsupported features, for printing.
std::string plan_export_render(const PlanExport& exported, const std::string& target);

}  // namespace alloy
