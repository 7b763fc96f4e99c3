#include "server/rpc/peer_liveness.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace optstep {
namespace {

constexpr char kWhatToDo[] =
    "restart the group (every rank) and resume the sessions from their last checkpoints";

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

void PeerLiveness::Answered(int peer, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (peers_[peer].state == State::kAlive) peers_[peer].last_answer = now;
}

bool PeerLiveness::Left(int peer) {
  absl::MutexLock lock(&mu_);
  if (peer == rank_ || peers_[peer].state == State::kLeft || peers_[peer].state == State::kLost) {
    return false;
  }
  peers_[peer].state = State::kLeft;
  Fail(absl::UnavailableError(
      absl::StrCat("rank ", peer, " left the group (it was shut down); ", kWhatToDo)));
  return true;
}

std::vector<PeerLiveness::LostPeer> PeerLiveness::Check(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<LostPeer> lost;
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    Peer& peer = peers_[r];
    const absl::Duration silent = now - peer.last_answer;
    if (peer.state != State::kAlive || silent <= timeout_) continue;
    peer.state = State::kLost;
    lost.push_back(
        {r, absl::UnavailableError(absl::StrFormat("rank %d lost (no heartbeat for %.1f s); %s", r,
                                                   absl::ToDoubleSeconds(silent), kWhatToDo))});
    Fail(lost.back().why);
    if (!lost_.has_value()) lost_ = lost.back().why;
  }
  return lost;
}

absl::Status PeerLiveness::status() const {
  absl::MutexLock lock(&mu_);
  return failed_.value_or(absl::OkStatus());
}

absl::Status PeerLiveness::lost_status() const {
  absl::MutexLock lock(&mu_);
  return lost_.value_or(absl::OkStatus());
}

void PeerLiveness::Fail(absl::Status status) {
  if (!failed_.has_value()) failed_ = std::move(status);
}

}  // namespace optstep
