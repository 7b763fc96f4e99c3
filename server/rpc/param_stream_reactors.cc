#include "server/rpc/param_stream_reactors.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "server/engine/memory_budget.h"
#include "server/rpc/convert.h"
#include "server/rpc/idle_bound.h"
#include "server/rpc/open_streams.h"
#include "server/rpc/owned_write_reactor.h"
#include "server/rpc/param_chunker.h"
#include "server/rpc/stream_charges.h"
#include "wire/chunk.h"
#include "wire/grpc_status.h"
#include "wire/stream_end.h"

namespace optstep {
namespace {

// The PullParameters streams open on this rank: each holds the snapshot of the step it answers
// until its caller has taken all of it, and a session steps on meanwhile (each step makes a new
// snapshot), so a session has a few open per trainer at most.
constexpr int kOpenPullsPerTrainer = 4;
OpenStreams& OpenPulls() {
  static OpenStreams* const streams = new OpenStreams();
  return *streams;
}

// The pulls whose messages in hand the rank holds in its headroom: each owner has this many at
// once, whatever its number of sessions and trainers, while they fit there (every trainer of a
// session pulls after each step, and reads at once); its other pulls take those bytes from the
// budget, within its share, until they end (PullHeldBytes).
constexpr int kPullsInHeadroomPerOwner = 64;
HeadroomPlaces& PullsInHeadroom() {
  static HeadroomPlaces* const streams = new HeadroomPlaces(kPullsInHeadroomPerOwner);
  return *streams;
}

// What an open pull of `session` makes the rank hold besides the snapshot (which the session
// holds and counts): the message in hand, a copy of up to kMaxChunkBytes of values, and the same
// again serialized in the transport while its caller does not read.
int64_t PullHeldBytes(const Session& session) {
  return 2 * std::min<int64_t>(kMaxChunkBytes, session.stats().param_bytes);
}

class PullReactor final : public OwnedWriteReactor<v1::PullParametersResponse, PullReactor> {
 public:
  void Start(std::shared_ptr<PullReactor> self, grpc::CallbackServerContext* context,
             absl::Duration idle_timeout, Engine* engine,
             const v1::PullParametersRequest& request) {
    Own(std::move(self), context, idle_timeout, "PullParameters");
    const Caller caller = CallerOf(*context);
    absl::Status status = Validate(engine, caller, request);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      return FinishLocked(ToGrpcStatus(status));
    }
    std::weak_ptr<PullReactor> weak = weak_from_this();
    session_->GetSnapshot(dtype_, [weak](absl::StatusOr<std::shared_ptr<const ParamSnapshot>> s) {
      if (auto self = weak.lock()) self->OnSnapshot(std::move(s));
    });
  }

 private:
  absl::Status Validate(Engine* engine, const Caller& caller,
                        const v1::PullParametersRequest& request) {
    auto session = FindSession(*engine, caller, request.session_id());
    if (!session.ok()) return session.status();
    session_ = *std::move(session);
    // The request first: a bad one is named as such, also while the pulls' bounds are reached.
    if (request.dtype() == v1::DTYPE_BF16) {
      dtype_ = DType::kBF16;
    } else if (request.dtype() != v1::DTYPE_FP32 && request.dtype() != v1::DTYPE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PullParameters: dtype ", static_cast<int>(request.dtype()), " must be fp32 or bf16"));
    }
    OPTSTEP_RETURN_IF_ERROR(CheckParamIds(*session_, request.param_ids(), "PullParameters"));
    const int limit = kOpenPullsPerTrainer * std::max(1, session_->config().num_trainers);
    slot_ = OpenPulls().TryOpen(session_.get(), limit);
    if (!slot_.held()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("PullParameters: ", limit, " pulls of session '", session_->id(), "' (",
                       kOpenPullsPerTrainer,
                       " per trainer) are open on this rank already; read them (or "
                       "cancel them) first"));
    }
    // Before, a session's bound alone: one of 4,096 trainers could hold 16,384 pulls unread.
    absl::StatusOr<std::shared_ptr<const void>> held = HoldCopy(
        *engine, PullsInHeadroom(), session_->config().owner, PullHeldBytes(*session_),
        "PullParameters",
        absl::StrCat("session '", session_->id(),
                     "': a message of its parameters in hand and in the transport, held until "
                     "the stream is read; ",
                     kPullsInHeadroomPerOwner,
                     " pulls of an owner are held in the rank's headroom while it has room"));
    if (!held.ok()) return held.status();
    held_ = *std::move(held);
    // OWNERS storage: the parameters this rank owns; none of them: the step alone.
    std::optional<std::vector<uint32_t>> served = ServedParamIds(*session_, request.param_ids());
    none_ = !served.has_value();
    if (served.has_value()) ids_ = *std::move(served);
    return absl::OkStatus();
  }

