#ifndef OPTSTEP_TESTS_SERVER_ENGINE_SESSION_TEST_UTIL_H_
#define OPTSTEP_TESTS_SERVER_ENGINE_SESSION_TEST_UTIL_H_

// What the Session tests share: a step callback to wait on, an engine on the CPU, the two-parameter
// model most of them train, and shorthands for a trainer's calls.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "tests/testing/fault_injecting_device.h"

namespace optstep {
namespace testutil {

// The outcome of one committed step, once its callback came. Keep it alive until then.
class Outcome {
 public:
  StepCallback Callback();
  // Waits for the callback; answers what it was told.
  const absl::StatusOr<StepOutcome>& Wait();
  // Waits at most `timeout`; answers whether the callback came.
  bool WaitFor(absl::Duration timeout);
  bool HasBeenNotified() const { return done_.HasBeenNotified(); }
  // REQUIRES: the callback came.
  const absl::StatusOr<StepOutcome>& result() const { return result_; }

 private:
  absl::Notification done_;
  absl::StatusOr<StepOutcome> result_ = absl::UnknownError("not called");
};

// Raw fp32 bytes as floats.
std::vector<float> Floats(const std::string& bytes);

// An engine of one rank on the CPU device (0 threads: the device's default). Fails the test (and
// answers null) when it cannot be created.
std::unique_ptr<Engine> MakeEngine(int num_threads = 0);
// A fault-injecting device over the CPU device with one thread, and an engine of one rank with
// `options` on `device`. Fail the test (and answer null) when they cannot be created.
std::shared_ptr<FaultInjectingDevice> FaultInjectingCpuDevice();
std::unique_ptr<Engine> MakeEngineOn(std::shared_ptr<Device> device,
                                     EngineOptions options = EngineOptions());

// Polls `condition` every millisecond for at most `timeout`; answers its last value.
template <typename Condition>
bool Eventually(Condition condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

SubOptimizerConfig AdamW(double lr, double weight_decay);
SubOptimizerConfig Sgd(double lr);
// A chain of two sub-optimizers (each named): `matrices` steps the 2-D parameters, `rest` the
// others.
ChainConfig MatricesAndTheRest(const SubOptimizerConfig& matrices, const SubOptimizerConfig& rest);

// "w" (2x3) and "b" (3), stepped by `optimizer`, one trainer, SHARDED, the chain's default
// clipping, a 30 s step deadline.
SessionConfig TwoParamConfig(const SubOptimizerConfig& optimizer);

// Creates a session of `config` in `engine`; fails the test (and answers null) on error.
std::shared_ptr<Session> MakeSession(Engine& engine, const SessionConfig& config);

// `trainer` begins `step`; fails the test on error.
StepHandle BeginStep(Session& session, uint64_t step, int trainer);

// Sends fp32 `values` of `param` from `offset`.
absl::Status SendGradient(Session& session, const StepHandle& c, int param, int64_t offset,
                          const std::vector<float>& values);

// The current fp32 values of `param` (Session::GetSnapshot).
std::vector<float> ParamValues(Session& session, int param);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_SERVER_ENGINE_SESSION_TEST_UTIL_H_
