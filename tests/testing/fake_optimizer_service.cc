#include "tests/testing/fake_optimizer_service.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/math/half.h"

namespace optstep {
namespace testutil {

FakeOptimizerService::FakeOptimizerService(v1::SessionInfo session)
    : session_(std::move(session)) {}

void FakeOptimizerService::set_behaviour(const Behaviour& behaviour) {
  absl::MutexLock lock(&mu_);
  behaviour_ = behaviour;
}

std::vector<v1::StepRequest> FakeOptimizerService::step_requests() const {
  absl::MutexLock lock(&mu_);
  return step_requests_;
}

std::vector<v1::InitParametersRequest> FakeOptimizerService::init_requests() const {
  absl::MutexLock lock(&mu_);
  return init_requests_;
}

std::vector<std::string> FakeOptimizerService::closed_sessions() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

std::vector<v1::CreateSessionRequest> FakeOptimizerService::create_requests() const {
  absl::MutexLock lock(&mu_);
  return create_requests_;
}

int FakeOptimizerService::step_streams() const {
  absl::MutexLock lock(&mu_);
  return step_streams_;
}

bool FakeOptimizerService::resume_timed_out() const {
  absl::MutexLock lock(&mu_);
  return resume_timed_out_;
}

grpc::Status FakeOptimizerService::CheckSession(const std::string& id) const {
  if (id != session_.session_id()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("session '", id, "' not found"));
  }
  return grpc::Status::OK;
}

grpc::Status FakeOptimizerService::CreateSession(grpc::ServerContext*,
                                                 const v1::CreateSessionRequest* request,
                                                 v1::CreateSessionResponse* response) {
  if (request->spec().name() != session_.spec().name()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "fake: unexpected spec");
  }
  absl::MutexLock lock(&mu_);
  create_requests_.push_back(*request);
  if (!behaviour_.create_error.ok()) return behaviour_.create_error;
  response->mutable_summary()->set_session_id(session_.session_id());
  response->mutable_summary()->set_name(session_.spec().name());
  response->set_attached(true);
  return grpc::Status::OK;
}

grpc::Status FakeOptimizerService::GetSession(grpc::ServerContext*,
                                              const v1::GetSessionRequest* request,
                                              v1::SessionInfo* response) {
  {
    absl::MutexLock lock(&mu_);
    if (!behaviour_.get_error.ok()) return behaviour_.get_error;
  }
  grpc::Status status = CheckSession(request->session_id());
  if (!status.ok()) return status;
  if (request->layout_offset() != 0) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "fake: the layout is one page");
  }
  *response = session_;  // the whole layout on one page
  response->set_num_parameters(session_.spec().parameters_size());
  return status;
}

grpc::Status FakeOptimizerService::ListSessions(grpc::ServerContext*,
                                                const v1::ListSessionsRequest*,
                                                v1::ListSessionsResponse* response) {
  v1::SessionSummary* summary = response->add_sessions();
  summary->set_session_id(session_.session_id());
  summary->set_name(session_.spec().name());
  summary->set_num_parameters(session_.spec().parameters_size());
  summary->set_num_trainers(session_.spec().num_trainers());
  summary->set_gradient_mode(session_.spec().gradient_mode());
  summary->set_step(session_.step());
  absl::MutexLock lock(&mu_);
  for (const std::string& target : behaviour_.rank_targets) response->add_rank_targets(target);
  for (uint32_t rank : behaviour_.stood_in_ranks) response->add_stood_in_ranks(rank);
  return grpc::Status::OK;
}

grpc::Status FakeOptimizerService::CloseSession(grpc::ServerContext*,
                                                const v1::CloseSessionRequest* request,
                                                v1::CloseSessionResponse*) {
  grpc::Status status = CheckSession(request->session_id());
  absl::MutexLock lock(&mu_);
  if (!behaviour_.close_error.ok() && !behaviour_.close_then_error) return behaviour_.close_error;
  if (status.ok()) closed_.push_back(request->session_id());
  if (!behaviour_.close_error.ok()) return behaviour_.close_error;
  return status;
}

grpc::Status FakeOptimizerService::InitParameters(
    grpc::ServerContext*, grpc::ServerReader<v1::InitParametersRequest>* reader,
    v1::InitParametersResponse* response) {
  v1::InitParametersRequest request;
  uint64_t elements = 0;
  while (reader->Read(&request)) {
    elements += request.values().data().size() / 4;
    absl::MutexLock lock(&mu_);
    init_requests_.push_back(request);
  }
  {
    absl::MutexLock lock(&mu_);
    if (behaviour_.init_unavailable > 0) {
      --behaviour_.init_unavailable;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the group heals; nothing was written");
    }
  }
  response->set_elements(elements);
  return grpc::Status::OK;
}

