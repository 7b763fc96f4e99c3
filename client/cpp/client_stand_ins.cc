// The Client's part in a group that stands in for a lost rank (docs/deploy.md, "A rank that does
// not return"): which channel reaches a rank now, following the stand-ins the group tells of, and
// the connect that looks a rank up with another rank when its own address does not answer (rank
// 0, or any other for rank 0).

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "client/cpp/client_rank.h"
#include "wire/grpc_status.h"

namespace optstep {

namespace {

// How long FirstReady watches a channel before it looks again: once one is ready, the others'
// watches end within it.
constexpr absl::Duration kWatchSlice = absl::Milliseconds(100);

// The first of `channels` found ready by `deadline`; none when none is. All are watched on one
// completion queue, which polls them: a channel's connection does not move on otherwise.
std::optional<size_t> FirstReady(const std::vector<grpc::Channel*>& channels, absl::Time deadline) {
  grpc::CompletionQueue queue;
  std::optional<size_t> ready;
  size_t watching = 0;
  const auto watch = [&](size_t r) {
    const grpc_connectivity_state state = channels[r]->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) {
      ready = r;
      return;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return;
    channels[r]->NotifyOnStateChange(state,
                                     absl::ToChronoTime(std::min(deadline, now + kWatchSlice)),
                                     &queue, reinterpret_cast<void*>(r));
    ++watching;
  };
  for (size_t r = 0; r < channels.size() && !ready; ++r) watch(r);
  void* tag = nullptr;
  bool changed = false;
  while (watching > 0 && queue.Next(&tag, &changed)) {
    --watching;
    if (!ready) watch(reinterpret_cast<size_t>(tag));
  }
  queue.Shutdown();
  while (queue.Next(&tag, &changed)) {
  }
  return ready;
}

}  // namespace

absl::Status Client::AwaitRanks() {
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  std::vector<grpc::Channel*> channels;
  for (const auto& rank : ranks_) channels.push_back(rank->channel.get());
  // The first rank to answer tells where the group serves a rank that is stood in for (every
  // rank knows), whose own address would not answer within the timeout; only a group of several
  // ranks has any.
  if (ranks_.size() > 1) {
    if (std::optional<size_t> first = FirstReady(channels, deadline)) {
      absl::StatusOr<v1::ListSessionsResponse> told =
          AskDirectory(*ranks_[*first], std::min(options_.rpc_timeout, deadline - absl::Now()));
      // A group still forming (or of an earlier release) may not say: the ranks are waited for
      // at their own addresses, then looked up again (ConnectStandIns).
      if (told.ok()) FollowStandIns(told->rank_targets(), told->stood_in_ranks());
    }
  }
  std::vector<size_t> unreachable;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    // Told of a stand-in, the rank is served by whichever answers first: its own process may be
    // back already (the directory lags behind a stand-in that gave way).
    std::vector<grpc::Channel*> serving = {ranks_[r]->channel.get()};
    const std::shared_ptr<Rank> stand_in = Reach(r);
    if (stand_in != ranks_[r]) serving.push_back(stand_in->channel.get());
    const std::optional<size_t> first = FirstReady(serving, deadline);
    if (!first) unreachable.push_back(r);
    if (first == 0 && serving.size() > 1) ForgetStandIn(r);
  }
  return unreachable.empty() ? absl::OkStatus() : ConnectStandIns(unreachable);
}

