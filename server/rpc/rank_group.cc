#include "server/rpc/rank_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "server/engine/checkpoint_io.h"
#include "server/rpc/state_dict_stream.h"
#include "base/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/rendezvous.h"
#include "wire/grpc_status.h"

namespace optstep {

RankGroup::RankGroup(RankGroupOptions options, Engine* engine)
    : options_(std::move(options)), engine_(engine) {
  {
    absl::MutexLock lock(&mu_);
    addresses_.assign(options_.world_size, "");
    peers_.resize(options_.world_size);
  }
  if (options_.world_size > 1 && engine_ != nullptr) {
    relay_ = std::make_unique<SerialExecutor>();
    engine_->SetAbortVoteListener(
        [this](const std::string& id, uint64_t resolution, uint64_t step) {
          RelayAbortVote(id, resolution, step);
        });
  }
}

RankGroup::~RankGroup() {
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
        status = CallPeer(r, &v1::PeerService::Stub::AbortStep, request, absl::Seconds(5)).status();
      }
      LOG_IF(WARNING, !status.ok()) << "session " << session_id << ": cannot tell rank " << r
                                    << " of the vote to abort step " << step << ": " << status;
    }
  });
}

absl::Status RankGroup::EnsureAddress(int rank) {
  std::shared_ptr<KeyValueStore> store;
  {
    absl::MutexLock lock(&mu_);
    if (!addresses_[rank].empty()) return absl::OkStatus();
    store = store_;
  }
  if (store == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, "'s address is unknown"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::string address,
                           store->Get(RankAddressKey(rank), absl::Seconds(5)));
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
        grpc::CreateChannel(addresses_[rank], options_.peer_credentials
                                                  ? options_.peer_credentials
                                                  : grpc::InsecureChannelCredentials()));
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


// ---- Held operations (docs/checkpoints.md, "RPCs and consistency") ----

namespace {

uint64_t NewToken() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t base = std::random_device()() * 0x9E3779B97F4A7C15ull;
  const uint64_t token = base + (++counter) * 0xBF58476D1CE4E5B9ull;
  return token == 0 ? 1 : token;
}

v1::HeldSessionRequest HeldRequest(const Session& session, uint64_t token, absl::Duration lease) {
  v1::HeldSessionRequest request;
  request.set_session_id(session.id());
  request.set_token(token);
  request.set_lease_ms(absl::ToInt64Milliseconds(lease));
  return request;
}

// Which ranks hold `key`: masters and counters every rank, a parameter's optimizer state its
// owner. A key naming no parameter goes to rank 0, which refuses it with the reason.
std::vector<int> RanksOf(const std::string& key, const Session& session,
                         const std::map<std::string, int>& param_of) {
  const int world = session.layout().world_size;
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  if (!absl::StartsWith(key, "state/")) return all;
  const std::string rest = key.substr(6);
  const size_t first = rest.find('/'), last = rest.rfind('/');
  if (first == std::string::npos || last == first) return {0};
  const std::string middle = rest.substr(first + 1, last - first - 1);
  auto it = param_of.find(middle);
  if (it == param_of.end()) return absl::StartsWith(middle, "group") ? all : std::vector<int>{0};
  return {session.layout().owner[it->second]};
}

}  // namespace

absl::StatusOr<std::string> DefinitionJson(const Session& session) {
  v1::SessionSpec spec;
  if (!spec.ParseFromString(session.config().definition_key)) {
    return absl::InternalError(absl::StrCat("session '", session.id(), "': bad definition"));
  }
  spec.clear_name();
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  auto status = google::protobuf::util::MessageToJsonString(spec, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("session '", session.id(),
                                            "': definition to JSON: ", status.ToString()));
  }
  return json;
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

