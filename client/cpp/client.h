#ifndef OPTSTEP_CLIENT_CPP_CLIENT_H_
#define OPTSTEP_CLIENT_CPP_CLIENT_H_

// optstep::Client: the C++ client of the optstep service (sessions, optimizer steps, parameters,
// health). No gRPC type appears here: every method answers absl::Status / absl::StatusOr with
// the server's code and message, or the transport's (UNAVAILABLE when a rank cannot be reached,
// DEADLINE_EXCEEDED when a call outlives its deadline). The session protos (SessionSpec,
// SessionInfo) are used as plain data.
//
//   ClientOptions options;
//   options.target = "localhost:50051";
//   OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
//   OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo session, client->CreateSession(spec));
//   StepOptions step;
//   step.session_id = session.session_id();
//   step.step = session.step() + 1;
//   OPTSTEP_ASSIGN_OR_RETURN(StepReply reply, client->Step(step, gradients));

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/cpp/client_options.h"
#include "client/cpp/client_types.h"
#include "client/cpp/step_recovery.h"
#include "client/cpp/step_stream.h"
#include "kernels/dtype.h"
#include "optstep/v1/checkpoint_service.pb.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "optstep/v1/session.pb.h"

namespace optstep {
namespace client_internal {
class SessionLayout;
}  // namespace client_internal

// Thread-safe: any method may be called from several threads at once (each call has its own
// gRPC call; the cache of session layouts is guarded by a mutex). Holds one channel per rank
// (ClientOptions.rank_targets); gradient chunks go to the rank that owns their parameter
// (SessionInfo.layout), parameters come back from one rank.
class Client final {
 public:
  // Validates `options` (INVALID_ARGUMENT), opens one channel per rank and, unless
  // options.connect_timeout is zero, waits for every rank to be reachable (UNAVAILABLE). A rank
  // may be stood in for (docs/deploy.md, "A rank that does not return"), its own address
  // answering nothing: the first rank that answers says where, and the client waits for the
  // stand-in instead. A rank still not reached is looked up once more (rank 0 says where; for
  // rank 0, another rank does).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Number of ranks this client has a channel to.
  int num_ranks() const { return static_cast<int>(ranks_.size()); }

  // ---- Sessions (asked of rank 0, or of its stand-in). The answers also refresh the client's
  // cached layouts.

  // Registers a model, or attaches to the existing session of the same name and definition;
  // `*attached` (if given) tells which. Answers the whole SessionInfo, as GetSession. Sends a
  // random request_id, the same when the call is made again where rank 0 is served now, so that
  // a retry after a lost answer never leaves a second session.
  absl::StatusOr<v1::SessionInfo> CreateSession(const v1::SessionSpec& spec,
                                                bool* attached = nullptr);
  // The whole SessionInfo (every parameter and owner), read in GetSession's pages.
  absl::StatusOr<v1::SessionInfo> GetSession(absl::string_view session_id);
  // The summaries of every session the caller may see, by id, read `page_size` (0: the server's
  // default) at a time.
  absl::StatusOr<std::vector<v1::SessionSummary>> ListSessions(uint32_t page_size = 0);
  // One ListSessions page, as the server answers it.
  absl::Status ListSessionsPage(const v1::ListSessionsRequest& request,
                                v1::ListSessionsResponse* page);
  // Closes the session; NOT_FOUND when there is none. A close retried where rank 0 is served now,
  // after an attempt that got no answer, answers OK on NOT_FOUND: that attempt closed it.
  absl::Status CloseSession(absl::string_view session_id);

  // ---- Parameters

  // Sets the initial fp32 values of one parameter (all of its elements), streamed to the
  // parameter's owner rank in chunks of at most options.max_chunk_bytes. Only before the first
  // step (FAILED_PRECONDITION afterwards, also once a rank applied its part of step 1 before a
  // lost rank interrupted it). Refused UNAVAILABLE (a group that heals, a rank not reached;
  // nothing written), they are sent again with backoff for up to options.recovery_timeout (an
  // attempt under way runs to its stream_timeout). INVALID_ARGUMENT when values.size() is not
  // the parameter's element count.
  absl::Status InitParameters(absl::string_view session_id, uint32_t param_id,
                              absl::Span<const float> values);