absl::Status Client::ConnectStandIns(const std::vector<size_t>& unreachable) {
  auto not_reached = [this](size_t r, absl::string_view why) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to rank ", r, " at '", ranks_[r]->target, "' within ",
                     absl::FormatDuration(options_.connect_timeout), why));
  };
  // Rank 0 knows whether the group serves a rank elsewhere; any other rank knows it of rank 0.
  size_t asked = 0;
  while (asked < ranks_.size() &&
         std::find(unreachable.begin(), unreachable.end(), asked) != unreachable.end()) {
    ++asked;
  }
  if (asked == ranks_.size()) return not_reached(0, "");
  absl::StatusOr<v1::ListSessionsResponse> told = AskDirectory(*Reach(asked), options_.rpc_timeout);
  if (!told.ok()) {
    return not_reached(unreachable.front(),
                       absl::StrCat(", and rank ", asked,
                                    " could not say where it is: ", told.status().message()));
  }
  FollowStandIns(told->rank_targets(), told->stood_in_ranks());
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  for (size_t r : unreachable) {
    std::shared_ptr<Rank> rank = Reach(r);
    if (rank == ranks_[r]) return not_reached(r, ", and no stand-in serves it");
    if (!rank->channel->WaitForConnected(absl::ToChronoTime(deadline))) {
      return not_reached(r, absl::StrCat(", nor its stand-in at '", rank->target, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ListSessionsResponse> Client::AskDirectory(Rank& rank, absl::Duration timeout) {
  grpc::ClientContext context;
  // Not waiting for a channel that is not ready: the rank asked may be the one away.
  Prepare(context, timeout, /*wait_for_ready=*/false);
  v1::ListSessionsRequest request;
  request.set_page_size(1);
  v1::ListSessionsResponse response;
  OPTSTEP_RETURN_IF_ERROR(FromGrpcStatus(rank.service->ListSessions(&context, request, &response)));
  return response;
}

absl::Status Client::OnRank(size_t rank, const std::function<absl::Status(Rank& rank)>& call,
                            absl::Time deadline) {
  return OnRanks(
      {rank}, [&] { return call(*Reach(rank)); }, deadline);
}

absl::Status Client::OnRanks(const std::vector<size_t>& ranks,
                             const std::function<absl::Status()>& call, absl::Time deadline) {
  const auto reached = [&] {
    std::vector<std::shared_ptr<Rank>> now;
    for (size_t r : ranks) now.push_back(Reach(r));
    return now;
  };
  const std::vector<std::shared_ptr<Rank>> before = reached();
  absl::Status status = call();
  // Once more where the other ranks say the ranks are served now, if that is elsewhere for one
  // (a call that waits for the channel to be ready ends at its deadline instead). CANCELLED,
  // which this client never asks of these calls, comes from a server that stops: a stand-in
  // giving way to the rank's own process.
  const bool away = absl::IsUnavailable(status) || absl::IsCancelled(status) ||
                    (options_.wait_for_ready && absl::IsDeadlineExceeded(status));
  if (!away || !LookUpRankZero(deadline).ok()) return status;
  const std::vector<std::shared_ptr<Rank>> after = reached();
  if (after == before) return status;
  // A rank back at its own address: its channel failed to connect while the rank was away, and
  // waits out its reconnect backoff; a call made meanwhile fails at once.
  for (const std::shared_ptr<Rank>& rank : after) {
    grpc::experimental::ChannelResetConnectionBackoff(rank->channel.get());
  }
  return call();
}

absl::Status Client::LookUpRankZero(absl::Time deadline) {
  // The other ranks first, each at its own address or at its stand-in's: they know where rank 0
  // is served. Rank 0's own address last (with no other rank): a process of rank 0 that is back
  // but has not healed itself in yet knows no stand-in, and answers nothing useful.
  absl::Status last = absl::UnavailableError("no rank answered");
  for (size_t i = 1; i <= ranks_.size(); ++i) {
    const size_t r = i % ranks_.size();
    absl::StatusOr<v1::ListSessionsResponse> told =
        AskDirectory(r == 0 ? *ranks_[0] : *Reach(r), TimeoutBy(deadline));
    if (!told.ok()) {
      last = told.status();
      continue;
    }
    FollowStandIns(told->rank_targets(), told->stood_in_ranks());
    return absl::OkStatus();
  }
  return last;
}

void Client::ForgetStandIn(size_t rank) {
  absl::MutexLock lock(&mu_);
  stand_ins_.erase(static_cast<uint32_t>(rank));
}

std::shared_ptr<Client::Rank> Client::Reach(size_t rank) {
  absl::MutexLock lock(&mu_);
  auto it = stand_ins_.find(static_cast<uint32_t>(rank));
  return it != stand_ins_.end() ? it->second : ranks_[rank];
}

void Client::FollowStandIns(const google::protobuf::RepeatedPtrField<std::string>& rank_targets,
                            const google::protobuf::RepeatedField<uint32_t>& stood_in_ranks) {
  absl::flat_hash_map<uint32_t, std::string> told;
  for (uint32_t rank : stood_in_ranks) {
    if (rank < ranks_.size() && rank < static_cast<uint32_t>(rank_targets.size())) {
      told[rank] = rank_targets.Get(static_cast<int>(rank));
    }
  }
  absl::MutexLock lock(&mu_);
  for (auto it = stand_ins_.begin(); it != stand_ins_.end();) {
    auto now = told.find(it->first);
    if (now == told.end() || now->second != it->second->target) {
      stand_ins_.erase(it++);
    } else {
      ++it;
    }
  }
  for (const auto& [rank, target] : told) {
    if (!stand_ins_.contains(rank)) stand_ins_[rank] = open_rank_(target);
  }
}

}  // namespace optstep
