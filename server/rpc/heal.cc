#include "server/rpc/heal.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "checkpoint/state_dict.h"
#include "glog/logging.h"
#include "server/rpc/convert.h"
#include "server/rpc/heal_calls.h"
#include "server/rpc/state_dict_stream.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

// A session as a healed rank recreates it: its id, definition, name, owner, the request id that
// created it, and the resolutions this rank started (the group's count while no step runs: steps
// wait during a heal).
absl::StatusOr<v1::CreateReplicaRequest> Describe(const Session& session) {
  v1::CreateReplicaRequest replica;
  replica.set_session_id(session.id());
  if (!replica.mutable_spec()->ParseFromString(session.config().definition_key)) {
    return absl::InternalError(absl::StrCat("session '", session.id(), "': bad definition"));
  }
  replica.mutable_spec()->set_name(session.config().name);
  replica.set_owner(session.config().owner);
  replica.set_request_id(session.config().request_id);
  replica.set_resolutions(session.resolutions_started());
  return replica;
}

std::vector<std::shared_ptr<Session>> SessionsById(Engine* engine) {
  std::vector<std::shared_ptr<Session>> sessions = engine->ListSessions();
  std::sort(sessions.begin(), sessions.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return sessions;
}

// Every session of this rank, in id order, as Describe answers it.
absl::StatusOr<std::vector<v1::CreateReplicaRequest>> DescribeAll(Engine* engine) {
  std::vector<v1::CreateReplicaRequest> replicas;
  for (const std::shared_ptr<Session>& session : SessionsById(engine)) {
    OPTSTEP_ASSIGN_OR_RETURN(v1::CreateReplicaRequest replica, Describe(*session));
    replicas.push_back(std::move(replica));
  }
  return replicas;
}

// The rejoining rank's replicas (in session id order) while every other rank rebuilds its
// communicators for the generation: each session's rendezvous meets all of them.
absl::Status RecreateEverywhere(Engine* engine, RankGroup* group, int rank,
                                const v1::RegroupRequest& rebuild,
                                const std::vector<v1::CreateReplicaRequest>& sessions) {
  std::vector<absl::Status> status(group->world_size());
  std::vector<std::thread> threads;
  for (int r = 0; r < group->world_size(); ++r) {
    threads.emplace_back([&, r] {
      if (r != rank) {
        status[r] = RegroupOn(group, r, rebuild);
        return;
      }
      for (const v1::CreateReplicaRequest& replica : sessions) {
        // Rank 0 healing itself makes its replicas here.
        status[r] = rank == group->rank() ? CreateReplicaHere(engine, replica, group->generation())
                                          : group->CreateReplicaOn(rank, replica);
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

// PeerService.ListReplicas on rank `r`: its sessions' ids and resolutions, or with `session_id`
// that session's whole description (one answer for every session could outgrow a peer message).
// A rank not yet listening is waited for, up to the group's timeout: every rank published its
// address only once it listened, but a connection may still be on its way.
absl::StatusOr<v1::ListReplicasResponse> ListReplicasOn(RankGroup* group, int r,
                                                        const std::string& session_id = "") {
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(group->options().timeout));
  v1::ListReplicasRequest request;
  request.set_session_id(session_id);
  v1::ListReplicasResponse response;
  const grpc::Status status = group->Peer(r)->ListReplicas(&context, request, &response);
  // A rank of an earlier release lists nothing: it cannot have survived a rank 0 that heals.
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) return v1::ListReplicasResponse();
  OPTSTEP_RETURN_IF_ERROR(PeerStatus(r, status));
  return response;
}

// Every rank's answer to ListReplicas, by rank, asked at once; rank 0's own from `engine`, or
// left empty without one (rank 0 healing itself in has nothing to list yet).
absl::StatusOr<std::vector<v1::ListReplicasResponse>> ListEveryRank(RankGroup* group,
                                                                    Engine* engine) {
  std::vector<v1::ListReplicasResponse> lists(group->world_size());
  OPTSTEP_RETURN_IF_ERROR(group->ForEachRank([&](int r) -> absl::Status {
    if (r == 0 && engine == nullptr) return absl::OkStatus();
    OPTSTEP_ASSIGN_OR_RETURN(lists[r],
                             r == 0 ? ListReplicas(engine, *group, {}) : ListReplicasOn(group, r));
    return absl::OkStatus();
  }));
  return lists;
}

// Once the rank healed in has its state: every rank whose sessions are a step behind another
// rank's takes that step (Regroup kCatchUp; rank 0's own part here).
absl::Status CatchUp(Engine* engine, RankGroup* group, v1::RegroupRequest catch_up) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<v1::ListReplicasResponse> lists,
                           ListEveryRank(group, engine));
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<CatchUpSources> plan, PlanCatchUp(lists));
  return group->ForEachRank([&](int r) -> absl::Status {
    if (plan[r].empty()) return absl::OkStatus();
    if (r == 0) return CatchUpFromPeers(engine, group, plan[0]);
    v1::RegroupRequest request = catch_up;
    request.mutable_catch_up_from()->insert(plan[r].begin(), plan[r].end());
    return MoveStateOn(group, r, request);
  });
}

absl::StatusOr<uint64_t> Heal(Engine* engine, RankGroup* group, int rank,
                              const std::string& address, uint64_t generation,
                              const std::vector<v1::CreateReplicaRequest>& sessions) {
  const absl::Time started = absl::Now();
  OPTSTEP_RETURN_IF_ERROR(RecreateEverywhere(
      engine, group, rank, Phase(generation, rank, address, v1::RegroupRequest::PHASE_REBUILD),
      sessions));
  const absl::Time rebuilt = absl::Now();
  // The rank fetches each session's state from its peers itself.
  if (rank == group->rank()) {
    OPTSTEP_RETURN_IF_ERROR(
        TakeStateFromPeers(engine, rank, group->world_size(), PeerFetch(group)));
  } else {
    OPTSTEP_RETURN_IF_ERROR(MoveStateOn(
        group, rank, Phase(generation, rank, address, v1::RegroupRequest::PHASE_TRANSFER)));
  }
  OPTSTEP_RETURN_IF_ERROR(
      CatchUp(engine, group, Phase(generation, rank, address, v1::RegroupRequest::PHASE_CATCH_UP)));
  LOG(INFO) << "event=rank_healed rank=" << rank << " generation=" << generation
            << " sessions=" << sessions.size()
            << " rebuild_s=" << absl::ToDoubleSeconds(rebuilt - started)
            << " transfer_s=" << absl::ToDoubleSeconds(absl::Now() - rebuilt);
  return generation;
}

// This rank's process asking to be healed in, reachable at `address`.
v1::RejoinRequest ThisProcess(const RankGroup& group, const std::string& address) {
  v1::RejoinRequest request;
  request.set_rank(group.rank());
  request.set_address(address);
  request.set_stand_in(group.options().stand_in);
  request.set_incarnation(group.incarnation());
  return request;
}

// The sessions rank `rank` is healed with (asked once every rank began the heal).
using SessionsToHeal = std::function<absl::StatusOr<std::vector<v1::CreateReplicaRequest>>()>;

// Rank 0, holding heal_mu: heals the `rejoining` rank (itself too; a stand-in for it) into
// generation `generation`: every rank begins (rank 0 first), the heal, every rank ends (rank 0
// last), each session resumed. A heal that failed because the rejoining process was lost
// meanwhile leaves the rank to the heartbeats, as the other ranks do, and its next process heals
// in; any other failure is told to `on_heal_failed` (the group restarts).
absl::StatusOr<uint64_t> RunHeal(Engine* engine, RankGroup* group,
                                 const v1::RejoinRequest& rejoining, uint64_t generation,
                                 const SessionsToHeal& sessions_to_heal) {
  const int rank = static_cast<int>(rejoining.rank());
  const std::string& address = rejoining.address();
  const bool stand_in = rejoining.stand_in();
  LOG(WARNING) << "event=rank_rejoining rank=" << rank << " address=" << address
               << " generation=" << generation;
  // Rank 0 learns the address first: it calls the rejoining rank through it.
  v1::RegroupRequest begin = Phase(generation, rank, address, v1::RegroupRequest::PHASE_BEGIN);
  begin.set_incarnation(rejoining.incarnation());
  begin.set_stand_in(stand_in);
  for (uint32_t r : group->stood_in_ranks()) {
    if (static_cast<int>(r) != rank) begin.add_stood_in_ranks(r);
  }
  if (stand_in) begin.add_stood_in_ranks(rank);
  // A stand-in for rank 0 serves the group's store at its own address (the configured one is
  // rank 0's lost process); a rank 0 of its own, at the configured one.
  if (group->options().stand_in) begin.set_rendezvous(group->addresses()[0]);
  absl::Status begun = group->BeginRegroup(begin);
  if (begun.ok()) {
    begun = group->ForEachRank(
        [&](int r) { return r == 0 ? group->PauseForRegroup(begin) : RegroupOn(group, r, begin); });
  }
  absl::StatusOr<uint64_t> healed = absl::UnknownError("not healed");
  if (!begun.ok()) {
    healed = begun;
  } else {
    absl::StatusOr<std::vector<v1::CreateReplicaRequest>> sessions = sessions_to_heal();
    healed = sessions.ok() ? Heal(engine, group, rank, address, generation, *sessions)
                           : sessions.status();
  }
  const bool passing =
      absl::IsUnavailable(healed.status()) || absl::IsDeadlineExceeded(healed.status());
  v1::RegroupRequest end = Phase(generation, rank, address, v1::RegroupRequest::PHASE_END);
  end.set_failed(!healed.ok());
  // Rank 0's own heal: its process exits (on_heal_failed below); its next one heals in again.
  end.set_retry(!healed.ok() && rank == 0 && passing);
  for (const std::shared_ptr<Session>& session : engine->ListSessions()) {
    (*end.mutable_resolutions())[session->id()] = session->resolutions_started();
  }
  // Every other rank first, rank 0 last: trainers wait for rank 0 to serve before they redo a
  // step, and by then every rank takes it (a rank still healing would refuse it while the others
  // began resolving it, and wait for that rank in the collectives).
  const auto end_on = [&](int r) {
    absl::Status ended = EndHealOn(group, r, end);
    LOG_IF(WARNING, !ended.ok()) << "ending the heal of rank " << rank << " on rank " << r << ": "
                                 << ended;
    return absl::OkStatus();
  };
  (void)group->ForEachRank([&](int r) { return r == 0 ? absl::OkStatus() : end_on(r); });
  (void)end_on(0);
  if (healed.ok()) {
    ResumeSessions(engine, generation);
    group->CountHealed(rank);
    return healed;
  }
  LOG(ERROR) << "event=rank_heal_failed rank=" << rank << " error=\""
             << LogValue(healed.status().message()) << "\"";
  // The rank's process was lost in its heal, or the heal failed for a passing reason (a call
  // lost on the way, a peer that took too long): the group waits for its next process, as the
  // one that rejoined exits once told (RejoinGroup). A stand-in only for a passing reason, its
  // host alive: the host stops it and stands in again (RankProcess); one that was lost took its
  // host with it. Not rank 0 itself, nor a process of an earlier release (unknown); and not over
  // and over (a rank that dies in each heal: out of memory). Another failure (a state that
  // does not fit, one that is refused) would come again: the group restarts.
  const auto gone = [&] { return group->ProcessGone(rank, rejoining.incarnation()); };
  const bool waits = stand_in ? passing && !gone() : passing || gone();
  if (rank != group->rank() && rejoining.incarnation() != 0 && waits &&
      group->CountHealLost(rank) <= RankGroup::kMaxHealsLostInARow) {
    LOG(WARNING) << "event=rank_lost_while_healing rank=" << rank << " generation=" << generation
                 << " the group waits for the rank's next process";
  } else if (group->options().on_heal_failed) {
    group->options().on_heal_failed(healed.status());
  }
  return healed;
}

// The sessions rank 0 heals itself in with, once every rank began the heal (no resolution starts
// any more): those every survivor lists, each described by rank 1. A session only some hold (a
// creation or a close the loss cut) is closed on them first. Before, the group restarted as a
// whole, every session falling back to its automatic checkpoints.
absl::StatusOr<std::vector<v1::CreateReplicaRequest>> SessionsOfSurvivors(RankGroup* group) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<v1::ListReplicasResponse> lists,
                           ListEveryRank(group, /*engine=*/nullptr));
  const std::vector<std::string> cut = SessionsCutOnSurvivors(lists);
  for (const std::string& id : cut) {
    LOG(WARNING) << "event=session_cut_by_loss session=" << LogValue(id)
                 << " only some ranks hold it (a creation or close cut by the loss of rank 0); "
                    "it is closed on them";
    OPTSTEP_RETURN_IF_ERROR(group->CloseCutSession(id));
  }
  std::vector<v1::CreateReplicaRequest> sessions;
  for (const v1::CreateReplicaRequest& listed : lists[1].replicas()) {
    if (std::binary_search(cut.begin(), cut.end(), listed.session_id())) continue;
    OPTSTEP_ASSIGN_OR_RETURN(v1::ListReplicasResponse described,
                             ListReplicasOn(group, 1, listed.session_id()));
    if (described.replicas_size() != 1) {
      return absl::InternalError(absl::StrCat("rank 1 described session '", listed.session_id(),
                                              "' ", described.replicas_size(), " times"));
    }
    sessions.push_back(std::move(*described.mutable_replicas(0)));
  }
  return sessions;
}

}  // namespace

