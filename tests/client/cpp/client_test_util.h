#ifndef OPTSTEP_TESTS_CLIENT_CPP_CLIENT_TEST_UTIL_H_
#define OPTSTEP_TESTS_CLIENT_CPP_CLIENT_TEST_UTIL_H_

// What the client tests against fake ranks (client_test.cc, two_rank_client_test.cc) share.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "client/cpp/client.h"
#include "optstep/v1/optimizer_service.pb.h"

namespace optstep {
namespace testutil {

inline constexpr size_t kChunkBytes = 16;  // 4 fp32 elements per wire chunk

// The values a fake rank returns for `n` elements of parameter `p` (FakeValue).
std::vector<float> Expected(uint32_t p, uint64_t n);

// Step 1 of session "s".
StepOptions FirstStep();

// Reassembles the gradient elements (as fp32 bit patterns widened from any dtype) that one
// rank received for `param_id`, checking that the chunks tile [0, n) in chunks of at most
// kChunkBytes (gtest expectations).
std::vector<float> ReceivedFp32(const std::vector<v1::StepRequest>& requests, uint32_t param_id,
                                uint64_t n);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_CLIENT_CPP_CLIENT_TEST_UTIL_H_