  // The current parameters (`param_ids`, or all when empty) in `dtype` (kF32 or kBF16), as they
  // were after the last step.
  absl::StatusOr<Parameters> PullParameters(absl::string_view session_id, DType dtype,
                                            absl::Span<const uint32_t> param_ids = {});
  // As above, but each parameter with a destination in `into` is written there as its chunks
  // arrive (no copy beside it) and left out of Parameters.params (counted in
  // destinations_filled). INVALID_ARGUMENT (NOT_FOUND for an unknown id), before anything is
  // asked, for a destination that is not a parameter pulled or not its size in `dtype`. A pull
  // that fails part way may have written some destinations. `into`'s memory must stay valid
  // during the call. The pull ends by `by` at the latest (DEADLINE_EXCEEDED), each stream
  // within ClientOptions.stream_timeout as ever.
  absl::StatusOr<Parameters> PullParameters(absl::string_view session_id, DType dtype,
                                            absl::Span<const uint32_t> param_ids,
                                            const ParamDestinations& into,
                                            absl::Time by = absl::InfiniteFuture());

  // ---- Steps

  // One optimizer step of trainer options.trainer_id. The gradients (any dtype, any ranges;
  // together they must be this trainer's whole contribution to the step) are validated, split
  // into wire chunks and sent to their owner ranks, each stream as header -> chunks -> commit.
  // Blocks until the step has run (that is, until every trainer has committed) and answers the
  // result and the updated parameters in options.return_dtype. A retry of the same
  // (session, step, trainer) is safe. Codes: INVALID_ARGUMENT / NOT_FOUND for bad gradients
  // (checked here before anything is sent), FAILED_PRECONDITION for a step out of sequence,
  // ABORTED when the step was aborted (redo it), DEADLINE_EXCEEDED after
  // options.stream_timeout. While the group recovers from a lost rank the step waits for it
  // (options.recovery_timeout) and redoes itself; ABORTED with RewindStep(status) set when the
  // session came back at an older step than options.step - 1 (step_recovery.h).
  // The bytes the slices point to must stay valid during the call.
  absl::StatusOr<StepReply> Step(const StepOptions& options,
                                 absl::Span<const GradientSlice> gradients);
  // As Step, but each returned parameter with a destination in `into` is written there as its
  // chunks arrive (no copy beside it) and left out of StepReply.params (counted in
  // destinations_filled). INVALID_ARGUMENT (NOT_FOUND for an unknown id), before anything is
  // sent, for a destination that is not a returned parameter or not its size. A reply that fails
  // part way may have written some destinations: the step's redo after a recovery, or the caller's
  // retry, writes them all. `into`'s memory must stay valid during the call.
  absl::StatusOr<StepReply> Step(const StepOptions& options,
                                 absl::Span<const GradientSlice> gradients,
                                 const ParamDestinations& into);
  // A step whose gradients are sent as they are produced (step_stream.h): opens one Step stream
  // per rank of the session's layout and sends the header; the stream's Add queues gradients,
  // its Finish answers as Step. Codes as Step's checks before sending; no recovery wait.
  absl::StatusOr<std::unique_ptr<StepStream>> OpenStep(const StepOptions& options);
  // Convenience: whole fp32 gradients per parameter.
  absl::StatusOr<StepReply> Step(const StepOptions& options,
                                 absl::Span<const FullGradient> gradients);

  // ---- Checkpoints and state dicts (rank 0; docs/checkpoints.md). Each sees one step on every
  // rank, while trainers may be stepping.

  // Saves the session as checkpoint `name` under the servers' --checkpoint_root (FAILED_
  // PRECONDITION when unset; INVALID_ARGUMENT for a name that escapes it; ALREADY_EXISTS).
  // `progress` (optional) sees each report; the answer is the last one, with the step saved.
  // These four calls go to rank 0 where it is served now, as the session calls do (OnRankZero).
  using CheckpointProgressFn = std::function<void(const v1::CheckpointProgress&)>;
  absl::StatusOr<v1::CheckpointProgress> Save(absl::string_view session_id, absl::string_view name,
                                              const CheckpointProgressFn& progress = nullptr);
  // Restores checkpoint `name` onto the session's current ranks; the answer's step is the step
  // restored. FAILED_PRECONDITION for another definition or format version, DATA_LOSS for a
  // damaged checkpoint (the running state is then unchanged).
  absl::StatusOr<v1::CheckpointProgress> Load(absl::string_view session_id, absl::string_view name,
                                              const CheckpointProgressFn& progress = nullptr);
  // The session's state was replaced at `step` (a Load or an import, this client's or another
  // one's): the steps this client saw applied before no longer count for its recovery (Load and
  // ImportStateDict call it themselves). With `trainer_id`, for that trainer alone (it learned
  // of a restore itself; the others are told as a rewind).
  void StateReplaced(absl::string_view session_id, uint64_t step,
                     std::optional<uint32_t> trainer_id = std::nullopt) {
    recovery_.Restart(session_id, step, trainer_id);
  }

