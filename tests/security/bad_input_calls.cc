#include "tests/security/bad_input_calls.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/sync_stream.h>

#include <cstring>
#include <set>
#include <tuple>
#include <utility>

#include "absl/time/clock.h"
#include "optstep/v1/checkpoint_service.grpc.pb.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/testing/unary_call.h"
#include "wire/stream_end.h"

namespace optstep {
namespace testutil {
namespace {

void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
}

// Reads every answer of a stream, then its status.
template <typename Stream, typename Response>
grpc::Status Drain(Stream& stream, Response response) {
  while (stream.Read(&response)) {
  }
  return stream.Finish();
}

// A server stream: calls `method` of a `Service` stub with `request` and drains the answers.
template <typename Service, typename Response, typename Request, typename Method>
grpc::Status ReadAll(const std::shared_ptr<grpc::Channel>& channel, Method method,
                     const Request& request) {
  auto stub = Service::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = ((*stub).*method)(&context, request);
  return Drain(*reader, Response());
}

// A client stream: writes `messages`, half-closes and answers the status.
template <typename Request, typename Response, typename Open>
grpc::Status WriteAll(const std::vector<Request>& messages, Open open) {
  grpc::ClientContext context;
  SetDeadline(context);
  Response response;
  auto writer = open(&context, &response);
  for (const Request& message : messages) {
    if (!writer->Write(message)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

}  // namespace

grpc::Status CallUnaryBytes(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& bytes) {
  return UnaryCallBytes(channel, method, bytes);
}

grpc::Status CallCreate(const std::shared_ptr<grpc::Channel>& channel,
                        const v1::SessionSpec& spec) {
  v1::CreateSessionRequest request;
  *request.mutable_spec() = spec;
  return CallUnary(channel, "/optstep.v1.OptimizerService/CreateSession", request);
}

grpc::Status CallStepBytes(const std::shared_ptr<grpc::Channel>& channel,
                           const std::vector<std::string>& messages, bool half_close) {
  grpc::ClientContext context;
  SetDeadline(context);
  const grpc::internal::RpcMethod method("/optstep.v1.OptimizerService/Step",
                                         grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &context));
  for (const std::string& bytes : messages) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer message(&slice, 1);
    if (!stream->Write(message)) break;
  }
  if (half_close) stream->WritesDone();
  return Drain(*stream, grpc::ByteBuffer());
}

grpc::Status CallStep(const std::shared_ptr<grpc::Channel>& channel,
                      const std::vector<v1::StepRequest>& messages) {
  std::vector<std::string> bytes;
  for (const v1::StepRequest& message : messages) bytes.push_back(message.SerializeAsString());
  return CallStepBytes(channel, bytes);
}

grpc::Status CallInit(const std::shared_ptr<grpc::Channel>& channel,
                      const std::vector<v1::InitParametersRequest>& messages, Ending ending) {
  std::vector<v1::InitParametersRequest> stream = messages;
  if (ending == Ending::kTally) {
    StreamTally tally;
    std::set<uint32_t> params;
    for (const v1::InitParametersRequest& m : messages) {
      if (!m.has_values()) continue;
      tally.Add(m.values().data());
      params.insert(m.values().param_id());
    }
    *stream.emplace_back().mutable_end() = tally.End(params.size());
  }
  auto stub = v1::OptimizerService::NewStub(channel);
  return WriteAll<v1::InitParametersRequest, v1::InitParametersResponse>(
      stream, [&](grpc::ClientContext* context, v1::InitParametersResponse* response) {
        return stub->InitParameters(context, response);
      });
}

grpc::Status CallPull(const std::shared_ptr<grpc::Channel>& channel,
                      const v1::PullParametersRequest& request) {
  return ReadAll<v1::OptimizerService, v1::PullParametersResponse>(
      channel, &v1::OptimizerService::Stub::PullParameters, request);
}

grpc::Status CallExport(const std::shared_ptr<grpc::Channel>& channel,
                        const v1::ExportStateDictRequest& request) {
  return ReadAll<v1::CheckpointService, v1::StateDictChunk>(
      channel, &v1::CheckpointService::Stub::ExportStateDict, request);
}

grpc::Status CallImport(const std::shared_ptr<grpc::Channel>& channel,
                        const std::vector<v1::StateDictChunk>& messages, Ending ending) {
  std::vector<v1::StateDictChunk> stream = messages;
  if (ending == Ending::kTally) {
    StreamTally tally;
    std::set<std::tuple<std::string, std::string, std::string>> tensors;
    for (const v1::StateDictChunk& m : messages) {
      tally.Add(m.data());
      tensors.emplace(m.sub_optimizer(), m.chunk_key(), m.key());
    }
    v1::StateDictChunk end;
    *end.mutable_end() = tally.End(tensors.size());
    stream.push_back(std::move(end));
  }
  auto stub = v1::CheckpointService::NewStub(channel);
  return WriteAll<v1::StateDictChunk, v1::ImportStateDictResponse>(
      stream, [&](grpc::ClientContext* context, v1::ImportStateDictResponse* response) {
        return stub->ImportStateDict(context, response);
      });
}

grpc::Status CallSave(const std::shared_ptr<grpc::Channel>& channel,
                      const v1::SaveRequest& request) {
  return ReadAll<v1::CheckpointService, v1::CheckpointProgress>(
      channel, &v1::CheckpointService::Stub::Save, request);
}

grpc::Status CallLoad(const std::shared_ptr<grpc::Channel>& channel,
                      const v1::LoadRequest& request) {
  return ReadAll<v1::CheckpointService, v1::CheckpointProgress>(
      channel, &v1::CheckpointService::Stub::Load, request);
}

v1::StepRequest StepHeaderOf(const std::string& session_id, uint64_t step, uint32_t trainer) {
  v1::StepRequest request;
  request.mutable_header()->set_session_id(session_id);
  request.mutable_header()->set_step(step);
  request.mutable_header()->set_trainer_id(trainer);
  return request;
}

v1::StepRequest GradientOf(uint32_t param_id, uint64_t offset, const std::vector<float>& values,
                           v1::DType dtype) {
  v1::StepRequest request;
  request.mutable_gradient()->set_param_id(param_id);
  request.mutable_gradient()->set_offset(offset);
  request.mutable_gradient()->set_dtype(dtype);
  request.mutable_gradient()->set_data(Fp32Bytes(values));
  return request;
}

v1::StepRequest CommitOf(uint64_t num_elements) {
  v1::StepRequest request;
  request.mutable_commit()->set_num_elements(num_elements);
  return request;
}

std::string Varint(uint64_t value) {
  std::string out;
  for (; value >= 0x80; value >>= 7) out.push_back(static_cast<char>(value | 0x80));
  out.push_back(static_cast<char>(value));
  return out;
}

std::string Fp32Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace testutil
}  // namespace optstep