  void OnSnapshot(absl::StatusOr<std::shared_ptr<const ParamSnapshot>> snapshot) {
    absl::MutexLock lock(&mu_);
    if (!snapshot.ok()) return FinishLocked(ToGrpcStatus(snapshot.status()));
    step_ = (*snapshot)->step;
    chunker_.emplace(*std::move(snapshot), ids_, kMaxChunkBytes);
    WriteNextLocked();
  }

  void WriteNextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    response_.Clear();
    const bool first = first_;
    if (first_) response_.set_step(step_);
    first_ = false;
    const absl::Status held = chunker_->CheckHeld();
    if (!held.ok()) return FinishLocked(ToGrpcStatus(held));
    if (!none_ && chunker_->Next(response_.mutable_parameter())) return WriteLocked(&response_);
    // A rank that owns none of the parameters asked for still answers the step.
    if (none_ && first) return WriteLocked(&response_);
    // Before the caller hears the end: its next pull may follow at once.
    slot_.Release();
    held_.reset();
    FinishLocked(grpc::Status::OK);
  }

  std::shared_ptr<Session> session_;
  OpenStreams::Slot slot_;  // the session's, in OpenPulls; held until the stream ends
  // The owner's place in PullsInHeadroom, or else PullHeldBytes of the budget (HoldCopy); held
  // as the slot.
  std::shared_ptr<const void> held_;
  DType dtype_ = DType::kF32;
  std::vector<uint32_t> ids_;
  bool none_ = false;  // this rank serves none of the parameters asked for

  std::optional<ParamChunker> chunker_ ABSL_GUARDED_BY(mu_);
  v1::PullParametersResponse response_ ABSL_GUARDED_BY(mu_);
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
};

// The InitParameters streams open on this rank: each of a session's trainers may have a few open
// at once (a thread-safe client may set several parameters at once, one stream each), so a rank
// stages at most that many copies of the values.
constexpr int kOpenInitStreamsPerTrainer = 4;
OpenStreams& OpenInitStreams() {
  static OpenStreams* const streams = new OpenStreams();
  return *streams;
}

// The InitParameters streams whose staged values the rank holds in its headroom, outside the
// budget: each owner has kOpenInitStreamsPerTrainer of them at once, whatever its number of
// sessions (its other streams stage within its share of the budget, StagingCharge).
HeadroomPlaces& InitStreamsInHeadroom() {
  static HeadroomPlaces* const streams = new HeadroomPlaces(kOpenInitStreamsPerTrainer);
  return *streams;
}

// A chunk that continues a staged piece shorter than this is appended to it: a stream of small
// chunks stages few pieces (each has a few dozen bytes of its own), and a long piece is not
// copied again and again.
constexpr uint64_t kSmallPieceBytes = uint64_t{64} << 10;
// Pieces a stream may stage beyond one per parameter and one per kSmallPieceBytes of values.
constexpr uint64_t kOutOfOrderPieces = 1024;

// The stream is a transaction: each chunk is checked (header, size, the stream's byte bound) and
// kept; only a stream that sent its StreamEnd, agreeing with the chunks before it, and then
// half-closed writes them, all together (Session::InitValues of every piece). A small piece is
// extended by the chunk that continues it; what a stream stages is bounded by the session's
// parameters, in bytes and in pieces, and a session has a few streams per trainer open at most.
// A caller that sends nothing for the stream idle bound has its stream cancelled (CallIdleWatch).
// gRPC calls OnReadDone for one message at a time, so the members need no lock (but
// `cancelled_`); the last read starts the write, whose callback alone touches them after.
class InitReactor final : public grpc::ServerReadReactor<v1::InitParametersRequest> {
 public:
  InitReactor(grpc::CallbackServerContext* context, absl::Duration idle_timeout, Engine* engine,
              v1::InitParametersResponse* response)
      : engine_(engine),
        caller_(CallerOf(*context)),
        response_(response),
        idle_(CallIdleWatch::Start(context, idle_timeout, "InitParameters",
                                   CallIdleWatch::Waits::kReads)) {
    absl::StatusOr<std::shared_ptr<const void>> silent =
        TakeSilentUploadPlace("InitParameters", CallerKey(caller_, context->peer()));
    if (!silent.ok()) {
      End(silent.status());
      return;
    }
    silent_ = *std::move(silent);
    Read();
  }

