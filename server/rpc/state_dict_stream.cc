#include "server/rpc/state_dict_stream.h"

#include <algorithm>
#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/caller_text.h"
#include "base/run_detached.h"
#include "base/status_macros.h"
#include "kernels/tensor.h"
#include "optstep/v1/internal.pb.h"
#include "server/engine/chained_state_dict.h"
#include "server/engine/cost_model.h"
#include "server/rpc/caller_calls.h"
#include "server/rpc/owned_write_reactor.h"
#include "server/rpc/stream_charges.h"
#include "wire/chunk.h"
#include "wire/grpc_status.h"
#include "wire/stream_end.h"

namespace optstep {
namespace {

v1::DType WireType(StateTensor::Type type) {
  return type == StateTensor::Type::kI64 ? v1::DTYPE_INT64 : v1::DTYPE_FP32;
}

size_t ElementBytes(StateTensor::Type type) { return type == StateTensor::Type::kI64 ? 8 : 4; }

// Streams each tensor of a delivered state in FillStateChunk's pieces.
class StateStreamReactor final : public OwnedWriteReactor<v1::StateDictChunk, StateStreamReactor> {
 public:
  void Start(std::shared_ptr<StateStreamReactor> self, grpc::CallbackServerContext* context,
             absl::Duration idle_timeout, const char* what) {
    Own(std::move(self), context, idle_timeout, what);
  }

  void Deliver(absl::StatusOr<StreamedState> state) {
    absl::MutexLock lock(&mu_);
    if (!state.ok()) return FinishLocked(ToGrpcStatus(state.status()));
    state_ = *std::move(state);
    next_ = 0;
    WriteNextLocked();
  }

 private:
  void WriteNextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (next_ == state_.tensors.size()) return FinishLocked(grpc::Status::OK);
    offset_ = FillStateChunk(state_.tensors[next_], offset_, &chunk_);
    if (offset_ >= state_.tensors[next_].tensor->bytes.size()) {
      ++next_;
      offset_ = 0;
    }
    WriteLocked(&chunk_);
  }

