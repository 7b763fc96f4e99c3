#include "server/rpc/heal.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "checkpoint/state_dict.h"
#include "glog/logging.h"
#include "server/rpc/state_dict_stream.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

// A session as rank 0 recreates it on the rejoining rank.
struct SessionToHeal {
  std::shared_ptr<Session> session;
  v1::SessionSpec spec;
  uint64_t resolutions = 0;
};

absl::StatusOr<SessionToHeal> Describe(const std::shared_ptr<Session>& session) {
  SessionToHeal heal;
  heal.session = session;
  if (!heal.spec.ParseFromString(session->config().definition_key)) {
    return absl::InternalError(absl::StrCat("session '", session->id(), "': bad definition"));
  }
  heal.spec.set_name(session->config().name);
  // The resolutions rank 0 started (the group's count while no step runs: steps wait).
  heal.resolutions = session->resolutions_started();
  return heal;
}

// Regroup phase `phase` of generation `generation` on rank `r` (rank 0: its own group).
absl::Status RegroupOn(RankGroup* group, int r, v1::RegroupRequest request) {
  if (r == 0) return group->Regroup(request);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(group->options().timeout));
  v1::RegroupResponse response;
  return PeerStatus(r, group->Peer(r)->Regroup(&context, request, &response));
}

v1::RegroupRequest Phase(uint64_t generation, int rank, const std::string& address,
                         v1::RegroupRequest::Phase phase) {
  v1::RegroupRequest request;
  request.set_generation(generation);
  request.set_rank(rank);
  request.set_address(address);
  request.set_phase(phase);
  return request;
}

// The rejoining rank's replicas (in session id order) while every other rank rebuilds its
// communicators for the generation: each session's rendezvous meets all of them.
absl::Status RecreateEverywhere(RankGroup* group, int rank, const v1::RegroupRequest& rebuild,
                                const std::vector<SessionToHeal>& sessions) {
  std::vector<absl::Status> status(group->world_size());
  std::vector<std::thread> threads;
  for (int r = 0; r < group->world_size(); ++r) {
    threads.emplace_back([&, r] {
      if (r != rank) {
        status[r] = RegroupOn(group, r, rebuild);
        return;
      }
      for (const SessionToHeal& heal : sessions) {
        status[r] = group->CreateHealedReplica(rank, heal.session->id(), heal.spec,
                                               heal.session->config().owner, heal.resolutions);
        if (!status[r].ok()) return;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) OPTSTEP_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// Waits for a Session import (its DoneCallback).
absl::Status Imported(const std::function<void(Session::DoneCallback)>& start) {
  absl::Notification done;
  absl::Status status;
  start([&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

absl::Status Named(const Session& session, absl::string_view what, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("session '", session.id(), "': ", what, ": ", status.message()));
}

absl::StatusOr<uint64_t> Heal(Engine* engine, RankGroup* group, int rank,
                              const std::string& address, uint64_t generation) {
  std::vector<std::shared_ptr<Session>> live = engine->ListSessions();
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  std::vector<SessionToHeal> sessions;
  for (const std::shared_ptr<Session>& session : live) {
    OPTSTEP_ASSIGN_OR_RETURN(SessionToHeal heal, Describe(session));
    sessions.push_back(std::move(heal));
  }
  const absl::Time started = absl::Now();
  OPTSTEP_RETURN_IF_ERROR(RecreateEverywhere(
      group, rank, Phase(generation, rank, address, v1::RegroupRequest::PHASE_REBUILD), sessions));
  const absl::Time rebuilt = absl::Now();
  // The rank fetches each session's state from its peers itself.
  OPTSTEP_RETURN_IF_ERROR(
      RegroupOn(group, rank, Phase(generation, rank, address, v1::RegroupRequest::PHASE_TRANSFER)));
  LOG(INFO) << "event=rank_healed rank=" << rank << " generation=" << generation
            << " sessions=" << sessions.size()
            << " rebuild_s=" << absl::ToDoubleSeconds(rebuilt - started)
            << " transfer_s=" << absl::ToDoubleSeconds(absl::Now() - rebuilt);
  return generation;
}

}  // namespace

absl::StatusOr<uint64_t> HealRejoinedRank(Engine* engine, RankGroup* group, int rank,
                                          const std::string& address) {
  if (group->rank() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank 0 heals the group; this is rank ", group->rank()));
  }
  if (!group->options().heal || group->options().communicators == nullptr ||
      !engine->options().state_redundancy) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank,
                     " cannot rejoin: the group does not heal (--state_redundancy=0); it "
                     "restarts as a whole"));
  }
  if (rank <= 0 || rank >= group->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is not a rank that can rejoin a group of ", group->world_size()));
  }
  absl::MutexLock heal_lock(&group->heal_mu());
  // The rank rejoining may be counted lost (or not yet): any other lost peer means two are lost.
  if (group->lost_peers(/*except=*/rank) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " cannot rejoin: another rank is lost too (",
                     group->MembersStatus().message(), "); the group restarts as a whole"));
  }
  const uint64_t generation = group->generation() + 1;
  LOG(WARNING) << "event=rank_rejoining rank=" << rank << " address=" << address
               << " generation=" << generation;
  // Rank 0 learns the address first: it calls the rejoining rank through it.
  const v1::RegroupRequest begin =
      Phase(generation, rank, address, v1::RegroupRequest::PHASE_BEGIN);
  absl::Status begun = group->Regroup(begin);
  if (begun.ok()) {
    begun = group->ForEachRank(
        [&](int r) { return r == 0 ? absl::OkStatus() : RegroupOn(group, r, begin); });
  }
  absl::StatusOr<uint64_t> healed =
      begun.ok() ? Heal(engine, group, rank, address, generation) : begun;
  v1::RegroupRequest end = Phase(generation, rank, address, v1::RegroupRequest::PHASE_END);
  end.set_failed(!healed.ok());
  // Every other rank first, rank 0 last: trainers wait for rank 0 to serve before they redo a
  // step, and by then every rank takes it (a rank still healing would refuse it while the others
  // began resolving it, and wait for that rank in the collectives).
  const auto end_on = [&](int r) {
    absl::Status ended = RegroupOn(group, r, end);
    LOG_IF(WARNING, !ended.ok()) << "ending the heal of rank " << rank << " on rank " << r << ": "
                                 << ended;
    return absl::OkStatus();
  };
  (void)group->ForEachRank([&](int r) { return r == 0 ? absl::OkStatus() : end_on(r); });
  (void)end_on(0);
  if (healed.ok()) ResumeSessions(engine);
  if (!healed.ok()) {
    LOG(ERROR) << "event=rank_heal_failed rank=" << rank << " error=\"" << healed.status().message()
               << "\"";
    if (group->options().on_heal_failed) group->options().on_heal_failed(healed.status());
  }
  return healed;
}

