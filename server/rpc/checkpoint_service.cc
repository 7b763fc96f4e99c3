#include "server/rpc/checkpoint_service.h"

#include <algorithm>
#include <memory>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "server/engine/chained_state_dict.h"
#include "server/engine/cost_model.h"
#include "server/rpc/caller.h"
#include "server/rpc/caller_calls.h"
#include "server/rpc/convert.h"
#include "server/rpc/held_operations.h"
#include "server/rpc/open_streams.h"
#include "server/rpc/owned_write_reactor.h"
#include "server/rpc/stream_charges.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

// Streams the progress of a Save or Load: the latest report whenever the previous write is done
// (reports in between are coalesced), then the final status.
class ProgressReactor final : public OwnedWriteReactor<v1::CheckpointProgress, ProgressReactor> {
 public:
  void Start(std::shared_ptr<ProgressReactor> self, grpc::CallbackServerContext* context,
             absl::Duration idle_timeout, const char* what) {
    Own(std::move(self), context, idle_timeout, what);
  }

  void Report(const CheckpointProgress& progress, uint64_t step) {
    absl::MutexLock lock(&mu_);
    pending_.set_bytes_done(progress.bytes_done);
    pending_.set_bytes_total(progress.bytes_total);
    pending_.set_files_done(progress.files_done);
    pending_.set_files_total(progress.files_total);
    pending_.set_step(step);
    has_pending_ = true;
    if (!writing_) WriteNextLocked();
  }
  void Done(absl::Status status) {
    absl::MutexLock lock(&mu_);
    done_ = true;
    status_ = ToGrpcStatus(status);
    if (!writing_) WriteNextLocked();
  }

 private:
  void WriteNextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = false;
    if (finished_) return;
    if (has_pending_) {
      written_ = pending_;
      has_pending_ = false;
      writing_ = true;
      return WriteLocked(&written_);
    }
    if (done_) FinishLocked(status_);
  }

  v1::CheckpointProgress pending_ ABSL_GUARDED_BY(mu_);
  v1::CheckpointProgress written_ ABSL_GUARDED_BY(mu_);
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

using CheckpointRun = std::function<absl::StatusOr<uint64_t>(
    HeldOperations& held, Session& session, const std::string& name,
    const CheckpointProgressCallback& progress)>;

// Save and Load (`what`): the group's operation on a thread of its own (it blocks on other ranks
// and on files), its progress streamed to the caller of `context`. The call's request holds
// `request_bytes` (and this its session id and name again) while it waits its turn.
grpc::ServerWriteReactor<v1::CheckpointProgress>* RunCheckpoint(
    grpc::CallbackServerContext* context, absl::Duration idle_timeout, const char* what,
    Engine* engine, HeldOperations* held, const std::string& session_id, const std::string& name,
    int64_t request_bytes, CheckpointRun run) {
  auto reactor = std::make_shared<ProgressReactor>();
  ProgressReactor* raw = reactor.get();
  raw->Start(reactor, context, idle_timeout, what);
  const Caller caller = CallerOf(*context);
  absl::Status queued = ProcessCallerCalls().Run(
      caller.identity, what,
      [engine, held, caller, session_id, name, run = std::move(run), reactor] {
        // Cancelled while it waited its turn (the caller gave up): nothing is done for nobody.
        if (reactor->finished()) return;
        absl::StatusOr<std::shared_ptr<Session>> session = FindSession(*engine, caller, session_id);
        if (!session.ok()) return reactor->Done(session.status());
        const uint64_t step = (*session)->stats().step;
        CheckpointProgress last;
        absl::StatusOr<uint64_t> done =
            run(*held, **session, name, [&](const CheckpointProgress& progress) {
              last = progress;
              reactor->Report(progress, step);
            });
        if (done.ok()) reactor->Report(last, *done);  // the step saved or restored
        reactor->Done(done.status());
      },
      request_bytes);
  if (!queued.ok()) reactor->Done(queued);
  return raw;
}

