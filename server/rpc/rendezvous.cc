#include "server/rpc/rendezvous.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/run_detached.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

std::chrono::system_clock::time_point After(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

// A channel to rank 0 that reconnects quickly to its next process.
std::shared_ptr<grpc::Channel> StoreChannel(const std::string& target,
                                            std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  SetFastReconnect(args);
  return grpc::CreateCustomChannel(
      target, credentials ? std::move(credentials) : grpc::InsecureChannelCredentials(), args);
}

}  // namespace

std::string RankAddressKey(int rank) { return absl::StrCat("optstep/rank/", rank, "/address"); }

void SetFastReconnect(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
}

RendezvousServiceImpl::RendezvousServiceImpl() : store_(NewInMemoryKeyValueStore()) {}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Set(grpc::CallbackServerContext* context,
                                                     const v1::RendezvousSetRequest* request,
                                                     v1::RendezvousSetResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(store_->Set(request->key(), request->value())));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Get(grpc::CallbackServerContext* context,
                                                     const v1::RendezvousGetRequest* request,
                                                     v1::RendezvousGetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Duration timeout = absl::Milliseconds(request->timeout_ms());
  // The wait runs on its own thread; rendezvous gets are few (ranks x groups x the slices of
  // a long wait, NewAbandoningKeyValueStore).
  RunDetached([store = store_, key = request->key(), timeout, reactor, response] {
    absl::StatusOr<std::string> value = store->Get(key, timeout);
    if (value.ok()) response->set_value(*std::move(value));
    reactor->Finish(ToGrpcStatus(value.status()));
  });
  return reactor;
}

GrpcKeyValueStore::GrpcKeyValueStore(const std::string& target,
                                     std::shared_ptr<grpc::ChannelCredentials> credentials)
    : credentials_(std::move(credentials)),
      target_(target),
      stub_(v1::RendezvousService::NewStub(StoreChannel(target, credentials_))) {}

std::string GrpcKeyValueStore::target() const {
  absl::MutexLock lock(&mu_);
  return target_;
}

void GrpcKeyValueStore::Retarget(const std::string& target) {
  absl::MutexLock lock(&mu_);
  if (target == target_) return;
  target_ = target;
  stub_ = v1::RendezvousService::NewStub(StoreChannel(target, credentials_));
}

std::shared_ptr<v1::RendezvousService::Stub> GrpcKeyValueStore::stub() const {
  absl::MutexLock lock(&mu_);
  return stub_;
}

absl::Status GrpcKeyValueStore::Set(const std::string& key, const std::string& value) {
  return SetWithin(key, value, absl::Seconds(60));
}

absl::Status GrpcKeyValueStore::SetWithin(const std::string& key, const std::string& value,
                                          absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(After(timeout));
  v1::RendezvousSetRequest request;
  request.set_key(key);
  request.set_value(value);
  v1::RendezvousSetResponse response;
  return FromGrpcStatus(stub()->Set(&context, request, &response));
}

absl::StatusOr<std::string> GrpcKeyValueStore::Get(const std::string& key, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(After(timeout + absl::Seconds(5)));
  v1::RendezvousGetRequest request;
  request.set_key(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::RendezvousGetResponse response;
  grpc::Status status = stub()->Get(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_value());
}

absl::StatusOr<std::string> GrpcKeyValueStore::Peek(const std::string& key, absl::Duration within) {
  grpc::ClientContext context;
  context.set_deadline(After(within));
  v1::RendezvousGetRequest request;
  request.set_key(key);
  v1::RendezvousGetResponse response;
  grpc::Status status = stub()->Get(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_value());
}

}  // namespace optstep
