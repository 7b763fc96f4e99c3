#include "server/rpc/request_parse_interceptor.h"

#include <google/protobuf/descriptor.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace optstep {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

// "/optstep.v1.OptimizerService/CreateSession" -> "optstep.v1.CreateSessionRequest", or the
// method path when the generated pool does not know it.
std::string RequestTypeName(absl::string_view method) {
  const std::string full_name = absl::StrReplaceAll(absl::StripPrefix(method, "/"), {{"/", "."}});
  const google::protobuf::MethodDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full_name);
  if (descriptor == nullptr) return absl::StrCat("the request message of ", method);
  return descriptor->input_type()->full_name();
}

class RequestParseInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit RequestParseInterceptor(ServerRpcInfo* info)
      : method_(info->method()),
        // Only these receive their one request with the call: a client stream's reads end with
        // no message too, and its reactor answers for them.
        single_request_(info->type() == ServerRpcInfo::Type::UNARY ||
                        info->type() == ServerRpcInfo::Type::SERVER_STREAMING) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (single_request_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat(method_, ": the request does not parse as ", RequestTypeName(method_))));
    }
    methods->Proceed();
  }

 private:
  const char* const method_;  // owned by gRPC for the server's lifetime
  const bool single_request_;
  bool unparsed_ = false;
};

class RequestParseFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(ServerRpcInfo* info) override {
    return new RequestParseInterceptor(info);
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRequestParseInterceptorFactory() {
  return std::make_unique<RequestParseFactory>();
}

}  // namespace optstep
