#include "client/cpp/step_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cpp/chunking.h"
#include "client/cpp/param_assembler.h"
#include "client/cpp/session_layout.h"
#include "client/cpp/step_call.h"

namespace optstep {

using client_internal::ParamAssembler;
using client_internal::RankContribution;
using client_internal::StepCall;

StepStream::StepStream(LayoutPtr layout, std::vector<std::unique_ptr<StepCall>> calls,
                       std::shared_ptr<client_internal::Arrivals> arrivals, StepOptions options,
                       size_t max_chunk_bytes)
    : layout_(std::move(layout)),
      arrivals_(std::move(arrivals)),
      options_(std::move(options)),
      max_chunk_bytes_(max_chunk_bytes),
      calls_(std::move(calls)),
      num_elements_(calls_.size(), 0),
      assembler_(std::make_unique<ParamAssembler>(*layout_, options_.return_dtype,
                                                  options_.return_param_ids)) {}

StepStream::~StepStream() {
  absl::MutexLock lock(&mu_);
  calls_.clear();  // each cancels a call still running and waits for gRPC to let go
}

absl::Status StepStream::Add(absl::Span<const GradientSlice> slices) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<RankContribution> plan,
                           client_internal::PlanContributions(*layout_, slices, max_chunk_bytes_));
  return Queue(plan);
}

absl::Status StepStream::Queue(absl::Span<const RankContribution> plan) {
  absl::MutexLock lock(&mu_);
  if (finished_) return AlreadyFinished();
  for (size_t r = 0; r < plan.size() && r < calls_.size(); ++r) {
    if (plan[r].chunks.empty()) continue;
    calls_[r]->Append(plan[r].chunks);
    num_elements_[r] += plan[r].num_elements;
  }
  return absl::OkStatus();
}

absl::Status StepStream::WriteInto(uint32_t param_id, absl::Span<uint8_t> bytes) {
  absl::MutexLock lock(&mu_);
  if (finished_) return AlreadyFinished();
  return assembler_->SetDestination(param_id, bytes);
}

void StepStream::OnParamReady(std::function<void(uint32_t)> ready) {
  absl::MutexLock lock(&mu_);
  if (!finished_) assembler_->OnReady(std::move(ready));
}

absl::Status StepStream::AlreadyFinished() const {
  return absl::FailedPreconditionError(absl::StrCat("session '", options_.session_id, "': step ",
                                                    options_.step, " was already finished"));
}

void StepStream::OnApplied(std::function<void(uint64_t step)> applied) {
  absl::MutexLock lock(&mu_);
  if (!finished_) on_applied_ = std::move(applied);
}

absl::StatusOr<StepReply> StepStream::Finish() {
  // Taken out of the object: Add and Queue refuse once finished_; leaving this function ends
  // the calls (and so releases the gradients).
  std::vector<std::unique_ptr<StepCall>> calls;
  std::unique_ptr<ParamAssembler> assembler;
  std::function<void(uint64_t)> on_applied;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return AlreadyFinished();
    finished_ = true;
    on_applied = std::move(on_applied_);
    // Every rank gets this trainer's commit (with its share of the chunks, possibly none).
    for (size_t r = 0; r < calls_.size(); ++r) calls_[r]->Commit(num_elements_[r]);
    calls = std::move(calls_);
    assembler = std::move(assembler_);
  }
  // Every rank answers before any is read to the end: a rank that refused the step (one still
  // healing while the others took it) is seen at once, not after a rank whose step waits in the
  // collectives for it.
  for (const auto& call : calls) {
    while (!call->AwaitAnswer(absl::Milliseconds(10))) {
      for (const auto& other : calls) {
        absl::Status failed = other->EndedWith();
        if (failed.ok()) continue;
        for (const auto& c : calls) c->Cancel();
        return failed;
      }
    }
  }
  // Every stream is half-closed by now. They are read together, each response taken as it
  // arrives: read one after the other, a rank's parameters (every rank returns those it owns)
  // would pile up in this process while another rank's are read to their end (or, before
  // Layout.returns_owned, one rank returns them all: SessionLayout::ReturnsFrom).
  std::vector<v1::StepResult> results(calls.size());
  std::vector<bool> ended(calls.size(), false);
  for (size_t open = calls.size(); open > 0;) {
    const uint64_t seen = arrivals_->count();
    for (uint32_t r = 0; r < calls.size(); ++r) {
      if (ended[r]) continue;
      const bool returns = !options_.skip_return && layout_->ReturnsFrom(r, options_.trainer_id);
      absl::StatusOr<bool> end =
          calls[r]->ReceiveAvailable(&results[r], returns ? assembler.get() : nullptr);
      if (!end.ok()) {
        for (const auto& call : calls) call->Cancel();
        return end.status();
      }
      if (*end) {
        ended[r] = true;
        --open;
      }
    }
    if (open > 0) arrivals_->AwaitAfter(seen);
  }
  for (uint32_t r = 1; r < calls.size(); ++r) {
    if (results[r].step() != results[0].step()) {
      return absl::InternalError(absl::StrCat("rank ", r, " answered step ", results[r].step(),
                                              ", rank 0 step ", results[0].step()));
    }
  }
  if (on_applied) on_applied(results[0].step());
  StepReply reply;
  reply.step = results[0].step();
  reply.skipped = results[0].skipped();
  reply.grad_norm = results[0].grad_norm();
  reply.clipped = results[0].clipped();
  // A skipped step may come back without parameters: nothing changed.
  const bool nothing_changed = reply.skipped && assembler->chunks_added() == 0;
  if (!options_.skip_return && !nothing_changed) {
    OPTSTEP_ASSIGN_OR_RETURN(reply.params, assembler->Finish());
    reply.destinations_filled = assembler->destinations_filled();
  }
  return reply;
}

}  // namespace optstep