// Each ExportStateDict stream holds a copy of its session's state until the caller has read it:
// a session has this many open on rank 0 at most (and one per trainer: each may export at once,
// as Lightning's state_dict() on every worker), so that a caller that opens exports and does not
// read them cannot make the rank hold a copy per stream.
constexpr int kOpenExportsPerSession = 2;

OpenStreams& OpenExports() {
  static OpenStreams* const streams = new OpenStreams();
  return *streams;
}

// The exports whose copies the rank holds in its headroom, outside the budget: each owner has
// kOpenExportsPerSession of them at once, whatever its number of sessions.
HeadroomPlaces& ExportsInHeadroom() {
  static HeadroomPlaces* const exports = new HeadroomPlaces(kOpenExportsPerSession);
  return *exports;
}

// Each ImportStateDict stream stages up to a copy of its session's state until it is applied
// (NewStateDictUploadReactor bounds them per session).
OpenStreams& OpenImports() {
  static OpenStreams* const streams = new OpenStreams();
  return *streams;
}

// INVALID_ARGUMENT for a layout or chunk prefix that is none, NOT_FOUND for a model chunk the
// session has none of: checked before the export takes a slot, a place and the copy (a mistake
// answered as the limits' refusal, or a copy of every rank's state made for nothing, before).
absl::Status CheckExportRequest(const Session& session, const v1::ExportStateDictRequest& request) {
  if (!v1::StateDictLayout_IsValid(request.layout())) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportStateDict: layout ", static_cast<int>(request.layout()),
                     " is not a StateDictLayout (0 merged, 1 by model chunk, 2 by sub-optimizer)"));
  }
  const std::string& prefix = request.chunk_prefix();
  if (!prefix.empty() && prefix != "model" && prefix != "model_") {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExportStateDict: chunk_prefix '", CallerText(prefix), "' must be 'model' or 'model_'"));
  }
  std::set<uint32_t> chunks;
  for (const ParamInfo& param : session.config().params) chunks.insert(param.model_chunk);
  for (uint32_t chunk : request.model_chunks()) {
    if (chunks.count(chunk) == 0) {
      return absl::NotFoundError(absl::StrCat("ExportStateDict: model chunk ", chunk,
                                              " not found: session '", session.id(),
                                              "' has model chunks ", absl::StrJoin(chunks, ", ")));
    }
  }
  return absl::OkStatus();
}

// The layouts of spec §7.2 over a merged dict. REQUIRES: CheckExportRequest passed.
absl::StatusOr<StreamedState> LayOut(const Session& session, std::shared_ptr<const StateDict> flat,
                                     const v1::ExportStateDictRequest& request) {
  StreamedState out;
  if (request.layout() == v1::STATE_DICT_LAYOUT_MERGED) {
    for (const auto& [key, tensor] : *flat) out.tensors.push_back({"", "", key, &tensor});
    out.keep = std::move(flat);
    return out;
  }
  const std::string prefix = request.chunk_prefix().empty() ? "model" : request.chunk_prefix();
  const SessionConfig& config = session.config();
  std::vector<ParamGroup> groups;
  for (const GroupRuntime& g : session.groups()) groups.push_back(g.def);
  const SubOptimizerChunks sub_chunks =
      ChunkListsOf(config.params, groups, static_cast<int>(config.chain.sub_optimizers.size()));
  const std::vector<uint32_t> chain = ChainChunkList(sub_chunks);
  auto chunked =
      std::make_shared<ChunkedStateDict>(SplitByModelChunk(*flat, config.params, chain, prefix));
  if (request.layout() == v1::STATE_DICT_LAYOUT_BY_MODEL_CHUNK) {
    // Only the chunks asked for (their counters and meta keys included), under their keys in
    // the whole chain.
    const std::set<uint32_t> wanted(request.model_chunks().begin(), request.model_chunks().end());
    for (size_t k = 0; k < chain.size() && !wanted.empty(); ++k) {
      if (wanted.count(chain[k]) == 0) chunked->erase(ChunkKey(k, chain.size(), prefix));
    }
    for (const auto& [chunk_key, dict] : *chunked) {
      for (const auto& [key, tensor] : dict) out.tensors.push_back({chunk_key, "", key, &tensor});
    }
    out.keep = std::move(chunked);
    return out;
  }
  // Views into the chunked dict, which the stream keeps: one copy of the state, whatever the
  // number of sub-optimizers (ExportBytes reserves one).
  OPTSTEP_ASSIGN_OR_RETURN(const std::vector<ChunkViews> per_sub,
                           SplitChunkedStateDictViews(*chunked, sub_chunks));
  for (size_t j = 0; j < per_sub.size(); ++j) {
    const std::string& sub = config.chain.sub_optimizers[j].name;
    for (const auto& [chunk_key, dict] : per_sub[j]) {
      for (const auto& [key, tensor] : *dict) out.tensors.push_back({chunk_key, sub, key, &tensor});
    }
  }
  out.keep = std::move(chunked);
  return out;
}

