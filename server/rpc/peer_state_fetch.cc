#include "server/rpc/peer_state_fetch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/run_detached.h"
#include "base/status_macros.h"
#include "server/rpc/peer_service.h"
#include "server/rpc/state_dict_stream.h"
#include "wire/grpc_status.h"

namespace optstep {

grpc::ServerWriteReactor<v1::StateDictChunk>* PeerServiceImpl::StreamExport(
    const v1::FetchStateRequest& request, SessionExport start) {
  return NewStateStreamReactor([engine = engine_, id = request.session_id(),
                                start](std::function<void(absl::StatusOr<StreamedState>)> deliver) {
    RunDetached([engine, id, start, deliver = std::move(deliver)] {
      absl::StatusOr<std::shared_ptr<Session>> session = engine->GetSession(id);
      if (!session.ok()) return deliver(session.status());
      ((**session).*start)([deliver](absl::StatusOr<std::shared_ptr<const StateDict>> dict) {
        if (!dict.ok()) return deliver(dict.status());
        StreamedState state;
        for (const auto& [key, tensor] : **dict) state.tensors.push_back({"", "", key, &tensor});
        state.keep = *std::move(dict);
        deliver(std::move(state));
      });
    });
  });
}

grpc::ServerWriteReactor<v1::StateDictChunk>* PeerServiceImpl::FetchOwnedState(
    grpc::CallbackServerContext*, const v1::FetchStateRequest* request) {
  return StreamExport(*request, &Session::ExportOwnedState);
}

grpc::ServerWriteReactor<v1::StateDictChunk>* PeerServiceImpl::FetchShadow(
    grpc::CallbackServerContext*, const v1::FetchStateRequest* request) {
  return StreamExport(*request, &Session::ExportShadow);
}

grpc::ServerWriteReactor<v1::StateDictChunk>* PeerServiceImpl::FetchMasters(
    grpc::CallbackServerContext*, const v1::FetchStateRequest* request) {
  return StreamExport(*request, &Session::ExportMasters);
}

absl::StatusOr<std::shared_ptr<const StateDict>> FetchPeerState(v1::PeerService::Stub& peer,
                                                                int peer_rank,
                                                                const std::string& session_id,
                                                                PeerState what) {
  v1::FetchStateRequest request;
  request.set_session_id(session_id);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>> reader =
      what == PeerState::kOwned    ? peer.FetchOwnedState(&context, request)
      : what == PeerState::kShadow ? peer.FetchShadow(&context, request)
                                   : peer.FetchMasters(&context, request);
  StateDictAssembler assembler;
  v1::StateDictChunk chunk;
  absl::Status added = absl::OkStatus();
  while (reader->Read(&chunk)) {
    if (added.ok()) added = assembler.Add(chunk);
  }
  const absl::Status finished = FromGrpcStatus(reader->Finish());
  if (!finished.ok()) {
    return absl::Status(finished.code(),
                        absl::StrCat("rank ", peer_rank, ": ", finished.message()));
  }
  OPTSTEP_RETURN_IF_ERROR(added);
  return assembler.BuildPlain();
}

}  // namespace optstep
