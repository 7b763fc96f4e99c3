#ifndef OPTSTEP_TESTS_SECURITY_BAD_INPUT_CASES_H_
#define OPTSTEP_TESTS_SECURITY_BAD_INPUT_CASES_H_

// The kinds of bad input of the bad-input suite (bad_input_suite_test.cc), by RPC. Each kind is
// one call with the exact code and a part of the message that names the field or value; none
// may change the two sessions of the Target, and the server must go on serving after each.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace optstep {
namespace testutil {

// What the cases call: a rank started with the flags of kBadInputServerFlags, and two sessions
// of SmallSpec (tests/integration/test_session.h) with initial values set.
struct Target {
  std::shared_ptr<grpc::Channel> channel;
  std::string fresh;            // no step yet: InitParameters still allowed
  std::string stepped;          // two steps applied
  std::string closable;         // a third session, for the case that closes it twice
  std::string checkpoint_root;  // --checkpoint_root of the rank
};

// Limits the cases rely on (besides --checkpoint_root).
inline constexpr int64_t kMaxParamsPerSession = 64;
inline constexpr int64_t kMaxSessionBytes = 1 << 20;
inline constexpr int64_t kMaxStreamBytes = 1 << 16;
inline constexpr int64_t kStreamIdleTimeoutMs = 300;

struct BadInput {
  std::string name;  // unique: the kind of bad input
  std::function<grpc::Status(const Target&)> call;
  grpc::StatusCode code;
  std::string message;  // a part of the answer's message
};

std::vector<BadInput> SessionSpecCases();      // CreateSession: the spec's shape and fields
std::vector<BadInput> HyperparameterCases();   // CreateSession: the optimizer chain
std::vector<BadInput> ParameterStreamCases();  // InitParameters, PullParameters, Get/Close
std::vector<BadInput> StepCases();             // Step streams, typed and raw
std::vector<BadInput> CheckpointCases();       // Save, Load, Export/ImportStateDict, peer calls

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_SECURITY_BAD_INPUT_CASES_H_
