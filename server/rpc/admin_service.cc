#include "server/rpc/admin_service.h"

#include "base/caller_text.h"
#include "glog/logging.h"

namespace optstep {

grpc::ServerUnaryReactor* AdminServiceImpl::Shutdown(grpc::CallbackServerContext* context,
                                                     const v1::ShutdownRequest* request,
                                                     v1::ShutdownResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!on_shutdown_) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "this server was started without a shutdown path"));
    return reactor;
  }
  LOG(INFO) << "event=shutdown_requested peer=" << context->peer() << " reason=\""
            << LogValue(request->reason()) << "\"";
  on_shutdown_(request->reason());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace optstep