  StreamedState state_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  size_t offset_ ABSL_GUARDED_BY(mu_) = 0;
  v1::StateDictChunk chunk_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

size_t FillStateChunk(const StreamedTensor& item, size_t offset, v1::StateDictChunk* chunk) {
  const StateTensor& tensor = *item.tensor;
  const size_t element = ElementBytes(tensor.type);
  const size_t n = std::min(kMaxChunkBytes / element * element, tensor.bytes.size() - offset);
  chunk->Clear();
  chunk->set_key(item.key);
  chunk->set_chunk_key(item.chunk_key);
  chunk->set_sub_optimizer(item.sub_optimizer);
  for (int64_t d : tensor.shape) chunk->add_shape(d);
  chunk->set_offset(offset / element);
  chunk->set_dtype(WireType(tensor.type));
  chunk->set_data(tensor.bytes.data() + offset, n);
  return offset + n;
}

bool ForEachStateChunk(const StreamedTensor& item, v1::StateDictChunk* chunk,
                       const std::function<bool()>& send) {
  size_t offset = 0;
  do {
    offset = FillStateChunk(item, offset, chunk);
    if (!send()) return false;
  } while (offset < item.tensor->bytes.size());
  return true;
}

grpc::ServerWriteReactor<v1::StateDictChunk>* NewStateStreamReactor(
    grpc::CallbackServerContext* context, absl::Duration idle_timeout, const char* what,
    std::function<void(std::function<void(absl::StatusOr<StreamedState>)> deliver,
                       std::function<bool()> ended)>
        produce) {
  auto reactor = std::make_shared<StateStreamReactor>();
  StateStreamReactor* raw = reactor.get();
  raw->Start(reactor, context, idle_timeout, what);
  std::weak_ptr<StateStreamReactor> weak = reactor;
  produce(
      [weak](absl::StatusOr<StreamedState> state) {
        if (auto self = weak.lock()) self->Deliver(std::move(state));
      },
      [weak] {
        std::shared_ptr<StateStreamReactor> self = weak.lock();
        return self == nullptr || self->finished();
      });
  return raw;
}

absl::Status StateDictAssembler::AddAll(
    grpc::ClientReaderInterface<v1::StateDictChunk>& reader,
    const std::function<absl::Status(const grpc::Status&)>& finished, StallWatch* watch) {
  v1::StateDictChunk chunk;
  absl::Status added = absl::OkStatus();
  while (reader.Read(&chunk)) {
    if (watch != nullptr) watch->Progressed();
    if (added.ok()) added = Add(chunk);
  }
  const grpc::Status end = reader.Finish();
  if (!end.ok()) return finished(end);
  return added;
}

absl::Status StateDictAssembler::Add(const v1::StateDictChunk& chunk) {
  const std::string what = absl::StrCat("state dict key '", chunk.key(), "'");
  OPTSTEP_RETURN_IF_ERROR(CheckChunkExtent(chunk.offset(), chunk.data().size(), what));
  StateTensor::Type type;
  if (chunk.dtype() == v1::DTYPE_FP32) {
    type = StateTensor::Type::kF32;
  } else if (chunk.dtype() == v1::DTYPE_INT64) {
    type = StateTensor::Type::kI64;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", static_cast<int>(chunk.dtype()), " is not fp32 or int64"));
  }
  for (const std::string* name : {&chunk.key(), &chunk.chunk_key(), &chunk.sub_optimizer()}) {
    if (name->size() > kMaxStateKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat("state dict key '", CallerText(*name, 64),
                                                     "': ", name->size(), " bytes, over the ",
                                                     kMaxStateKeyBytes, " a key or name may have"));
    }
  }
  if (chunk.shape_size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", chunk.shape_size(), " dimensions (at most ", kMaxDims, ")"));
  }
  Shape shape(chunk.shape().begin(), chunk.shape().end());
  const size_t element = ElementBytes(type);
  // The elements, counted against the limit as they are multiplied: a product of large
  // dimensions must not wrap around, nor be allocated before it is refused.
  const uint64_t most = byte_limit_ / element;
  uint64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 1 || d > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": dimension ", d, " out of range"));
    }
    if (static_cast<uint64_t>(d) > most / elements) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": shape ", ShapeString(shape), " is over the ", byte_limit_,
                       " bytes a state dict of this session can hold"));
    }
    elements *= static_cast<uint64_t>(d);
  }
  const size_t total = static_cast<size_t>(elements) * element;
  if (chunk.data().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a chunk without data"));
  }
  StateDict& dict = parts_[{chunk.sub_optimizer(), chunk.chunk_key()}];
  auto [it, fresh] = dict.try_emplace(chunk.key());
  StateTensor& tensor = it->second;
  if (fresh) {
    if (total > byte_limit_ - declared_bytes_) {
      dict.erase(it);
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": its ", total, " bytes would bring the dict to ", declared_bytes_ + total,
          " bytes, over the ", byte_limit_, " bytes a state dict of this session can hold"));
    }
    if (reserve_) {
      absl::Status reserved = reserve_(total);
      if (!reserved.ok()) {
        dict.erase(it);
        return reserved;
      }
    }
    declared_bytes_ += total;
    tensor.type = type;
    tensor.shape = shape;
    tensor.bytes.assign(total, '\0');
  } else if (tensor.type != type || tensor.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": chunks disagree on dtype or shape"));
  }
  // The offset is compared in elements first: in bytes, a large one would wrap.
  const size_t begin = chunk.offset() <= total / element ? chunk.offset() * element : total + 1;
  if (chunk.data().size() % element != 0 || begin > total || chunk.data().size() > total - begin) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": chunk at element ", chunk.offset(),
                                                   " of ", chunk.data().size(), " bytes exceeds ",
                                                   total, " bytes"));
  }
  if (chunk.data().size() > declared_bytes_ - bytes_) {
    // More data than the tensors declared: some elements came twice. Refused at once, so that a
    // stream cannot grow what it holds by sending the same piece again and again.
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": chunk at element ", chunk.offset(), " brings the data to ",
                     bytes_ + chunk.data().size(), " bytes, over the ", declared_bytes_,
                     " bytes the tensors declare: elements arrived twice"));
  }
  // Each range of elements is kept until the end; a chunk that continues the tensor's last one
  // extends it. Chunks out of order must not hold many times their bytes in ranges.
  std::vector<std::pair<uint64_t, uint64_t>>& ranges =
      received_[{chunk.sub_optimizer(), chunk.chunk_key(), chunk.key()}];
  const uint64_t end = chunk.offset() + chunk.data().size() / element;
  if (!ranges.empty() && ranges.back().second == chunk.offset()) {
    ranges.back().second = end;
  } else {
    const uint64_t range_limit = tensors() + declared_bytes_ / kSmallChunkBytes + kSpareChunks;
    if (ranges_ >= range_limit) {
      return absl::ResourceExhaustedError(absl::StrCat(what, ": more than ", range_limit,
                                                       " ranges of elements for ", tensors(),
                                                       " tensors of ", declared_bytes_,
                                                       " bytes; send each tensor's elements in "
                                                       "order (or in chunks of ",
                                                       kSmallChunkBytes, " bytes or more)"));
    }
    ++ranges_;
    ranges.emplace_back(chunk.offset(), end);
  }
  tensor.bytes.replace(begin, chunk.data().size(), chunk.data());
  bytes_ += chunk.data().size();
  return absl::OkStatus();
}

