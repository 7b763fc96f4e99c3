// The engine's failure branches, reached through a fault-injecting Device and Communicator: a
// rank whose gradient statistics fail makes every rank abort the step with nothing applied; a
// failed gradient write, optimizer step, all-reduce or all-gather breaks the replica (further
// steps are refused); a device slow enough to miss the step deadline aborts the step on every
// rank; a corrupted gradient skips it. Ranks are engines in this process joined by gloo.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/comm/key_value_store.h"
#include "kernels/device_factory.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/fault_injecting_communicator.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::FaultInjectingCommunicator;
using ::optstep::testutil::FaultInjectingDevice;
using ::optstep::testutil::FaultInjector;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::StatusIs;

constexpr char kSessionId[] = "failures";
constexpr int64_t kElements = 6;
// How long a rank waits in a collective for a peer that left it.
constexpr absl::Duration kCommTimeout = absl::Seconds(5);

// The step's result; UNKNOWN when it did not come within 30 s.
absl::StatusOr<StepOutcome> Await(Outcome& outcome) {
  if (!outcome.WaitFor(absl::Seconds(30))) return absl::UnknownError("no outcome within 30 s");
  return outcome.result();
}

// One rank: its engine over a fault-injecting device, and the session's fault-injecting
// communicator (owned by the session).
struct Rank {
  std::shared_ptr<FaultInjectingDevice> device;
  std::unique_ptr<Engine> engine;
  FaultInjectingCommunicator* comm = nullptr;
  std::shared_ptr<Session> session;
};

// The next call of `method` fails with `status`.
void FailNext(FaultInjector& faults, const char* method, absl::Status status) {
  const int64_t next = faults.calls(method) + 1;
  faults.FailCall(method, next, std::move(status));
}