absl::StatusOr<v1::HeldSessionResponse> RankGroup::CallPeer(int rank, HeldMethod method,
                                                            const v1::HeldSessionRequest& request,
                                                            absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  v1::HeldSessionResponse response;
  grpc::Status status = (Peer(rank)->*method)(&context, request, &response);
  if (!status.ok()) {
    return FromGrpcStatus(
        grpc::Status(status.error_code(), absl::StrCat("rank ", rank, ": ", status.error_message())));
  }
  return response;
}

absl::Status RankGroup::WithHeldSession(Session& session, const HeldOperation& op) {
  if (options_.rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint and state dict operations are served by rank 0; this is rank ", options_.rank));
  }
  const uint64_t token = NewToken();
  const absl::Duration lease = options_.hold_lease;
  const absl::Duration call_timeout = absl::Seconds(30);
  const v1::HeldSessionRequest base = HeldRequest(session, token, lease);
  // a. Hold: no rank starts a resolution it has not started yet.
  std::vector<uint64_t> started(options_.world_size, 0);
  absl::Status status = ForEachRank([&](int r) -> absl::Status {
    if (r == 0) {
      OPTSTEP_ASSIGN_OR_RETURN(started[0], session.Hold(token, lease));
      return absl::OkStatus();
    }
    OPTSTEP_ASSIGN_OR_RETURN(v1::HeldSessionResponse response,
                             CallPeer(r, &v1::PeerService::Stub::HoldSession, base, call_timeout));
    started[r] = response.resolutions();
    return absl::OkStatus();
  });
  // b. Settle every rank at the highest resolution begun anywhere.
  std::vector<HeldPoint> points(options_.world_size);
  if (status.ok()) {
    const uint64_t target = *std::max_element(started.begin(), started.end());
    v1::HeldSessionRequest settle = base;
    settle.set_target(target);
    settle.set_timeout_ms(absl::ToInt64Milliseconds(options_.settle_timeout));
    status = ForEachRank([&](int r) -> absl::Status {
      if (r == 0) {
        OPTSTEP_ASSIGN_OR_RETURN(points[0], session.Settle(token, target,
                                                           absl::Now() + options_.settle_timeout,
                                                           lease));
        return absl::OkStatus();
      }
      OPTSTEP_ASSIGN_OR_RETURN(v1::HeldSessionResponse response,
                               CallPeer(r, &v1::PeerService::Stub::SettleSession, settle,
                                        options_.settle_timeout + call_timeout));
      points[r] = HeldPoint{response.resolutions(), response.step(), response.skipped_steps()};
      return absl::OkStatus();
    });
  }
  for (int r = 1; r < options_.world_size && status.ok(); ++r) {
    if (points[r].step != points[0].step) {
      status = absl::InternalError(absl::StrCat("session '", session.id(), "': rank ", r,
                                                " settled at step ", points[r].step,
                                                ", rank 0 at step ", points[0].step));
    }
  }
  // c. The operation.
  if (status.ok()) status = op(token, points[0]);
  // d. Release, whatever happened (a rank that missed it lets go when its lease passes).
  (void)ForEachRank([&](int r) -> absl::Status {
    if (r == 0) return session.Release(token);
    absl::StatusOr<v1::HeldSessionResponse> released =
        CallPeer(r, &v1::PeerService::Stub::ReleaseSession, base, call_timeout);
    if (!released.ok()) LOG(WARNING) << "releasing hold: " << released.status();
    return absl::OkStatus();
  });
  return status;
}