absl::StatusOr<uint64_t> HealRejoinedRank(Engine* engine, RankGroup* group,
                                          const v1::RejoinRequest& request) {
  const int rank = static_cast<int>(request.rank());
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
  if (group->options().on_rejoin) group->options().on_rejoin();
  absl::MutexLock lifecycle_lock(&group->lifecycle_mu());
  absl::MutexLock heal_lock(&group->heal_mu());
  // A stand-in takes the place of a lost rank only: the rank's own process may have returned
  // while the stand-in started.
  if (request.stand_in() && !group->peer_failed(rank)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a stand-in for rank ", rank, " cannot rejoin: the rank is not lost (it returned)"));
  }
  // The rank rejoining may be counted lost (or not yet): any other lost peer means two are lost.
  if (group->lost_peers(/*except=*/rank) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " cannot rejoin: another rank is lost too (",
                     group->MembersStatus().message(), "); the group restarts as a whole"));
  }
  return RunHeal(engine, group, request, group->generation() + 1,
                 [engine] { return DescribeAll(engine); });
}

absl::StatusOr<std::optional<uint64_t>> HealRankZero(Engine* engine, RankGroup* group) {
  const int world_size = group->world_size();
  if (group->rank() != 0 || world_size == 1 || !group->options().heal ||
      group->options().communicators == nullptr) {
    return std::nullopt;
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<v1::ListReplicasResponse> answers,
                           ListEveryRank(group, /*engine=*/nullptr));
  int survivors = 0;
  int fresh = -1;
  uint64_t generation = 0;
  for (int r = 1; r < world_size; ++r) {
    if (answers[r].awaits_rank_zero()) {
      ++survivors;
      generation = std::max(generation, answers[r].generation());
    } else if (fresh < 0) {
      fresh = r;
    }
  }
  if (survivors == 0) return std::nullopt;  // a new group
  if (fresh >= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank 0 cannot rejoin: ", survivors, " rank(s) wait for it, but rank ", fresh,
                     " was restarted too; the group restarts as a whole"));
  }
  absl::MutexLock lifecycle_lock(&group->lifecycle_mu());
  absl::MutexLock heal_lock(&group->heal_mu());
  // The survivors that are stand-ins, told to every rank at the heal's first phase.
  for (int r = 1; r < world_size; ++r) group->SetStoodIn(r, answers[r].stand_in());
  OPTSTEP_ASSIGN_OR_RETURN(uint64_t healed,
                           RunHeal(engine, group, ThisProcess(*group, group->addresses()[0]),
                                   generation + 1, [group] { return SessionsOfSurvivors(group); }));
  return std::optional<uint64_t>(healed);
}

