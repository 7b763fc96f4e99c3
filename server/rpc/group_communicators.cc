#include "server/rpc/group_communicators.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace optstep {

std::string CommunicatorPrefix(uint64_t generation, const std::string& session_id) {
  return generation == 0 ? session_id : absl::StrCat("g", generation, "/", session_id);
}

absl::Status CommunicatorLink::With(const std::function<absl::Status(Communicator&)>& call) {
  std::unique_ptr<Communicator> broken;
  absl::MutexLock lock(&mu_);
  if (inner_ == nullptr) return closed_;
  absl::Status status = call(*inner_);
  // A peer lost (or a collective past its timeout) leaves the connection unusable: it closes at
  // once, so that a peer waiting for this rank in a collective fails there too, rather than at
  // its own timeout. The next collectives answer this error until the rebuild.
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) broken = CloseLocked(status);
  return status;
}

absl::Status CommunicatorLink::Replace(std::unique_ptr<Communicator> inner) {
  if (inner->rank() != rank_ || inner->world_size() != world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("a rebuilt communicator is rank ", inner->rank(),
                                                   " of ", inner->world_size(), ", not rank ",
                                                   rank_, " of ", world_size_));
  }
  std::unique_ptr<Communicator> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::exchange(inner_, std::move(inner));
  }
  return absl::OkStatus();  // `old` (its sockets to a lost peer) closes outside the lock
}

void CommunicatorLink::Close(absl::Status why) {
  std::unique_ptr<Communicator> old;
  {
    absl::MutexLock lock(&mu_);
    old = CloseLocked(std::move(why));
  }
  // `old` closes its sockets outside the lock.
}

std::unique_ptr<Communicator> CommunicatorLink::CloseLocked(absl::Status why) {
  closed_ = std::move(why);
  return std::exchange(inner_, nullptr);
}

absl::Status RebuildableCommunicator::AllReduce(void* data, int64_t count, CommDType dtype,
                                                ReduceOp op) {
  return link_->With([&](Communicator& c) { return c.AllReduce(data, count, dtype, op); });
}

absl::Status RebuildableCommunicator::AllGatherV(const void* send, int64_t send_count, void* recv,
                                                 const std::vector<int64_t>& recv_counts,
                                                 CommDType dtype) {
  return link_->With(
      [&](Communicator& c) { return c.AllGatherV(send, send_count, recv, recv_counts, dtype); });
}

absl::Status RebuildableCommunicator::Broadcast(void* data, int64_t count, CommDType dtype,
                                                int root) {
  return link_->With([&](Communicator& c) { return c.Broadcast(data, count, dtype, root); });
}

absl::Status RebuildableCommunicator::RingShift(const void* send, int64_t send_count, void* recv,
                                                int64_t recv_count, CommDType dtype) {
  return link_->With(
      [&](Communicator& c) { return c.RingShift(send, send_count, recv, recv_count, dtype); });
}

absl::Status RebuildableCommunicator::Barrier() {
  return link_->With([](Communicator& c) { return c.Barrier(); });
}

absl::StatusOr<std::unique_ptr<Communicator>> GroupCommunicators::Make(
    const std::string& session_id) {
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> inner,
                           connect_(CommunicatorPrefix(generation(), session_id)));
  const int rank = inner->rank(), world_size = inner->world_size();
  auto link = std::make_shared<CommunicatorLink>(std::move(inner));
  absl::MutexLock lock(&mu_);
  for (auto it = made_.begin(); it != made_.end();) {
    it = it->second.expired() ? made_.erase(it) : std::next(it);
  }
  made_[session_id] = link;
  return std::unique_ptr<Communicator>(
      std::make_unique<RebuildableCommunicator>(rank, world_size, std::move(link)));
}

void GroupCommunicators::SetGeneration(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  generation_ = generation;
}

uint64_t GroupCommunicators::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void GroupCommunicators::CloseAll(uint64_t generation, const absl::Status& why) {
  std::vector<std::shared_ptr<CommunicatorLink>> live;
  {
    absl::MutexLock lock(&mu_);
    if (generation != generation_) return;
    for (const auto& [id, weak] : made_) {
      if (std::shared_ptr<CommunicatorLink> link = weak.lock()) live.push_back(std::move(link));
    }
  }
  for (const std::shared_ptr<CommunicatorLink>& link : live) link->Close(why);
}

absl::Status GroupCommunicators::RebuildAll(uint64_t generation,
                                            const std::set<std::string>& sessions) {
  std::vector<std::pair<std::string, std::shared_ptr<CommunicatorLink>>> live, stale;
  {
    absl::MutexLock lock(&mu_);
    generation_ = generation;
    for (const auto& [id, weak] : made_) {
      std::shared_ptr<CommunicatorLink> link = weak.lock();
      if (link != nullptr) (sessions.count(id) != 0 ? live : stale).emplace_back(id, link);
    }
  }
  for (const auto& [id, link] : stale) {
    link->Close(absl::UnavailableError(
        absl::StrCat("session ", id, " is closed; its communicator was not rebuilt for generation ",
                     generation)));
  }
  for (const auto& [id, link] : live) {  // in id order, as on every rank
    absl::StatusOr<std::unique_ptr<Communicator>> inner =
        connect_(CommunicatorPrefix(generation, id));
    absl::Status rebuilt = inner.ok() ? link->Replace(*std::move(inner)) : inner.status();
    if (!rebuilt.ok()) {
      return absl::Status(rebuilt.code(), absl::StrCat("session ", id,
                                                       ": rebuilding its communicator for "
                                                       "generation ",
                                                       generation, ": ", rebuilt.message()));
    }
    LOG(INFO) << "event=communicator_rebuilt session=" << id << " generation=" << generation;
  }
  return absl::OkStatus();
}

}  // namespace optstep