absl::StatusOr<std::shared_ptr<const StateDict>> RankGroup::ExportStateDict(
    Session& session, const std::vector<uint32_t>& model_chunks) {
  std::vector<std::shared_ptr<const StateDict>> parts(options_.world_size);
  OPTSTEP_RETURN_IF_ERROR(WithHeldSession(session, [&](uint64_t token, const HeldPoint&) {
    return ForEachRank([&](int r) -> absl::Status {
      if (r == 0) {
        StateSelection all;
        all.model_chunks = model_chunks;
        OPTSTEP_ASSIGN_OR_RETURN(parts[0], session.ExportHeld(token, all));
        return absl::OkStatus();
      }
      v1::HeldSessionRequest request = HeldRequest(session, token, options_.hold_lease);
      for (uint32_t chunk : model_chunks) request.add_model_chunks(chunk);
      grpc::ClientContext context;
      std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>> reader =
          Peer(r)->ExportHeldState(&context, request);
      StateDictAssembler assembler;
      v1::StateDictChunk chunk;
      absl::Status added = absl::OkStatus();
      while (reader->Read(&chunk)) {
        if (added.ok()) added = assembler.Add(chunk);
      }
      grpc::Status finished = reader->Finish();
      if (!finished.ok()) {
        return FromGrpcStatus(grpc::Status(finished.error_code(),
                                           absl::StrCat("rank ", r, ": ", finished.error_message())));
      }
      OPTSTEP_RETURN_IF_ERROR(added);
      OPTSTEP_ASSIGN_OR_RETURN(parts[r], assembler.Build(session));
      return absl::OkStatus();
    });
  }));
  auto merged = std::make_shared<StateDict>();
  for (const auto& part : parts) merged->insert(part->begin(), part->end());
  return std::shared_ptr<const StateDict>(std::move(merged));
}

absl::Status RankGroup::ImportStateDict(Session& session, std::shared_ptr<const StateDict> state) {
  std::map<std::string, int> param_of;
  for (size_t p = 0; p < session.config().params.size(); ++p) {
    param_of[session.config().params[p].name] = static_cast<int>(p);
  }
  std::vector<std::shared_ptr<StateDict>> parts(options_.world_size);
  for (auto& part : parts) part = std::make_shared<StateDict>();
  for (const auto& [key, tensor] : *state) {
    for (int r : RanksOf(key, session, param_of)) (*parts[r])[key] = tensor;
  }
  return WithHeldSession(session, [&](uint64_t token, const HeldPoint&) -> absl::Status {
    // Every rank validates and stages its part; only then does any rank change.
    OPTSTEP_RETURN_IF_ERROR(ForEachRank([&](int r) -> absl::Status {
      if (r == 0) return session.StageState(token, parts[0], /*complete=*/false);
      grpc::ClientContext context;
      v1::HeldSessionResponse response;
      std::unique_ptr<grpc::ClientWriter<v1::HeldStateChunk>> writer =
          Peer(r)->StageHeldState(&context, &response);
      v1::HeldStateChunk message;  // the first names the session and the hold, even when
      message.set_session_id(session.id());  // this rank has no part to stage
      message.set_token(token);
      bool open = writer->Write(message);
      message.clear_session_id();
      for (const auto& [key, tensor] : *parts[r]) {
        if (!open) break;
        const size_t element = tensor.type == StateTensor::Type::kI64 ? 8 : 4;
        const size_t step = kMaxChunkBytes / element * element;
        for (size_t offset = 0; offset == 0 || offset < tensor.bytes.size(); offset += step) {
          v1::StateDictChunk* chunk = message.mutable_chunk();
          chunk->Clear();
          chunk->set_key(key);
          for (int64_t d : tensor.shape) chunk->add_shape(d);
          chunk->set_offset(offset / element);
          chunk->set_dtype(tensor.type == StateTensor::Type::kI64 ? v1::DTYPE_INT64
                                                                   : v1::DTYPE_FP32);
          chunk->set_data(tensor.bytes.data() + offset,
                          std::min(step, tensor.bytes.size() - offset));
          if (!(open = writer->Write(message))) break;
        }
      }
      writer->WritesDone();
      grpc::Status finished = writer->Finish();
      if (!finished.ok()) {
        return FromGrpcStatus(grpc::Status(finished.error_code(),
                                           absl::StrCat("rank ", r, ": ", finished.error_message())));
      }
      return absl::OkStatus();
    }));
    return ApplyEverywhere(session, token);
  });
}

