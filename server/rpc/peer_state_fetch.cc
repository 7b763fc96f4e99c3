// The serving side of state redundancy's fetches (heal.h, PeerFetch): a session's state dicts
// streamed from its coordinator.

#include <utility>

#include "base/run_detached.h"
#include "server/rpc/peer_service.h"
#include "server/rpc/state_dict_stream.h"

namespace optstep {

grpc::ServerWriteReactor<v1::StateDictChunk>* PeerServiceImpl::StreamExport(
    const v1::FetchStateRequest& request, SessionExport start) {
  // Between ranks: the calling rank bounds its own wait (StallWatch).
  return NewStateStreamReactor(
      nullptr, absl::ZeroDuration(), "FetchState",
      [engine = engine_, id = request.session_id(), start](
          std::function<void(absl::StatusOr<StreamedState>)> deliver,
          std::function<bool()> /*ended*/) {
        RunDetached([engine, id, start, deliver = std::move(deliver)] {
          absl::StatusOr<std::shared_ptr<Session>> session = engine->GetSession(id);
          if (!session.ok()) return deliver(session.status());
          ((**session).*start)([deliver](absl::StatusOr<std::shared_ptr<const StateDict>> dict) {
            if (!dict.ok()) return deliver(dict.status());
            StreamedState state;
            for (const auto& [key, tensor] : **dict)
              state.tensors.push_back({"", "", key, &tensor});
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

}  // namespace optstep
