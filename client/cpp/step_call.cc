#include "client/cpp/step_call.h"

#include "absl/strings/str_cat.h"
#include "client/cpp/grpc_status.h"
#include "client/cpp/proto_dtype.h"
#include "kernels/status_macros.h"

namespace optstep {
namespace client_internal {

StepCall::StepCall(v1::OptimizerService::Stub& stub, absl::Time deadline, bool wait_for_ready) {
  context_.set_deadline(absl::ToChronoTime(deadline));
  context_.set_wait_for_ready(wait_for_ready);
  stream_ = stub.Step(&context_);
}

StepCall::~StepCall() {
  if (!finished_) Cancel();
}

bool StepCall::Send(const v1::StepHeader& header, const RankContribution& contribution) {
  v1::StepRequest request;
  *request.mutable_header() = header;
  if (!stream_->Write(request)) return false;

  // One request object for every chunk: its data string keeps its capacity between chunks.
  v1::TensorChunk* chunk = request.mutable_gradient();
  for (const GradientSlice& slice : contribution.chunks) {
    chunk->set_param_id(slice.param_id);
    chunk->set_offset(slice.offset);
    chunk->set_dtype(ToWireDType(slice.dtype));
    chunk->mutable_data()->assign(reinterpret_cast<const char*>(slice.bytes.data()),
                                  slice.bytes.size());
    if (!stream_->Write(request)) return false;
  }
  request.mutable_commit()->set_num_elements(contribution.num_elements);
  if (!stream_->Write(request)) return false;
  return stream_->WritesDone();
}

absl::Status StepCall::Receive(v1::StepResult* result, ParamAssembler* assembler) {
  v1::StepResponse response;
  if (!stream_->Read(&response)) {
    OPTSTEP_RETURN_IF_ERROR(Finish());
    return absl::InternalError("Step stream ended OK without a StepResult");
  }
  if (!response.has_result()) {
    Cancel();
    return absl::InternalError("Step stream began with a parameter chunk, not a StepResult");
  }
  *result = response.result();
  uint64_t chunks = 0;
  while (stream_->Read(&response)) {
    if (!response.has_parameter()) {
      Cancel();
      return absl::InternalError("Step stream sent a second StepResult");
    }
    ++chunks;
    if (assembler == nullptr) {
      Cancel();
      return absl::InternalError("Step stream sent parameters that were not asked for");
    }
    v1::TensorChunk* chunk = response.mutable_parameter();
    absl::StatusOr<DType> dtype = FromWireDType(chunk->dtype());
    absl::Status added = dtype.ok() ? assembler->Add(chunk->param_id(), chunk->offset(), *dtype,
                                                     chunk->data())
                                    : absl::InternalError(absl::StrCat(
                                          "Step stream sent a parameter chunk with ",
                                          dtype.status().message()));
    if (!added.ok()) {
      Cancel();
      return added;
    }
  }
  OPTSTEP_RETURN_IF_ERROR(Finish());
  if (chunks != result->params_to_follow()) {
    return absl::InternalError(absl::StrCat("Step stream announced ", result->params_to_follow(),
                                            " parameter chunks and sent ", chunks));
  }
  return absl::OkStatus();
}

void StepCall::Cancel() {
  if (finished_) return;
  context_.TryCancel();
  Finish().IgnoreError();
}

absl::Status StepCall::Finish() {
  if (!finished_) {
    finished_ = true;
    final_status_ = FromGrpcStatus(stream_->Finish());
  }
  return final_status_;
}

}  // namespace client_internal
}  // namespace optstep