absl::Status RankGroup::ApplyEverywhere(Session& session, uint64_t token) {
  return ForEachRank([&](int r) -> absl::Status {
    if (r == 0) return session.ApplyStaged(token);
    return CallPeer(r, &v1::PeerService::Stub::ApplyHeldState,
                    HeldRequest(session, token, options_.hold_lease), absl::Seconds(600))
        .status();
  });
}

absl::Status RankGroup::CheckCheckpointRoot(const std::string& name) const {
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.rank, " has no checkpoint root: start it with --checkpoint_root"));
  }
  return ValidateCheckpointName(name);
}

absl::StatusOr<uint64_t> RankGroup::SaveCheckpoint(Session& session, const std::string& name,
                                                   const CheckpointProgressCallback& progress) {
  OPTSTEP_RETURN_IF_ERROR(CheckCheckpointRoot(name));
  OPTSTEP_ASSIGN_OR_RETURN(const std::string definition, DefinitionJson(session));
  const CheckpointLocation where{options_.checkpoint_root, name};
  uint64_t step = 0;
  OPTSTEP_RETURN_IF_ERROR(WithHeldSession(session, [&](uint64_t token, const HeldPoint& point) {
    OPTSTEP_RETURN_IF_ERROR(PrepareCheckpoint(where.root, where.name));
    std::vector<ShardFile> shards(options_.world_size);
    std::atomic<int> files_done{0};
    OPTSTEP_RETURN_IF_ERROR(ForEachRank([&](int r) -> absl::Status {
      if (r == 0) {
        OPTSTEP_ASSIGN_OR_RETURN(
            shards[0], WriteHeldShard(session, token, where, [&](const CheckpointProgress& p) {
              (void)session.Hold(token, options_.hold_lease);  // renews the lease
              CheckpointProgress all = p;
              all.files_done = files_done.load();
              all.files_total = options_.world_size;
              if (progress) progress(all);
            }));
      } else {
        v1::HeldSessionRequest request = HeldRequest(session, token, options_.hold_lease);
        request.set_checkpoint_name(name);
        OPTSTEP_ASSIGN_OR_RETURN(v1::HeldSessionResponse response,
                                 CallPeer(r, &v1::PeerService::Stub::SaveShard, request,
                                          absl::Hours(24)));
        shards[r] = ShardFile{response.shard_file(), response.shard_bytes(), response.shard_crc32c()};
      }
      ++files_done;
      return absl::OkStatus();
    }));
    step = point.step;
    return CommitSessionCheckpoint(session, point, where, definition, shards,
                                   options_.keep_checkpoints);
  }));
  return step;
}

absl::StatusOr<uint64_t> RankGroup::LoadCheckpoint(Session& session, const std::string& name,
                                                   const CheckpointProgressCallback& progress) {
  OPTSTEP_RETURN_IF_ERROR(CheckCheckpointRoot(name));
  OPTSTEP_ASSIGN_OR_RETURN(const std::string definition, DefinitionJson(session));
  const CheckpointLocation where{options_.checkpoint_root, name};
  uint64_t step = 0;
  OPTSTEP_RETURN_IF_ERROR(WithHeldSession(session, [&](uint64_t token, const HeldPoint&) {
    // Every rank verifies and stages; only when all succeeded does any rank apply.
    OPTSTEP_RETURN_IF_ERROR(ForEachRank([&](int r) -> absl::Status {
      if (r == 0) {
        OPTSTEP_ASSIGN_OR_RETURN(
            step, StageCheckpoint(session, token, where, definition,
                                  [&](const CheckpointProgress& p) {
                                    (void)session.Hold(token, options_.hold_lease);
                                    if (progress) progress(p);
                                  }));
        return absl::OkStatus();
      }
      v1::HeldSessionRequest request = HeldRequest(session, token, options_.hold_lease);
      request.set_checkpoint_name(name);
      return CallPeer(r, &v1::PeerService::Stub::StageCheckpoint, request, absl::Hours(24))
          .status();
    }));
    return ApplyEverywhere(session, token);
  }));
  return step;
}

