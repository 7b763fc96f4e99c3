#ifndef OPTSTEP_SERVER_ENGINE_ENGINE_H_
#define OPTSTEP_SERVER_ENGINE_ENGINE_H_

// The optimizer engine of one rank (Engine): its device and device worker, its sessions and the
// admission of their memory, configured by EngineOptions. Knows nothing of gRPC or protos.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/fair_executor.h"
#include "kernels/comm/communicator.h"
#include "kernels/device.h"
#include "kernels/device_factory.h"
#include "server/engine/admission.h"
#include "server/engine/memory_budget.h"
#include "server/engine/session.h"
#include "server/engine/session_config.h"
#include "server/engine/shared_segments.h"
#include "server/engine/step_observer.h"

namespace optstep {

// NOT_FOUND naming the session id: the answer for an unknown id, and for a session the caller may
// not see (which must not be told apart).
absl::Status SessionNotFoundError(const std::string& id);

struct EngineOptions {
  DeviceOptions device;
  // The device to use instead of creating one from `device` (tests inject a fault-injecting
  // Device here); null: CreateDevice(device).
  std::shared_ptr<Device> injected_device;
  int rank = 0;
  int world_size = 1;
  absl::Duration default_step_deadline = absl::Seconds(60);
  int max_sessions = 64;
  int64_t max_params_per_session = 1 << 20;
  // The bytes this rank admits sessions into (admission.h); 0: kDefaultMemoryBudgetFraction of the
  // device's memory, or of the cgroup's limit or the host's memory (ResolveMemoryBudget).
  int64_t memory_budget = 0;
  // What the copies that streams hold in their owners' places in the headroom (outside the
  // budget: an export's state, staged initial values, unread pulls, waiting Step streams) may
  // take together (MemoryBudget::set_headroom); 0: DefaultStreamHeadroom.
  int64_t memory_headroom = 0;
  // A stand-in's (rank_process.h): its host's budget, which it shares rather than having one of
  // its own (memory_budget and memory_headroom are then unused); must outlive the engine's
  // construction only.
  const MemoryBudget* share_budget_of = nullptr;
  int64_t max_session_bytes = 0;  // one session's footprint at most; 0: the budget alone
  // One owner's share of the rank (docs/security.md "Limits"): the most sessions one owner holds
  // (0: max_sessions alone) and the share of the memory budget its sessions may take together
  // (1: the budget alone), checked when a session is created, not when one is restored or healed.
  int max_sessions_per_owner = 0;
  double owner_memory_share = 1.0;
  // A device task (a slice of one session's device work) running longer than this turns the
  // rank unhealthy until it ends (docs/security.md); zero: no watchdog.
  absl::Duration device_watchdog = absl::Minutes(5);
  // Creates and connects the communicator of a session's group; called on every rank with the
  // same session id (it blocks until the group is connected). Unset: a local communicator, for
  // world size 1.
  std::function<absl::StatusOr<std::unique_ptr<Communicator>>(const std::string& session_id)>
      make_communicator;
  // Told about step phases, bytes and session / step events (metrics, logs); may be null.
  std::shared_ptr<StepObserver> step_observer;
  // --state_redundancy (docs/design.md, "State redundancy"; several ranks only): every session
  // keeps a shadow of the predecessor rank's owned state, counted by admission, and a peer lost
  // in a step interrupts the session (Session::interrupted_step) instead of breaking it.
  bool state_redundancy = false;
  // --shared_memory: trainers on this host may share a segment with the rank for their steps
  // (AttachSharedMemory; shared_segments.h).
  bool shared_memory = true;
  // --max_shared_segments: the most segments shared at once (each holds a descriptor).
  int max_shared_segments = kDefaultMaxSharedSegments;
};

// The optimizer engine of one rank: its device, its device worker and its sessions. Knows nothing
// of gRPC or protos. Thread-safe.
class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options);
  // Closes every session and joins the worker and the deadline thread.
  ~Engine();

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  struct Created {
    std::shared_ptr<Session> session;
    bool attached = false;  // the session of the same name (CreateSessionResponse.attached)
    bool made = false;      // made by this call (not attached to, nor answered to a retry)
  };
  // Creates a session (callers serialize creations, as RankGroup's create_mu_ does, so that an
  // owner's share is checked against what it holds); answers the owner's session created with
  // the same non-empty request_id (a retried creation: `attached` false), or attaches to the
  // owner's session of the same non-empty name, when its definition is identical
  // (FAILED_PRECONDITION names the session when it differs).
  // RESOURCE_EXHAUSTED beyond max_sessions / max_params_per_session / max_session_bytes, beyond
  // the owner's share (CheckAdmission), and when its footprint does not fit beside what is
  // admitted (SessionAdmission), before anything is allocated.
  // Blocks while the session's communicator group connects (every rank must create it).
  absl::StatusOr<Created> CreateSession(SessionConfig config);
  // Rank 0 allots the ids; the other ranks create their replicas with the id rank 0 gave.
  // ALREADY_EXISTS when this rank holds the id. With `heal_generation`, a replica a heal makes:
  // paused for that heal (Session::PauseForHeal) before any call can reach it, so that no
  // resolution (an abort vote relayed meanwhile) starts on it until the heal's end.
  absl::StatusOr<std::shared_ptr<Session>> CreateReplica(
      const std::string& id, SessionConfig config,
      std::optional<uint64_t> heal_generation = std::nullopt);
  // A new session id (rank 0): "s" and 32 hex digits of 128 random bits read from the kernel's
  // CSPRNG, so ids are neither guessed nor reused, across restarts too.
  static std::string NextSessionId();
  // The owner's session that CreateSession(config) answers without creating one (rank 0 asks
  // before it creates a session everywhere): `session` null when there is none.
  absl::StatusOr<Created> FindExisting(const SessionConfig& config) const;
  // NOT_FOUND naming the id.
  absl::StatusOr<std::shared_ptr<Session>> GetSession(const std::string& id) const;
  std::vector<std::shared_ptr<Session>> ListSessions() const;
  // Aborts its pending step and drops the session, releases its admitted bytes and returns the
  // freed heap to the system (malloc_trim). NOT_FOUND naming the id.
  absl::Status CloseSession(const std::string& id);
  // Whether this rank would admit `config` now (SessionAdmission::Check, and for a `new_session`
  // its owner's share: RESOURCE_EXHAUSTED naming the owner and the limit): rank 0 asks before the
  // other ranks build their replicas. A restored session was admitted before: its owner's share
  // is not checked again.
  absl::Status CheckAdmission(const SessionConfig& config, bool new_session = true);
  // The rank's memory budget and what it has admitted.
  const MemoryBudget& memory_budget() const { return admission_->budget(); }
  // Takes `bytes` of the rank's budget for something other than a session's footprint (what an
  // export or a further trainer's InitParameters stream stages) as `owner`'s: within its share
  // (CheckOwnerShare), then as MemoryBudget::TryReserve.
  absl::StatusOr<MemoryBudget::Reservation> ReserveMemory(int64_t bytes, absl::string_view asker,
                                                          absl::string_view detail,
                                                          absl::string_view owner);
  // `bytes` of the rank's headroom (MemoryBudget::TryTakeHeadroom): a stream's copy held in its
  // owner's place there (HeadroomPlaces); nullopt when they do not fit.
  // `owner` holds at most its share (owner_memory_share) of the headroom.
  std::optional<MemoryBudget::HeadroomBytes> TryTakeHeadroom(int64_t bytes,
                                                             const std::string& owner);

  // A new shared memory segment for `trainer` of `session` (shared_segments.h).
  // FAILED_PRECONDITION when options().shared_memory is off or the session's gradients are
  // SHARDED (a segment holds every owned gradient whole); INVALID_ARGUMENT for a trainer out of
  // range; as SharedSegments::Attach otherwise.
  absl::StatusOr<std::shared_ptr<const SharedSegment>> AttachSharedMemory(const Session& session,
                                                                          int trainer);
  // The segments trainers share with this rank.
  const SharedSegments& shared_segments() const { return shared_segments_; }
  // Drops `trainer`'s segment of `session` (AttachSharedMemoryRequest.release).
  void ReleaseSharedMemory(const Session& session, int trainer) {
    shared_segments_.Drop(session.id(), trainer);
  }

  // False once a session lost its group (a peer rank died), or while the device worker is
  // stalled (a task has run longer than options().device_watchdog): the rank should stop
  // serving.
  bool healthy() const;
  // As healthy(), but a session only interrupted by a lost peer (state redundancy: it waits for
  // the group to heal) keeps the rank live: what a liveness probe asks.
  bool live() const;

  // What the device worker runs now, for metrics.
  struct DeviceActivity {
    bool stalled = false;                               // the running task passed the watchdog
    absl::Duration running_for = absl::ZeroDuration();  // zero when idle
  };
  DeviceActivity device_activity() const;

  // Shutdown: from now on new Step streams are refused (UNAVAILABLE); steps already begun go on.
  void StopAcceptingSteps() { accepting_steps_ = false; }
  bool accepting_steps() const { return accepting_steps_; }

  const EngineOptions& options() const { return options_; }
  Device& device() { return *device_; }

  // Told (session id, resolution, step) when a session of this rank votes to abort a step past
  // its deadline (Session::Options::on_abort_vote); the rank group relays it to the other ranks.
  // Must not block. Null to stop; Set waits for calls in progress.
  using AbortVoteListener =
      std::function<void(const std::string& session_id, uint64_t resolution, uint64_t step)>;
  void SetAbortVoteListener(AbortVoteListener listener);

 private:
  Engine(EngineOptions options, std::shared_ptr<Device> device);
  // Every rank computes the same layout from the same definition: PartitionByCostAndMemory over
  // the parameters' step costs and owned bytes (cost_model.h).
  absl::StatusOr<Layout> LayoutOf(const SessionConfig& config) const;
  // RESOURCE_EXHAUSTED when `config` declares more than max_params_per_session parameters.
  absl::Status CheckParamCount(const SessionConfig& config) const;
  // Builds the replica: layout, admission (the session holds its reservation), communicator,
  // tensors. Does not register it.
  absl::StatusOr<std::shared_ptr<Session>> BuildSession(const std::string& id,
                                                        SessionConfig config);
  absl::StatusOr<Created> FindExistingLocked(const SessionConfig& config) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the session built unless one of the same id (or, with `by_name`, one FindExisting
  // answers) appeared meanwhile.
  absl::StatusOr<Created> Register(std::shared_ptr<Session> session, bool by_name);
  // The open sessions of `owner` on this rank, and the bytes it holds: what its sessions reserved
  // (closed ones still held by a call too, and its parts on a stand-in sharing this rank's
  // budget: MemoryBudget::HeldBy) and its trainers' shared memory.
  OwnerHoldings HoldingsOf(const std::string& owner) const ABSL_LOCKS_EXCLUDED(mu_);
  void WatchDeadlines();
  // Marks the device worker stalled while its running task has passed the watchdog, logging the
  // change (event=device_stalled / event=device_recovered).
  void WatchDevice(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void ReportCreated(const Session& session) const;

  // Shared with the sessions (which may outlive the engine).
  struct AbortVoteRelay {
    absl::Mutex mu;
    AbortVoteListener listener ABSL_GUARDED_BY(mu);
  };

  const EngineOptions options_;
  // Shared with the sessions, which may outlive the engine.
  std::shared_ptr<Device> device_;
  // The device worker: runs the device math of every session, one task at a time, the sessions'
  // queues in turn.
  std::shared_ptr<FairExecutor> device_worker_;
  const std::shared_ptr<AbortVoteRelay> abort_relay_ = std::make_shared<AbortVoteRelay>();
  const std::unique_ptr<SessionAdmission> admission_;
  SharedSegments shared_segments_;
  // AttachSharedMemory's check of the owner's share and its attach, one at a time. Taken before
  // mu_.
  absl::Mutex attach_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool device_stalled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread deadline_thread_;
  std::atomic<bool> accepting_steps_{true};
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_ENGINE_H_