std::vector<std::string> SessionsCutOnSurvivors(
    const std::vector<v1::ListReplicasResponse>& lists) {
  std::map<std::string, size_t> holders;  // by session id: how many survivors list it
  for (size_t r = 1; r < lists.size(); ++r) {
    for (const v1::CreateReplicaRequest& listed : lists[r].replicas()) {
      ++holders[listed.session_id()];
    }
  }
  std::vector<std::string> cut;
  for (const auto& [id, count] : holders) {
    if (count + 1 < lists.size()) cut.push_back(id);
  }
  return cut;
}

absl::StatusOr<v1::ListReplicasResponse> ListReplicas(Engine* engine, const RankGroup& group,
                                                      const v1::ListReplicasRequest& request) {
  v1::ListReplicasResponse response;
  response.set_awaits_rank_zero(group.AwaitsRankZero());
  response.set_generation(group.generation());
  response.set_stand_in(group.options().stand_in);
  if (!request.session_id().empty()) {
    OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                             engine->GetSession(request.session_id()));
    OPTSTEP_ASSIGN_OR_RETURN(*response.add_replicas(), Describe(*session));
    return response;
  }
  for (const std::shared_ptr<Session>& session : SessionsById(engine)) {
    v1::CreateReplicaRequest* replica = response.add_replicas();
    replica->set_session_id(session->id());
    replica->set_resolutions(session->resolutions_started());
    replica->set_step(session->stats().step);
  }
  return response;
}

