#include "server/rpc/rank_group.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/rendezvous.h"
#include "server/rpc/status_bridge.h"

namespace optstep {

RankGroup::RankGroup(RankGroupOptions options, Engine* engine)
    : options_(std::move(options)), engine_(engine) {
  absl::MutexLock lock(&mu_);
  addresses_.assign(options_.world_size, "");
  peers_.resize(options_.world_size);
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
    OPTSTEP_ASSIGN_OR_RETURN(std::string address,
                             store->Get(RankAddressKey(r), options_.timeout));
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

v1::PeerService::Stub* RankGroup::Peer(int rank) {
  absl::MutexLock lock(&mu_);
  if (peers_[rank] == nullptr) {
    peers_[rank] = v1::PeerService::NewStub(
        grpc::CreateChannel(addresses_[rank], grpc::InsecureChannelCredentials()));
  }
  return peers_[rank].get();
}

absl::StatusOr<Engine::Created> RankGroup::CreateSession(const v1::SessionSpec& spec) {
  if (options_.rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sessions are created on rank 0; this is rank ", options_.rank, " of ",
        options_.world_size));
  }
  OPTSTEP_ASSIGN_OR_RETURN(SessionConfig config, SessionConfigFromProto(spec));
  absl::MutexLock create_lock(&create_mu_);
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Session> existing, engine_->FindByName(config));
  if (existing != nullptr) return Engine::Created{existing, true};
  if (options_.world_size == 1) return engine_->CreateSession(std::move(config));

  for (int r = 1; r < options_.world_size; ++r) {
    absl::MutexLock lock(&mu_);
    if (addresses_[r].empty()) {
      return absl::UnavailableError(absl::StrCat("rank ", r, " of ", options_.world_size,
                                                 " has not joined the group yet; retry when "
                                                 "rank 0 reports SERVING"));
    }
  }
  // Every rank creates its replica at once: they meet in the communicator's rendezvous.
  const std::string id = engine_->NextSessionId();
  std::vector<absl::Status> peer_status(options_.world_size);
  std::vector<std::thread> calls;
  for (int r = 1; r < options_.world_size; ++r) {
    calls.emplace_back([this, r, &id, &spec, &peer_status] {
      v1::CreateReplicaRequest request;
      request.set_session_id(id);
      *request.mutable_spec() = spec;
      v1::CreateReplicaResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           absl::ToChronoMilliseconds(options_.timeout));
      grpc::Status status = Peer(r)->CreateReplica(&context, request, &response);
      peer_status[r] = FromGrpcStatus(grpc::Status(
          status.error_code(), absl::StrCat("rank ", r, ": ", status.error_message())));
    });
  }
  absl::StatusOr<std::shared_ptr<Session>> local = engine_->CreateReplica(id, std::move(config));
  for (std::thread& t : calls) t.join();
  absl::Status failed = local.status();
  for (int r = 1; r < options_.world_size && failed.ok(); ++r) {
    if (!peer_status[r].ok()) failed = peer_status[r];
  }
  if (!failed.ok()) {
    (void)CloseSession(id);
    return failed;
  }
  return Engine::Created{*local, false};
}

absl::Status RankGroup::CloseSession(const std::string& id) {
  for (int r = 1; r < options_.world_size && options_.rank == 0; ++r) {
    v1::CloseReplicaRequest request;
    request.set_session_id(id);
    v1::CloseReplicaResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status status = Peer(r)->CloseReplica(&context, request, &response);
    if (!status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND) {
      LOG(WARNING) << "closing session " << id << " on rank " << r << ": "
                   << status.error_message();
    }
  }
  return engine_->CloseSession(id);
}

grpc::ServerUnaryReactor* PeerServiceImpl::CreateReplica(grpc::CallbackServerContext* context,
                                                         const v1::CreateReplicaRequest* request,
                                                         v1::CreateReplicaResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Joining the group blocks until every rank arrives: not on the reaction.
  std::thread([engine = engine_, request, reactor] {
    absl::StatusOr<SessionConfig> config = SessionConfigFromProto(request->spec());
    absl::Status status = config.status();
    if (config.ok()) status = engine->CreateReplica(request->session_id(), *std::move(config)).status();
    reactor->Finish(ToGrpcStatus(status));
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::CloseReplica(grpc::CallbackServerContext* context,
                                                        const v1::CloseReplicaRequest* request,
                                                        v1::CloseReplicaResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(engine_->CloseSession(request->session_id())));
  return reactor;
}

}  // namespace optstep