// ---- This rank's part (PeerService) ----

absl::StatusOr<std::string> PeerServiceImpl::CheckpointRoot(const Session& session) const {
  const std::string root = group_ == nullptr ? "" : group_->options().checkpoint_root;
  if (root.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", session.rank(), " has no checkpoint root: start it with --checkpoint_root"));
  }
  return root;
}

absl::Duration PeerServiceImpl::Lease(const v1::HeldSessionRequest& request) const {
  return request.lease_ms() > 0 ? absl::Milliseconds(request.lease_ms()) : absl::Seconds(30);
}

grpc::ServerUnaryReactor* PeerServiceImpl::Detached(grpc::CallbackServerContext* context,
                                                    const v1::HeldSessionRequest& request,
                                                    HeldWork work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::thread([engine = engine_, id = request.session_id(), reactor, work = std::move(work)] {
    absl::StatusOr<std::shared_ptr<Session>> session = engine->GetSession(id);
    reactor->Finish(ToGrpcStatus(session.ok() ? work(**session) : session.status()));
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::AbortStep(grpc::CallbackServerContext* context,
                                                     const v1::HeldSessionRequest* request,
                                                     v1::HeldSessionResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Session>> session = engine_->GetSession(request->session_id());
  if (session.ok()) {
    (*session)->JoinAbort(request->target(), request->step());
    if (group_ != nullptr && group_->rank() == 0) {
      group_->RelayAbortVote(request->session_id(), request->target(), request->step());
    }
  }
  reactor->Finish(ToGrpcStatus(session.status()));
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::HoldSession(grpc::CallbackServerContext* context,
                                                       const v1::HeldSessionRequest* request,
                                                       v1::HeldSessionResponse* response) {
  return Detached(context, *request, [this, request, response](Session& s) -> absl::Status {
    OPTSTEP_ASSIGN_OR_RETURN(uint64_t started, s.Hold(request->token(), Lease(*request)));
    response->set_resolutions(started);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PeerServiceImpl::SettleSession(grpc::CallbackServerContext* context,
                                                         const v1::HeldSessionRequest* request,
                                                         v1::HeldSessionResponse* response) {
  return Detached(context, *request, [this, request, response](Session& s) -> absl::Status {
    OPTSTEP_ASSIGN_OR_RETURN(
        HeldPoint point,
        s.Settle(request->token(), request->target(),
                 absl::Now() + absl::Milliseconds(request->timeout_ms()), Lease(*request)));
    response->set_resolutions(point.resolutions);
    response->set_step(point.step);
    response->set_skipped_steps(point.skipped_steps);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PeerServiceImpl::ReleaseSession(grpc::CallbackServerContext* context,
                                                          const v1::HeldSessionRequest* request,
                                                          v1::HeldSessionResponse*) {
  return Detached(context, *request,
                  [request](Session& s) { return s.Release(request->token()); });
}

grpc::ServerUnaryReactor* PeerServiceImpl::ApplyHeldState(grpc::CallbackServerContext* context,
                                                          const v1::HeldSessionRequest* request,
                                                          v1::HeldSessionResponse*) {
  return Detached(context, *request,
                  [request](Session& s) { return s.ApplyStaged(request->token()); });
}

grpc::ServerWriteReactor<v1::StateDictChunk>* PeerServiceImpl::ExportHeldState(
    grpc::CallbackServerContext*, const v1::HeldSessionRequest* request) {
  return NewStateStreamReactor([engine = engine_, request = *request](
                                   std::function<void(absl::StatusOr<StreamedState>)> deliver) {
    std::thread([engine, request, deliver = std::move(deliver)] {
      absl::StatusOr<std::shared_ptr<Session>> session = engine->GetSession(request.session_id());
      if (!session.ok()) return deliver(session.status());
      StateSelection owned;
      owned.model_chunks.assign(request.model_chunks().begin(), request.model_chunks().end());
      owned.params = StateSelection::Params::kNone;  // rank 0 holds every master
      owned.counters = false;
      absl::StatusOr<std::shared_ptr<const StateDict>> dict =
          (*session)->ExportHeld(request.token(), owned);
      if (!dict.ok()) return deliver(dict.status());
      StreamedState state;
      for (const auto& [key, tensor] : **dict) state.tensors.push_back({"", "", key, &tensor});
      state.keep = *std::move(dict);
      deliver(std::move(state));
    }).detach();
  });
}

namespace {

// Collects this rank's part of an import, then validates and stages it.
class StageReactor final : public grpc::ServerReadReactor<v1::HeldStateChunk> {
 public:
  explicit StageReactor(Engine* engine) : engine_(engine) { StartRead(&message_); }

  void OnReadDone(bool ok) override {
    if (!ok) return Stage();
    absl::Status status = absl::OkStatus();
    if (session_ == nullptr) {
      token_ = message_.token();
      absl::StatusOr<std::shared_ptr<Session>> session = engine_->GetSession(message_.session_id());
      status = session.status();
      if (session.ok()) session_ = *std::move(session);
    }
    if (status.ok() && message_.has_chunk()) status = assembler_.Add(message_.chunk());
    if (!status.ok()) return Finish(ToGrpcStatus(status));
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  void Stage() {
    if (session_ == nullptr) {
      return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty stage stream"));
    }
    std::thread([this] {
      absl::StatusOr<std::shared_ptr<const StateDict>> dict = assembler_.Build(*session_);
      absl::Status status = dict.status();
      if (dict.ok()) status = session_->StageState(token_, *std::move(dict), /*complete=*/false);
      Finish(ToGrpcStatus(status));
    }).detach();
  }

  Engine* const engine_;
  std::shared_ptr<Session> session_;
  uint64_t token_ = 0;
  StateDictAssembler assembler_;
  v1::HeldStateChunk message_;
};

}  // namespace

grpc::ServerReadReactor<v1::HeldStateChunk>* PeerServiceImpl::StageHeldState(
    grpc::CallbackServerContext*, v1::HeldSessionResponse*) {
  return new StageReactor(engine_);
}

grpc::ServerUnaryReactor* PeerServiceImpl::SaveShard(grpc::CallbackServerContext* context,
                                                     const v1::HeldSessionRequest* request,
                                                     v1::HeldSessionResponse* response) {
  return Detached(context, *request, [this, request, response](Session& s) -> absl::Status {
    OPTSTEP_ASSIGN_OR_RETURN(const std::string root, CheckpointRoot(s));
    OPTSTEP_ASSIGN_OR_RETURN(
        ShardFile shard,
        WriteHeldShard(s, request->token(), {root, request->checkpoint_name()},
                       [&](const CheckpointProgress&) { (void)s.Hold(request->token(), Lease(*request)); }));
    response->set_shard_file(shard.file);
    response->set_shard_bytes(shard.bytes);
    response->set_shard_crc32c(shard.crc32c);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PeerServiceImpl::StageCheckpoint(grpc::CallbackServerContext* context,
                                                           const v1::HeldSessionRequest* request,
                                                           v1::HeldSessionResponse* response) {
  return Detached(context, *request, [this, request, response](Session& s) -> absl::Status {
    OPTSTEP_ASSIGN_OR_RETURN(const std::string root, CheckpointRoot(s));
    OPTSTEP_ASSIGN_OR_RETURN(const std::string definition, DefinitionJson(s));
    OPTSTEP_ASSIGN_OR_RETURN(
        uint64_t step,
        optstep::StageCheckpoint(s, request->token(), {root, request->checkpoint_name()},
                                 definition, [&](const CheckpointProgress&) {
                                   (void)s.Hold(request->token(), Lease(*request));
                                 }));
    response->set_step(step);
    return absl::OkStatus();
  });
}

}  // namespace optstep