absl::Status TakeStateFromPeers(Engine* engine, int rank, int world_size, const HealFetch& fetch) {
  const int buddy = (rank + 1) % world_size;
  const int predecessor = (rank + world_size - 1) % world_size;
  const int any = rank == 0 ? 1 : 0;
  std::vector<std::shared_ptr<Session>> sessions = engine->ListSessions();
  std::sort(sessions.begin(), sessions.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  for (const std::shared_ptr<Session>& session : sessions) {
    Session* s = session.get();
    // The masters first: this rank's own state then overwrites its block with its own.
    OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const StateDict> masters,
                             fetch(any, s->id(), HealPart::kMasters));
    OPTSTEP_RETURN_IF_ERROR(Named(
        *s, "importing the masters",
        Imported([&](Session::DoneCallback done) { s->ImportMasters(masters, std::move(done)); })));
    OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const StateDict> own,
                             fetch(buddy, s->id(), HealPart::kShadow));
    OPTSTEP_RETURN_IF_ERROR(Named(
        *s, absl::StrCat("importing its own state from rank ", buddy, "'s shadow"),
        Imported([&](Session::DoneCallback done) { s->ImportOwnedState(own, std::move(done)); })));
    OPTSTEP_RETURN_IF_ERROR(RefreshShadow(*s, rank, world_size, fetch));
    LOG(INFO) << "event=session_state_fetched session=" << s->id() << " rank=" << rank
              << " buddy=" << buddy << " predecessor=" << predecessor;
  }
  return absl::OkStatus();
}

absl::Status RefreshShadow(Session& session, int rank, int world_size, const HealFetch& fetch) {
  const int predecessor = (rank + world_size - 1) % world_size;
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const StateDict> shadow,
                           fetch(predecessor, session.id(), HealPart::kOwned));
  return Named(
      session, absl::StrCat("importing its shadow of rank ", predecessor),
      Imported([&](Session::DoneCallback done) { session.ImportShadow(shadow, std::move(done)); }));
}

HealFetch PeerFetch(RankGroup* group) {
  return [group](int peer, const std::string& session_id,
                 HealPart part) -> absl::StatusOr<std::shared_ptr<const StateDict>> {
    OPTSTEP_RETURN_IF_ERROR(group->EnsureAddress(peer));  // a rank knows few of them at first
    v1::PeerService::Stub& stub = *group->Peer(peer);
    v1::FetchStateRequest request;
    request.set_session_id(session_id);
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>> reader =
        part == HealPart::kOwned    ? stub.FetchOwnedState(&context, request)
        : part == HealPart::kShadow ? stub.FetchShadow(&context, request)
                                    : stub.FetchMasters(&context, request);
    StateDictAssembler assembler;
    OPTSTEP_RETURN_IF_ERROR(assembler.AddAll(
        *reader, [peer](const grpc::Status& end) { return PeerStatus(peer, end); }));
    return assembler.BuildPlain();
  };
}

void ResumeSessions(Engine* engine) {
  for (const std::shared_ptr<Session>& session : engine->ListSessions()) {
    session->ResumeAfterHeal();
  }
}

absl::StatusOr<uint64_t> RequestRejoin(RankGroup* group, const std::string& address,
                                       absl::Duration timeout) {
  OPTSTEP_RETURN_IF_ERROR(group->EnsureAddress(0));
  v1::RejoinRequest request;
  request.set_rank(group->rank());
  request.set_address(address);
  v1::RejoinResponse response;
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  OPTSTEP_RETURN_IF_ERROR(PeerStatus(0, group->Peer(0)->Rejoin(&context, request, &response)));
  return response.generation();
}

}  // namespace optstep
