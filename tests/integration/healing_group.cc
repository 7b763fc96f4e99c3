#include "tests/integration/healing_group.h"

#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "tests/integration/test_session.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testutil {

std::vector<std::string> HealingFlags(absl::Duration rejoin_timeout) {
  return {"--heartbeat_interval_ms=100", "--peer_timeout_ms=1000", "--state_redundancy=1",
          absl::StrCat("--rejoin_timeout_ms=", absl::ToInt64Milliseconds(rejoin_timeout))};
}

std::unique_ptr<Client> Trainer(const Group& group) {
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = absl::Seconds(20);
  options.recovery_timeout = absl::Seconds(30);
  auto client = Client::Connect(options);
  EXPECT_THAT(client.status(), IsOk());
  return client.ok() ? *std::move(client) : nullptr;
}

bool AwaitHealth(const ServerProcess& rank, bool serving, absl::Duration bound) {
  ClientOptions options;
  options.target = rank.address();
  auto client = Client::Connect(options);
  if (!client.ok()) return false;
  for (const absl::Time end = absl::Now() + bound; absl::Now() < end;) {
    absl::StatusOr<bool> health = (*client)->CheckHealth();
    if (health.ok() && *health == serving) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

bool Live(const ServerProcess& rank) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(rank.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("optstep.liveness");
  grpc::health::v1::HealthCheckResponse response;
  return health->Check(&context, request, &response).ok() &&
         response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

bool Running(const ServerProcess& rank) {
  int status = 0;
  return rank.pid() > 0 && waitpid(rank.pid(), &status, WNOHANG) == 0;
}

absl::StatusOr<uint64_t> AwaitListedStep(const ServerProcess& rank, const std::string& session_id,
                                         uint64_t step, absl::Duration bound) {
  auto peer = v1::PeerService::NewStub(
      grpc::CreateChannel(rank.address(), grpc::InsecureChannelCredentials()));
  const absl::Time end = absl::Now() + bound;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ListReplicasResponse listed;
    const grpc::Status status = peer->ListReplicas(&context, v1::ListReplicasRequest(), &listed);
    if (!status.ok()) return absl::InternalError(status.error_message());
    uint64_t now = 0;
    for (const v1::CreateReplicaRequest& replica : listed.replicas()) {
      if (replica.session_id() == session_id) now = replica.step();
    }
    if (now == step || absl::Now() >= end) return now;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status Restart(Group& group, int rank, std::vector<std::string> flags) {
  const std::string& address = group[rank]->address();
  flags.push_back(absl::StrCat("--port=", address.substr(address.rfind(':') + 1)));
  flags.push_back(absl::StrCat("--rank=", rank));
  flags.push_back(absl::StrCat("--world_size=", group.size()));
  if (rank > 0) flags.push_back(absl::StrCat("--rendezvous=", group[0]->address()));
  OPTSTEP_ASSIGN_OR_RETURN(group[rank], ServerProcess::Start(flags));
  return absl::OkStatus();
}

v1::SessionSpec SpreadSpec(const std::string& name, v1::ParameterStorage storage) {
  v1::SessionSpec spec = SmallSpec(name);
  spec.set_parameter_storage(storage);
  spec.clear_parameters();
  for (int p = 0; p < kSpreadParams; ++p) {
    auto* param = spec.add_parameters();
    param->set_name(absl::StrCat("layer", p, ".weight"));
    param->add_shape(16 + 8 * p);
  }
  return spec;
}

std::vector<std::vector<float>> SpreadGradients(uint64_t step) {
  std::vector<std::vector<float>> grads(kSpreadParams);
  for (int p = 0; p < kSpreadParams; ++p) {
    for (int i = 0; i < 16 + 8 * p; ++i) {
      grads[p].push_back(0.01f * static_cast<float>((i * 7 + p * 3) % 11 - 5) +
                         0.002f * static_cast<float>(step));
    }
  }
  return grads;
}

absl::StatusOr<StepReply> StepSpread(Client& trainer, const std::string& session_id,
                                     uint64_t step) {
  const std::vector<std::vector<float>> grads = SpreadGradients(step);
  std::vector<FullGradient> full;
  for (int p = 0; p < kSpreadParams; ++p) full.push_back({static_cast<uint32_t>(p), grads[p]});
  StepOptions options;
  options.session_id = session_id;
  options.step = step;
  return trainer.Step(options, full);
}

absl::StatusOr<v1::SessionInfo> SteppedReference(Client& trainer, uint64_t steps,
                                                 v1::ParameterStorage storage) {
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo reference,
                           trainer.CreateSession(SpreadSpec("reference", storage)));
  for (uint64_t step = 1; step <= steps; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSpread(trainer, reference.session_id(), step).status());
  }
  return reference;
}

absl::StatusOr<std::string> StateOf(Client& trainer, const std::string& session_id) {
  v1::ExportStateDictRequest request;
  request.set_session_id(session_id);
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<Client::StateDictEntry> entries,
                           trainer.ExportStateDict(request));
  std::string all;
  for (const Client::StateDictEntry& entry : entries) {
    absl::StrAppend(&all, entry.chunk_key, "/", entry.key, ":", entry.bytes.size(), ":",
                    entry.bytes, ";");
  }
  return all;
}

absl::Status SameStateAndParameters(Client& trainer, const std::string& reference,
                                    const std::string& other) {
  OPTSTEP_ASSIGN_OR_RETURN(std::string expected, StateOf(trainer, reference));
  OPTSTEP_ASSIGN_OR_RETURN(std::string got, StateOf(trainer, other));
  if (expected.empty()) return absl::InternalError("the reference session exports no state");
  if (got != expected) return absl::InternalError("the optimizer state differs");
  OPTSTEP_ASSIGN_OR_RETURN(std::string expected_params, Pulled(trainer, reference));
  OPTSTEP_ASSIGN_OR_RETURN(std::string got_params, Pulled(trainer, other));
  if (got_params != expected_params) return absl::InternalError("the parameters differ");
  return absl::OkStatus();
}

}  // namespace testutil
}  // namespace optstep
