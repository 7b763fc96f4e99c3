#ifndef OPTSTEP_SERVER_RPC_GROUP_COMMUNICATORS_H_
#define OPTSTEP_SERVER_RPC_GROUP_COMMUNICATORS_H_

// The sessions' communicators of one rank, rebuilt when the group heals (docs/deploy.md,
// "Failure handling"). Interface for the heal:
//   GroupCommunicators::Make(session id)      the engine's make_communicator
//   GroupCommunicators::SetGeneration(g)      communicators made from now on rendezvous in g
//   GroupCommunicators::RebuildAll(g)         every live session's communicator reconnects in g
// Generation g's store keys are prefixed "g<g>/" (generation 0, the group as first formed, has
// no prefix), so that a new generation never meets the connection entries of an older one.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/comm/communicator.h"

namespace optstep {

// The store prefix of `session_id`'s communicator in generation `generation`.
std::string CommunicatorPrefix(uint64_t generation, const std::string& session_id);

// The connection behind a RebuildableCommunicator, shared with the GroupCommunicators that may
// replace it. Collectives and Replace are serialised: a collective waits while a rebuild swaps
// the connection. Thread-safe.
class CommunicatorLink {
 public:
  explicit CommunicatorLink(std::unique_ptr<Communicator> inner)
      : rank_(inner->rank()), world_size_(inner->world_size()), inner_(std::move(inner)) {}
  // Runs `call` on the current connection, holding it; once closed, answers why. A call that
  // fails UNAVAILABLE (a peer lost) or DEADLINE_EXCEEDED closes the connection (Close).
  absl::Status With(const std::function<absl::Status(Communicator&)>& call);
  // Replaces the connection with `inner` (same rank and world size: INVALID_ARGUMENT otherwise).
  absl::Status Replace(std::unique_ptr<Communicator> inner);
  // Closes the connection (after a running collective ended): its sockets close, so that a peer
  // still waiting for this rank in a collective fails there. Collectives answer `why` until
  // Replace.
  void Close(absl::Status why);

 private:
  // Answers the connection (for the caller to destroy outside the lock); collectives answer
  // `why` from now on.
  std::unique_ptr<Communicator> CloseLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int rank_;
  const int world_size_;
  absl::Mutex mu_;
  std::unique_ptr<Communicator> inner_ ABSL_GUARDED_BY(mu_);  // null once closed
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

// A communicator whose connection can be replaced between collectives (CommunicatorLink): the
// session keeps this object while the group re-forms around a restarted rank. Thread-compatible
// as any Communicator.
class RebuildableCommunicator final : public Communicator {
 public:
  RebuildableCommunicator(int rank, int world_size, std::shared_ptr<CommunicatorLink> link)
      : rank_(rank), world_size_(world_size), link_(std::move(link)) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override;
  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override;
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override;
  absl::Status Barrier() override;

 private:
  const int rank_;
  const int world_size_;
  const std::shared_ptr<CommunicatorLink> link_;
};

// Makes the sessions' communicators of one rank and rebuilds them for a new generation.
// Thread-safe.
class GroupCommunicators {
 public:
  // Connects a communicator whose store keys start with `prefix` (blocks for the rendezvous).
  using Connect =
      std::function<absl::StatusOr<std::unique_ptr<Communicator>>(const std::string& prefix)>;
  explicit GroupCommunicators(Connect connect) : connect_(std::move(connect)) {}

  // The communicator of session `session_id` in the current generation.
  absl::StatusOr<std::unique_ptr<Communicator>> Make(const std::string& session_id);
  void SetGeneration(uint64_t generation);
  uint64_t generation() const;
  // Sets the generation, then reconnects the communicator of each of `sessions` (the rank's
  // open sessions) still in use, in session id order (every rank rebuilds the same sessions in
  // the same order: each rendezvous waits for all ranks). The first error, naming the session.
  // The link of a session not among them (closed, but still held by a call that has yet to end)
  // is closed for good: the rank healed in has no such session, and its rendezvous would wait
  // for that rank until the timeout.
  absl::Status RebuildAll(uint64_t generation, const std::set<std::string>& sessions);
  // Closes every session's connection (CommunicatorLink::Close) until RebuildAll: a heal's first
  // phase, once no resolution runs here. A collective that the loss cut can wait on a rank that
  // survived, not on the lost one (a ring waits on its neighbours only); without this it would
  // wait until the collective timeout, and the heal with it. Only while the generation is still
  // `generation`: a later heal's connections are not the ones to close.
  void CloseAll(uint64_t generation, const absl::Status& why);

 private:
  const Connect connect_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // By session id; a session that closed leaves an expired link (dropped at the next Make).
  std::map<std::string, std::weak_ptr<CommunicatorLink>> made_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_GROUP_COMMUNICATORS_H_