// What a copy of `session`'s state for `model_chunks` (every chunk when empty) holds on rank 0:
// the fp32 master and optimizer state of each of their parameters (EstimateOwnedBytes, less the
// gradient buffer, which is not exported), plus 1 MiB of counters.
absl::StatusOr<int64_t> ExportBytes(const Session& session,
                                    const std::vector<uint32_t>& model_chunks) {
  const SessionConfig& config = session.config();
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<int64_t> owned,
                           EstimateOwnedBytes(config.chain, config.params));
  const std::set<uint32_t> chunks(model_chunks.begin(), model_chunks.end());
  int64_t bytes = int64_t{1} << 20;
  for (size_t p = 0; p < config.params.size(); ++p) {
    if (!chunks.empty() && chunks.count(config.params[p].model_chunk) == 0) continue;
    bytes += owned[p] - 4 * config.params[p].numel();
  }
  return bytes;
}

}  // namespace

CheckpointServiceImpl::CheckpointServiceImpl(Engine* engine, RankGroup* group,
                                             absl::Duration stream_idle_timeout)
    : engine_(engine),
      stream_idle_timeout_(stream_idle_timeout),
      own_group_(group == nullptr ? std::make_unique<RankGroup>(RankGroupOptions{}, engine)
                                  : nullptr),
      held_(group == nullptr ? own_group_.get() : group) {}

CheckpointServiceImpl::~CheckpointServiceImpl() = default;

grpc::ServerWriteReactor<v1::CheckpointProgress>* CheckpointServiceImpl::Save(
    grpc::CallbackServerContext* context, const v1::SaveRequest* request) {
  return RunCheckpoint(context, stream_idle_timeout_, "Save", engine_, &held_,
                       request->session_id(), request->name(),
                       2 * static_cast<int64_t>(request->SpaceUsedLong()),
                       [](HeldOperations& held, Session& session, const std::string& name,
                          const CheckpointProgressCallback& progress) {
                         return held.SaveCheckpoint(session, name, progress);
                       });
}

grpc::ServerWriteReactor<v1::CheckpointProgress>* CheckpointServiceImpl::Load(
    grpc::CallbackServerContext* context, const v1::LoadRequest* request) {
  return RunCheckpoint(context, stream_idle_timeout_, "Load", engine_, &held_,
                       request->session_id(), request->name(),
                       2 * static_cast<int64_t>(request->SpaceUsedLong()),
                       [](HeldOperations& held, Session& session, const std::string& name,
                          const CheckpointProgressCallback& progress) {
                         return held.LoadCheckpoint(session, name, progress);
                       });
}

