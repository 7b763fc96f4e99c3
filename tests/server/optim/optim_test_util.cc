#include "tests/server/optim/optim_test_util.h"

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>

#include "kernels/device_factory.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testutil {

std::unique_ptr<Device> TestDevice() {
  DeviceOptions options;
  const char* kind = std::getenv("OPTSTEP_TEST_DEVICE");
  if (kind != nullptr && kind[0] != '\0') options.kind = kind;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options);
  EXPECT_TRUE(device.ok()) << device.status();
  if (!device.ok()) std::abort();  // every test needs it
  return *std::move(device);
}

Tensor Upload(Device& device, const Shape& shape, const std::vector<float>& values) {
  absl::StatusOr<Tensor> t = device.Allocate(DType::kF32, shape);
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(static_cast<int64_t>(values.size()), t->numel());
  EXPECT_THAT(device.CopyFromHost(values.data(), DType::kF32, t->numel(), *t, 0), IsOk());
  return *std::move(t);
}

std::vector<float> Download(Device& device, const Tensor& t) {
  std::vector<float> out(t.numel());
  EXPECT_THAT(device.CopyToHost(t, 0, t.numel(), DType::kF32, out.data()), IsOk());
  return out;
}

ref::Matrix DownloadMatrix(Device& device, const Tensor& t) {
  return ref::Matrix::FromFloats(t.dim(0), t.dim(1), Download(device, t));
}

std::vector<float> Normal(int64_t n, double scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

std::vector<float> Integers(int64_t n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

std::vector<float> PowersOfTwo(int64_t n, int lo, int hi, uint32_t seed, bool positive) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> exponent(lo, hi);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> v(n);
  for (float& x : v) {
    const bool minus = negative(rng) && !positive;
    x = std::ldexp(minus ? -1.0f : 1.0f, exponent(rng));
  }
  return v;
}

::testing::AssertionResult AllClose(const std::vector<float>& got, const ref::Matrix& want,
                                    double rtol, double atol) {
  if (got.size() != want.v.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.v.size();
  }
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess = std::fabs(got[i] - want.v[i]) - (atol + rtol * std::fabs(want.v[i]));
    if (!(excess <= worst)) {
      worst = std::isnan(excess) ? INFINITY : excess;
      at = i;
    }
  }
  if (worst <= 0.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << at << " (row " << at / std::max<int64_t>(1, want.cols) << ", col "
         << at % std::max<int64_t>(1, want.cols) << "): got " << got[at] << ", want " << want.v[at]
         << " (rtol " << rtol << ", atol " << atol << ")";
}

::testing::AssertionResult AllClose(const ref::Matrix& got, const ref::Matrix& want, double rtol,
                                    double atol) {
  std::vector<float> g(got.v.begin(), got.v.end());
  return AllClose(g, want, rtol, atol);
}

double RelativeError(const std::vector<float>& got, const ref::Matrix& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want.v[i]) * (got[i] - want.v[i]);
    norm += want.v[i] * want.v[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

StepHarness::StepHarness(Device& device, Optimizer& optimizer, ParamInfo info,
                         const std::vector<float>& initial)
    : device_(device), optimizer_(optimizer), info_(std::move(info)) {
  EXPECT_THAT(optimizer_.CheckParam(info_), IsOk());
  EXPECT_THAT(optimizer_.InitState(device_, info_, state_), IsOk());
  param_ = Upload(device_, info_.shape, initial);
  absl::StatusOr<Tensor> grad = device_.Allocate(DType::kF32, info_.shape);
  EXPECT_TRUE(grad.ok());
  grad_ = *std::move(grad);
}

void StepHarness::Step(const std::vector<float>& grad, double lr, double weight_decay, int64_t t) {
  EXPECT_THAT(device_.CopyFromHost(grad.data(), DType::kF32, grad_.numel(), grad_, 0), IsOk());
  StepArgs args;
  args.lr = lr;
  args.weight_decay = weight_decay;
  args.group_step = t;
  EXPECT_THAT(optimizer_.Step(device_, args, grad_, param_, state_), IsOk());
}

std::vector<float> StepHarness::param() const { return Download(device_, param_); }

ref::Matrix StepHarness::param_matrix() const {
  const int64_t rows = info_.shape.empty() ? 1 : info_.shape[0];
  return ref::Matrix::FromFloats(rows, param_.numel() / std::max<int64_t>(1, rows), param());
}

std::vector<float> StepHarness::state(const std::string& key) const {
  Tensor* t = const_cast<ParamState&>(state_).Find(key);
  EXPECT_NE(t, nullptr) << key;
  return t == nullptr ? std::vector<float>() : Download(device_, *t);
}

}  // namespace testutil
}  // namespace optstep
