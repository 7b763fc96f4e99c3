#ifndef OPTSTEP_TESTS_KERNELS_DEVICE_CONFORMANCE_H_
#define OPTSTEP_TESTS_KERNELS_DEVICE_CONFORMANCE_H_

// The Device conformance suite: one set of TEST_Ps (device_conformance_*_test.cc, linked in
// with alwayslink) that every Device implementation must pass. Each implementation gets its own
// cc_test target holding only an INSTANTIATE_TEST_SUITE_P over its DeviceFactory values:
//   device_conformance_cpu_test   always built and run;
//   device_conformance_cuda_test  tagged "gpu", built only under --config=cuda; it fails (never
//                                 skips) where no GPU can be opened.

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace optstep {
namespace testing_internal {

// How the suite obtains a device. `create(num_threads)`: a fresh device; implementations
// without threads (CUDA) ignore the argument. The suite compares results of devices made with
// 1 and with several threads, which must be bit-identical.
struct DeviceFactory {
  std::string name;  // test-name suffix: letters, digits and '_' only
  std::function<absl::StatusOr<std::unique_ptr<Device>>(int num_threads)> create;
};

inline std::ostream& operator<<(std::ostream& os, const DeviceFactory& f) { return os << f.name; }

// Sizes that cover one element, a vector tail, odd sizes, and more than one 64Ki block.
inline const std::vector<int64_t>& ConformanceSizes() {
  static const std::vector<int64_t>* sizes = new std::vector<int64_t>{1, 7, 4097, 65537 + 3};
  return *sizes;
}

class DeviceConformanceTest : public ::testing::TestWithParam<DeviceFactory> {
 protected:
  // Creates device_ (default thread count); the test fails if the device cannot be made.
  void SetUp() override;

  // An fp32 tensor of shape {values.size()} holding `values`.
  absl::StatusOr<Tensor> Upload(const std::vector<float>& values);
  // An fp32 tensor of `shape` holding `values` (as many as the shape has elements).
  absl::StatusOr<Tensor> Upload(const Shape& shape, const std::vector<float>& values);
  absl::StatusOr<Tensor> Upload(Device& device, const std::vector<float>& values);
  // All elements of the fp32 tensor `t`.
  absl::StatusOr<std::vector<float>> Download(const Tensor& t);
  absl::StatusOr<std::vector<float>> Download(Device& device, const Tensor& t);

  // n values uniform in [lo, hi) from a generator seeded with `seed`.
  static std::vector<float> Uniform(int64_t n, float lo, float hi, uint32_t seed);
  // n standard normal values scaled by `scale`.
  static std::vector<float> Normal(int64_t n, float scale, uint32_t seed);
  // n integers uniform in [lo, hi], as floats.
  static std::vector<float> Integers(int64_t n, int lo, int hi, uint32_t seed);

  std::unique_ptr<Device> device_;
};

}  // namespace testing_internal
}  // namespace optstep

#endif  // OPTSTEP_TESTS_KERNELS_DEVICE_CONFORMANCE_H_
