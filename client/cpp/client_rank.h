#ifndef OPTSTEP_CLIENT_CPP_CLIENT_RANK_H_
#define OPTSTEP_CLIENT_CPP_CLIENT_RANK_H_

// The channel and stubs of one rank, and the context of one call, private to the Client's own
// files (client.cc, client_checkpoints.cc, client_stand_ins.cc).

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"

namespace optstep {

struct Client::Rank {
  std::string target;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::OptimizerService::Stub> service;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

// A context for one call with the given timeout.
inline void Prepare(grpc::ClientContext& context, absl::Duration timeout, bool wait_for_ready) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context.set_wait_for_ready(wait_for_ready);
}

}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_CLIENT_RANK_H_
