// GroupCommunicators: a session's communicator rendezvous under the group's generation ("g<g>/"
// before the session id; none in generation 0), RebuildAll reconnects every session still in
// use, in id order, under the new generation, and the session's communicator goes on working
// through the new connection; a session that closed is not rebuilt, nor one that is still held
// but no longer open (its collectives answer why). CloseAll (a heal's first
// phase) releases every connection at once, and the collectives answer why until the rebuild (a
// late one, of an older generation, closes nothing); so does a collective that lost a peer, for
// its own connection.

#include "server/rpc/group_communicators.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;

// Local (one-rank) communicators, recording the prefixes they were made with.
struct Recorder {
  std::vector<std::string> prefixes;
  GroupCommunicators::Connect connect() {
    return [this](const std::string& prefix) -> absl::StatusOr<std::unique_ptr<Communicator>> {
      prefixes.push_back(prefix);
      CommunicatorOptions options;
      options.prefix = prefix;
      return CreateCommunicator(options);
    };
  }
};

TEST(GroupCommunicatorsTest, RebuildAllReconnectsTheLiveSessionsUnderTheNewGeneration) {
  Recorder recorder;
  GroupCommunicators communicators(recorder.connect());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> b, communicators.Make("sb"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> a, communicators.Make("sa"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> closed, communicators.Make("sc"));
  closed.reset();
  // Closed, but still held by a call that has yet to end.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> held, communicators.Make("se"));
  ASSERT_THAT(communicators.RebuildAll(2, {"sa", "sb"}), IsOk());
  EXPECT_EQ(communicators.generation(), 2u);
  EXPECT_THAT(recorder.prefixes, ElementsAre("sb", "sa", "sc", "se", "g2/sa", "g2/sb"));
  float held_value = 1.0f;
  EXPECT_THAT(held->AllReduce(&held_value, 1, CommDType::kFloat32, ReduceOp::kSum),
              StatusIs(absl::StatusCode::kUnavailable,
                       "session se is closed; its communicator was not rebuilt for generation 2"));
  // A session made now joins the new generation; the rebuilt ones still work.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> d, communicators.Make("sd"));
  EXPECT_EQ(recorder.prefixes.back(), "g2/sd");
  float value = 3.0f;
  EXPECT_THAT(a->AllReduce(&value, 1, CommDType::kFloat32, ReduceOp::kSum), IsOk());
  EXPECT_EQ(value, 3.0f);
  EXPECT_EQ(a->rank(), 0);
  EXPECT_EQ(a->world_size(), 1);
}

// A local communicator that counts its connections alive.
class Counted final : public ForwardingCommunicator {
 public:
  Counted(std::unique_ptr<Communicator> base, int* alive)
      : ForwardingCommunicator(std::move(base)), alive_(alive) {
    ++*alive_;
  }
  ~Counted() override { --*alive_; }

 private:
  int* const alive_;
};

TEST(GroupCommunicatorsTest, CloseAllReleasesEveryConnectionUntilTheRebuild) {
  int alive = 0;
  GroupCommunicators communicators(
      [&alive](const std::string& prefix) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        CommunicatorOptions options;
        options.prefix = prefix;
        OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> inner, CreateCommunicator(options));
        return std::unique_ptr<Communicator>(std::make_unique<Counted>(std::move(inner), &alive));
      });
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> a, communicators.Make("sa"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> b, communicators.Make("sb"));
  ASSERT_EQ(alive, 2);
  communicators.CloseAll(communicators.generation(), absl::UnavailableError("closed for a heal"));
  // The connections are gone (their sockets closed), not only refused.
  EXPECT_EQ(alive, 0);
  float value = 3.0f;
  EXPECT_THAT(a->AllReduce(&value, 1, CommDType::kFloat32, ReduceOp::kSum),
              StatusIs(absl::StatusCode::kUnavailable, "closed for a heal"));
  EXPECT_THAT(b->Barrier(), StatusIs(absl::StatusCode::kUnavailable, "closed for a heal"));
  EXPECT_EQ(a->rank(), 0);
  ASSERT_THAT(communicators.RebuildAll(1, {"sa", "sb"}), IsOk());
  EXPECT_EQ(alive, 2);
  EXPECT_THAT(a->AllReduce(&value, 1, CommDType::kFloat32, ReduceOp::kSum), IsOk());
  EXPECT_EQ(value, 3.0f);
  // A close for the heal into generation 0, late: the connections of generation 1 stay.
  communicators.CloseAll(0, absl::UnavailableError("closed for an older heal"));
  EXPECT_EQ(alive, 2);
  EXPECT_THAT(a->AllReduce(&value, 1, CommDType::kFloat32, ReduceOp::kSum), IsOk());
}

// Counted, whose collectives fail as when a peer is lost.
class LosesAPeer final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  absl::Status AllReduce(void*, int64_t, CommDType, ReduceOp) override {
    return absl::UnavailableError("peer lost");
  }
};

TEST(GroupCommunicatorsTest, ACollectiveThatLostAPeerReleasesTheConnection) {
  int alive = 0;
  bool lose = true;
  GroupCommunicators communicators(
      [&](const std::string& prefix) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        CommunicatorOptions options;
        options.prefix = prefix;
        OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> inner, CreateCommunicator(options));
        auto counted = std::make_unique<Counted>(std::move(inner), &alive);
        if (!lose) return std::unique_ptr<Communicator>(std::move(counted));
        return std::unique_ptr<Communicator>(std::make_unique<LosesAPeer>(std::move(counted)));
      });
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> a, communicators.Make("sa"));
  ASSERT_EQ(alive, 1);
  float value = 3.0f;
  EXPECT_THAT(a->AllReduce(&value, 1, CommDType::kFloat32, ReduceOp::kSum),
              StatusIs(absl::StatusCode::kUnavailable, "peer lost"));
  // Released at once (a peer waiting for this rank fails too), and refused until the rebuild.
  EXPECT_EQ(alive, 0);
  EXPECT_THAT(a->Barrier(), StatusIs(absl::StatusCode::kUnavailable, "peer lost"));
  lose = false;
  ASSERT_THAT(communicators.RebuildAll(1, {"sa"}), IsOk());
  EXPECT_THAT(a->AllReduce(&value, 1, CommDType::kFloat32, ReduceOp::kSum), IsOk());
}

TEST(GroupCommunicatorsTest, AFailedReconnectNamesTheSessionAndTheGeneration) {
  bool fail = false;
  GroupCommunicators communicators(
      [&fail](const std::string& prefix) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        if (fail) return absl::DeadlineExceededError("rendezvous timed out");
        CommunicatorOptions options;
        options.prefix = prefix;
        return CreateCommunicator(options);
      });
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> a, communicators.Make("sa"));
  fail = true;
  EXPECT_THAT(communicators.RebuildAll(1, {"sa"}),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "session sa: rebuilding its communicator for generation 1: rendezvous "
                       "timed out"));
}

}  // namespace
}  // namespace optstep