absl::Status CreateReplicaHere(Engine* engine, const v1::CreateReplicaRequest& request,
                               std::optional<uint64_t> heal_generation) {
  OPTSTEP_ASSIGN_OR_RETURN(
      SessionConfig config,
      SessionConfigFromProto(request.spec(), request.owner(), request.request_id()));
  if (request.admission_only()) return engine->CheckAdmission(config, !request.restored());
  OPTSTEP_ASSIGN_OR_RETURN(
      std::shared_ptr<Session> created,
      engine->CreateReplica(request.session_id(), std::move(config), heal_generation));
  if (request.resolutions() == 0) return absl::OkStatus();
  // A replica healed into a running group counts the group's resolutions as its own.
  absl::Status adopted = created->AdoptResolutions(request.resolutions());
  if (!adopted.ok()) (void)engine->CloseSession(request.session_id());
  return adopted;
}

namespace {

using FetchedState = absl::StatusOr<std::shared_ptr<const StateDict>>;

// `fetch` of one part, run on a thread of its own; get() waits for it.
std::future<FetchedState> FetchAsync(const HealFetch& fetch, int peer, std::string session_id,
                                     HealPart part) {
  return std::async(std::launch::async, [&fetch, peer, id = std::move(session_id), part] {
    return fetch(peer, id, part);
  });
}

absl::Status ImportShadowOf(Session& session, int predecessor,
                            std::shared_ptr<const StateDict> shadow) {
  return Named(session, absl::StrCat("importing its shadow of rank ", predecessor),
               Imported([&](Session::DoneCallback done) {
                 session.ImportShadow(std::move(shadow), std::move(done));
               }));
}

}  // namespace