absl::Status StateDictAssembler::CheckComplete() const {
  for (const auto& [where, ranges_in_arrival_order] : received_) {
    const auto& [sub, chunk_key, key] = where;
    const StateTensor& tensor = parts_.at({sub, chunk_key}).at(key);
    const uint64_t numel = static_cast<uint64_t>(NumElements(tensor.shape));
    std::vector<std::pair<uint64_t, uint64_t>> ranges = ranges_in_arrival_order;
    std::sort(ranges.begin(), ranges.end());
    uint64_t covered = 0;  // [0, covered) arrived exactly once
    const std::string what = absl::StrCat("state dict key '", key, "' (", numel, " elements)");
    for (const auto& [begin, end] : ranges) {
      if (begin > covered) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": elements [", covered, ", ", begin, ") never arrived"));
      }
      if (begin < covered) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": elements [", begin, ", ",
                                                       std::min(covered, end), ") arrived twice"));
      }
      covered = end;
    }
    if (covered < numel) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": elements [", covered, ", ", numel, ") never arrived"));
    }
  }
  return absl::OkStatus();
}

uint64_t StateDictAssembler::tensors() const {
  uint64_t n = 0;
  for (const auto& entry : parts_) n += entry.second.size();
  return n;
}

absl::StatusOr<std::shared_ptr<const StateDict>> StateDictAssembler::BuildPlain() {
  OPTSTEP_RETURN_IF_ERROR(CheckComplete());
  received_.clear();
  if (parts_.empty()) return std::make_shared<const StateDict>();
  if (parts_.size() > 1 || parts_.begin()->first != std::make_pair(std::string(), std::string())) {
    return absl::InvalidArgumentError("a rank's state dict came keyed by model chunk");
  }
  return std::make_shared<const StateDict>(std::move(parts_.begin()->second));
}

