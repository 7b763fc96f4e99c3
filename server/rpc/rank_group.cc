#include "server/rpc/rank_group.h"

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/rpc/convert.h"
#include "server/rpc/rendezvous.h"
#include "server/rpc/retry_while_answering.h"
#include "server/rpc/stall_watch.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

constexpr int kMaxPeerMessageBytes = (4 << 20) + (64 << 10);

}  // namespace

RankGroup::RankGroup(RankGroupOptions options, Engine* engine)
    : options_(std::move(options)),
      engine_(engine),
      incarnation_(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))),
      heal_end_watch_(options_.peer_timeout),
      liveness_(options_.rank, options_.world_size, options_.peer_timeout) {
  {
    absl::MutexLock lock(&mu_);
    addresses_.assign(options_.world_size, "");
    stood_in_.assign(options_.world_size, false);
    lost_heals_.assign(options_.world_size, 0);
    peers_.resize(options_.world_size);
  }
  if (options_.world_size > 1 && engine_ != nullptr) {
    relay_ = std::make_unique<SerialExecutor>();
    engine_->SetAbortVoteListener([this](const std::string& id, uint64_t resolution,
                                         uint64_t step) { RelayAbortVote(id, resolution, step); });
  }
}

RankGroup::~RankGroup() {
  {
    absl::MutexLock lock(&heartbeat_mu_);
    heartbeat_.reset();
  }
  if (relay_ != nullptr) engine_->SetAbortVoteListener(nullptr);
  relay_.reset();  // the calls already queued run (each with a short deadline)
}

void RankGroup::RelayAbortVote(const std::string& session_id, uint64_t resolution, uint64_t step) {
  if (relay_ == nullptr) return;
  relay_->Post([this, session_id, resolution, step] {
    v1::HeldSessionRequest request;
    request.set_session_id(session_id);
    request.set_target(resolution);
    request.set_step(step);
    // Rank 0 tells everyone (the voter hears its own vote back and ignores it); others tell 0.
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == options_.rank || (options_.rank != 0 && r != 0)) continue;
      absl::Status status = EnsureAddress(r);
      if (status.ok()) {
        status = CallPeer(r, &v1::PeerService::Stub::AbortStep, request,
                          "waiting for the vote to abort to be taken", absl::Seconds(5))
                     .status();
      }
      LOG_IF(WARNING, !status.ok()) << "session " << session_id << ": cannot tell rank " << r
                                    << " of the vote to abort step " << step << ": " << status;
    }
  });
}

void RankGroup::StartHeartbeats() {
  if (options_.world_size == 1) return;
  absl::MutexLock lock(&heartbeat_mu_);
  if (left_ || heartbeat_ != nullptr) return;
  PeerHeartbeat::Options options;
  options.rank = options_.rank;
  options.world_size = options_.world_size;
  options.interval = options_.heartbeat_interval;
  if (options_.rank != 0) {
    options.on_group_formed = [this] { MarkFormed(); };
    options.knows_group_formed = [this] { return formed(); };
    options.on_rank_zero_heal = [this](uint64_t generation, bool healing) {
      HearOfRankZeroHeal(generation, healing);
    };
  }
  if (options_.rank > 1) {
    options.on_rank_zero_stand_in = [this](const std::string& address) {
      SetRankZeroStandIn(address);
    };
  }
  options.rendezvous = [this] { return rank_zero_stand_in(); };
  heartbeat_ = std::make_unique<PeerHeartbeat>(
      options, &liveness_,
      [this](int peer) -> v1::PeerService::Stub* {
        return EnsureAddress(peer, options_.heartbeat_interval).ok() ? Peer(peer) : nullptr;
      },
      [this](const PeerLiveness::LostPeer& lost) {
        LOG(ERROR) << "event=peer_lost rank=" << lost.rank
                   << " this rank stops serving: " << lost.why.message();
        if (options_.on_peer_lost) options_.on_peer_lost(lost.rank);
      });
}

void RankGroup::Leave(bool announce) {
  absl::MutexLock lock(&heartbeat_mu_);
  left_ = true;
  if (heartbeat_ != nullptr && announce) heartbeat_->AnnounceLeaving();
  heartbeat_.reset();
}

