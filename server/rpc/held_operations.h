#ifndef OPTSTEP_SERVER_RPC_HELD_OPERATIONS_H_
#define OPTSTEP_SERVER_RPC_HELD_OPERATIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/state_dict.h"
#include "server/engine/session.h"
#include "server/engine/session_checkpoint.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// The deadlines of the calls that move a session's state on a peer: long enough for the largest
// state (a checkpoint's shard written or read; a load's state applied, a shadow fetched again).
// A peer that stops answering its pings fails them sooner (RankGroup::CallWhileAnswering); the
// deadline bounds only one that answers but whose call never ends (a disk that stalls).
inline constexpr absl::Duration kShardCallTimeout = absl::Hours(24);
inline constexpr absl::Duration kApplyCallTimeout = absl::Minutes(10);

// The held-operation protocol (docs/checkpoints.md, "RPCs and consistency"), run by rank 0 over
// its group: operations that must see one step on every rank hold the session on every rank,
// settle the ranks at one resolution, operate, and release every rank whatever happened. The
// state-dict export and import and the checkpoint save and load are built on it; each rank's side
// is PeerServiceImpl (peer_service.h).
// Thread-safe (it keeps no state of its own); calls block on the other ranks and on files: never
// call them on a gRPC reaction. Every call answers FAILED_PRECONDITION on ranks other than 0.
class HeldOperations {
 public:
  // `group` must outlive this object.
  explicit HeldOperations(RankGroup* group) : group_(group) {}

  // A new hold token: random, never 0, distinct from every other this process makes.
  static uint64_t NewToken();

  // Holds `session` on every rank, settles them at the highest resolution any of them started,
  // runs `op` with the hold's token and the settled point, and releases every rank whatever
  // happened. Blocks. UNAVAILABLE once a peer is lost (RankGroup::PeersStatus).
  using HeldOperation = std::function<absl::Status(uint64_t token, const HeldPoint& point)>;
  absl::Status WithHeldSession(Session& session, const HeldOperation& op) {
    return WithHeldSession(session, NewToken(), op);
  }
  // As above with the token `token` (NewToken), for a caller that needs it before the hold (a
  // save's temporary made ahead of it).
  absl::Status WithHeldSession(Session& session, uint64_t token, const HeldOperation& op);

  // The state dict of `model_chunks` (all when empty) gathered from every rank at one step:
  // every master from rank 0 (REPLICATED storage) or from its owner (OWNERS), each parameter's
  // optimizer state from its owner.
  absl::StatusOr<std::shared_ptr<const StateDict>> ExportStateDict(
      Session& session, const std::vector<uint32_t>& model_chunks);
  // Routes each key to the ranks that hold it (counters: every rank; masters: every rank, or
  // their owner under OWNERS storage; state: the owner), has every rank validate and stage its
  // part, and only then applies everywhere.
  absl::Status ImportStateDict(Session& session, std::shared_ptr<const StateDict> state);
  // Checkpoint `name` under every rank's checkpoint root. Answers the step saved.
  absl::StatusOr<uint64_t> SaveCheckpoint(Session& session, const std::string& name,
                                          const CheckpointProgressCallback& progress);
  // Every rank verifies and stages its part of checkpoint `name` (also an automatic one,
  // "auto/<session id>/step-<N>"); then every rank applies it. Answers the step restored.
  // `restoring`: the automatic restore, which sets aside the checkpoints it passed over itself
  // (else those of the timeline the session leaves are, RankGroupOptions::replacing_state).
  absl::StatusOr<uint64_t> LoadCheckpoint(Session& session, const std::string& name,
                                          const CheckpointProgressCallback& progress,
                                          bool restoring = false);

 private:
  const RankGroupOptions& options() const { return group_->options(); }
  // REQUIRES: `rank` > 0 and the session held under `token`. Rank `rank`'s part of the export.
  absl::StatusOr<std::shared_ptr<const StateDict>> ExportFrom(
      int rank, const Session& session, uint64_t token, const std::vector<uint32_t>& model_chunks);
  // REQUIRES: `rank` > 0 and the session held under `token`. Streams `part` to rank `rank`,
  // which validates and stages it.
  absl::Status StageOn(int rank, const Session& session, uint64_t token, const StateDict& part);
  // Renews the hold of `token` on every rank; ABORTED naming the rank where it is gone (its lease
  // passed: resolutions may have run there since). Called as a held operation goes (a rank that
  // finished its part waits for the others without renewing it) and right before it commits or
  // applies anything, so that no rank writes under a hold it lost.
  absl::Status RenewEverywhere(Session& session, uint64_t token);
  // Every rank writes the state it staged under `token`, once the automatic checkpoints of step
  // `abandoned_from` on (none when unset), which the session's timeline leaves, are set aside
  // (RankGroupOptions::replacing_state, told `kept_step` too) and every rank still holds it.
  absl::Status ApplyEverywhere(Session& session, uint64_t token,
                               std::optional<uint64_t> abandoned_from,
                               std::optional<uint64_t> kept_step = std::nullopt);
  // Where checkpoint `name` lives under this rank's root (LocateCheckpoint); FAILED_PRECONDITION
  // without a root.
  absl::StatusOr<CheckpointLocation> Locate(const std::string& name, bool allow_auto) const;
  // Save's operation once rank 0 prepared `where`: every rank writes its shard of the held
  // state, then rank 0 commits. The caller removes the temporary when this fails.
  absl::Status SaveShardsAndCommit(Session& session, uint64_t token, const HeldPoint& point,
                                   const CheckpointLocation& where, const std::string& definition,
                                   const CheckpointProgressCallback& progress);

  RankGroup* const group_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_HELD_OPERATIONS_H_