  // One tensor of an exported state dict: its key, and for keyed layouts its chunk and
  // sub-optimizer (spec §7.2).
  struct StateDictEntry {
    std::string sub_optimizer;
    std::string chunk_key;
    std::string key;
    v1::DType dtype = v1::DTYPE_FP32;
    std::vector<uint64_t> shape;
    std::string bytes;  // little-endian, whole tensor
  };
  absl::StatusOr<std::vector<StateDictEntry>> ExportStateDict(
      const v1::ExportStateDictRequest& request);
  // Streams `entries` (any layout ExportStateDict answers) into the session (StateReplaced at
  // the session's step then).
  absl::Status ImportStateDict(absl::string_view session_id,
                               absl::Span<const StateDictEntry> entries);

  // ---- Operations (AdminService, admin token)

  // Shuts rank `rank` down as SIGTERM does (the running step finishes or is cut at its grace
  // period; the process exits). OUT_OF_RANGE for a rank this client does not know.
  absl::Status Shutdown(int rank = 0, absl::string_view reason = "");

  // ---- Health (grpc.health.v1 on rank 0)

  // true when `service` ("" = the whole server) is SERVING, false when NOT_SERVING (or
  // UNKNOWN); the status code when the check itself fails (e.g. UNAVAILABLE). When rank 0 does
  // not answer SERVING, the other ranks are asked where it is served (LookUpRankZero) and that
  // one is checked.
  absl::StatusOr<bool> CheckHealth(absl::string_view service = "");

 private:
  // CheckHealth and GetSession, each call of theirs cut at `deadline` if that comes before
  // rpc_timeout: the probes of a step's recovery, which must end within recovery_timeout.
  absl::StatusOr<bool> CheckHealthBy(absl::string_view service, absl::Time deadline);
  absl::StatusOr<v1::SessionInfo> GetSessionBy(absl::string_view session_id, absl::Time deadline);
  // The timeout of one call made by `deadline`: rpc_timeout, or less where the deadline is nearer
  // (at least 1 ms, so that a call past it fails DEADLINE_EXCEEDED rather than waiting).
  absl::Duration TimeoutBy(absl::Time deadline) const;
  struct Rank;  // channel and stubs of one rank (client.cc)
  using LayoutPtr = std::shared_ptr<const client_internal::SessionLayout>;

  // Opens a channel to a target, and its stubs, with the client's credentials and arguments.
  using RankOpener = std::function<std::shared_ptr<Rank>(const std::string& target)>;

