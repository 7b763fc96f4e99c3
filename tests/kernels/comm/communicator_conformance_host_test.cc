// The conformance suite on the host-memory kinds: "local" and "gloo" (world sizes 1 to 4;
// "gloo" with one rank is a local communicator), ranks as threads on 127.0.0.1.

#include "gtest/gtest.h"
#include "tests/kernels/comm/communicator_conformance.h"

namespace optstep {
namespace testing_internal {
namespace {

INSTANTIATE_TEST_SUITE_P(Local, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ExpandWorldSizes(LocalKind())), ParamName);
INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
                         ::testing::ValuesIn(ExpandWorldSizes(GlooKind())), ParamName);

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