void RankGroup::PeerLeft(int rank) {
  if (rank < 0 || rank >= options_.world_size || !liveness_.Left(rank)) return;
  LOG(WARNING) << "event=peer_left rank=" << rank << " rank " << rank
               << " shuts down on purpose; this rank stops serving until "
               << (options_.heal ? "it rejoins or the group is restarted"
                                 : "the group is restarted");
}

absl::Status RankGroup::PeersStatus() const {
  OPTSTEP_RETURN_IF_ERROR(liveness_.status());
  absl::MutexLock lock(&mu_);
  return healing_;
}

absl::Status RankGroup::LostPeersStatus() const {
  OPTSTEP_RETURN_IF_ERROR(liveness_.lost_status());
  absl::MutexLock lock(&mu_);
  return healing_;
}

void RankGroup::MarkFormed() {
  absl::MutexLock lock(&mu_);
  formed_ = true;
}

bool RankGroup::formed() const {
  absl::MutexLock lock(&mu_);
  return formed_;
}

absl::Status RankGroup::FormingStatus(absl::string_view what) const {
  if (options_.rank != 0 || !options_.heal || formed()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the group is forming (rank 0 heals itself in or restores the sessions); ", what,
                   " when rank 0 reports SERVING"));
}

void RankGroup::NoteFormedSeen(int rank) {
  if (rank <= 0 || rank >= options_.world_size) return;
  absl::MutexLock lock(&mu_);
  formed_seen_.insert(rank);
}

bool RankGroup::AwaitFormedSeen(absl::Duration bound) {
  absl::MutexLock lock(&mu_);
  struct Seen {
    const std::set<int>* seen;
    size_t peers;
  } seen{&formed_seen_, static_cast<size_t>(options_.world_size - 1)};
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Seen* s) { return s->seen->size() >= s->peers; }, &seen),
                              bound);
}

uint64_t RankGroup::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

std::vector<std::shared_ptr<Session>> RankGroup::Sessions() const {
  return engine_ != nullptr ? engine_->ListSessions() : std::vector<std::shared_ptr<Session>>();
}

grpc::Status RankGroup::PingOnce(int rank, v1::PingResponse* response,
                                 grpc::ClientContext* context) {
  grpc::ClientContext own;
  if (context == nullptr) context = &own;
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.peer_timeout));
  v1::PingRequest request;
  request.set_rank(options_.rank);
  return Peer(rank)->Ping(context, request, response);
}

bool RankGroup::ProcessGone(int rank, uint64_t incarnation) {
  v1::PingResponse response;
  const grpc::Status status = PingOnce(rank, &response);
  LOG(INFO) << "event=rank_pinged rank=" << rank
            << " code=" << absl::StatusCodeToString(FromGrpcStatus(status).code())
            << " incarnation=" << response.incarnation() << " healing_incarnation=" << incarnation;
  return !status.ok() || response.incarnation() != incarnation;
}

bool RankGroup::Answers(int rank) { return Answers(rank, nullptr); }

bool RankGroup::Answers(int rank, grpc::ClientContext* context) {
  v1::PingResponse response;
  return PingOnce(rank, &response, context).ok();
}

absl::Status RankGroup::CallUntilTaken(int rank, absl::string_view call,
                                       const std::function<absl::Status()>& attempt) {
  return RetryWhileAnswering(
      absl::StrCat("call=", call, " rank=", rank), absl::Now() + options_.timeout,
      options_.peer_timeout, [this, rank] { return Answers(rank); },
      [&, attempts = 0]() mutable {
        const int made = attempts++;
        return options_.drop_peer_call && options_.drop_peer_call(call, rank, made)
                   ? absl::UnavailableError("dropped (--drop_first_peer_call)")
                   : attempt();
      });
}

int RankGroup::CountHealLost(int rank) {
  absl::MutexLock lock(&mu_);
  return ++lost_heals_[rank];
}

void RankGroup::CountHealed(int rank) {
  absl::MutexLock lock(&mu_);
  lost_heals_[rank] = 0;
}

absl::Status RankGroup::EnsureAddress(int rank, absl::Duration wait) {
  std::shared_ptr<KeyValueStore> store;
  {
    absl::MutexLock lock(&mu_);
    if (!addresses_[rank].empty()) return absl::OkStatus();
    store = store_;
  }
  if (store == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, "'s address is unknown"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::string address, store->Get(RankAddressKey(rank), wait));
  absl::MutexLock lock(&mu_);
  addresses_[rank] = address;
  return absl::OkStatus();
}