class SessionFailureTest : public ::testing::Test {
 protected:
  // Starts `world` ranks and creates the session on every rank: parameters "a" and "b" of
  // kElements each (one per rank with two ranks), AdamW, the given step deadline.
  void StartRanks(int world, absl::Duration step_deadline = absl::Seconds(60)) {
    ranks_.resize(world);
    std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
    for (int r = 0; r < world; ++r) {
      Rank& rank = ranks_[r];
      DeviceOptions cpu;
      cpu.num_threads = 1;
      absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(cpu);
      ASSERT_THAT(device.status(), IsOk());
      rank.device = std::make_shared<FaultInjectingDevice>(*std::move(device));
      EngineOptions options;
      options.injected_device = rank.device;
      options.rank = r;
      options.world_size = world;
      options.make_communicator =
          [&rank, store, r,
           world](const std::string& id) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        CommunicatorOptions comm;
        comm.kind = world > 1 ? "gloo" : "local";
        comm.rank = r;
        comm.world_size = world;
        comm.prefix = id;
        comm.store = store;
        comm.timeout = kCommTimeout;
        absl::StatusOr<std::unique_ptr<Communicator>> created = CreateCommunicator(comm);
        if (!created.ok()) return created.status();
        auto wrapped = std::make_unique<FaultInjectingCommunicator>(*std::move(created));
        rank.comm = wrapped.get();
        return std::unique_ptr<Communicator>(std::move(wrapped));
      };
      absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
      ASSERT_THAT(engine.status(), IsOk());
      rank.engine = *std::move(engine);
    }
    // Deadline votes are relayed to every other rank, as the rank group does.
    for (int r = 0; r < world; ++r) {
      ranks_[r].engine->SetAbortVoteListener(
          [this, r](const std::string& id, uint64_t resolution, uint64_t step) {
            for (size_t other = 0; other < ranks_.size(); ++other) {
              if (static_cast<int>(other) == r) continue;
              auto session = ranks_[other].engine->GetSession(id);
              if (session.ok()) (*session)->JoinAbort(resolution, step);
            }
          });
    }
    SessionConfig config;
    config.params = {ParamInfo{"a", {2, kElements / 2}}, ParamInfo{"b", {kElements}}};
    SubOptimizerConfig adam;
    adam.name = "adam";
    adam.kind = "adamw";
    adam.adamw.lr = 0.1;
    config.chain.sub_optimizers = {adam};
    config.step_deadline = step_deadline;
    // The group connects only when every rank creates its replica.
    std::vector<std::thread> threads;
    std::vector<absl::StatusOr<std::shared_ptr<Session>>> created(world);
    for (int r = 0; r < world; ++r) {
      threads.emplace_back(
          [&, r] { created[r] = ranks_[r].engine->CreateReplica(kSessionId, config); });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_THAT(created[r].status(), IsOk());
      ranks_[r].session = *created[r];
    }
  }

  // Begins trainer 0's part of `step` on `rank` and sends the gradients of the parameters it
  // owns; `added` is the status of the first AddGradient that failed (OK when none did).
  absl::StatusOr<StepHandle> BeginAndSend(int rank, uint64_t step, absl::Status* added) {
    Session& session = *ranks_[rank].session;
    StepBegin begin;
    begin.step = step;
    absl::StatusOr<StepHandle> c = session.Begin(begin);
    if (!c.ok()) return c;
    *added = absl::OkStatus();
    for (int p = 0; p < 2; ++p) {
      if (session.layout().owner[p] != rank) continue;
      std::vector<float> grad(kElements);
      for (int i = 0; i < kElements; ++i) grad[i] = 0.25f * (i + 1) * (p == 0 ? 1 : -2);
      *added = session.AddGradient(*c, p, 0, DType::kF32, grad.data(), kElements * 4);
      if (!added->ok()) break;
    }
    return c;
  }

  // Sends and commits step `step` on every rank; outcomes[r] gets rank r's result.
  void CommitStep(uint64_t step, std::vector<Outcome>& outcomes) {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      absl::Status added;
      absl::StatusOr<StepHandle> c = BeginAndSend(static_cast<int>(r), step, &added);
      ASSERT_THAT(c.status(), IsOk());
      ASSERT_THAT(added, IsOk());
      ASSERT_THAT(ranks_[r].session->Commit(*c, 0, outcomes[r].Callback()), IsOk());
    }
  }

  // Rank r's whole state (masters, optimizer state, counters) once its resolutions are done.
  StateDict HeldState(int r) {
    Session& session = *ranks_[r].session;
    const uint64_t token = 100 + r;
    absl::StatusOr<uint64_t> started = session.holds().Hold(token, absl::Seconds(30));
    EXPECT_THAT(started.status(), IsOk());
    if (!started.ok()) return {};
    EXPECT_THAT(session.holds()
                    .Settle(token, *started, absl::Now() + absl::Seconds(30), absl::Seconds(30))
                    .status(),
                IsOk());
    absl::StatusOr<std::shared_ptr<const StateDict>> state =
        session.holds().ExportHeld(token, StateSelection{});
    EXPECT_THAT(state.status(), IsOk());
    EXPECT_THAT(session.holds().Release(token), IsOk());
    return state.ok() ? **state : StateDict{};
  }

  // Every step from now on is refused on rank r: the replica is broken.
  void ExpectBroken(int r, uint64_t step) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    Session& session = *ranks_[r].session;
    EXPECT_FALSE(session.healthy());
    EXPECT_FALSE(ranks_[r].engine->healthy());
    StepBegin begin;
    begin.step = step;
    EXPECT_THAT(session.Begin(begin).status(),
                StatusIs(absl::StatusCode::kUnavailable, "the group must be restarted"));
  }

  // Fails rank 1's next call of `method` and commits step 1 on both ranks: rank 1's outcome is
  // (code1, message1), rank 0 waits out the communicator timeout in `phase` and loses its peer,
  // and neither applies the step nor takes another.
  void ExpectRankOneFailureBreaksBoth(FaultInjector& faults, const char* method,
                                      absl::Status injected, absl::StatusCode code1,
                                      const std::string& message1, const std::string& phase) {
    FailNext(faults, method, std::move(injected));
    std::vector<Outcome> outcomes(2);
    ASSERT_NO_FATAL_FAILURE(CommitStep(1, outcomes));
    EXPECT_THAT(Await(outcomes[1]).status(), StatusIs(code1, message1));
    EXPECT_THAT(Await(outcomes[0]).status(),
                StatusIs(absl::StatusCode::kUnavailable,
                         "session 'failures': rank 0 lost a peer during " + phase));
    for (int r = 0; r < 2; ++r) {
      ExpectBroken(r, 1);
      EXPECT_EQ(ranks_[r].session->stats().step, 0u);
    }
  }

  std::vector<Rank> ranks_;
};

