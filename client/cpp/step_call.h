#ifndef OPTSTEP_CLIENT_CPP_STEP_CALL_H_
#define OPTSTEP_CLIENT_CPP_STEP_CALL_H_

// One trainer's Step stream to one rank, on gRPC's synchronous API: header -> gradient chunks ->
// commit -> half-close, then the StepResult and (from the rank that returns parameters) the
// parameter chunks. Internal to client/. Thread-compatible: one thread drives a call.

#include <memory>

#include <grpcpp/client_context.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cpp/chunking.h"
#include "client/cpp/param_assembler.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"

namespace optstep {
namespace client_internal {

class StepCall final {
 public:
  // Starts the call. `stub` must outlive it.
  StepCall(v1::OptimizerService::Stub& stub, absl::Time deadline, bool wait_for_ready);
  ~StepCall();

  StepCall(const StepCall&) = delete;
  StepCall& operator=(const StepCall&) = delete;

  // Writes `header`, the contribution's chunks and a StepCommit carrying its element count, then
  // half-closes. Returns false when the stream broke; Finish() then tells why.
  bool Send(const v1::StepHeader& header, const RankContribution& contribution);

  // Reads the StepResult into `*result` and the parameter chunks that follow it into
  // `assembler` (null: none may follow), then finishes the call. Answers the call's status
  // (the server's code and message) or INTERNAL when the server broke the stream's protocol.
  absl::Status Receive(v1::StepResult* result, ParamAssembler* assembler);

  // Ends the call early (after an error elsewhere) and waits for it to finish.
  void Cancel();

 private:
  // Finishes the call once; later calls answer the same status.
  absl::Status Finish();

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream_;
  bool finished_ = false;
  absl::Status final_status_;
};

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_STEP_CALL_H_