absl::StatusOr<std::shared_ptr<const StateDict>> StateDictAssembler::Build(const Session& session) {
  OPTSTEP_RETURN_IF_ERROR(CheckComplete());
  received_.clear();
  if (parts_.empty()) return std::make_shared<const StateDict>();
  if (parts_.size() == 1 && parts_.begin()->first == std::make_pair(std::string(), std::string())) {
    return std::make_shared<const StateDict>(std::move(parts_.begin()->second));
  }
  const SessionConfig& config = session.config();
  const size_t num_subs = config.chain.sub_optimizers.size();
  std::vector<ChunkedStateDict> per_sub(num_subs);
  ChunkedStateDict chunked;
  bool by_sub = false;
  for (auto& [where, dict] : parts_) {
    const auto& [sub, chunk_key] = where;
    if (chunk_key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict key '", dict.begin()->first,
                       "' has no chunk_key while other keys are keyed by model chunk"));
    }
    if (sub.empty()) {
      chunked[chunk_key] = std::move(dict);
      continue;
    }
    by_sub = true;
    size_t j = 0;
    while (j < num_subs && config.chain.sub_optimizers[j].name != sub) ++j;
    if (j == num_subs) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict chunk '", chunk_key, "': no sub-optimizer named '", sub, "'"));
    }
    per_sub[j][chunk_key] = std::move(dict);
  }
  parts_.clear();
  if (by_sub) {
    if (!chunked.empty()) {
      return absl::InvalidArgumentError(
          "a state dict is keyed either by model chunk or by sub-optimizer, not both");
    }
    std::vector<ParamGroup> groups;
    for (const GroupRuntime& g : session.groups()) groups.push_back(g.def);
    OPTSTEP_ASSIGN_OR_RETURN(
        chunked, MergeChunkedStateDicts(
                     per_sub, ChunkListsOf(config.params, groups, static_cast<int>(num_subs))));
  }
  OPTSTEP_ASSIGN_OR_RETURN(StateDict flat, FlattenChunks(chunked));
  return std::make_shared<const StateDict>(std::move(flat));
}

// ---- Uploads ----

namespace {

uint64_t TokenOf(const v1::StateDictChunk&) { return 0; }
uint64_t TokenOf(const v1::HeldStateChunk& message) { return message.token(); }
const v1::StateDictChunk* ChunkOf(const v1::StateDictChunk& message) {
  return message.has_end() ? nullptr : &message;
}
const v1::StateDictChunk* ChunkOf(const v1::HeldStateChunk& message) {
  return message.has_chunk() ? &message.chunk() : nullptr;
}
const v1::StreamEnd* EndOf(const v1::StateDictChunk& message) {
  return message.has_end() ? &message.end() : nullptr;
}
const v1::StreamEnd* EndOf(const v1::HeldStateChunk& message) {
  return message.has_end() ? &message.end() : nullptr;
}
bool CarriesTensor(const v1::StateDictChunk& message) {
  return !message.key().empty() || !message.data().empty() || message.shape_size() > 0;
}
bool CarriesTensor(const v1::HeldStateChunk& message) { return message.has_chunk(); }

// The most bytes a state dict of `session` can declare: per sub-optimizer (a per-sub-optimizer
// dict repeats a shared chunk), what the group's owners hold of every parameter (its master,
// gradient buffer and optimizer state: EstimateOwnedBytes, the sizes admission reserved; the
// dict holds the master and the state), plus 1 MiB of counters.
absl::StatusOr<uint64_t> StateDictByteBound(const Session& session) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<int64_t> owned,
                           EstimateOwnedBytes(session.config().chain, session.config().params));
  uint64_t bytes = 0;
  for (int64_t b : owned) bytes += static_cast<uint64_t>(b);
  const uint64_t subs = std::max<size_t>(1, session.config().chain.sub_optimizers.size());
  return subs * bytes + (uint64_t{1} << 20);
}

// A session's uploads open at once on a rank, at least (NewStateDictUploadReactor).
constexpr int kOpenUploadsPerSession = 2;

