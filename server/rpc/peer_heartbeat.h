#ifndef OPTSTEP_SERVER_RPC_PEER_HEARTBEAT_H_
#define OPTSTEP_SERVER_RPC_PEER_HEARTBEAT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "server/rpc/peer_liveness.h"

namespace optstep {

// One rank's heartbeats to the other ranks of its group, on a thread of its own: every
// `interval`, one PeerService.Ping to every peer whose address is known, all at once, each with
// `interval` as its deadline. The answers go to a PeerLiveness, which starts watching a peer when
// its stub is first had, and learns the process behind each answer; a peer it finds lost is
// reported to `on_lost` (on the heartbeat thread). A round that ended well past its deadline
// (twice the interval) was this process's own stall (a paused machine or container, a starved
// thread): its missing answers say nothing of the peers, and no peer is judged on it unless the
// round before stalled too. Thread-safe. The liveness and the stubs must outlive it.
class PeerHeartbeat {
 public:
  struct Options {
    int rank = 0;
    int world_size = 1;
    absl::Duration interval = absl::Seconds(1);
    // Told when an answer of rank 0 says that the group formed (on the heartbeat thread); may be
    // null.
    std::function<void()> on_group_formed;
    // Whether this rank knows that its group formed, told in every ping
    // (PingRequest.knows_group_formed); may be null (false).
    std::function<bool()> knows_group_formed;
    // Told of each answer of rank 1: where it stands in for a lost rank 0 (empty: nowhere), on the
    // heartbeat thread; may be null.
    std::function<void(const std::string& address)> on_rank_zero_stand_in;
    // Told of each answer of rank 0: its group generation, and whether it heals into it (on the
    // heartbeat thread); may be null.
    std::function<void(uint64_t generation, bool healing)> on_rank_zero_heal;
    // Where this rank's group keeps its rendezvous store now, when not at the configured address
    // (a stand-in for rank 0 serves it; empty otherwise), told in every ping
    // (PingRequest.rendezvous); may be null.
    std::function<std::string()> rendezvous;
    // The time (absl::Now when null; tests pass a clock of their own).
    std::function<absl::Time()> clock;
  };
  // The stub that calls peer `peer`, or null while its address is unknown. Called on the
  // heartbeat thread; may block for about `interval`.
  using StubOf = std::function<v1::PeerService::Stub*(int peer)>;
  using OnLost = std::function<void(const PeerLiveness::LostPeer& lost)>;

  // Starts the heartbeat thread.
  PeerHeartbeat(Options options, PeerLiveness* liveness, StubOf stub_of, OnLost on_lost);
  // Stop().
  ~PeerHeartbeat();
  PeerHeartbeat(const PeerHeartbeat&) = delete;
  PeerHeartbeat& operator=(const PeerHeartbeat&) = delete;

  // Ends the heartbeats and joins the thread (a round in flight ends within `interval`); from
  // now on no peer is judged by this rank. Idempotent.
  void Stop();
  // Stop(), then tells every watched peer that this rank shuts down on purpose (a Ping with
  // `leaving`), waiting at most `interval` for their answers.
  void AnnounceLeaving();

 private:
  // Pings every peer of `peers` at once, each with deadline `interval`; answers, by position,
  // the answer of each that answered, nullopt for the others.
  std::vector<std::optional<v1::PingResponse>> PingAll(
      const std::vector<v1::PeerService::Stub*>& peers, bool leaving) const;
  void Run();
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }

  const Options options_;
  PeerLiveness* const liveness_;
  const StubOf stub_of_;
  const OnLost on_lost_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PEER_HEARTBEAT_H_
