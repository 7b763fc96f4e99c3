// The receiving half of Session: a trainer's Begin, its gradient chunks and its Commit
// (docs/design.md §3). The step itself runs on the coordinator (session.cc).

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "base/status_macros.h"
#include "server/engine/session.h"

namespace optstep {
namespace {

// Writes `pieces` (raw elements of `dtype`, split anywhere) to dst[offset, ...), or adds them: the
// whole elements of each piece straight from it, an element split across pieces through `partial`.
absl::Status CopyPiecesFromHost(Device& device, absl::Span<const absl::string_view> pieces,
                                DType dtype, bool add, Tensor& dst, int64_t offset) {
  auto transfer = [&](const void* src, int64_t count) {
    return add ? device.AddFromHost(src, dtype, count, dst, offset)
               : device.CopyFromHost(src, dtype, count, dst, offset);
  };
  const size_t size = DTypeSize(dtype);
  char partial[sizeof(double)];
  size_t have = 0;
  for (absl::string_view piece : pieces) {
    if (have > 0) {
      const size_t take = std::min(size - have, piece.size());
      std::memcpy(partial + have, piece.data(), take);
      have += take;
      piece.remove_prefix(take);
      if (have < size) continue;
      OPTSTEP_RETURN_IF_ERROR(transfer(partial, 1));
      ++offset;
      have = 0;
    }
    const int64_t whole = static_cast<int64_t>(piece.size() / size);
    if (whole > 0) {
      OPTSTEP_RETURN_IF_ERROR(transfer(piece.data(), whole));
      offset += whole;
    }
    piece.remove_prefix(whole * size);
    std::memcpy(partial, piece.data(), piece.size());
    have = piece.size();
  }
  return absl::OkStatus();
}

// The bytes [begin, end) of the concatenation of `pieces`, as views of them.
std::vector<absl::string_view> SliceBytes(absl::Span<const absl::string_view> pieces, size_t begin,
                                          size_t end) {
  std::vector<absl::string_view> slice;
  size_t at = 0;  // where the current piece starts
  for (absl::string_view piece : pieces) {
    const size_t from = std::max(begin, at), to = std::min(end, at + piece.size());
    if (from < to) slice.push_back(piece.substr(from - at, to - from));
    at += piece.size();
    if (at >= end) break;
  }
  return slice;
}

}  // namespace

absl::StatusOr<Contribution> Session::Begin(const StepBegin& begin) {
  if (begin.trainer < 0 || begin.trainer >= config_.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat("trainer_id ", begin.trainer,
                                                   " out of range: session '", id_, "' declares ",
                                                   config_.num_trainers, " trainers"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(auto schedule, ResolveSchedule(begin));
  std::vector<WaitingChunk> superseded;
  Contribution c;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckUsable());
    c.trainer = begin.trainer;
    c.step = begin.step;
    c.return_dtype = begin.return_dtype;
    c.return_params = begin.return_params;
    c.stream_params = begin.stream_params;
    c.generation = generation_;
    if (begin.step == step_ && step_ > 0 && last_outcome_) {
      c.replay = true;
      return c;
    }
    if (begin.step != step_ + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session '", id_, "': step ", begin.step, " out of sequence; expected step ", step_ + 1));
    }
    if (running_ || contributions_.committed(begin.trainer)) {
      c.retry = true;
      return c;
    }
    if (schedule_ && *schedule_ != schedule) {
      for (size_t g = 0; g < schedule.size(); ++g) {
        if ((*schedule_)[g] != schedule[g]) {
          return absl::InvalidArgumentError(
              absl::StrCat("step ", begin.step, ": trainer ", begin.trainer, " gives group ", g,
                           " lr ", schedule[g].first, ", weight_decay ", schedule[g].second,
                           " but another trainer gave lr ", (*schedule_)[g].first,
                           ", weight_decay ", (*schedule_)[g].second));
        }
      }
    }
    schedule_ = std::move(schedule);
    if (!step_began_) step_began_ = absl::Now();
    contributions_.DropTrainer(begin.trainer);
    superseded = order_.TakeWaiting(begin.trainer);
    c.attempt = ++attempts_[begin.trainer];
  }
  for (WaitingChunk& chunk : superseded) {
    chunk.added(absl::AbortedError(absl::StrCat("step ", begin.step, ": trainer ", begin.trainer,
                                                " began the step again on another stream")));
  }
  return c;
}

absl::Status Session::CheckUsable() const {
  if (closed_) return absl::UnavailableError(absl::StrCat("session '", id_, "' is closed"));
  if (broken_) {
    return absl::UnavailableError(absl::StrCat("session '", id_, "': rank ", rank_,
                                               " lost a peer; the group must be restarted"));
  }
  return absl::OkStatus();
}

absl::Status Session::CheckFresh(const Contribution& c) const {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  if (c.generation != generation_ || (!c.retry && !c.replay && c.attempt != attempts_[c.trainer])) {
    return absl::AbortedError(absl::StrCat("session '", id_, "': step ", c.step, " of trainer ",
                                           c.trainer, " was aborted or superseded; redo the step"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Session::ElementCount(int param_id, DType dtype, size_t bytes) const {
  if (param_id < 0 || param_id >= static_cast<int>(params_.size())) {
    return absl::NotFoundError(absl::StrCat("param_id ", param_id, " not found: session '", id_,
                                            "' has ", params_.size(), " parameters"));
  }
  const size_t size = DTypeSize(dtype);
  if (bytes % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("param '", names_[param_id], "': ", bytes,
                                                   " bytes is not a multiple of the ",
                                                   DTypeName(dtype), " element size ", size));
  }
  return static_cast<int64_t>(bytes / size);
}

absl::Status Session::AddGradient(const Contribution& c, int param_id, int64_t offset, DType dtype,
                                  const void* data, size_t bytes) {
  const absl::string_view piece(static_cast<const char*>(data), bytes);
  return AddGradient(c, param_id, offset, dtype, absl::MakeConstSpan(&piece, 1));
}

absl::Status Session::AddGradient(const Contribution& c, int param_id, int64_t offset, DType dtype,
                                  absl::Span<const absl::string_view> pieces) {
  // A chunk of a later trainer may have to wait for its turn: it waits as a copy.
  std::shared_ptr<std::string> copy;
  std::vector<absl::string_view> views(pieces.begin(), pieces.end());
  if (ordered_ && c.trainer > 0) {
    copy = std::make_shared<std::string>();
    for (absl::string_view piece : pieces) copy->append(piece.data(), piece.size());
    views.assign(1, *copy);
  }
  auto added = [id = id_, trainer = c.trainer, param_id](absl::Status status) {
    LOG_IF(WARNING, !status.ok()) << "session " << id << ": a waiting chunk of param " << param_id
                                  << " from trainer " << trainer << " was not added: " << status;
  };
  return AddGradient(c, param_id, offset, dtype, views, std::move(copy), std::move(added)).status();
}

absl::StatusOr<Session::ChunkFate> Session::AddGradient(const Contribution& c, int param_id,
                                                        int64_t offset, DType dtype,
                                                        absl::Span<const absl::string_view> pieces,
                                                        std::shared_ptr<const void> keep,
                                                        std::function<void(absl::Status)> added) {
  size_t bytes = 0;
  for (absl::string_view piece : pieces) bytes += piece.size();
  OPTSTEP_ASSIGN_OR_RETURN(const int64_t count, ElementCount(param_id, dtype, bytes));
  if (layout_.owner[param_id] != rank_) {
    return absl::InvalidArgumentError(absl::StrCat("param '", names_[param_id],
                                                   "' is owned by rank ", layout_.owner[param_id],
                                                   ", not rank ", rank_));
  }
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckFresh(c));
    if (c.retry || c.replay) return ChunkFate::kAdded;  // already counted once
    OPTSTEP_RETURN_IF_ERROR(contributions_.CheckBounds(param_id, offset, count));
    if (ordered_ && c.trainer > order_.turn(param_id)) {
      order_.Wait(WaitingChunk{c, param_id, offset, dtype,
                               std::vector<absl::string_view>(pieces.begin(), pieces.end()),
                               std::move(keep), std::move(added)});
      return ChunkFate::kWaiting;
    }
  }
  // The turn only moves forward, so it is still this trainer's (or past it: a resend).
  OPTSTEP_RETURN_IF_ERROR(WriteChunk(c, param_id, offset, dtype, pieces));
  return ChunkFate::kAdded;
}

absl::Status Session::WriteChunk(const Contribution& c, int param_id, int64_t offset, DType dtype,
                                 absl::Span<const absl::string_view> pieces) {
  size_t bytes = 0;
  for (absl::string_view piece : pieces) bytes += piece.size();
  const size_t size = DTypeSize(dtype);
  std::vector<ElementRange> fresh;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckFresh(c));
    OPTSTEP_RETURN_IF_ERROR(contributions_.AddRange(c.trainer, param_id, offset,
                                                    static_cast<int64_t>(bytes / size), &fresh));
    generation = generation_;
    ++inflight_copies_;
  }
  // Trainer 0 (and SHARDED) writes the buffer; later trainers add to it, in turn.
  const bool add = ordered_ && c.trainer > 0;
  absl::Status status;
  int64_t written = 0;
  for (const ElementRange& range : fresh) {
    status = CopyPiecesFromHost(
        *device_, SliceBytes(pieces, (range.begin - offset) * size, (range.end - offset) * size),
        dtype, add, grads_[param_id], range.begin);
    if (!status.ok()) break;
    written += range.end - range.begin;
  }
  std::vector<WaitingChunk> released;
  {
    absl::MutexLock lock(&mu_);
    --inflight_copies_;
    if (!status.ok()) {
      // Recorded but not (all) written: the step cannot be trusted on this rank any more.
      broken_ = true;
      status =
          absl::InternalError(absl::StrCat("session '", id_, "': param '", names_[param_id],
                                           "': writing the gradient failed: ", status.message()));
    } else if (ordered_ && generation == generation_ && c.trainer == order_.turn(param_id)) {
      released = order_.Added(param_id, written);
    }
  }
  if (status.ok()) observer_->OnBytesIn(static_cast<int64_t>(written * size));
  AddReleased(std::move(released));
  return status;
}