absl::Status RankGroup::Join(const std::string& advertise_address,
                             std::shared_ptr<KeyValueStore> store) {
  {
    absl::MutexLock lock(&mu_);
    addresses_[options_.rank] = advertise_address;
    store_ = store;
  }
  if (options_.world_size == 1) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(store->Set(RankAddressKey(options_.rank), advertise_address));
  if (options_.rank != 0) return absl::OkStatus();
  for (int r = 1; r < options_.world_size; ++r) {
    OPTSTEP_ASSIGN_OR_RETURN(std::string address, store->Get(RankAddressKey(r), options_.timeout));
    LOG(INFO) << "rank " << r << " is at " << address;
    absl::MutexLock lock(&mu_);
    addresses_[r] = address;
  }
  return absl::OkStatus();
}

std::vector<std::string> RankGroup::addresses() const {
  absl::MutexLock lock(&mu_);
  return addresses_;
}

void RankGroup::SetRankZeroStandIn(const std::string& address) {
  absl::MutexLock lock(&mu_);
  if (address != rank_zero_stand_in_) {
    LOG(WARNING) << "event=rank_zero_stand_in address=" << (address.empty() ? "-" : address);
  }
  rank_zero_stand_in_ = address;
}

std::string RankGroup::rank_zero_stand_in() const {
  absl::MutexLock lock(&mu_);
  return rank_zero_stand_in_;
}

void RankGroup::HearOfRendezvous(const std::string& address) {
  absl::MutexLock lock(&mu_);
  heard_rendezvous_ = address;
}

std::string RankGroup::heard_rendezvous() const {
  absl::MutexLock lock(&mu_);
  return heard_rendezvous_;
}

void RankGroup::SetStoodIn(int rank, bool stood_in) {
  absl::MutexLock lock(&mu_);
  stood_in_[rank] = stood_in;
}

std::vector<uint32_t> RankGroup::stood_in_ranks() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint32_t> ranks;
  for (size_t r = 0; r < stood_in_.size(); ++r) {
    if (stood_in_[r]) ranks.push_back(static_cast<uint32_t>(r));
  }
  return ranks;
}

v1::PeerService::Stub* RankGroup::Peer(int rank) {
  absl::MutexLock lock(&mu_);
  if (peers_[rank] == nullptr) {
    // A channel of its own connections: one made for a restarted rank does not inherit the
    // backoff of the connections to its predecessor (grpc shares them between channels).
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    SetFastReconnect(args);  // a restarted peer is reached again at once
    // The state streamed between ranks comes in chunks of up to 4 MiB plus their envelope (the
    // default --max_message_bytes), over grpc's default 4 MiB.
    args.SetMaxReceiveMessageSize(kMaxPeerMessageBytes);
    peers_[rank] = v1::PeerService::NewStub(grpc::CreateCustomChannel(
        addresses_[rank],
        options_.peer_credentials ? options_.peer_credentials : grpc::InsecureChannelCredentials(),
        args));
  }
  return peers_[rank].get();
}

absl::StatusOr<Engine::Created> RankGroup::CreateSession(const v1::SessionSpec& spec,
                                                         const std::string& owner,
                                                         const std::string& request_id) {
  if (options_.rank != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sessions are created on rank 0; this is rank ", options_.rank, " of ",
                     options_.world_size));
  }
  // A session made before a restarted rank 0 healed itself in would be made on the other ranks
  // beside their own sessions, in the generation they had.
  OPTSTEP_RETURN_IF_ERROR(FormingStatus("retry"));
  OPTSTEP_RETURN_IF_ERROR(PeersStatus());
  OPTSTEP_ASSIGN_OR_RETURN(SessionConfig config, SessionConfigFromProto(spec, owner, request_id));
  absl::MutexLock create_lock(&create_mu_);
  // Again: a heal may have run while this call waited for the lock.
  OPTSTEP_RETURN_IF_ERROR(PeersStatus());
  OPTSTEP_ASSIGN_OR_RETURN(Engine::Created existing, engine_->FindExisting(config));
  // A trainer attaches to a session restored as it was saved, bounds added since or not.
  if (existing.session != nullptr) return existing;
  OPTSTEP_RETURN_IF_ERROR(CheckNewSessionSpec(spec));
  if (options_.world_size == 1) return engine_->CreateSession(std::move(config));

  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Session> created,
                           CreateEverywhere(engine_->NextSessionId(), spec, std::move(config),
                                            /*restored=*/false));
  return Engine::Created{std::move(created), false, true};
}