// Equal keys and, bit for bit, equal tensors; keys starting with `skip` are not compared.
void ExpectSameState(const StateDict& before, const StateDict& after, absl::string_view skip = "") {
  ASSERT_FALSE(before.empty());
  ASSERT_EQ(before.size(), after.size());
  for (auto b = before.begin(), a = after.begin(); b != before.end(); ++b, ++a) {
    ASSERT_EQ(b->first, a->first);
    if (!skip.empty() && absl::StartsWith(b->first, skip)) continue;
    EXPECT_EQ(b->second.shape, a->second.shape) << b->first;
    EXPECT_TRUE(b->second.bytes == a->second.bytes) << b->first << " changed";
  }
}

TEST_F(SessionFailureTest, GradientStatisticsFailureAbortsTheStepOnEveryRank) {
  ASSERT_NO_FATAL_FAILURE(StartRanks(2));
  const StateDict before[2] = {HeldState(0), HeldState(1)};
  FailNext(ranks_[1].device->faults(), "ComputeGradientStats",
           absl::InternalError("injected: the device lost the gradient"));
  std::vector<Outcome> outcomes(2);
  ASSERT_NO_FATAL_FAILURE(CommitStep(1, outcomes));
  EXPECT_THAT(Await(outcomes[0]).status(),
              StatusIs(absl::StatusCode::kAborted,
                       "step aborted: a rank could not compute its gradient statistics"));
  EXPECT_THAT(Await(outcomes[1]).status(),
              StatusIs(absl::StatusCode::kAborted,
                       "here: injected: the device lost the gradient); redo the step"));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_TRUE(ranks_[r].session->healthy());
    EXPECT_EQ(ranks_[r].session->stats().step, 0u);
    ExpectSameState(before[r], HeldState(r));
  }
  // The step can be redone, and then it is applied everywhere.
  std::vector<Outcome> redo(2);
  ASSERT_NO_FATAL_FAILURE(CommitStep(1, redo));
  for (int r = 0; r < 2; ++r) {
    ASSERT_THAT(Await(redo[r]).status(), IsOk());
    EXPECT_EQ(Await(redo[r])->step, 1u);
    EXPECT_NE(HeldState(r).at("param/a").bytes, before[r].at("param/a").bytes);
  }
}

TEST_F(SessionFailureTest, GradientWriteFailureBreaksTheReplica) {
  ASSERT_NO_FATAL_FAILURE(StartRanks(1));
  FailNext(ranks_[0].device->faults(), "CopyFromHost",
           absl::InternalError("injected: copy engine fault"));
  absl::Status added;
  absl::StatusOr<StepHandle> c = BeginAndSend(0, 1, &added);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_THAT(added, StatusIs(absl::StatusCode::kInternal,
                              "session 'failures': param 'a': writing the gradient failed: "
                              "injected: copy engine fault"));
  Outcome outcome;
  EXPECT_THAT(ranks_[0].session->Commit(*c, 0, outcome.Callback()),
              StatusIs(absl::StatusCode::kUnavailable, "the group must be restarted"));
  ExpectBroken(0, 1);
  EXPECT_EQ(ranks_[0].session->stats().step, 0u);
}

TEST_F(SessionFailureTest, OptimizerStepFailureBreaksTheReplica) {
  ASSERT_NO_FATAL_FAILURE(StartRanks(1));
  FailNext(ranks_[0].device->faults(), "AdamW",
           absl::InternalError("injected: kernel launch failed"));
  std::vector<Outcome> outcomes(1);
  ASSERT_NO_FATAL_FAILURE(CommitStep(1, outcomes));
  EXPECT_THAT(Await(outcomes[0]).status(),
              StatusIs(absl::StatusCode::kInternal, "injected: kernel launch failed"));
  ExpectBroken(0, 1);
  ExpectBroken(0, 2);
  EXPECT_EQ(ranks_[0].session->stats().step, 0u);
}

TEST_F(SessionFailureTest, OptimizerStepFailureOnOneRankBreaksEveryRank) {
  ASSERT_NO_FATAL_FAILURE(StartRanks(2));
  // Rank 1 never reaches the all-gather; rank 0 gives up on it there.
  ExpectRankOneFailureBreaksBoth(
      ranks_[1].device->faults(), "AdamW", absl::InternalError("injected: kernel launch failed"),
      absl::StatusCode::kInternal, "injected: kernel launch failed", "the all-gather");
}

