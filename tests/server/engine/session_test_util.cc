#include "tests/server/engine/session_test_util.h"

#include <cstring>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/device_factory.h"

namespace optstep {
namespace testutil {

StepCallback Outcome::Callback() {
  return [this](absl::StatusOr<StepOutcome> o) {
    result_ = std::move(o);
    done_.Notify();
  };
}

const absl::StatusOr<StepOutcome>& Outcome::Wait() {
  done_.WaitForNotification();
  return result_;
}

bool Outcome::WaitFor(absl::Duration timeout) {
  return done_.WaitForNotificationWithTimeout(timeout);
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::unique_ptr<Engine> MakeEngine(int num_threads) {
  EngineOptions options;
  if (num_threads > 0) options.device.num_threads = num_threads;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status();
    return nullptr;
  }
  return *std::move(engine);
}

std::shared_ptr<FaultInjectingDevice> FaultInjectingCpuDevice() {
  DeviceOptions cpu;
  cpu.num_threads = 1;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(cpu);
  if (!device.ok()) {
    ADD_FAILURE() << device.status();
    return nullptr;
  }
  return std::make_shared<FaultInjectingDevice>(*std::move(device));
}

std::unique_ptr<Engine> MakeEngineOn(std::shared_ptr<Device> device, EngineOptions options) {
  options.injected_device = std::move(device);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status();
    return nullptr;
  }
  return *std::move(engine);
}

SubOptimizerConfig AdamW(double lr, double weight_decay) {
  SubOptimizerConfig adam;
  adam.name = "adam";
  adam.kind = "adamw";
  adam.adamw.lr = lr;
  adam.adamw.weight_decay = weight_decay;
  return adam;
}

SubOptimizerConfig Sgd(double lr) {
  SubOptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.kind = "sgd";
  sgd.sgd.lr = lr;
  return sgd;
}

ChainConfig MatricesAndTheRest(const SubOptimizerConfig& matrices, const SubOptimizerConfig& rest) {
  ChainConfig chain;
  chain.sub_optimizers = {matrices, rest};
  RoutingRule by_ndim;
  by_ndim.ndim = 2;
  by_ndim.sub_optimizer = matrices.name;
  RoutingRule otherwise;
  otherwise.sub_optimizer = rest.name;
  chain.rules = {by_ndim, otherwise};
  return chain;
}

SessionConfig TwoParamConfig(const SubOptimizerConfig& optimizer) {
  SessionConfig config;
  config.params = {ParamInfo{"w", {2, 3}}, ParamInfo{"b", {3}}};
  config.chain.sub_optimizers = {optimizer};
  config.step_deadline = absl::Seconds(30);
  return config;
}

std::shared_ptr<Session> MakeSession(Engine& engine, const SessionConfig& config) {
  absl::StatusOr<Engine::Created> created = engine.CreateSession(config);
  if (!created.ok()) {
    ADD_FAILURE() << created.status();
    return nullptr;
  }
  return created->session;
}

StepHandle BeginStep(Session& session, uint64_t step, int trainer) {
  StepBegin begin;
  begin.step = step;
  begin.trainer = trainer;
  absl::StatusOr<StepHandle> c = session.Begin(begin);
  if (!c.ok()) {
    ADD_FAILURE() << "step " << step << " trainer " << trainer << ": " << c.status();
    return StepHandle{};
  }
  return *c;
}

absl::Status SendGradient(Session& session, const StepHandle& c, int param, int64_t offset,
                          const std::vector<float>& values) {
  return session.AddGradient(c, param, offset, DType::kF32, values.data(), values.size() * 4);
}

std::vector<float> ParamValues(Session& session, int param) {
  absl::Notification done;
  std::vector<float> out;
  session.GetSnapshot(DType::kF32, [&](absl::StatusOr<std::shared_ptr<const ParamSnapshot>> s) {
    if (s.ok()) {
      out = Floats((*s)->values[param]);
    } else {
      ADD_FAILURE() << s.status();
    }
    done.Notify();
  });
  done.WaitForNotification();
  return out;
}

}  // namespace testutil
}  // namespace optstep