grpc::ServerWriteReactor<v1::StateDictChunk>* CheckpointServiceImpl::ExportStateDict(
    grpc::CallbackServerContext* context, const v1::ExportStateDictRequest* request) {
  return NewStateStreamReactor(
      context, stream_idle_timeout_, "ExportStateDict",
      [engine = engine_, held = &held_, caller = CallerOf(*context), request = *request](
          std::function<void(absl::StatusOr<StreamedState>)> deliver, std::function<bool()> ended) {
        absl::Status queued = ProcessCallerCalls().Run(
            caller.identity, "ExportStateDict",
            [engine, held, caller, request, deliver, ended] {
              // Cancelled while it waited its turn: no copy of the state for nobody.
              if (ended()) return;
              absl::StatusOr<std::shared_ptr<Session>> session =
                  FindSession(*engine, caller, request.session_id());
              if (!session.ok()) return deliver(session.status());
              absl::Status valid = CheckExportRequest(**session, request);
              if (!valid.ok()) return deliver(valid);
              // The slot, the place in the headroom and the reservation are taken before the
              // copy is made (it waits for the session's hold, and may be of every rank's state):
              // an export refused costs no copy. They are counted while the stream holds it.
              const int limit = std::max(kOpenExportsPerSession, (*session)->config().num_trainers);
              OpenStreams::Slot slot = OpenExports().TryOpen(session->get(), limit);
              if (!slot.held()) {
                return deliver(absl::ResourceExhaustedError(absl::StrCat(
                    "ExportStateDict: ", limit, " exports of session '", (*session)->id(),
                    "' are open already; read them (or cancel them) first")));
              }
              // An owner's first exports hold their copies in the rank's headroom while they fit
              // there; its others take them from the budget, within its share, until the stream
              // ends: a session of many trainers, each with an export open, or an owner of many
              // sessions, each with exports open, must not take the rank past it.
              const std::vector<uint32_t> chunks(request.model_chunks().begin(),
                                                 request.model_chunks().end());
              absl::StatusOr<int64_t> copy_bytes = ExportBytes(**session, chunks);
              if (!copy_bytes.ok()) return deliver(copy_bytes.status());
              absl::StatusOr<std::shared_ptr<const void>> held_copy =
                  HoldCopy(*engine, ExportsInHeadroom(), (*session)->config().owner, *copy_bytes,
                           "ExportStateDict",
                           absl::StrCat("session '", (*session)->id(),
                                        "': a copy of its state, held until the stream is read"));
              if (!held_copy.ok()) return deliver(held_copy.status());
              absl::StatusOr<std::shared_ptr<const StateDict>> dict =
                  held->ExportStateDict(**session, chunks);
              if (!dict.ok()) return deliver(dict.status());
              absl::StatusOr<StreamedState> state = LayOut(**session, *std::move(dict), request);
              if (state.ok()) {
                // The slot and what holds the copy (HoldCopy) are given back with the
                // state, once the stream ends; the session is kept with it, since the slot is
                // counted by its address.
                struct Held {
                  std::shared_ptr<const void> state;
                  std::shared_ptr<Session> session;
                  OpenStreams::Slot slot;
                  std::shared_ptr<const void> copy;  // HoldCopy's
                };
                state->keep =
                    std::make_shared<Held>(Held{std::move(state->keep), *std::move(session),
                                                std::move(slot), *std::move(held_copy)});
              }
              deliver(std::move(state));
            },
            // While it waits, the call's request and this copy of it.
            2 * static_cast<int64_t>(request.SpaceUsedLong()));
        if (!queued.ok()) deliver(queued);
      });
}

grpc::ServerReadReactor<v1::StateDictChunk>* CheckpointServiceImpl::ImportStateDict(
    grpc::CallbackServerContext* context, v1::ImportStateDictResponse* response) {
  // The dict goes to the group on a thread of its own: the import blocks on other ranks.
  const Caller caller = CallerOf(*context);
  return NewStateDictUploadReactor<v1::StateDictChunk>(
      engine_, caller, CallerKey(caller, context->peer()), "empty state dict stream",
      CallIdleWatch::Start(context, stream_idle_timeout_, "ImportStateDict",
                           CallIdleWatch::Waits::kReads),
      &OpenImports(),
      [held = &held_, response](Session& session, uint64_t, std::shared_ptr<const StateDict> dict,
                                uint64_t bytes) {
        response->set_tensors(dict->size());
        response->set_bytes(bytes);
        OPTSTEP_RETURN_IF_ERROR(held->ImportStateDict(session, std::move(dict)));
        response->set_step(session.stats().step);
        return absl::OkStatus();
      });
}

}  // namespace optstep
