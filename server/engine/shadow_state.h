#ifndef OPTSTEP_SERVER_ENGINE_SHADOW_STATE_H_
#define OPTSTEP_SERVER_ENGINE_SHADOW_STATE_H_

// State redundancy (docs/design.md, "State redundancy"): with it, rank r keeps a ShadowState of
// its predecessor's replica of each session, (r + N - 1) % N: a copy of the masters that rank
// owns and their optimizer state, kept current with every step, so that a lost rank's own
// state survives it on its buddy (rank (owner + 1) % N).
//
// How a step keeps it current (StepCoordinator::Resolve): once the ranks agreed, each rank ships
// its owned gradients (mean, before clipping) around the ring into the shadow's gradient buffers
// (GradientShipment, in rounds on a thread of its own) while it steps its own parameters, each
// once its gradient is out; the shipment ends before the all-gather (REPLICATED storage) or a
// barrier of every rank (OWNERS storage, which gathers nothing). A trainer learns a step only
// after that collective, which no rank finishes before every rank entered it: so once any
// trainer saw step k, every buddy holds step k's gradients. The shadow is stepped with them once
// the step ended (the trainers have it), with the same code (owned_update.h) and the same agreed
// clip scale and schedule, by the coordinator, before any later task of it: the next step, and
// every export of the shadow, come after. So is it when the all-gather (or barrier) fails after
// the shipment ended: another rank may have finished the step. Step 1 first ships each rank's owned
// masters into its buddy's shadow the same way: the initial values reach only the replicas (under
// OWNERS only the owner's).
//
// Interface for the heal (the restarted rank r, its buddy b = r + 1 and predecessor p = r - 1):
//   on b:  Session::ExportShadow        r's owned masters, state, group counters; meta/step is
//                                       the last step applied to them (the shadow's step)
//   on r:  Session::ImportOwnedState    that state dict: r's own state, owned_applied_step
//   on p:  Session::ExportOwnedState    p's owned masters, state and counters
//   on r:  Session::ImportShadow        that state dict: r's shadow of p
//   any peer: Session::ExportMasters    the masters it holds (every one under REPLICATED
//                                       storage), the step counters (held at one step)
//   on r:  Session::ImportMasters       (before ImportOwnedState, which overwrites r's block)
//   every rank: Session::ResumeAfterHeal   steps are taken again; an interrupted step is redone
// A step redone after an interruption applies each update once: a rank (or shadow) whose
// owned_applied_step is already the step skips its update and still takes part in every
// collective.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
#include "server/engine/replica_state.h"
#include "server/engine/replica_state_dict.h"

namespace optstep {

// The shadow of one predecessor's replica of one session. Thread-compatible, as its
// ReplicaState: the session's coordinator (and the device worker it waits for) alone touches it.
class ShadowState {
 public:
  // The shadow of `replica`'s predecessor in the ring. REQUIRES: world size >= 2.
  static absl::StatusOr<std::unique_ptr<ShadowState>> Create(const ReplicaState& replica);

  int owner() const { return replica_->rank(); }
  ReplicaState& replica() { return *replica_; }
  // The last step of the owner's reflected here (its owned_applied_step then).
  uint64_t step() const { return replica_->owned_applied_step(); }
  // FAILED_PRECONDITION once an update failed midway (the shadow is partly stepped) until an
  // import replaces it.
  absl::Status CheckUsable() const { return usable_; }
  void Invalidate(absl::Status why) { usable_ = std::move(why); }
  void Revalidate() { usable_ = absl::OkStatus(); }

 private:
  explicit ShadowState(std::unique_ptr<ReplicaState> replica) : replica_(std::move(replica)) {}

  const std::unique_ptr<ReplicaState> replica_;
  absl::Status usable_;
};

// The bytes a shadow of `owner`'s replica holds: its owned masters, optimizer state and
// gradient buffers (what admission adds for redundancy).
int64_t ShadowBytes(const ReplicaState& shadow);

// The owned part of `replica` (a rank's own, or a shadow) as a state dict: the owned masters
// ("param/..."), their optimizer state, the group counters, "meta/step" = owned_applied_step.
// On the device worker.
absl::StatusOr<std::shared_ptr<const StateDict>> ExportOwned(ReplicaState& replica);
// Writes such a state dict into `replica` (every key checked first, as ResolveState: a shadow
// has no tensor of a parameter its owner does not own) and sets owned_applied_step to its
// "meta/step" (INVALID_ARGUMENT without one). On the device worker.
absl::Status ImportOwned(ReplicaState& replica, std::shared_ptr<const StateDict> state);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SHADOW_STATE_H_
