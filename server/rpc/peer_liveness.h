#ifndef OPTSTEP_SERVER_RPC_PEER_LIVENESS_H_
#define OPTSTEP_SERVER_RPC_PEER_LIVENESS_H_

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace optstep {

// Which peers of one rank are still there, judged from the answers to its heartbeats
// (PeerHeartbeat). A peer is watched from the time this rank learns its address (a rank publishes
// its address only once it listens); it is lost once it has not answered for `timeout`, and gone
// once it said that it shuts down on purpose, and lost at once when its answers come from another
// process than before (it restarted within the timeout: each answer carries the process's
// incarnation). Either lasts until the rank rejoins the group
// (Rejoined: a restarted rank healed into it); otherwise the group has to be restarted.
// The time is passed in, never read here.
// Thread-safe.
class PeerLiveness {
 public:
  PeerLiveness(int rank, int world_size, absl::Duration timeout);

  // Starts watching peer `peer` at `now`; nothing when it is watched already.
  void Watch(int peer, absl::Time now);
  bool watched(int peer) const;
  // Peer `peer` answered a heartbeat at `now`, from its process `incarnation` (0: unknown). An
  // answer from another process than the earlier answers makes the peer lost (reported by the
  // next Check). `asked`: when the heartbeat was sent; an answer to one sent before the peer
  // last rejoined is ignored, since the process it replaced may have sent it (a stand-in serves
  // until its rank's own process has healed in).
  void Answered(int peer, absl::Time now, uint64_t incarnation = 0,
                absl::Time asked = absl::InfiniteFuture());
  // Peer `peer` said it shuts down on purpose. True the first time.
  bool Left(int peer);
  // Peer `peer` is lost for `why` (UNAVAILABLE), whatever its heartbeats say: its heal failed, so
  // its process, which may still answer, holds no state to take part with. Reported by the next
  // Check, as a loss found there; lasts until it rejoins. Nothing when it is lost or gone already.
  void Lose(int peer, absl::Status why);
  // Peer `peer` (restarted) rejoined the group at `now`, as its process `incarnation` (0: learnt
  // from its next answer): it is watched as alive again, and an answer from another process
  // (the rejoin failed and it restarted again) loses it at once.
  void Rejoined(int peer, absl::Time now, uint64_t incarnation = 0);
  // How many peers other than `except` are lost or gone now.
  int lost_count(int except = -1) const;
  // Whether peer `peer` is lost or gone now.
  bool failed(int peer) const;
  // The watched peers that, at `now`, have not answered for longer than the timeout, or whose
  // process changed, and were not reported before, in rank order, each with its UNAVAILABLE
  // status; each turns lost.
  struct LostPeer {
    int rank;
    absl::Status why;
  };
  std::vector<LostPeer> Check(absl::Time now);

  // OK while no peer is lost or gone; else UNAVAILABLE naming the first one, and what to do.
  absl::Status status() const;
  // OK while no peer is lost (a peer that is gone does not count); else UNAVAILABLE naming the
  // first one lost, and what to do.
  absl::Status lost_status() const;

 private:
  enum class State { kUnwatched, kAlive, kLost, kLeft };
  struct Peer {
    State state = State::kUnwatched;
    absl::Time last_answer;
    absl::Status why;          // kLost, kLeft: what status() answers
    uint64_t failure = 0;      // kLost, kLeft: the order of the failure, the first one answered
    uint64_t incarnation = 0;  // of the process that answered (0: none known yet)
    absl::Time rejoined = absl::InfinitePast();  // when it last rejoined
  };

  // The status of the first failed peer of `states`, by the order of the failures; OK for none.
  absl::Status FirstFailure(std::initializer_list<State> states) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int rank_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::vector<Peer> peers_ ABSL_GUARDED_BY(mu_);
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  // Peers lost on an answer from a new process, for the next Check to report (also when they
  // rejoined meanwhile).
  std::vector<LostPeer> unreported_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PEER_LIVENESS_H_