  void OnReadDone(bool ok) override {
    idle_->Heard();
    silent_.reset();  // it sent its first message (or ended)
    if (!ok) return WriteStaged();
    absl::Status status = Stage();
    if (!status.ok()) return End(status);
    Read();
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    idle_->Stop();
    delete this;
  }

 private:
  void Read() {
    idle_->Waiting();
    StartRead(&request_);
  }

  absl::Status Stage() {
    if (session_ == nullptr) {
      auto session = FindSession(*engine_, caller_, request_.session_id());
      if (!session.ok()) return session.status();
      session_ = *std::move(session);
      // Every element once in fp32 is the most a stream needs.
      byte_limit_ = static_cast<uint64_t>(session_->stats().param_bytes);
      piece_limit_ =
          session_->config().params.size() + byte_limit_ / kSmallPieceBytes + kOutOfOrderPieces;
      const int limit = kOpenInitStreamsPerTrainer * std::max(1, session_->config().num_trainers);
      slot_ = OpenInitStreams().TryOpen(session_.get(), limit);
      if (!slot_.held()) {
        return absl::ResourceExhaustedError(
            absl::StrCat(What(), ": ", limit, " InitParameters streams of the session (",
                         kOpenInitStreamsPerTrainer,
                         " per trainer) are open on this rank already; nothing "
                         "was written"));
      }
      // An owner's first streams stage in the rank's headroom, while the most they may stage
      // fits there; its others take what they stage from the budget (StagingCharge). Counted
      // per owner: per session, an owner of many sessions staged a copy of each one's
      // parameters there.
      staging_ = StagingCharge(*engine_, InitStreamsInHeadroom(), session_->config().owner,
                               byte_limit_, What(),
                               absl::StrCat("session '", session_->id(),
                                            "': values staged until the stream's final message; "
                                            "nothing was written"));
    } else if (!request_.session_id().empty() && request_.session_id() != session_->id()) {
      return absl::InvalidArgumentError(
          absl::StrCat("InitParameters: session_id '", CallerText(request_.session_id()),
                       "' differs from the stream's session '", session_->id(), "'"));
    }
    if (ended_) {
      return absl::InvalidArgumentError(absl::StrCat(
          What(), ": a message after the stream's final message (StreamEnd); nothing was written"));
    }
    if (request_.has_end()) {
      if (request_.has_values()) {
        return absl::InvalidArgumentError(
            absl::StrCat(What(), ": the final message (StreamEnd) carries values too"));
      }
      ended_ = true;
      return tally_.Check(request_.end(), param_ids_.size(), What());
    }
    if (!request_.has_values()) return absl::OkStatus();
    v1::TensorChunk& chunk = *request_.mutable_values();
    OPTSTEP_ASSIGN_OR_RETURN(
        const ChunkHeader header,
        CheckChunkHeader(chunk.param_id(), chunk.offset(), chunk.dtype(), chunk.data().size(),
                         absl::StrCat("InitParameters: values of param_id ", chunk.param_id())));
    if (chunk.data().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(What(), ": values of param_id ", chunk.param_id(), " at offset ",
                       chunk.offset(), " carry no data; nothing was written"));
    }
    if (chunk.data().size() > byte_limit_ - tally_.bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          What(), ": ", tally_.bytes() + chunk.data().size(), " bytes of values, more than the ",
          byte_limit_, " bytes of the session's parameters; nothing was written"));
    }
    // Checked now, on its own (a piece it extends was checked), so that a bad message ends the
    // stream at once; written only at its end.
    OPTSTEP_RETURN_IF_ERROR(
        session_->CheckInitPiece({header.param_id, header.offset, header.dtype, chunk.data()})
            .status());
    OPTSTEP_RETURN_IF_ERROR(staging_.Grow(chunk.data().size()));
    tally_.Add(chunk.data());
    param_ids_.insert(chunk.param_id());
    if (ExtendsSmallPiece(header)) {
      staged_.back().second.append(chunk.data());
    } else {
      if (staged_.size() >= piece_limit_) {
        return absl::ResourceExhaustedError(
            absl::StrCat(What(), ": more than ", piece_limit_, " pieces of values for ",
                         session_->config().params.size(), " parameters of ", byte_limit_,
                         " bytes; send each parameter's values in order; nothing was written"));
      }
      staged_.push_back({header, std::move(*chunk.mutable_data())});
    }
    return absl::OkStatus();
  }

  // Whether a chunk at `header` takes up the values where the last staged piece ends, and that
  // piece is small.
  bool ExtendsSmallPiece(const ChunkHeader& header) const {
    if (staged_.empty()) return false;
    const auto& [last, data] = staged_.back();
    return data.size() < kSmallPieceBytes && last.param_id == header.param_id &&
           last.dtype == header.dtype &&
           last.offset + static_cast<int64_t>(data.size() / DTypeSize(last.dtype)) == header.offset;
  }

  // The staged values, the session's slot and the owner's place in the headroom are given back
  // before the caller hears the end: its next stream may follow at once.
  void End(const absl::Status& status) {
    std::vector<std::pair<ChunkHeader, std::string>>().swap(staged_);
    staging_.Release();
    slot_.Release();
    Finish(ToGrpcStatus(status));
  }

  // Ends the stream: at once when what it staged cannot be written, else once the session wrote
  // it (on its coordinator; the staged values live until then).
  void WriteStaged() {
    if (absl::Status complete = CheckComplete(); !complete.ok()) return End(complete);
    std::vector<Session::InitPiece> pieces;
    pieces.reserve(staged_.size());
    uint64_t elements = 0;
    for (const auto& staged : staged_) {
      pieces.push_back(Piece(staged));
      elements += staged.second.size() / DTypeSize(staged.first.dtype);
    }
    session_->InitValues(
        std::move(pieces),
        [this, elements](absl::Status status) {
          if (status.ok()) response_->set_elements(elements);
          End(status);
        },
        [this] { return cancelled_.load(); });
  }

  // OK when the stream ended well, with its final message, after which its values are written.
  absl::Status CheckComplete() const {
    if (const std::optional<absl::Duration> idled = idle_->idled()) {
      return absl::DeadlineExceededError(
          absl::StrCat(session_ == nullptr ? std::string("InitParameters stream") : What(),
                       ": nothing from the caller for ", absl::FormatDuration(*idled),
                       ", over the stream idle timeout of ", absl::FormatDuration(idle_->timeout()),
                       ", after ", tally_.Describe(param_ids_.size()), "; nothing was written"));
    }
    if (session_ == nullptr) {
      return absl::InvalidArgumentError("InitParameters: empty stream names no session");
    }
    if (cancelled_) {
      return absl::CancelledError(absl::StrCat(What(), " was cancelled after ",
                                               tally_.Describe(param_ids_.size()),
                                               "; nothing was written"));
    }
    if (!ended_) {
      return absl::InvalidArgumentError(
          absl::StrCat(What(), " ended after ", tally_.Describe(param_ids_.size()),
                       " without its final message (StreamEnd); nothing was written"));
    }
    return absl::OkStatus();
  }

  std::string What() const {
    return absl::StrCat("InitParameters stream of session '", session_->id(), "'");
  }

  static Session::InitPiece Piece(const std::pair<ChunkHeader, std::string>& staged) {
    return {staged.first.param_id, staged.first.offset, staged.first.dtype, staged.second};
  }

  Engine* const engine_;
  const Caller caller_;
  v1::InitParametersResponse* const response_;
  v1::InitParametersRequest request_;
  std::shared_ptr<Session> session_;
  uint64_t byte_limit_ = 0;
  uint64_t piece_limit_ = 0;
  OpenStreams::Slot slot_;  // the session's, in OpenInitStreams
  std::vector<std::pair<ChunkHeader, std::string>> staged_;
  StagingCharge staging_;               // what the staged values hold, until the end
  std::shared_ptr<const void> silent_;  // its caller's place in SilentUploads until a message
  std::set<uint32_t> param_ids_;
  StreamTally tally_;
  bool ended_ = false;
  std::atomic<bool> cancelled_{false};
  const std::shared_ptr<CallIdleWatch> idle_;
};

}  // namespace

grpc::ServerWriteReactor<v1::PullParametersResponse>* StartPullReactor(
    grpc::CallbackServerContext* context, absl::Duration idle_timeout, Engine* engine,
    const v1::PullParametersRequest* request) {
  auto reactor = std::make_shared<PullReactor>();
  PullReactor* raw = reactor.get();
  raw->Start(std::move(reactor), context, idle_timeout, engine, *request);
  return raw;
}

grpc::ServerReadReactor<v1::InitParametersRequest>* StartInitReactor(
    grpc::CallbackServerContext* context, absl::Duration idle_timeout, Engine* engine,
    v1::InitParametersResponse* response) {
  return new InitReactor(context, idle_timeout, engine, response);
}

}  // namespace optstep