absl::Status TakeStateFromPeers(Engine* engine, int rank, int world_size, const HealFetch& fetch) {
  const int buddy = (rank + 1) % world_size;
  const int predecessor = (rank + world_size - 1) % world_size;
  const int any = rank == 0 ? 1 : 0;
  for (const std::shared_ptr<Session>& session : SessionsById(engine)) {
    Session* s = session.get();
    // Each part is fetched while the one before is fetched or imported, so that the peers'
    // exports, the streams and the imports overlap; at most two state dicts are staged here at
    // once. The masters are imported first: the own state then overwrites this rank's block.
    std::future<FetchedState> own = FetchAsync(fetch, buddy, s->id(), HealPart::kShadow);
    {
      OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const StateDict> masters,
                               fetch(any, s->id(), HealPart::kMasters));
      OPTSTEP_RETURN_IF_ERROR(
          Named(*s, "importing the masters", Imported([&](Session::DoneCallback done) {
            s->ImportMasters(std::move(masters), std::move(done));
          })));
    }
    std::future<FetchedState> shadow = FetchAsync(fetch, predecessor, s->id(), HealPart::kOwned);
    {
      OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const StateDict> own_state, own.get());
      OPTSTEP_RETURN_IF_ERROR(
          Named(*s, absl::StrCat("importing its own state from rank ", buddy, "'s shadow"),
                Imported([&](Session::DoneCallback done) {
                  s->ImportOwnedState(std::move(own_state), std::move(done));
                })));
    }
    OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const StateDict> shadow_state, shadow.get());
    OPTSTEP_RETURN_IF_ERROR(ImportShadowOf(*s, predecessor, std::move(shadow_state)));
    LOG(INFO) << "event=session_state_fetched session=" << s->id() << " rank=" << rank
              << " buddy=" << buddy << " predecessor=" << predecessor;
  }
  return absl::OkStatus();
}

absl::Status RefreshShadow(Session& session, int rank, int world_size, const HealFetch& fetch) {
  const int predecessor = (rank + world_size - 1) % world_size;
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const StateDict> shadow,
                           fetch(predecessor, session.id(), HealPart::kOwned));
  return ImportShadowOf(session, predecessor, std::move(shadow));
}

