// The conformance suite on "nccl": one rank per GPU, ranks as threads, buffers in the memory
// of each rank's GPU (allocated through the CUDA Device). World sizes 1 up to the number of
// visible GPUs (at most 4); a one-GPU machine still runs world size 1 and the never-joining
// rank (a group of two whose second rank never comes). Built only under --config=cuda and
// tagged "gpu": without a GPU the target FAILS (every test that creates a communicator fails;
// it is never skipped as a whole); CPU CI filters it out by tag.

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/device.h"
#include "kernels/device_factory.h"
#include "kernels/dtype.h"
#include "base/status_macros.h"
#include "kernels/tensor.h"
#include "tests/kernels/comm/communicator_conformance.h"

namespace optstep {
namespace testing_internal {
namespace {

// One Device per GPU, shared by the tests (creating one per buffer would be slow).
Device* DeviceFor(int ordinal) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* devices = new absl::flat_hash_map<int, std::unique_ptr<Device>>();
  absl::MutexLock lock(&mu);
  auto it = devices->find(ordinal);
  if (it != devices->end()) return it->second.get();
  DeviceOptions options;
  options.kind = absl::StrCat("cuda:", ordinal);
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options);
  if (!device.ok()) return nullptr;
  return devices->emplace(ordinal, *std::move(device)).first->second.get();
}

// GPU memory held by a float32 tensor of ceil(bytes / 4) elements; the host copies go through
// a padded staging vector.
class DeviceBuffer final : public CommBuffer {
 public:
  DeviceBuffer(Device* device, Tensor tensor, size_t bytes)
      : device_(device), tensor_(std::move(tensor)), bytes_(bytes) {}

  void* data() override { return tensor_.data(); }
  size_t size() const override { return bytes_; }

  absl::Status Write(const std::vector<uint8_t>& bytes) override {
    if (bytes.size() != bytes_) return absl::InvalidArgumentError("size mismatch");
    std::vector<float> staging(tensor_.numel(), 0.0f);
    if (!bytes.empty()) std::memcpy(staging.data(), bytes.data(), bytes.size());
    return device_->CopyFromHost(staging.data(), DType::kF32, tensor_.numel(), tensor_, 0);
  }

  absl::StatusOr<std::vector<uint8_t>> Read() override {
    std::vector<float> staging(tensor_.numel());
    OPTSTEP_RETURN_IF_ERROR(
        device_->CopyToHost(tensor_, 0, tensor_.numel(), DType::kF32, staging.data()));
    std::vector<uint8_t> bytes(bytes_);
    if (!bytes.empty()) std::memcpy(bytes.data(), staging.data(), bytes_);
    return bytes;
  }

 private:
  Device* device_;
  Tensor tensor_;
  size_t bytes_;
};

absl::StatusOr<std::unique_ptr<CommBuffer>> AllocateOnGpu(int rank, size_t bytes) {
  Device* device = DeviceFor(rank);
  if (device == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open cuda:", rank));
  }
  const int64_t elements = std::max<int64_t>(1, (static_cast<int64_t>(bytes) + 3) / 4);
  OPTSTEP_ASSIGN_OR_RETURN(Tensor tensor, device->Allocate(DType::kF32, {elements}));
  return std::unique_ptr<CommBuffer>(new DeviceBuffer(device, std::move(tensor), bytes));
}

CommKind NcclKind() {
  CommKind kind;
  kind.name = "Nccl";
  kind.kind = "nccl";
  const int gpus = std::min(4, CudaDevice::VisibleDeviceCount());
  for (int w = 1; w <= std::max(1, gpus); ++w) kind.world_sizes.push_back(w);
  // NCCL ranks whose peer aborted may also wait for their own timeout.
  kind.reports_peer_loss = false;
  kind.allocate = AllocateOnGpu;
  return kind;
}

INSTANTIATE_TEST_SUITE_P(Nccl, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ExpandWorldSizes(NcclKind())), ParamName);

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
