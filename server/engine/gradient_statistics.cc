#include "server/engine/gradient_statistics.h"

#include <utility>

#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<GradientStats> MeanAndStatistics(const SessionConfig& config, Device& device,
                                                Tensor& grad) {
  if (SumsInTrainerOrder(config)) {
    OPTSTEP_RETURN_IF_ERROR(device.Scale(1.0f / static_cast<float>(config.num_trainers), grad));
  }
  return device.ComputeGradientStats(grad);
}

GradientStatistics::GradientStatistics(int num_params) : params_(num_params) {}

void GradientStatistics::BeginWrite(int param, bool changes) {
  Param& p = params_[param];
  ++p.writes;
  if (changes) ++p.version;
}

std::optional<uint64_t> GradientStatistics::EndWrite(int param, bool complete) {
  Param& p = params_[param];
  --p.writes;
  if (!complete || p.writes > 0 || p.posted == p.version) return std::nullopt;
  p.posted = p.version;
  return p.version;
}

bool GradientStatistics::Claim(int param, uint64_t version) {
  const Param& p = params_[param];
  if (p.version != version || p.writes > 0) return false;
  reading_ = param;
  return true;
}

void GradientStatistics::Release(int param, uint64_t version, bool current, Result result) {
  reading_ = -1;
  if (!current) return;
  Param& p = params_[param];
  p.computed = version;
  p.result = std::move(result);
}

std::vector<std::optional<GradientStatistics::Result>> GradientStatistics::Current() const {
  std::vector<std::optional<Result>> current(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].computed == params_[i].version) current[i] = params_[i].result;
  }
  return current;
}

void GradientStatistics::Reset() {
  const int reading = reading_;
  params_.assign(params_.size(), Param());
  reading_ = reading;
}

}  // namespace optstep