absl::StatusOr<std::shared_ptr<Session>> RankGroup::RestoreSession(const std::string& id,
                                                                   const v1::SessionSpec& spec,
                                                                   const std::string& owner,
                                                                   const std::string& request_id) {
  if (options_.rank != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sessions are restored on rank 0; this is rank ", options_.rank));
  }
  OPTSTEP_RETURN_IF_ERROR(PeersStatus());
  OPTSTEP_ASSIGN_OR_RETURN(SessionConfig config, SessionConfigFromProto(spec, owner, request_id));
  absl::MutexLock create_lock(&create_mu_);
  if (options_.world_size == 1) return engine_->CreateReplica(id, std::move(config));
  return CreateEverywhere(id, spec, std::move(config), /*restored=*/true);
}

absl::StatusOr<std::shared_ptr<Session>> RankGroup::CreateEverywhere(const std::string& id,
                                                                     const v1::SessionSpec& spec,
                                                                     SessionConfig config,
                                                                     bool restored) {
  for (int r = 1; r < options_.world_size; ++r) {
    absl::MutexLock lock(&mu_);
    if (addresses_[r].empty()) {
      return absl::UnavailableError(absl::StrCat("rank ", r, " of ", options_.world_size,
                                                 " has not joined the group yet; retry when "
                                                 "rank 0 reports SERVING"));
    }
  }
  v1::CreateReplicaRequest replica;
  replica.set_session_id(id);
  *replica.mutable_spec() = spec;
  replica.set_owner(config.owner);
  replica.set_request_id(config.request_id);
  // Every rank is asked first whether it admits the session (each checks its own part again as
  // it builds): a replica refused on one rank would leave the others waiting for it in the
  // communicator's rendezvous until the timeout.
  v1::CreateReplicaRequest admission = replica;
  admission.set_admission_only(true);
  admission.set_restored(restored);
  OPTSTEP_RETURN_IF_ERROR(ForEachRank([&](int r) {
    return r == 0 ? engine_->CheckAdmission(config, !restored) : CreateReplicaOn(r, admission);
  }));
  // Every rank creates its replica at once: they meet in the communicator's rendezvous.
  std::vector<absl::Status> peer_status(options_.world_size);
  std::vector<std::thread> calls;
  for (int r = 1; r < options_.world_size; ++r) {
    calls.emplace_back(
        [this, r, &replica, &peer_status] { peer_status[r] = CreateReplicaOn(r, replica); });
  }
  absl::StatusOr<std::shared_ptr<Session>> local = engine_->CreateReplica(id, std::move(config));
  for (std::thread& t : calls) t.join();
  absl::Status failed = local.status();
  for (int r = 1; r < options_.world_size && failed.ok(); ++r) {
    if (!peer_status[r].ok()) failed = peer_status[r];
  }
  if (!failed.ok()) {
    (void)DropSession(id);
    return failed;
  }
  return *local;
}

absl::Status RankGroup::CreateReplicaOn(int rank, const v1::CreateReplicaRequest& request) {
  v1::CreateReplicaResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options_.timeout));
  return PeerStatus(rank, Peer(rank)->CreateReplica(&context, request, &response));
}

