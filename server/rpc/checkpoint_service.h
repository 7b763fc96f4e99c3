#ifndef OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_
#define OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "checkpoint/state_dict.h"
#include "optstep/v1/checkpoint_service.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/held_operations.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/state_dict_stream.h"

namespace optstep {

// The checkpoint service of the v1 API (docs/checkpoints.md). Save / Load write and restore
// checkpoint directories across every rank of the group; ExportStateDict / ImportStateDict
// stream a session's state dict (merged, by model chunk or by sub-optimizer). All of them see
// one step on every rank (HeldOperations::WithHeldSession). Served by rank 0. Thread-safe.
class CheckpointServiceImpl final : public v1::CheckpointService::CallbackService {
 public:
  // `engine` and `group` must outlive the service. Without a group (tests of one rank), a group
  // of one rank with default options is used.
  // `stream_idle_timeout` bounds how long each streamed answer waits on its caller to take a
  // message (IdleBound; zero: no bound).
  CheckpointServiceImpl(Engine* engine, RankGroup* group = nullptr,
                        absl::Duration stream_idle_timeout = absl::ZeroDuration());
  ~CheckpointServiceImpl() override;

  grpc::ServerWriteReactor<v1::CheckpointProgress>* Save(grpc::CallbackServerContext* context,
                                                         const v1::SaveRequest* request) override;
  grpc::ServerWriteReactor<v1::CheckpointProgress>* Load(grpc::CallbackServerContext* context,
                                                         const v1::LoadRequest* request) override;
  grpc::ServerWriteReactor<v1::StateDictChunk>* ExportStateDict(
      grpc::CallbackServerContext* context, const v1::ExportStateDictRequest* request) override;
  grpc::ServerReadReactor<v1::StateDictChunk>* ImportStateDict(
      grpc::CallbackServerContext* context, v1::ImportStateDictResponse* response) override;

 private:
  Engine* const engine_;
  const absl::Duration stream_idle_timeout_;
  std::unique_ptr<RankGroup> own_group_;  // when none was given
  HeldOperations held_;                   // over the given group or own_group_
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_