absl::StatusOr<std::vector<CatchUpSources>> PlanCatchUp(
    const std::vector<v1::ListReplicasResponse>& lists) {
  // Each session's latest step, and the lowest rank at it.
  std::map<std::string, std::pair<uint64_t, int>> latest;
  for (size_t r = 0; r < lists.size(); ++r) {
    for (const v1::CreateReplicaRequest& listed : lists[r].replicas()) {
      if (!listed.has_step()) continue;  // an earlier release's rank
      auto [it, added] = latest.try_emplace(listed.session_id(), listed.step(), r);
      if (!added && listed.step() > it->second.first) it->second = {listed.step(), r};
    }
  }
  std::vector<CatchUpSources> plan(lists.size());
  for (size_t r = 0; r < lists.size(); ++r) {
    for (const v1::CreateReplicaRequest& listed : lists[r].replicas()) {
      if (!listed.has_step()) continue;
      const auto& [step, from] = latest.at(listed.session_id());
      if (listed.step() == step) continue;
      if (listed.step() + 1 != step) {
        return absl::FailedPreconditionError(
            absl::StrCat("session '", listed.session_id(), "' is at step ", listed.step(),
                         " on rank ", r, " and at step ", step, " on rank ", from,
                         ": a lost peer leaves a rank at most one step behind"));
      }
      plan[r][listed.session_id()] = static_cast<uint32_t>(from);
    }
  }
  return plan;
}

absl::Status CatchUpFromPeers(Engine* engine, RankGroup* group, const CatchUpSources& sources) {
  // Every source checked before any session changes.
  for (const auto& [id, from] : sources) {
    if (from >= static_cast<uint32_t>(group->world_size()) ||
        from == static_cast<uint32_t>(group->rank())) {
      return absl::InvalidArgumentError(absl::StrCat("session '", id, "': rank ", group->rank(),
                                                     " of ", group->world_size(),
                                                     " cannot take a step from rank ", from));
    }
  }
  const HealFetch fetch = PeerFetch(group);
  for (const auto& [id, from] : sources) {
    OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, engine->GetSession(id));
    const uint64_t behind = session->stats().step;
    OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const StateDict> masters,
                             fetch(static_cast<int>(from), id, HealPart::kMasters));
    OPTSTEP_RETURN_IF_ERROR(Named(*session, absl::StrCat("taking the masters of rank ", from),
                                  Imported([&](Session::DoneCallback done) {
                                    session->CatchUp(std::move(masters), std::move(done));
                                  })));
    LOG(WARNING) << "event=session_caught_up session=" << id << " rank=" << group->rank()
                 << " from=" << from << " step=" << behind << "->" << session->stats().step
                 << " a lost peer cut this rank's step alone; it takes the step rank " << from
                 << " finished";
  }
  return absl::OkStatus();
}

HealFetch PeerFetch(RankGroup* group) {
  return [group](int peer, const std::string& session_id,
                 HealPart part) -> absl::StatusOr<std::shared_ptr<const StateDict>> {
    OPTSTEP_RETURN_IF_ERROR(group->EnsureAddress(peer));  // a rank knows few of them at first
    v1::FetchStateRequest request;
    request.set_session_id(session_id);
    const char* what = part == HealPart::kOwned    ? "its own state"
                       : part == HealPart::kShadow ? "its shadow"
                                                   : "its masters";
    StateDictAssembler assembler;
    OPTSTEP_RETURN_IF_ERROR(group->ReadState(
        peer, absl::StrCat("fetching ", what, " of session '", session_id, "'"),
        [&](v1::PeerService::Stub& stub, grpc::ClientContext* context) {
          return part == HealPart::kOwned    ? stub.FetchOwnedState(context, request)
                 : part == HealPart::kShadow ? stub.FetchShadow(context, request)
                                             : stub.FetchMasters(context, request);
        },
        assembler));
    if (group->options().on_heal_fetched) group->options().on_heal_fetched();
    return assembler.BuildPlain();
  };
}

void ResumeSessions(Engine* engine, uint64_t generation) {
  for (const std::shared_ptr<Session>& session : engine->ListSessions()) {
    session->ResumeAfterHeal(generation);
  }
}

absl::StatusOr<uint64_t> RequestRejoin(RankGroup* group, const std::string& address) {
  OPTSTEP_RETURN_IF_ERROR(group->EnsureAddress(0));
  const v1::RejoinRequest request = ThisProcess(*group, address);
  v1::RejoinResponse response;
  OPTSTEP_RETURN_IF_ERROR(
      group->CallWhileAnswering(0, "waiting to be healed in", [&](grpc::ClientContext* context) {
        context->set_wait_for_ready(true);
        return group->Peer(0)->Rejoin(context, request, &response);
      }));
  return response.generation();
}

}  // namespace optstep
