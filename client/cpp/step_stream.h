#ifndef OPTSTEP_CLIENT_CPP_STEP_STREAM_H_
#define OPTSTEP_CLIENT_CPP_STEP_STREAM_H_

// optstep::StepStream: one optimizer step of one trainer whose gradients are sent while they are
// produced (e.g. by a backward pass), opened with Client::OpenStep. Each Add validates slices,
// splits them into wire chunks and queues them on the Step streams of their owner ranks, which
// gRPC writes while the caller goes on; Finish commits on every rank and reads the result and
// the updated parameters, as Client::Step answers them. Client::Step itself is one Add of every
// gradient before anything is sent.
//
// Unlike Client::Step, a stream does not wait for a recovering group: an error is answered as
// is, and the caller redoes the step with Client::Step (the same gradients).
//
// Thread-safe: Add may be called from several threads at once; Finish once, after every Add.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/cpp/client_types.h"

namespace optstep {
namespace client_internal {
class Arrivals;
class ParamAssembler;
class SessionLayout;
class StepCall;
struct RankContribution;
}  // namespace client_internal

class StepStream final {
 public:
  using LayoutPtr = std::shared_ptr<const client_internal::SessionLayout>;

  // Takes the opened calls, one per rank of `layout` (header sent), which count what arrives
  // in `arrivals`. Made by Client.
  StepStream(LayoutPtr layout, std::vector<std::unique_ptr<client_internal::StepCall>> calls,
             std::shared_ptr<client_internal::Arrivals> arrivals, StepOptions options,
             size_t max_chunk_bytes);
  // Cancels the calls unless Finish has run, and waits until gRPC has released the gradients.
  ~StepStream();

  StepStream(const StepStream&) = delete;
  StepStream& operator=(const StepStream&) = delete;

  // Queues `slices` (INVALID_ARGUMENT / NOT_FOUND as Client::Step, nothing queued then;
  // FAILED_PRECONDITION after Finish). Returns once queued. REQUIRES: the slices' bytes stay
  // valid until Finish has returned (or this object is gone).
  absl::Status Add(absl::Span<const GradientSlice> slices);

  // Queues a planned contribution per rank (already validated; Client::Step plans every
  // gradient before anything is sent). FAILED_PRECONDITION after Finish.
  absl::Status Queue(absl::Span<const client_internal::RankContribution> plan);

  // Returned parameter `param_id` is written straight into `bytes` (every element, in the return
  // dtype: e.g. the model's own tensor) as its chunks arrive, and is left out of
  // StepReply.params (counted in StepReply.destinations_filled; ParamAssembler::SetDestination).
  // A reply that fails may have written part of it. REQUIRES: before Finish; `bytes` stays valid
  // until Finish has returned.
  absl::Status WriteInto(uint32_t param_id, absl::Span<uint8_t> bytes);
  // `ready(param_id)` runs on Finish's thread as soon as each returned parameter has arrived,
  // before the reply is complete (ParamAssembler::OnReady). REQUIRES: before Finish.
  void OnParamReady(std::function<void(uint32_t)> ready);
  // `applied(step)` runs on Finish's thread once every rank answered the step applied, before
  // its parameters are read. REQUIRES: before Finish.
  void OnApplied(std::function<void(uint64_t step)> applied);

  // Commits everything added on every rank and answers the step's result and parameters, as
  // Client::Step. FAILED_PRECONDITION when called twice.
  absl::StatusOr<StepReply> Finish();

 private:
  absl::Status AlreadyFinished() const;

  const LayoutPtr layout_;
  const std::shared_ptr<client_internal::Arrivals> arrivals_;
  const StepOptions options_;
  const size_t max_chunk_bytes_;

  absl::Mutex mu_;
  // Moved out by Finish.
  std::vector<std::unique_ptr<client_internal::StepCall>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> num_elements_ ABSL_GUARDED_BY(mu_);  // added, by rank
  // Moved out by Finish.
  std::unique_ptr<client_internal::ParamAssembler> assembler_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(uint64_t)> on_applied_ ABSL_GUARDED_BY(mu_);  // moved out by Finish
};

}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_STEP_STREAM_H_