// The callers' uploads whose staged tensors the rank holds in its headroom, outside the budget:
// each owner has kOpenUploadsPerSession of them at once, whatever its number of sessions; its
// others stage within its share of the budget (StagingCharge).
HeadroomPlaces& UploadsInHeadroom() {
  static HeadroomPlaces* const uploads = new HeadroomPlaces(kOpenUploadsPerSession);
  return *uploads;
}

// gRPC calls OnReadDone for one message at a time and the action runs only after the last, so
// the members need no lock (but `cancelled_`, which OnCancel sets from any thread).
//
// The stream is a transaction: every piece is checked and staged in the assembler; only a stream
// that sent its StreamEnd, agreeing with what came before it, and then half-closed reaches the
// action. A stream that breaks, is cancelled or half-closes without its StreamEnd ends with an
// error and the action never runs.
template <typename Message>
class StateDictUploadReactor final : public grpc::ServerReadReactor<Message> {
 public:
  StateDictUploadReactor(Engine* engine, Caller caller, const std::string& caller_key,
                         std::string empty_error, std::shared_ptr<CallIdleWatch> idle,
                         OpenStreams* open, StateDictUpload action)
      : engine_(engine),
        caller_(std::move(caller)),
        empty_error_(std::move(empty_error)),
        idle_(std::move(idle)),
        open_(open),
        action_(std::move(action)) {
    if (!caller_key.empty()) {
      absl::StatusOr<std::shared_ptr<const void>> silent =
          TakeSilentUploadPlace("state dict stream", caller_key);
      if (!silent.ok()) {
        End(ToGrpcStatus(silent.status()));
        return;
      }
      silent_ = *std::move(silent);
    }
    Read();
  }

  void OnReadDone(bool ok) override {
    idle_->Heard();
    silent_.reset();  // it sent its first message (or ended)
    if (!ok) return RunAction();
    absl::Status status = Add();
    if (!status.ok()) return End(ToGrpcStatus(status));
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
    this->StartRead(&message_);
  }

  absl::Status Add() {
    if (session_ == nullptr) {
      token_ = TokenOf(message_);
      OPTSTEP_ASSIGN_OR_RETURN(session_, FindSession(*engine_, caller_, message_.session_id()));
      OPTSTEP_ASSIGN_OR_RETURN(const uint64_t limit, StateDictByteBound(*session_));
      assembler_.set_byte_limit(limit);
      if (open_ != nullptr) {
        const int most = std::max(kOpenUploadsPerSession, session_->config().num_trainers);
        slot_ = open_->TryOpen(session_.get(), most);
        if (!slot_.held()) {
          return absl::ResourceExhaustedError(
              absl::StrCat(What(), ": ", most,
                           " state dict uploads of the session are open on this rank "
                           "already; nothing was applied"));
        }
        // What it stages is held as the session owner's (a rank's part of a held import is the
        // part of a caller's upload charged so on rank 0).
        staging_ =
            StagingCharge(*engine_, UploadsInHeadroom(), session_->config().owner, limit, What(),
                          absl::StrCat("session '", session_->id(),
                                       "': state dict tensors staged until the stream's "
                                       "final message; nothing was applied"));
        assembler_.set_reserve([this](uint64_t bytes) { return staging_.Grow(bytes); });
      }
    }
    if (ended_) {
      return absl::InvalidArgumentError(absl::StrCat(
          What(), ": a message after the stream's final message (StreamEnd); nothing was applied"));
    }
    if (const v1::StreamEnd* end = EndOf(message_)) {
      if (CarriesTensor(message_)) {
        return absl::InvalidArgumentError(
            absl::StrCat(What(), ": the final message (StreamEnd) carries a tensor piece too"));
      }
      ended_ = true;
      return tally_.Check(*end, assembler_.tensors(), What());
    }
    const v1::StateDictChunk* chunk = ChunkOf(message_);
    if (chunk == nullptr) return absl::OkStatus();
    tally_.Add(chunk->data());
    return assembler_.Add(*chunk);
  }

