#include "server/rpc/peer_liveness.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace optstep {
namespace {

// Both ways out: which one the group takes depends on its --state_redundancy, not known here.
constexpr char kWhatToDo[] =
    "restart that rank with its ordinal (a group with state redundancy heals it in), or restart "
    "the group (every rank) and resume the sessions from their last checkpoints";

}  // namespace

PeerLiveness::PeerLiveness(int rank, int world_size, absl::Duration timeout)
    : rank_(rank), timeout_(timeout), peers_(world_size) {}

void PeerLiveness::Watch(int peer, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (peer == rank_ || peers_[peer].state != State::kUnwatched) return;
  peers_[peer].state = State::kAlive;
  peers_[peer].last_answer = now;
}

bool PeerLiveness::watched(int peer) const {
  absl::MutexLock lock(&mu_);
  return peers_[peer].state != State::kUnwatched;
}

void PeerLiveness::Answered(int peer, absl::Time now, uint64_t incarnation, absl::Time asked) {
  absl::MutexLock lock(&mu_);
  Peer& p = peers_[peer];
  if (p.state != State::kAlive || asked < p.rejoined) return;
  if (incarnation != 0 && p.incarnation != 0 && incarnation != p.incarnation) {
    p.state = State::kLost;
    p.why = absl::UnavailableError(
        absl::StrCat("rank ", peer, " lost (it restarted: a new process answers); ", kWhatToDo));
    p.failure = ++failures_;
    unreported_.push_back({peer, p.why});
    return;
  }
  if (incarnation != 0) p.incarnation = incarnation;
  p.last_answer = now;
}

bool PeerLiveness::Left(int peer) {
  absl::MutexLock lock(&mu_);
  if (peer == rank_ || peers_[peer].state == State::kLeft || peers_[peer].state == State::kLost) {
    return false;
  }
  peers_[peer].state = State::kLeft;
  peers_[peer].why = absl::UnavailableError(
      absl::StrCat("rank ", peer, " left the group (it was shut down); ", kWhatToDo));
  peers_[peer].failure = ++failures_;
  return true;
}

void PeerLiveness::Lose(int peer, absl::Status why) {
  absl::MutexLock lock(&mu_);
  Peer& p = peers_[peer];
  if (peer == rank_ || p.state == State::kLost || p.state == State::kLeft) return;
  p.state = State::kLost;
  p.why = std::move(why);
  p.failure = ++failures_;
  unreported_.push_back({peer, p.why});
}

void PeerLiveness::Rejoined(int peer, absl::Time now, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (peer == rank_) return;
  // A loss not yet reported (unreported_) stays to be reported: it happened.
  peers_[peer] = Peer{State::kAlive, now, absl::OkStatus()};
  peers_[peer].incarnation = incarnation;
  peers_[peer].rejoined = now;
}

bool PeerLiveness::failed(int peer) const {
  absl::MutexLock lock(&mu_);
  return peers_[peer].state == State::kLost || peers_[peer].state == State::kLeft;
}

int PeerLiveness::lost_count(int except) const {
  absl::MutexLock lock(&mu_);
  int lost = 0;
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    lost += r != except && (peers_[r].state == State::kLost || peers_[r].state == State::kLeft);
  }
  return lost;
}

std::vector<PeerLiveness::LostPeer> PeerLiveness::Check(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<LostPeer> lost;
  lost.swap(unreported_);
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    Peer& peer = peers_[r];
    const absl::Duration silent = now - peer.last_answer;
    if (peer.state != State::kAlive || silent <= timeout_) continue;
    peer.state = State::kLost;
    peer.why = absl::UnavailableError(absl::StrFormat("rank %d lost (no heartbeat for %.1f s); %s",
                                                      r, absl::ToDoubleSeconds(silent), kWhatToDo));
    peer.failure = ++failures_;
    lost.push_back({r, peer.why});
  }
  std::stable_sort(lost.begin(), lost.end(),
                   [](const LostPeer& a, const LostPeer& b) { return a.rank < b.rank; });
  return lost;
}

absl::Status PeerLiveness::FirstFailure(std::initializer_list<State> states) const {
  const Peer* first = nullptr;
  for (const Peer& peer : peers_) {
    const bool failed = std::find(states.begin(), states.end(), peer.state) != states.end();
    if (failed && (first == nullptr || peer.failure < first->failure)) first = &peer;
  }
  return first == nullptr ? absl::OkStatus() : first->why;
}

absl::Status PeerLiveness::status() const {
  absl::MutexLock lock(&mu_);
  return FirstFailure({State::kLost, State::kLeft});
}

absl::Status PeerLiveness::lost_status() const {
  absl::MutexLock lock(&mu_);
  return FirstFailure({State::kLost});
}

}  // namespace optstep