absl::Status RankGroup::CloseSession(const std::string& id) {
  // Only rank 0 closes a session on every rank: elsewhere, the rank's copy alone would go, and
  // rank 0's next step of it would wait for this rank in vain.
  if (options_.rank != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sessions are closed on rank 0; this is rank ", options_.rank, " of ",
                     options_.world_size, " (session '", id, "')"));
  }
  // A restarted rank 0 holds none of the group's sessions until it healed itself in: a close then
  // dropped the other ranks' replicas and answered NOT_FOUND, which a client that tried once
  // before reads as closed, with the automatic checkpoints left for a restart to bring back.
  OPTSTEP_RETURN_IF_ERROR(FormingStatus(absl::StrCat("close session '", id, "' again")));
  absl::MutexLock lifecycle_lock(&create_mu_);
  // Told before any rank drops its replica: its automatic checkpoints go first (hidden by a
  // durable rename), so that a rank 0 lost halfway through the close leaves none for a restart
  // to bring the closed session back. Told after, a loss once every rank had dropped it left
  // them whole. A close of a session the group does not serve touches none (those of a session
  // a restore set aside stay for an operator).
  if (options_.on_session_closed && engine_->GetSession(id).ok()) {
    options_.on_session_closed(id);
  }
  return DropSession(id);
}

absl::Status RankGroup::CloseReplicaOn(int rank, const std::string& id) {
  v1::CloseReplicaRequest request;
  request.set_session_id(id);
  // Made again if lost: a replica left open would fail that rank's next heal.
  return CallUntilTaken(rank, "CloseReplica", [&] {
    v1::CloseReplicaResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return PeerStatus(rank, Peer(rank)->CloseReplica(&context, request, &response));
  });
}

absl::Status RankGroup::DropSession(const std::string& id) {
  for (int r = 1; r < options_.world_size && options_.rank == 0; ++r) {
    const absl::Status status = CloseReplicaOn(r, id);
    if (!status.ok() && status.code() != absl::StatusCode::kNotFound) {
      LOG(WARNING) << "closing session " << id << " on rank " << r << ": " << status.message();
    }
  }
  return engine_->CloseSession(id);
}

absl::Status RankGroup::CloseCutSession(const std::string& id) {
  for (int r = 1; r < options_.world_size; ++r) {
    const absl::Status status = CloseReplicaOn(r, id);
    if (!status.ok() && !absl::IsNotFound(status)) return status;
  }
  if (options_.on_session_closed) options_.on_session_closed(id);
  return absl::OkStatus();
}

absl::Status RankGroup::ForEachRank(const std::function<absl::Status(int rank)>& call) {
  std::vector<absl::Status> status(options_.world_size);
  std::vector<std::thread> threads;
  for (int r = 1; r < options_.world_size; ++r) {
    threads.emplace_back([&, r] { status[r] = call(r); });
  }
  status[0] = call(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RankGroup::CallWhileAnswering(
    int rank, absl::string_view what,
    const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  grpc::ClientContext context;
  StallWatch watch(&context, 2 * options_.peer_timeout);  // after the context: destroyed first
  ProgressWhileAnswering answering(
      &watch, [this, rank](grpc::ClientContext* ping) { return Answers(rank, ping); },
      options_.heartbeat_interval);
  return watch.Explain(PeerStatus(rank, call(&context)), rank, what);
}

absl::StatusOr<v1::HeldSessionResponse> RankGroup::CallPeer(int rank, HeldMethod method,
                                                            const v1::HeldSessionRequest& request,
                                                            absl::string_view what,
                                                            absl::Duration timeout) {
  v1::HeldSessionResponse response;
  auto call = [&](grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return (Peer(rank)->*method)(context, request, &response);
  };
  if (timeout <= 2 * options_.peer_timeout) {  // the deadline comes first: no watch needed
    grpc::ClientContext context;
    OPTSTEP_RETURN_IF_ERROR(PeerStatus(rank, call(&context)));
  } else {
    OPTSTEP_RETURN_IF_ERROR(CallWhileAnswering(rank, what, call));
  }
  return response;
}

absl::Status RankGroup::ReadState(int rank, absl::string_view what, const StateStreamStart& start,
                                  StateDictAssembler& assembler) {
  grpc::ClientContext context;
  StallWatch watch(&context, options_.timeout);  // after the context: destroyed first
  std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>> reader = start(*Peer(rank), &context);
  const absl::Status read = assembler.AddAll(
      *reader, [rank](const grpc::Status& end) { return PeerStatus(rank, end); }, &watch);
  return watch.Explain(read, rank, what);
}

absl::Status PeerStatus(int rank, const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return FromGrpcStatus(
      grpc::Status(status.error_code(), absl::StrCat("rank ", rank, ": ", status.error_message())));
}

}  // namespace optstep
