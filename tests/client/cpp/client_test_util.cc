#include "tests/client/cpp/client_test_util.h"

#include <cstring>

#include "gtest/gtest.h"
#include "tests/testing/fake_optimizer_service.h"

namespace optstep {
namespace testutil {

std::vector<float> Expected(uint32_t p, uint64_t n) {
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = FakeValue(p, i);
  return v;
}

StepOptions FirstStep() {
  StepOptions options;
  options.session_id = "s";
  options.step = 1;
  return options;
}

std::vector<float> ReceivedFp32(const std::vector<v1::StepRequest>& requests, uint32_t param_id,
                                uint64_t n) {
  std::vector<float> values(n, -1.0f);
  uint64_t next = 0;
  for (const v1::StepRequest& r : requests) {
    if (!r.has_gradient() || r.gradient().param_id() != param_id) continue;
    EXPECT_EQ(r.gradient().offset(), next);
    EXPECT_LE(r.gradient().data().size(), kChunkBytes);
    const uint64_t count = r.gradient().data().size() / 4;
    std::memcpy(values.data() + next, r.gradient().data().data(), count * 4);
    next += count;
  }
  EXPECT_EQ(next, n);
  return values;
}

}  // namespace testutil
}  // namespace optstep
