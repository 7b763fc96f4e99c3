#ifndef OPTSTEP_TESTS_SERVER_OPTIM_OPTIM_TEST_UTIL_H_
#define OPTSTEP_TESTS_SERVER_OPTIM_OPTIM_TEST_UTIL_H_

// Helpers of the optimizer tests: the device under test, transfers, random data, comparisons
// with the float64 references, and a harness that steps one parameter. Test-only.
//
// The device is the CPU unless the environment variable OPTSTEP_TEST_DEVICE names another kind
// ("cuda"): the gpu-tagged variants of these tests set it (see BUILD).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "server/optim/optimizer.h"
#include "server/optim/param_info.h"
#include "tests/server/optim/reference/matrix64.h"

namespace optstep {
namespace testutil {

// The device under test (see above); the test fails when it cannot be made.
std::unique_ptr<Device> TestDevice();

Tensor Upload(Device& device, const Shape& shape, const std::vector<float>& values);
std::vector<float> Download(Device& device, const Tensor& t);
ref::Matrix DownloadMatrix(Device& device, const Tensor& t);

std::vector<float> Normal(int64_t n, double scale, uint32_t seed);
std::vector<float> Integers(int64_t n, int lo, int hi, uint32_t seed);
// entries 2^k (±2^k unless `positive`) with k uniform in [lo, hi].
std::vector<float> PowersOfTwo(int64_t n, int lo, int hi, uint32_t seed, bool positive = false);

// |got − want| <= atol + rtol·|want| element-wise; reports the worst violation.
::testing::AssertionResult AllClose(const std::vector<float>& got, const ref::Matrix& want,
                                    double rtol, double atol);
::testing::AssertionResult AllClose(const ref::Matrix& got, const ref::Matrix& want, double rtol,
                                    double atol);
// ‖got − want‖_F / ‖want‖_F.
double RelativeError(const std::vector<float>& got, const ref::Matrix& want);

// One parameter, its gradient buffer and its optimizer state on a device.
class StepHarness {
 public:
  StepHarness(Device& device, Optimizer& optimizer, ParamInfo info,
              const std::vector<float>& initial);
  // Uploads `grad` and applies one step with counter value `t` (1-based).
  void Step(const std::vector<float>& grad, double lr, double weight_decay, int64_t t);
  std::vector<float> param() const;
  ref::Matrix param_matrix() const;
  std::vector<float> state(const std::string& key) const;
  ParamState& param_state() { return state_; }
  const ParamInfo& info() const { return info_; }

 private:
  Device& device_;
  Optimizer& optimizer_;
  ParamInfo info_;
  ParamState state_;
  Tensor param_;
  Tensor grad_;
};

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_SERVER_OPTIM_OPTIM_TEST_UTIL_H_
