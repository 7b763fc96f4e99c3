#include "tests/integration/test_session.h"

#include <chrono>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace testutil {
namespace {

std::vector<float> Gradient(int param, uint64_t step) {
  std::vector<float> g(param == 0 ? 32 : 8);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.01f * static_cast<float>(i + 1) * (param == 0 ? 1.0f : -1.0f) +
           0.001f * static_cast<float>(step);
  }
  return g;
}

v1::StepRequest Header(const std::string& session_id, uint64_t step) {
  v1::StepRequest request;
  request.mutable_header()->set_session_id(session_id);
  request.mutable_header()->set_step(step);
  return request;
}

}  // namespace

absl::StatusOr<ConnectedServer> StartConnected(std::vector<std::string> flags) {
  ConnectedServer c;
  OPTSTEP_ASSIGN_OR_RETURN(c.server, ServerProcess::Start(std::move(flags)));
  ClientOptions options;
  options.target = c.server->address();
  OPTSTEP_ASSIGN_OR_RETURN(c.client, Client::Connect(options));
  return c;
}

v1::SessionSpec SmallSpec(const std::string& name) {
  v1::SessionSpec spec;
  spec.set_name(name);
  auto* w = spec.add_parameters();
  w->set_name("fc.weight");
  w->add_shape(8);
  w->add_shape(4);
  auto* b = spec.add_parameters();
  b->set_name("fc.bias");
  b->add_shape(8);
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset("adam");
  return spec;
}

absl::StatusOr<StepReply> StepSmall(Client& client, const std::string& session_id, uint64_t step,
                                    uint32_t trainer) {
  const std::vector<float> gw = Gradient(0, step), gb = Gradient(1, step);
  StepOptions options;
  options.session_id = session_id;
  options.step = step;
  options.trainer_id = trainer;
  const FullGradient grads[] = {{0, gw}, {1, gb}};
  return client.Step(options, grads);
}

absl::StatusOr<v1::CreateSessionResponse> CreateWithRequestId(const std::string& target,
                                                              const v1::SessionSpec& spec,
                                                              const std::string& request_id) {
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  v1::CreateSessionRequest request;
  *request.mutable_spec() = spec;
  request.set_request_id(request_id);
  v1::CreateSessionResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  OPTSTEP_RETURN_IF_ERROR(FromGrpcStatus(stub->CreateSession(&context, request, &response)));
  return response;
}

absl::Status WaitServing(Client& client) {
  for (int i = 0; i < 200; ++i) {
    auto serving = client.CheckHealth();
    if (serving.ok() && *serving) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError("rank 0 never turned SERVING");
}

absl::StatusOr<std::unique_ptr<OpenStep>> OpenStep::Begin(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& session_id, uint64_t step,
    uint32_t trainer) {
  auto open = std::make_unique<OpenStep>();
  open->stub_ = v1::OptimizerService::NewStub(channel);
  open->context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  open->stream_ = open->stub_->Step(&open->context_);
  v1::StepRequest header = Header(session_id, step);
  header.mutable_header()->set_trainer_id(trainer);
  bool ok = open->stream_->Write(header);
  for (int p = 0; p < 2 && ok; ++p) {
    const std::vector<float> g = Gradient(p, step);
    v1::StepRequest chunk;
    chunk.mutable_gradient()->set_param_id(p);
    chunk.mutable_gradient()->set_dtype(v1::DTYPE_FP32);
    chunk.mutable_gradient()->set_data(
        std::string(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(float)));
    ok = open->stream_->Write(chunk);
  }
  if (!ok) return absl::UnavailableError("the Step stream broke while sending");
  return open;
}

absl::StatusOr<std::unique_ptr<OpenStep>> OpenStep::BeginWithoutGradients(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& session_id, uint64_t step) {
  auto open = std::make_unique<OpenStep>();
  open->stub_ = v1::OptimizerService::NewStub(channel);
  open->context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  open->stream_ = open->stub_->Step(&open->context_);
  if (!open->stream_->Write(Header(session_id, step))) {
    return absl::UnavailableError("the Step stream broke while sending its header");
  }
  return open;
}

grpc::Status OpenStep::TryBegin(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& session_id, uint64_t step) {
  auto stub = v1::OptimizerService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->Step(&context);
  stream->Write(Header(session_id, step));
  // The server answers a refused header at once; reading waits for that end.
  v1::StepResponse response;
  while (stream->Read(&response)) {
  }
  return stream->Finish();
}

absl::StatusOr<uint64_t> OpenStep::Commit() {
  v1::StepRequest commit;
  commit.mutable_commit()->set_num_elements(kSmallElements);
  if (!stream_->Write(commit)) return absl::UnavailableError("the Step stream broke at commit");
  stream_->WritesDone();
  v1::StepResponse response;
  uint64_t step = 0;
  while (stream_->Read(&response)) {
    if (response.has_result()) step = response.result().step();
  }
  grpc::Status status = stream_->Finish();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  return step;
}

grpc::Status OpenStep::Finish() {
  stream_->WritesDone();
  return AwaitEnd();
}

grpc::Status OpenStep::AwaitEnd() {
  v1::StepResponse response;
  while (stream_->Read(&response)) {
  }
  return stream_->Finish();
}

std::string FlatParams(const HostParameterMap& params) {
  std::string all;
  for (const auto& [id, param] : params) {
    all.append(reinterpret_cast<const char*>(param.f32.data()), param.f32.size() * sizeof(float));
  }
  return all;
}

absl::StatusOr<std::string> Pulled(Client& client, const std::string& session) {
  OPTSTEP_ASSIGN_OR_RETURN(Parameters params, client.PullParameters(session, DType::kF32));
  return FlatParams(params.params);
}

absl::StatusOr<std::map<std::string, std::string>> ExportedState(Client& client,
                                                                 const std::string& session) {
  v1::ExportStateDictRequest request;
  request.set_session_id(session);
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<Client::StateDictEntry> entries,
                           client.ExportStateDict(request));
  std::map<std::string, std::string> out;
  for (const auto& e : entries) out[e.key] = e.bytes;
  return out;
}