void Session::AddReleased(std::vector<WaitingChunk> chunks) {
  for (WaitingChunk& chunk : chunks) {
    chunk.added(
        WriteChunk(chunk.contribution, chunk.param, chunk.offset, chunk.dtype, chunk.pieces));
  }
}

absl::Status Session::Commit(const Contribution& c, uint64_t num_elements, StepCallback done) {
  std::optional<StepOutcome> replay;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckFresh(c));
    if (c.replay) {
      replay = last_outcome_;
    } else {
      if (!c.retry) {
        const int64_t received = contributions_.elements_from(c.trainer);
        if (num_elements != 0 && static_cast<int64_t>(num_elements) != received) {
          contributions_.DropTrainer(c.trainer);
          return absl::InvalidArgumentError(absl::StrCat("step ", c.step, ": trainer ", c.trainer,
                                                         " commits ", num_elements,
                                                         " elements but sent ", received));
        }
        absl::Status complete = contributions_.CheckTrainerComplete(c.trainer);
        if (complete.ok()) {
          contributions_.Commit(c.trainer);
          if (contributions_.all_committed()) complete = contributions_.CheckAllComplete();
        }
        if (!complete.ok()) {
          contributions_.DropTrainer(c.trainer);
          return complete;
        }
      }
      waiters_.push_back(Waiter{c.return_dtype, c.return_params, std::move(done), c.stream_params});
      if (contributions_.all_committed() && !running_) StartResolutionLocked(/*abort=*/false);
      return absl::OkStatus();
    }
  }
  // Replay of the last applied step: its result with the current parameters.
  if (!c.return_params) {
    replay->params = nullptr;
    done(*replay);
    return absl::OkStatus();
  }
  GetSnapshot(c.return_dtype, [outcome = *replay, done = std::move(done)](
                                  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> s) mutable {
    if (!s.ok()) return done(s.status());
    outcome.params = *std::move(s);
    done(std::move(outcome));
  });
  return absl::OkStatus();
}

}  // namespace optstep