  std::string What() const {
    return absl::StrCat("state dict stream of session '", session_->id(), "'");
  }

  // Gives the stream's slot and what it staged back, then finishes the call.
  void End(const grpc::Status& status) {
    staging_.Release();
    slot_.Release();
    this->Finish(status);
  }

  void RunAction() {
    if (const std::optional<absl::Duration> idled = idle_->idled()) {
      return End(ToGrpcStatus(absl::DeadlineExceededError(absl::StrCat(
          session_ == nullptr ? std::string("state dict stream") : What(),
          ": nothing from the caller for ", absl::FormatDuration(*idled),
          ", over the stream idle timeout of ", absl::FormatDuration(idle_->timeout()), ", after ",
          tally_.Describe(assembler_.tensors()), "; nothing was applied"))));
    }
    if (session_ == nullptr) {
      return End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, empty_error_));
    }
    if (cancelled_) {
      return End(grpc::Status(
          grpc::StatusCode::CANCELLED,
          absl::StrCat(What(), " was cancelled after ", tally_.Describe(assembler_.tensors()),
                       "; nothing was applied")));
    }
    if (!ended_) {
      return End(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat(What(), " ended after ", tally_.Describe(assembler_.tensors()),
                       " without its final message (StreamEnd); nothing was applied")));
    }
    auto act = [this] {
      if (cancelled_) {
        return End(grpc::Status(grpc::StatusCode::CANCELLED,
                                absl::StrCat(What(),
                                             " was cancelled while it waited its turn; "
                                             "nothing was applied")));
      }
      absl::StatusOr<std::shared_ptr<const StateDict>> dict = assembler_.Build(*session_);
      absl::Status status = dict.status();
      if (dict.ok()) status = action_(*session_, token_, *std::move(dict), assembler_.bytes());
      End(ToGrpcStatus(status));
    };
    // A rank's part of a held import: the caller's import on rank 0 waits for it.
    if (open_ == nullptr) return RunDetached(std::move(act));
    // A caller's: its turn among its calls (each holds a thread while it runs), as Save's.
    absl::Status queued = ProcessCallerCalls().Run(caller_.identity, "ImportStateDict", act);
    if (!queued.ok()) End(ToGrpcStatus(queued));
  }

  Engine* const engine_;
  const Caller caller_;
  const std::string empty_error_;
  const std::shared_ptr<CallIdleWatch> idle_;
  OpenStreams* const open_;
  const StateDictUpload action_;
  OpenStreams::Slot slot_;              // the session's, in `open_`
  StagingCharge staging_;               // what the assembler stages (a caller's upload)
  std::shared_ptr<const void> silent_;  // its caller's place in SilentUploads until a message
  Message message_;
  std::shared_ptr<Session> session_;
  uint64_t token_ = 0;
  StateDictAssembler assembler_;
  StreamTally tally_;
  bool ended_ = false;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

template <typename Message>
grpc::ServerReadReactor<Message>* NewStateDictUploadReactor(
    Engine* engine, Caller caller, const std::string& caller_key, std::string empty_error,
    std::shared_ptr<CallIdleWatch> idle, OpenStreams* open, StateDictUpload action) {
  return new StateDictUploadReactor<Message>(engine, std::move(caller), caller_key,
                                             std::move(empty_error), std::move(idle), open,
                                             std::move(action));
}

template grpc::ServerReadReactor<v1::StateDictChunk>* NewStateDictUploadReactor<v1::StateDictChunk>(
    Engine*, Caller, const std::string&, std::string, std::shared_ptr<CallIdleWatch>, OpenStreams*,
    StateDictUpload);
template grpc::ServerReadReactor<v1::HeldStateChunk>* NewStateDictUploadReactor<v1::HeldStateChunk>(
    Engine*, Caller, const std::string&, std::string, std::shared_ptr<CallIdleWatch>, OpenStreams*,
    StateDictUpload);

}  // namespace optstep
