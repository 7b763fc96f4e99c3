#include "server/rpc/peer_heartbeat.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace optstep {

PeerHeartbeat::PeerHeartbeat(Options options, PeerLiveness* liveness, StubOf stub_of,
                             OnLost on_lost)
    : options_(options),
      liveness_(liveness),
      stub_of_(std::move(stub_of)),
      on_lost_(std::move(on_lost)) {
  thread_ = std::thread([this] { Run(); });
}

PeerHeartbeat::~PeerHeartbeat() { Stop(); }

void PeerHeartbeat::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PeerHeartbeat::AnnounceLeaving() {
  Stop();
  std::vector<v1::PeerService::Stub*> peers;
  for (int r = 0; r < options_.world_size; ++r) {
    if (r != options_.rank && liveness_->watched(r)) peers.push_back(stub_of_(r));
  }
  (void)PingAll(peers, /*leaving=*/true);
}

std::vector<std::optional<v1::PingResponse>> PeerHeartbeat::PingAll(
    const std::vector<v1::PeerService::Stub*>& peers, bool leaving) const {
  struct Call {
    grpc::ClientContext context;
    v1::PingRequest request;
    v1::PingResponse response;
    bool answered = false;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  size_t pending = 0;
  const std::string rendezvous = options_.rendezvous ? options_.rendezvous() : std::string();
  const bool knows_formed = options_.knows_group_formed && options_.knows_group_formed();
  for (v1::PeerService::Stub* peer : peers) {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.interval));
    call->request.set_rank(options_.rank);
    call->request.set_leaving(leaving);
    call->request.set_rendezvous(rendezvous);
    call->request.set_knows_group_formed(knows_formed);
    {
      absl::MutexLock lock(&mu);
      ++pending;
    }
    // The callback runs on a gRPC thread: it only records the answer.
    peer->async()->Ping(&call->context, &call->request, &call->response,
                        [&mu, &pending, answered = &call->answered](grpc::Status status) {
                          absl::MutexLock lock(&mu);
                          *answered = status.ok();
                          --pending;
                        });
    calls.push_back(std::move(call));
  }
  // Every call has a deadline, so this ends; the calls' state lives until their callbacks ran.
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](size_t* left) { return *left == 0; }, &pending));
  std::vector<std::optional<v1::PingResponse>> answered;
  for (const auto& call : calls) {
    answered.push_back(call->answered ? std::optional<v1::PingResponse>(std::move(call->response))
                                      : std::nullopt);
  }
  return answered;
}

void PeerHeartbeat::Run() {
  absl::Time next = absl::Now();
  bool stalled_before = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline(absl::Condition(&stopping_), next)) return;
    }
    next += options_.interval;
    // Before the stubs are chosen: a ping through a stub chosen before a rank rejoined reaches
    // the process it replaced, and must count as asked before the rejoin (PeerLiveness::Answered
    // ignores its answer).
    const absl::Time asked = Now();
    std::vector<int> ranks;
    std::vector<v1::PeerService::Stub*> peers;
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == options_.rank) continue;
      v1::PeerService::Stub* peer = stub_of_(r);
      if (peer == nullptr) continue;  // not yet known: not yet watched
      liveness_->Watch(r, Now());
      ranks.push_back(r);
      peers.push_back(peer);
    }
    const std::vector<std::optional<v1::PingResponse>> answered = PingAll(peers, /*leaving=*/false);
    const absl::Time now = Now();
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!answered[i].has_value()) continue;
      liveness_->Answered(ranks[i], now, answered[i]->incarnation(), asked);
      if (ranks[i] == 0 && answered[i]->group_formed() && options_.on_group_formed) {
        options_.on_group_formed();
      }
      if (ranks[i] == 0 && options_.on_rank_zero_heal) {
        options_.on_rank_zero_heal(answered[i]->generation(), answered[i]->healing());
      }
      if (ranks[i] == 1 && options_.on_rank_zero_stand_in) {
        options_.on_rank_zero_stand_in(answered[i]->rank_zero_stand_in());
      }
    }
    // The calls' deadlines end a round within about the interval: one that took much longer
    // stalled here, the peers' answers waiting unread. Judged at the next round, which then
    // starts at once (a dead peer is lost one round later), unless that one stalls too.
    const bool stalled = now - asked > 2 * options_.interval && !stalled_before;
    stalled_before = stalled;
    // A round that overran starts the next one at once rather than catching up.
    next = std::max(next, absl::Now());
    if (stalled) {
      LOG(WARNING) << "event=heartbeat_stalled took_s=" << absl::ToDoubleSeconds(now - asked)
                   << " this rank's heartbeat round stalled; no peer is judged on it";
      continue;
    }
    for (const PeerLiveness::LostPeer& lost : liveness_->Check(now)) on_lost_(lost);
  }
}

}  // namespace optstep
