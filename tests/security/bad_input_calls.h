#ifndef OPTSTEP_TESTS_SECURITY_BAD_INPUT_CALLS_H_
#define OPTSTEP_TESTS_SECURITY_BAD_INPUT_CALLS_H_

// Every RPC of a rank called with a request exactly as given (typed, or as raw bytes that need
// not parse), each answering the call's final grpc::Status, for the bad-input suite. Answers of
// streaming calls are read to the end and dropped. Every call has a deadline of 20 s.
// Thread-compatible: free functions over a channel, which may be shared.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optstep/v1/checkpoint_service.pb.h"
#include "optstep/v1/optimizer_service.pb.h"

namespace optstep {
namespace testutil {

// A unary call of `method` ("/optstep.v1.OptimizerService/CreateSession") with `bytes` as the
// request message.
grpc::Status CallUnaryBytes(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& bytes);

// A unary call of `method` with `request` serialized.
template <typename Request>
grpc::Status CallUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const Request& request) {
  return CallUnaryBytes(channel, method, request.SerializeAsString());
}

grpc::Status CallCreate(const std::shared_ptr<grpc::Channel>& channel, const v1::SessionSpec& spec);

// A Step stream that writes `messages` as raw bytes, half-closes (unless `half_close` is
// false: the stream then waits on the server) and reads every answer.
grpc::Status CallStepBytes(const std::shared_ptr<grpc::Channel>& channel,
                           const std::vector<std::string>& messages, bool half_close = true);
grpc::Status CallStep(const std::shared_ptr<grpc::Channel>& channel,
                      const std::vector<v1::StepRequest>& messages);

// How a client stream of tensor chunks ends: with the StreamEnd that tallies what was sent, as
// a client does, or without one (the messages given are the whole stream).
enum class Ending { kTally, kAsGiven };

grpc::Status CallInit(const std::shared_ptr<grpc::Channel>& channel,
                      const std::vector<v1::InitParametersRequest>& messages,
                      Ending ending = Ending::kTally);
grpc::Status CallPull(const std::shared_ptr<grpc::Channel>& channel,
                      const v1::PullParametersRequest& request);
grpc::Status CallExport(const std::shared_ptr<grpc::Channel>& channel,
                        const v1::ExportStateDictRequest& request);
grpc::Status CallImport(const std::shared_ptr<grpc::Channel>& channel,
                        const std::vector<v1::StateDictChunk>& messages,
                        Ending ending = Ending::kTally);
grpc::Status CallSave(const std::shared_ptr<grpc::Channel>& channel,
                      const v1::SaveRequest& request);
grpc::Status CallLoad(const std::shared_ptr<grpc::Channel>& channel,
                      const v1::LoadRequest& request);

// Step stream messages.
v1::StepRequest StepHeaderOf(const std::string& session_id, uint64_t step, uint32_t trainer = 0);
v1::StepRequest GradientOf(uint32_t param_id, uint64_t offset, const std::vector<float>& values,
                           v1::DType dtype = v1::DTYPE_FP32);
v1::StepRequest CommitOf(uint64_t num_elements);

// Protobuf's base-128 varint of `value`.
std::string Varint(uint64_t value);

// `values` as raw little-endian fp32 bytes.
std::string Fp32Bytes(const std::vector<float>& values);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_SECURITY_BAD_INPUT_CALLS_H_
