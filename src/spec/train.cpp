#include "spec/train.hpp"

#include <cmath>

#include <fmt/format.h>

#include "spec/error.hpp"
#include "spec/field_reader.hpp"

namespace alloy {

namespace {
// Sanity bounds, as for models (docs/architecture.md): products of them stay inside 64 bits.
constexpr int64_t kTrainMostSeqLen = 100'000'000;
constexpr int64_t kTrainMostSequences = 10'000'000;
constexpr int64_t kTrainMostSteps = 1'000'000'000;
constexpr double kTrainMostLearningRate = 10.0;
constexpr double kTrainLeastBucketMib = 1.0 / 1024;  // 1 KiB
constexpr double kTrainMostBucketMib = 65536;       // 64 GiB
}  // namespace

int train_optimizer_states(const TrainSpec& train) { return train.optimizer == "sgd" ? 1 : 2; }

const char* loss_scaling_name(LossScaling scaling) {
  switch (scaling) {
    case LossScaling::LossScaling_auto: return "auto";
    case LossScaling::LossScaling_none: return "none";
    case LossScaling::LossScaling_dynamic: return "dynamic";
  }
  return "?";
}

namespace {

// `expert_tokens: [n0, n1, ...]`: numbers, each >= 0.
std::vector<double> train_expert_tokens(const YAML::Node& node, const FieldReader& r) {
  const char* hint = "write the top-k picks of each routed expert, e.g. `expert_tokens: [5120, 4410, 3800, 3054]` "
                     "(alloy train's step log field expert_tokens)";
  if (!node.IsSequence() || node.size() == 0) r.fail("expert_tokens", "expert_tokens must be a list of numbers", hint);
  std::vector<double> out;
  for (const YAML::Node& item : node) {
    double value = -1;
    if (!item.IsScalar() || !YAML::convert<double>::decode(item, value) || !(value >= 0) || !std::isfinite(value))
      r.fail("expert_tokens", "expert_tokens must be numbers >= 0", hint);
    out.push_back(value);
  }
  return out;
}

}  // namespace

TrainSpec train_load(const std::string& path) { return train_load_text(spec_file_text(path), path); }

TrainSpec train_load_text(const std::string& text, const std::string& path) {
  const YAML::Node root = spec_text_parse(text, path, false);
  FieldReader r(root, path);
  r.reject_unknown({"seq_len", "global_batch", "global_batch_tokens", "min_global_batch", "max_global_batch",
                    "precision", "master_weights_fp32", "optimizer", "steps", "learning_rate",
                    "min_learning_rate", "warmup_steps", "weight_decay", "beta1", "beta2", "adam_eps",
                    "grad_clip", "seed", "gradient_bucket_mib", "gradient_communication", "loss_scaling",
                    "initial_loss_scale", "loss_scale_growth_interval", "expert_tokens"});
  TrainSpec t;
  t.source_path = path;
  t.seq_len = r.get_int("seq_len", t.seq_len);
  if (t.seq_len <= 0) r.fail("seq_len", "sequence length must be positive", "write e.g. `seq_len: 2048`");
  if (r.has("global_batch") && r.has("global_batch_tokens")) {
    r.fail("global_batch_tokens", "give the global batch either in sequences or in tokens, not both",
           "remove global_batch or global_batch_tokens");
  }
  if (r.has("global_batch_tokens")) {
    int64_t tokens = r.get_int("global_batch_tokens");
    if (tokens <= 0 || tokens % t.seq_len != 0) {
      r.fail("global_batch_tokens",
             std::to_string(tokens) + " tokens is not a positive multiple of seq_len " + std::to_string(t.seq_len),
             "use a multiple of seq_len, or give `global_batch` in sequences");
    }
    t.global_batch_sequences = tokens / t.seq_len;
  } else {
    t.global_batch_sequences = r.get_int("global_batch", t.global_batch_sequences);
  }
  t.min_global_batch = r.get_int("min_global_batch", 0);
  t.max_global_batch = r.get_int("max_global_batch", 0);
  std::string precision = r.get_string("precision", precision_name(t.precision));
  if (!precision_parse(precision, &t.precision)) {
    r.fail("precision", "unknown precision '" + precision + "'", "use one of fp32, tf32, bf16, fp16, fp8");
  }
  t.master_weights_fp32 = r.get_bool("master_weights_fp32", t.master_weights_fp32);
  t.optimizer = r.get_string("optimizer", t.optimizer);
  t.steps = r.get_int("steps", t.steps);
  t.learning_rate = r.get_double("learning_rate", t.learning_rate);
  t.min_learning_rate = r.get_double("min_learning_rate", t.min_learning_rate);
  t.warmup_steps = r.get_int("warmup_steps", t.warmup_steps);
  t.weight_decay = r.get_double("weight_decay", t.weight_decay);
  t.beta1 = r.get_double("beta1", t.beta1);
  t.beta2 = r.get_double("beta2", t.beta2);
  t.adam_eps = r.get_double("adam_eps", t.adam_eps);
  t.grad_clip = r.get_double("grad_clip", t.grad_clip);
  t.gradient_bucket_mib = r.get_double("gradient_bucket_mib", t.gradient_bucket_mib);
  const std::string wire = r.get_string("gradient_communication", precision_name(t.gradient_communication));
  if (!precision_parse(wire, &t.gradient_communication))
    r.fail("gradient_communication", "unknown precision '" + wire + "'", "use fp32 or bf16");
  const std::string scaling = r.get_string("loss_scaling", loss_scaling_name(t.loss_scaling));
  bool known_scaling = false;
  for (LossScaling s : {LossScaling::LossScaling_auto, LossScaling::LossScaling_none, LossScaling::LossScaling_dynamic})
    if (scaling == loss_scaling_name(s)) t.loss_scaling = s, known_scaling = true;
  if (!known_scaling)
    r.fail("loss_scaling", "unknown loss scaling '" + scaling + "'",
           "use auto (dynamic where a rank computes in fp16), dynamic or none");
  t.initial_loss_scale = r.get_double("initial_loss_scale", t.initial_loss_scale);
  t.loss_scale_growth_interval = r.get_int("loss_scale_growth_interval", t.loss_scale_growth_interval);
  const int64_t seed = r.get_int("seed", static_cast<int64_t>(t.seed));
  if (seed < 0)
    throw Error(fmt::format("seed {} is negative", seed), {t.source_path, "seed"}, "write a whole number >= 0, e.g. `seed: 1234`");
  t.seed = static_cast<uint64_t>(seed);
  if (r.has("expert_tokens")) t.expert_tokens = train_expert_tokens(root["expert_tokens"], r);
  train_validate(t);
  return t;
}

std::string train_to_yaml(const TrainSpec& t) {
  // {} writes the shortest text that reads back as the same double.
  std::string out = fmt::format("seq_len: {}\nglobal_batch: {}\n", t.seq_len, t.global_batch_sequences);
  if (t.min_global_batch > 0 || t.max_global_batch > 0)
    out += fmt::format("min_global_batch: {}\nmax_global_batch: {}\n", t.min_global_batch, t.max_global_batch);
  out += fmt::format(
      "precision: {}\nmaster_weights_fp32: {}\noptimizer: {}\nsteps: {}\nlearning_rate: {}\nmin_learning_rate: {}\n"
      "warmup_steps: {}\nweight_decay: {}\nbeta1: {}\nbeta2: {}\nadam_eps: {}\ngrad_clip: {}\n"
      "gradient_bucket_mib: {}\ngradient_communication: {}\nloss_scaling: {}\ninitial_loss_scale: {}\n"
      "loss_scale_growth_interval: {}\nseed: {}\n",
      precision_name(t.precision), t.master_weights_fp32, t.optimizer, t.steps, t.learning_rate, t.min_learning_rate,
      t.warmup_steps, t.weight_decay, t.beta1, t.beta2, t.adam_eps, t.grad_clip, t.gradient_bucket_mib,
      precision_name(t.gradient_communication), loss_scaling_name(t.loss_scaling), t.initial_loss_scale,
      t.loss_scale_growth_interval, t.seed);
  if (!t.expert_tokens.empty()) out += fmt::format("expert_tokens: [{}]\n", fmt::join(t.expert_tokens, ", "));
  return out;
}

void train_validate(const TrainSpec& t) {
  auto bad = [&](const char* field, const std::string& what, const std::string& hint) {
    throw Error(what, {t.source_path, field}, hint);
  };
  if (t.seq_len <= 0 || t.seq_len > kTrainMostSeqLen)
    bad("seq_len", fmt::format("sequence length {} is outside [1, {}]", t.seq_len, kTrainMostSeqLen), "write e.g. `seq_len: 2048`");
  if (t.global_batch_sequences <= 0 || t.global_batch_sequences > kTrainMostSequences)
    bad("global_batch", fmt::format("global batch {} is outside [1, {}] sequences", t.global_batch_sequences, kTrainMostSequences),
        "write e.g. `global_batch: 512`");
  if (t.min_global_batch < 0 || t.max_global_batch < 0 || t.max_global_batch > kTrainMostSequences ||
      (t.max_global_batch > 0 && t.min_global_batch > t.max_global_batch)) {
    bad("min_global_batch", "the batch range must satisfy 0 < min_global_batch <= max_global_batch",
        "set both, e.g. min_global_batch: 256 and max_global_batch: 1024");
  }
  if (t.gradient_communication != Precision::Precision_fp32 && t.gradient_communication != Precision::Precision_bf16)
    bad("gradient_communication",
        fmt::format("gradients are sent in fp32 or bf16, not {}", precision_name(t.gradient_communication)),
        "write `gradient_communication: bf16` (or fp32, the default)");
  if (t.optimizer != "adamw" && t.optimizer != "sgd") {
    bad("optimizer", "unknown optimizer '" + t.optimizer + "'", "use adamw or sgd");
  }
  if (t.steps <= 0 || t.steps > kTrainMostSteps)
    bad("steps", fmt::format("{} steps is outside [1, {}]", t.steps, kTrainMostSteps), "write e.g. `steps: 1000`");
  if (!(t.learning_rate > 0) || !(t.min_learning_rate >= 0) || t.min_learning_rate > t.learning_rate ||
      t.learning_rate > kTrainMostLearningRate) {
    bad("learning_rate", fmt::format("need 0 <= min_learning_rate <= learning_rate and 0 < learning_rate <= {}", kTrainMostLearningRate),
        "write e.g. learning_rate: 3e-4 and min_learning_rate: 3e-5");
  }
  if (t.warmup_steps < 0 || t.warmup_steps > kTrainMostSteps)
    bad("warmup_steps", fmt::format("warm-up steps {} is outside [0, {}]", t.warmup_steps, kTrainMostSteps),
        "write e.g. `warmup_steps: 100`");
  if (!(t.weight_decay >= 0) || !std::isfinite(t.weight_decay))
    bad("weight_decay", "weight decay must be a finite number >= 0", "write e.g. `weight_decay: 0.1`");
  if (!(t.beta1 >= 0 && t.beta1 < 1)) bad("beta1", "beta1 must be in [0, 1)", "write e.g. `beta1: 0.9`");
  if (!(t.beta2 >= 0 && t.beta2 < 1)) bad("beta2", "beta2 must be in [0, 1)", "write e.g. `beta2: 0.95`");
  if (!(t.adam_eps > 0) || !std::isfinite(t.adam_eps)) bad("adam_eps", "adam_eps must be a finite number > 0", "write e.g. `adam_eps: 1e-8`");
  if (!(t.gradient_bucket_mib >= kTrainLeastBucketMib && t.gradient_bucket_mib <= kTrainMostBucketMib))
    bad("gradient_bucket_mib",
        fmt::format("gradient_bucket_mib must be a number from {} to {}", kTrainLeastBucketMib, kTrainMostBucketMib),
        "write e.g. `gradient_bucket_mib: 64`");
  // Past 2^64 a scaled fp32 gradient overflows before any fp16 one would have.
  if (!(t.initial_loss_scale >= 1 && t.initial_loss_scale <= 0x1p64))
    bad("initial_loss_scale", "the initial loss scale must be a number from 1 to 2^64",
        "write e.g. `initial_loss_scale: 65536` (a power of two keeps the scaling exact)");
  if (t.loss_scale_growth_interval < 1 || t.loss_scale_growth_interval > kTrainMostSteps)
    bad("loss_scale_growth_interval",
        fmt::format("the loss scale growth interval must be from 1 to {} steps", kTrainMostSteps),
        "write e.g. `loss_scale_growth_interval: 2000`");
  double picks = 0;
  for (double n : t.expert_tokens) picks += n >= 0 ? n : -1e300;
  if (!t.expert_tokens.empty() && !(picks > 0))
    bad("expert_tokens", "expert_tokens must be numbers >= 0, not all 0",
        "write the top-k picks of each routed expert (alloy train's step log field expert_tokens)");
  if (!(t.grad_clip >= 0) || !std::isfinite(t.grad_clip))
    bad("grad_clip", "grad_clip must be a finite number >= 0 (0 disables clipping)", "write e.g. `grad_clip: 1.0`");
}

}  // namespace alloy