absl::Status AwaitAutoCheckpoint(const std::string& root, const std::string& session,
                                 uint64_t step) {
  const std::filesystem::path manifest = std::filesystem::path(root) / "auto" / session /
                                         absl::StrCat("step-", step) / "manifest.json";
  for (const absl::Time give_up = absl::Now() + absl::Seconds(20); absl::Now() < give_up;) {
    if (std::filesystem::exists(manifest)) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(manifest.string(), " never appeared"));
}

// OK when every session counts as many resolutions on every rank of `group` (PeerService.
// ListReplicas): the heal transfers state through resolutions on some ranks only, and a hold
// (checkpoint, state dict) settles every rank at one count.
absl::Status SameResolutionsEverywhere(const std::vector<std::unique_ptr<ServerProcess>>& group) {
  std::map<std::string, uint64_t> on_rank0;
  for (size_t r = 0; r < group.size(); ++r) {
    auto peer = v1::PeerService::NewStub(
        grpc::CreateChannel(group[r]->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::ListReplicasResponse listed;
    const grpc::Status status = peer->ListReplicas(&context, v1::ListReplicasRequest(), &listed);
    if (!status.ok()) return absl::InternalError(status.error_message());
    for (const v1::CreateReplicaRequest& replica : listed.replicas()) {
      if (r == 0) {
        on_rank0[replica.session_id()] = replica.resolutions();
      } else if (on_rank0[replica.session_id()] != replica.resolutions()) {
        return absl::InternalError(absl::StrCat(
            "session '", replica.session_id(), "': ", replica.resolutions(),
            " resolutions on rank ", r, ", ", on_rank0[replica.session_id()], " on rank 0"));
      }
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> SlowReaderChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

std::vector<grpc::Status> StageAndEndInitStreams(v1::OptimizerService::Stub& stub,
                                                 const std::vector<std::string>& sessions) {
  const size_t count = sessions.size();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::InitParametersResponse> responses(count);
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::InitParametersRequest>>> streams;
  v1::InitParametersRequest half;
  half.mutable_values()->set_dtype(v1::DTYPE_FP32);
  half.mutable_values()->set_data(std::string(2 << 20, '\0'));
  for (size_t s = 0; s < count; ++s) {
    half.set_session_id(sessions[s]);
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub.InitParameters(contexts.back().get(), &responses[s]));
    for (int64_t offset : {int64_t{0}, int64_t{1} << 19}) {
      half.mutable_values()->set_offset(offset);
      if (!streams.back()->Write(half)) break;
    }
  }
  absl::SleepFor(absl::Milliseconds(500));  // the rank has read what it takes
  std::vector<grpc::Status> ended;
  for (auto& stream : streams) {
    stream->WritesDone();
    ended.push_back(stream->Finish());
  }
  return ended;
}

bool UnreadExport::started() {
  v1::StateDictChunk chunk;
  return reader_->Read(&chunk);
}

absl::Status UnreadExport::Cancel() {
  context_.TryCancel();
  return FromGrpcStatus(reader_->Finish());
}

}  // namespace testutil
}  // namespace optstep