TEST_F(SessionFailureTest, AllReduceFailureBreaksEveryRank) {
  ASSERT_NO_FATAL_FAILURE(StartRanks(2));
  ExpectRankOneFailureBreaksBoth(
      ranks_[1].comm->faults(), "AllReduce", absl::UnavailableError("injected: connection reset"),
      absl::StatusCode::kUnavailable,
      "session 'failures': rank 1 lost a peer during step agreement: injected: connection reset",
      "step agreement");
  EXPECT_EQ(ranks_[1].device->faults().calls("AdamW"), 0);  // nothing was stepped
}

TEST_F(SessionFailureTest, AllGatherFailureBreaksEveryRank) {
  ASSERT_NO_FATAL_FAILURE(StartRanks(2));
  ExpectRankOneFailureBreaksBoth(
      ranks_[1].comm->faults(), "AllGatherV", absl::UnavailableError("injected: connection reset"),
      absl::StatusCode::kUnavailable,
      "session 'failures': rank 1 lost a peer during the all-gather: injected: connection reset",
      "the all-gather");
}

TEST_F(SessionFailureTest, DelayedDeviceMissesTheDeadlineAndEveryRankAborts) {
  ASSERT_NO_FATAL_FAILURE(StartRanks(2, /*step_deadline=*/absl::Milliseconds(300)));
  const StateDict before[2] = {HeldState(0), HeldState(1)};
  // Rank 0 has its whole contribution; rank 1's gradient copy takes five deadlines.
  std::vector<Outcome> outcomes(2);
  absl::Status added;
  absl::StatusOr<StepHandle> c0 = BeginAndSend(0, 1, &added);
  ASSERT_THAT(c0.status(), IsOk());
  ASSERT_THAT(added, IsOk());
  ASSERT_THAT(ranks_[0].session->Commit(*c0, 0, outcomes[0].Callback()), IsOk());
  FaultInjector& faults = ranks_[1].device->faults();
  const int64_t next = faults.calls("CopyFromHost") + 1;
  faults.DelayCalls("CopyFromHost", next, next, absl::Milliseconds(1500));
  absl::StatusOr<StepHandle> c1 = BeginAndSend(1, 1, &added);
  ASSERT_THAT(c1.status(), IsOk());
  // The copy finished after rank 1 voted to abort: the chunk counts for nothing, and the commit
  // is refused or answered as aborted, depending on whether the abort has finished.
  absl::Status committed = ranks_[1].session->Commit(*c1, 0, outcomes[1].Callback());
  if (committed.ok()) committed = Await(outcomes[1]).status();
  EXPECT_THAT(committed, StatusIs(absl::StatusCode::kAborted, "redo the step"));
  // Rank 0 had every contribution: it says so, and that another rank's were incomplete.
  EXPECT_THAT(Await(outcomes[0]).status(),
              StatusIs(absl::StatusCode::kAborted,
                       "session 'failures': step 1 aborted after the 300ms step deadline; every "
                       "trainer had committed on rank 0; contributions were incomplete on another "
                       "rank; redo the step"));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_TRUE(ranks_[r].session->healthy());
    ExpectSameState(before[r], HeldState(r));
  }
  std::vector<Outcome> redo(2);
  ASSERT_NO_FATAL_FAILURE(CommitStep(1, redo));
  for (int r = 0; r < 2; ++r) ASSERT_THAT(Await(redo[r]).status(), IsOk());
}

TEST_F(SessionFailureTest, CorruptedGradientSkipsTheStepOnEveryRank) {
  ASSERT_NO_FATAL_FAILURE(StartRanks(2));
  const StateDict before[2] = {HeldState(0), HeldState(1)};
  FaultInjector& faults = ranks_[1].device->faults();
  faults.CorruptCall("CopyFromHost", faults.calls("CopyFromHost") + 1);  // a NaN in the gradient
  std::vector<Outcome> outcomes(2);
  ASSERT_NO_FATAL_FAILURE(CommitStep(1, outcomes));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const absl::StatusOr<StepOutcome>& outcome = Await(outcomes[r]);
    ASSERT_THAT(outcome.status(), IsOk());
    EXPECT_TRUE(outcome->skipped);
    EXPECT_EQ(outcome->step, 1u);
    EXPECT_EQ(ranks_[r].session->stats().skipped_steps, 1u);
    // Parameters, optimizer state and group counters are untouched; only meta/ counts the step.
    ExpectSameState(before[r], HeldState(r), /*skip=*/"meta/");
  }
}

}  // namespace
}  // namespace optstep
