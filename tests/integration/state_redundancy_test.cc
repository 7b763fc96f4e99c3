// State redundancy across real rank processes on loopback (docs/design.md, "State
// redundancy"): with --state_redundancy=1, after a few steps each rank's buddy holds a shadow
// equal bit for bit to the rank's own state (masters it owns, their optimizer state, the group
// counters, the step), fetched through PeerService.FetchShadow and FetchOwnedState; every rank
// answers the masters of every parameter, and its memory gauge counts its shadow. Without
// redundancy there is no shadow to fetch.

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gtest/gtest.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "server/rpc/state_dict_stream.h"
#include "tests/integration/test_metrics.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::StepSmall;

using Group = std::vector<std::unique_ptr<ServerProcess>>;

// The trained session's id on `group` after `steps` steps of an Adam session.
absl::StatusOr<std::string> Train(Group& group, uint64_t steps) {
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = absl::Seconds(20);
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Client> trainer, Client::Connect(options));
  // Rank 0 serves once every rank joined the group.
  for (const absl::Time end = absl::Now() + absl::Seconds(20);;) {
    absl::StatusOr<bool> serving = trainer->CheckHealth();
    if (serving.ok() && *serving) break;
    if (absl::Now() > end) return absl::DeadlineExceededError("rank 0 never served");
    absl::SleepFor(absl::Milliseconds(50));
  }
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo info, trainer->CreateSession(SmallSpec("adam")));
  for (uint64_t step = 1; step <= steps; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*trainer, info.session_id(), step).status());
  }
  return info.session_id();
}

enum class PeerState { kOwned, kShadow, kMasters };

// PeerService.FetchOwnedState / FetchShadow / FetchMasters of `rank`, assembled as a peer does.
absl::StatusOr<std::shared_ptr<const StateDict>> Fetch(const ServerProcess& rank, int r,
                                                       const std::string& id, PeerState what) {
  std::unique_ptr<v1::PeerService::Stub> peer = v1::PeerService::NewStub(
      grpc::CreateChannel(rank.address(), grpc::InsecureChannelCredentials()));
  v1::FetchStateRequest request;
  request.set_session_id(id);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>> reader =
      what == PeerState::kOwned    ? peer->FetchOwnedState(&context, request)
      : what == PeerState::kShadow ? peer->FetchShadow(&context, request)
                                   : peer->FetchMasters(&context, request);
  StateDictAssembler assembler;
  absl::Status read = assembler.AddAll(*reader, [r](const grpc::Status& end) {
    return absl::Status(static_cast<absl::StatusCode>(end.error_code()),
                        absl::StrCat("rank ", r, ": ", end.error_message()));
  });
  if (!read.ok()) return read;
  return assembler.BuildPlain();
}

TEST(StateRedundancyTest, EachBuddysShadowEqualsTheOwnersExportedState) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group,
                                 testutil::StartGroup(world, {"--state_redundancy=1"}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::string id, Train(group, 3));
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE(absl::StrCat("owner ", r));
      const int buddy = (r + 1) % world;
      OPTSTEP_ASSERT_OK_AND_ASSIGN(auto own, Fetch(*group[r], r, id, PeerState::kOwned));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(auto shadow,
                                   Fetch(*group[buddy], buddy, id, PeerState::kShadow));
      ASSERT_EQ(own->size(), shadow->size());
      for (const auto& [key, tensor] : *own) {
        ASSERT_EQ(shadow->count(key), 1u) << key;
        EXPECT_EQ(shadow->at(key).bytes, tensor.bytes) << key;
      }
      ASSERT_EQ(own->count("meta/step"), 1u);
      uint64_t step = 0;
      memcpy(&step, own->at("meta/step").bytes.data(), sizeof(step));
      EXPECT_EQ(step, 3u);
      // Every rank answers every master.
      OPTSTEP_ASSERT_OK_AND_ASSIGN(auto masters, Fetch(*group[r], r, id, PeerState::kMasters));
      EXPECT_EQ(masters->count("param/" + SmallSpec("adam").parameters(0).name()), 1u);
    }
  }
}

TEST(StateRedundancyTest, WithoutRedundancyThereIsNoShadow) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(2, {"--state_redundancy=0"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::string id, Train(group, 1));
  EXPECT_THAT(Fetch(*group[1], 1, id, PeerState::kShadow).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "keeps no shadow"));
}

// Each rank's memory gauge counts its shadow: with redundancy it exceeds the same group's without
// by the predecessor's owned masters, Adam moments and gradient buffers, 16 bytes an element, all
// of the session's elements between the two ranks.
TEST(StateRedundancyTest, TheMemoryGaugeCountsTheShadow) {
  std::vector<double> gauges[2];
  for (int redundancy : {0, 1}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(
        Group group, testutil::StartGroup(2, {absl::StrCat("--state_redundancy=", redundancy),
                                              "--metrics_port=-1"}));
    OPTSTEP_ASSERT_OK(Train(group, 1).status());
    for (int r = 0; r < 2; ++r) {
      gauges[redundancy].push_back(
          testutil::ScrapeMetrics(group[r]->metrics_port())["optstep_device_memory_bytes"]);
    }
  }
  double shadows = 0;
  for (int r = 0; r < 2; ++r) {
    const double shadow = gauges[1][r] - gauges[0][r];
    EXPECT_GT(shadow, 0) << "rank " << r;
    shadows += shadow;
  }
  EXPECT_EQ(shadows, 16.0 * testutil::kSmallElements);
}

}  // namespace
}  // namespace optstep