std::vector<v1::TensorChunk> FakeOptimizerService::ParameterChunks(
    const std::vector<uint32_t>& requested, v1::DType dtype, const Behaviour& behaviour) const {
  std::vector<uint32_t> ids = requested;
  if (ids.empty()) {
    for (int i = 0; i < session_.spec().parameters_size(); ++i) ids.push_back(i);
  }
  std::vector<v1::TensorChunk> chunks;
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    uint64_t n = 1;
    for (uint64_t d : session_.spec().parameters(*it).shape()) n *= d;
    for (uint64_t first = 0; first < n; first += behaviour.reply_chunk_elements) {
      const uint64_t count = std::min(behaviour.reply_chunk_elements, n - first);
      v1::TensorChunk chunk;
      chunk.set_param_id(*it);
      chunk.set_offset(first);
      chunk.set_dtype(dtype);
      std::string* data = chunk.mutable_data();
      for (uint64_t i = first; i < first + count; ++i) {
        const float v = FakeValue(*it, i);
        if (dtype == v1::DTYPE_BF16) {
          const uint16_t h = math::FloatToBf16(v);
          data->append(reinterpret_cast<const char*>(&h), 2);
        } else {
          data->append(reinterpret_cast<const char*>(&v), 4);
        }
      }
      chunks.push_back(std::move(chunk));
    }
  }
  if (behaviour.leave_out_last_chunk && !chunks.empty()) chunks.pop_back();
  return chunks;
}

grpc::Status FakeOptimizerService::Step(
    grpc::ServerContext*, grpc::ServerReaderWriter<v1::StepResponse, v1::StepRequest>* stream) {
  Behaviour behaviour;
  {
    absl::MutexLock lock(&mu_);
    behaviour = behaviour_;
    ++step_streams_;
  }
  v1::StepRequest request;
  v1::StepHeader header;
  while (stream->Read(&request)) {
    if (request.has_header()) header = request.header();
    {
      absl::MutexLock lock(&mu_);
      step_requests_.push_back(request);
    }
    if (behaviour.error_at_header && !behaviour.step_error.ok()) return behaviour.step_error;
  }
  if (!behaviour.step_error.ok()) return behaviour.step_error;

  std::vector<v1::TensorChunk> chunks;
  if (!header.skip_return() && !behaviour.skipped) {
    chunks = ParameterChunks(
        !behaviour.step_returns.empty() ? behaviour.step_returns
                                        : std::vector<uint32_t>(header.return_param_ids().begin(),
                                                                header.return_param_ids().end()),
        header.return_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP32 : header.return_dtype(),
        behaviour);
  }
  v1::StepResponse response;
  v1::StepResult* result = response.mutable_result();
  result->set_step(header.step());
  result->set_skipped(behaviour.skipped);
  result->set_grad_norm(behaviour.skipped ? 0.0 : 2.5);
  result->set_clipped(!behaviour.skipped);
  result->set_params_to_follow(chunks.size() + (behaviour.miscount_chunks ? 1 : 0));
  stream->Write(response);
  for (size_t i = 0; i < chunks.size(); ++i) {
    *response.mutable_parameter() = std::move(chunks[i]);
    stream->Write(response);
    if (i == 0 && behaviour.resume != nullptr &&
        !behaviour.resume->WaitForNotificationWithTimeout(absl::Seconds(5))) {
      absl::MutexLock lock(&mu_);
      resume_timed_out_ = true;
    }
  }
  return grpc::Status::OK;
}

grpc::Status FakeOptimizerService::PullParameters(
    grpc::ServerContext*, const v1::PullParametersRequest* request,
    grpc::ServerWriter<v1::PullParametersResponse>* writer) {
  grpc::Status status = CheckSession(request->session_id());
  if (!status.ok()) return status;
  Behaviour behaviour;
  {
    absl::MutexLock lock(&mu_);
    behaviour = behaviour_;
  }
  bool first = true;
  for (v1::TensorChunk& chunk : ParameterChunks(
           {request->param_ids().begin(), request->param_ids().end()},
           request->dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_FP32 : request->dtype(),
           behaviour)) {
    v1::PullParametersResponse response;
    if (first) response.set_step(session_.step());
    first = false;
    *response.mutable_parameter() = std::move(chunk);
    writer->Write(response);
  }
  return grpc::Status::OK;
}

FakeServer StartFakeServer(grpc::Service* service) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  // 127.0.0.1 only: "localhost" may bind ::1 to another port, or not at all, and a client that
  // resolves it to ::1 first may reach another process's server there.
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  FakeServer fake;
  fake.server = builder.BuildAndStart();
  CHECK(fake.server != nullptr) << "cannot start the fake server";
  CHECK_GT(port, 0);
  fake.target = absl::StrCat("127.0.0.1:", port);
  return fake;
}

}  // namespace testutil
}  // namespace optstep
