#include "bench/gpt_layout.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/registry.h"

namespace optstep {
namespace bench {
namespace {

// Fills `t` with a repeated pattern of normal values of scale `scale`.
absl::Status Fill(Device& device, Tensor& t, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> pattern(1 << 16);
  for (float& x : pattern) x = normal(rng);
  for (int64_t i = 0; i < t.numel(); i += static_cast<int64_t>(pattern.size())) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(pattern.size()), t.numel() - i);
    OPTSTEP_RETURN_IF_ERROR(device.CopyFromHost(pattern.data(), DType::kF32, n, t, i));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<ParamInfo> GptLayer(const GptShape& s, int index) {
  const std::string p = absl::StrCat("layers.", index, ".");
  std::vector<ParamInfo> params = {
      {p + "input_layernorm.weight", {s.hidden}},
      {p + "input_layernorm.bias", {s.hidden}},
      {p + "attention.linear_qkv.weight", {3 * s.hidden, s.hidden}},
      {p + "attention.linear_qkv.bias", {3 * s.hidden}},
      {p + "attention.linear_proj.weight", {s.hidden, s.hidden}},
      {p + "attention.linear_proj.bias", {s.hidden}},
      {p + "pre_mlp_layernorm.weight", {s.hidden}},
      {p + "pre_mlp_layernorm.bias", {s.hidden}},
      {p + "mlp.linear_fc1.weight", {s.ffn, s.hidden}},
      {p + "mlp.linear_fc1.bias", {s.ffn}},
      {p + "mlp.linear_fc2.weight", {s.hidden, s.ffn}},
      {p + "mlp.linear_fc2.bias", {s.hidden}},
  };
  const uint32_t head_dim = static_cast<uint32_t>(s.hidden / s.heads);
  params[2].qkv = {static_cast<uint32_t>(s.heads), 1, head_dim};
  return params;
}

std::vector<ParamInfo> GptRest(const GptShape& s) {
  std::vector<ParamInfo> params = {
      {"embedding.word_embeddings.weight", {s.vocab, s.hidden}},
      {"embedding.position_embeddings.weight", {s.positions, s.hidden}},
      {"final_layernorm.weight", {s.hidden}},
      {"final_layernorm.bias", {s.hidden}},
  };
  params[0].embedding_or_output = true;
  return params;
}

int64_t CountElements(const std::vector<ParamInfo>& params) {
  int64_t n = 0;
  for (const ParamInfo& p : params) n += p.numel();
  return n;
}

absl::StatusOr<std::unique_ptr<ChainStepper>> ChainStepper::Create(Device& device,
                                                                   const ChainConfig& chain,
                                                                   std::vector<ParamInfo> params) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<ParamGroup> defs, RouteParameters(chain, params));
  std::unique_ptr<ChainStepper> stepper(new ChainStepper(device, std::move(params)));
  const std::vector<ParamInfo>& ps = stepper->params_;
  stepper->states_.resize(ps.size());
  std::vector<int> group_of(ps.size(), 0);
  for (ParamGroup& def : defs) {
    Group group;
    const SubOptimizerConfig& sub = chain.sub_optimizers[def.sub_optimizer];
    OPTSTEP_ASSIGN_OR_RETURN(group.optimizer, CreateOptimizer(sub.name, sub, def.overrides));
    for (int p : def.param_ids) {
      OPTSTEP_RETURN_IF_ERROR(group.optimizer->CheckParam(ps[p]));
      group_of[p] = static_cast<int>(stepper->groups_.size());
    }
    group.def = std::move(def);
    stepper->groups_.push_back(std::move(group));
  }
  for (size_t p = 0; p < ps.size(); ++p) {
    OPTSTEP_ASSIGN_OR_RETURN(Tensor master, device.Allocate(DType::kF32, ps[p].shape));
    OPTSTEP_ASSIGN_OR_RETURN(Tensor grad, device.Allocate(DType::kF32, ps[p].shape));
    OPTSTEP_RETURN_IF_ERROR(Fill(device, master, 0.02f, 1 + p));
    OPTSTEP_RETURN_IF_ERROR(Fill(device, grad, 1e-3f, 1000 + p));
    OPTSTEP_RETURN_IF_ERROR(
        stepper->groups_[group_of[p]].optimizer->InitState(device, ps[p], stepper->states_[p]));
    stepper->masters_.push_back(std::move(master));
    stepper->grads_.push_back(std::move(grad));
  }
  OPTSTEP_RETURN_IF_ERROR(device.Synchronize());
  return stepper;
}

absl::Status ChainStepper::Step() {
  for (Group& group : groups_) {
    StepArgs args;
    args.lr = 1e-4;
    args.weight_decay = 0.01 * group.def.wd_mult;
    args.group_step = ++group.applied;
    // In the engine's batches (server/engine/owned_update.h).
    std::vector<int64_t> bytes;
    for (int p : group.def.param_ids) bytes.push_back(params_[p].numel() * 4);
    const int64_t batch_bytes = group.optimizer->batches() ? kStepBatchBytes : 0;
    size_t next = 0;
    for (int length : BatchLengths(bytes, batch_bytes)) {
      std::vector<StepOperands> batch;
      for (; length > 0; --length, ++next) {
        const int p = group.def.param_ids[next];
        batch.push_back({&grads_[p], &masters_[p], &states_[p]});
      }
      OPTSTEP_RETURN_IF_ERROR(group.optimizer->StepBatch(device_, args, batch));
    }
  }
  return device_.Synchronize();
}

}  // namespace bench
}  // namespace optstep
