#include "tests/testing/unary_call.h"

#include <grpcpp/generic/generic_stub.h>

#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace optstep {
namespace testutil {

grpc::Status UnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const google::protobuf::Message& request, const std::string& token) {
  return UnaryCallBytes(channel, method, request.SerializeAsString(), token);
}

grpc::Status UnaryCallBytes(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& bytes,
                            const std::string& token) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  return done.get_future().get();
}

}  // namespace testutil
}  // namespace optstep