  Client(ClientOptions options, std::vector<std::shared_ptr<Rank>> ranks, RankOpener open_rank);
  // What reaches rank `rank` now: its stand-in while the group says one stands in for it
  // (SessionInfo.layout.stood_in_ranks), else the rank of ClientOptions.
  std::shared_ptr<Rank> Reach(size_t rank);
  // Follows the stand-ins the group tells of (Layout, ListSessionsResponse): opens a channel to
  // each new one, drops those of ranks back.
  void FollowStandIns(const google::protobuf::RepeatedPtrField<std::string>& rank_targets,
                      const google::protobuf::RepeatedField<uint32_t>& stood_in_ranks);
  // Connect's wait for every rank, within the connect timeout. The first rank to answer tells
  // which ranks are stood in for (AskDirectory), whose own addresses would not answer; each of
  // those is then served by whichever answers first, its stand-in or its own process (back
  // while the directory still lists the stand-in). UNAVAILABLE naming the first rank not
  // reached (ConnectStandIns).
  absl::Status AwaitRanks();
  // Reach(rank) is the rank's own channel again.
  void ForgetStandIn(size_t rank);
  // After AwaitRanks could not reach `unreachable` (ascending) within the connect timeout: asks
  // rank 0 for stand-ins (or, rank 0 not reached, the first rank reached) and waits for theirs.
  // UNAVAILABLE naming the first rank not reached.
  absl::Status ConnectStandIns(const std::vector<size_t>& unreachable);
  // The first page of `rank`'s ListSessions, within `timeout`: the group's directory as that
  // rank knows it.
  absl::StatusOr<v1::ListSessionsResponse> AskDirectory(Rank& rank, absl::Duration timeout);
  // Rank 0 does not answer, or is not serving: asks every other rank, then rank 0's own address,
  // where rank 0 is served (its stand-in, or its own process back) and follows the first
  // answer (the whole directory: the stand-ins of every rank), each call cut at `deadline`
  // (TimeoutBy). The last error when none answered.
  absl::Status LookUpRankZero(absl::Time deadline = absl::InfiniteFuture());
  // Runs `call` on rank 0 (Reach); when it answers UNAVAILABLE or CANCELLED (a server that stops;
  // DEADLINE_EXCEEDED with wait_for_ready) and the other ranks say rank 0 is served elsewhere now
  // (LookUpRankZero), runs it there once more: a creation then attaches to the session the first
  // try made, a close finds none (NOT_FOUND) if the first try's answer was lost. The look-up ends
  // by `deadline`.
  absl::Status OnRankZero(const std::function<absl::Status(Rank& rank)>& call,
                          absl::Time deadline = absl::InfiniteFuture()) {
    return OnRank(0, call, deadline);
  }
  // OnRankZero for rank `rank`: a rank stood in for, or back from its stand-in, since this client
  // last read the directory (an initialisation) is followed.
  absl::Status OnRank(size_t rank, const std::function<absl::Status(Rank& rank)>& call,
                      absl::Time deadline = absl::InfiniteFuture());
  // OnRank for a call that reaches every rank of `ranks` (through Reach; an OWNERS pull): run
  // once more, in whole, where one of them is served elsewhere now.
  absl::Status OnRanks(const std::vector<size_t>& ranks, const std::function<absl::Status()>& call,
                       absl::Time deadline = absl::InfiniteFuture());
  // Runs the checkpoint progress stream that `start(stub, context)` begins on rank 0 where it is
  // served now (OnRankZero); answers its last report, `progress` seeing each (client.cc).
  template <typename Start>
  absl::StatusOr<v1::CheckpointProgress> OnRankZeroProgress(Start start,
                                                            const CheckpointProgressFn& progress);
  // One ExportStateDict (into `entries`, cleared first) and one ImportStateDict on `rank`
  // (answered in `response`).
  absl::Status ReadStateDict(Rank& rank, const v1::ExportStateDictRequest& request,
                             std::vector<StateDictEntry>& entries);
  absl::Status WriteStateDict(Rank& rank, absl::string_view session_id,
                              absl::Span<const StateDictEntry> entries,
                              v1::ImportStateDictResponse* response);

  // The cached layout of `session_id`, fetched with GetSession on first use.
  absl::StatusOr<LayoutPtr> Layout(absl::string_view session_id);
  // Caches the layout of `info`; INTERNAL when `info` is inconsistent.
  absl::StatusOr<LayoutPtr> Remember(const v1::SessionInfo& info);

  absl::StatusOr<StepReply> StepWithLayout(const StepOptions& options, LayoutPtr layout,
                                           absl::Span<const GradientSlice> gradients,
                                           const ParamDestinations& into);
  // The checks of a step before anything is sent.
  absl::Status CheckStep(const StepOptions& options,
                         const client_internal::SessionLayout& layout) const;
  // Opens the Step streams of `options` over `layout`'s ranks (header sent).
  std::unique_ptr<StepStream> OpenStepCalls(const StepOptions& options, LayoutPtr layout);

  // The reply of step `options` that the session applied and restored: its parameters, pulled
  // by `by`, those with a destination in `into` written there.
  absl::StatusOr<StepReply> AppliedStep(const StepOptions& options, const ParamDestinations& into,
                                        absl::Time by);

  const ClientOptions options_;
  const std::vector<std::shared_ptr<Rank>> ranks_;
  const RankOpener open_rank_;
  client_internal::StepRecovery recovery_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, LayoutPtr> layouts_ ABSL_GUARDED_BY(mu_);
  // The stand-ins the group last told of, by rank (docs/deploy.md, "A rank that does not
  // return"); a rank's own process back, its entry goes.
  absl::flat_hash_map<uint32_t, std::shared_ptr<Rank>> stand_ins_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_CLIENT_H_
