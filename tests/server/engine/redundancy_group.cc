#include "tests/server/engine/redundancy_group.h"

#include <cmath>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/device_factory.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testutil {
namespace {

constexpr char kSessionId[] = "redundancy";

// Waits for an export's callback.
StateDict AwaitState(const std::function<void(Session::StateCallback)>& call) {
  absl::Notification done;
  absl::StatusOr<std::shared_ptr<const StateDict>> state;
  call([&](absl::StatusOr<std::shared_ptr<const StateDict>> s) {
    state = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_THAT(state.status(), IsOk());
  return state.ok() ? **state : StateDict{};
}

absl::Status AwaitDone(const std::function<void(Session::DoneCallback)>& call) {
  absl::Notification done;
  absl::Status status;
  call([&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

}  // namespace

SwappableCommunicator::SwappableCommunicator(int rank, int world,
                                             std::unique_ptr<FaultInjectingCommunicator> inner)
    : rank_(rank), world_(world), inner_(std::move(inner)) {}

FaultInjector& SwappableCommunicator::faults() {
  absl::MutexLock lock(&mu_);
  return inner_->faults();
}

void SwappableCommunicator::Replace(std::unique_ptr<FaultInjectingCommunicator> inner) {
  absl::MutexLock lock(&mu_);
  inner_ = std::move(inner);
}

absl::Status SwappableCommunicator::AllReduce(void* data, int64_t count, CommDType dtype,
                                              ReduceOp op) {
  absl::MutexLock lock(&mu_);
  return inner_->AllReduce(data, count, dtype, op);
}

absl::Status SwappableCommunicator::AllGatherV(const void* send, int64_t send_count, void* recv,
                                               const std::vector<int64_t>& recv_counts,
                                               CommDType dtype) {
  absl::MutexLock lock(&mu_);
  return inner_->AllGatherV(send, send_count, recv, recv_counts, dtype);
}

absl::Status SwappableCommunicator::Broadcast(void* data, int64_t count, CommDType dtype,
                                              int root) {
  absl::MutexLock lock(&mu_);
  return inner_->Broadcast(data, count, dtype, root);
}

absl::Status SwappableCommunicator::RingShift(const void* send, int64_t send_count, void* recv,
                                              int64_t recv_count, CommDType dtype) {
  absl::MutexLock lock(&mu_);
  return inner_->RingShift(send, send_count, recv, recv_count, dtype);
}

absl::Status SwappableCommunicator::Barrier() {
  absl::MutexLock lock(&mu_);
  return inner_->Barrier();
}

RedundancyGroup::RedundancyGroup(int world, const SessionConfig& config, bool redundancy,
                                 absl::Duration comm_timeout)
    : config_(config), redundancy_(redundancy), comm_timeout_(comm_timeout), ranks_(world) {
  for (int r = 0; r < world; ++r) ranks_[r].engine = MakeEngine(r);
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<std::shared_ptr<Session>>> created(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back(
        [&, r] { created[r] = ranks_[r].engine->CreateReplica(kSessionId, config_); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_THAT(created[r].status(), IsOk());
    if (created[r].ok()) ranks_[r].session = *created[r];
  }
}

RedundancyGroup::~RedundancyGroup() {
  for (Rank& rank : ranks_) rank.session.reset();
}

absl::StatusOr<std::unique_ptr<FaultInjectingCommunicator>> RedundancyGroup::Connect(
    int r, const std::string& id) {
  CommunicatorOptions comm;
  comm.kind = "gloo";
  comm.rank = r;
  comm.world_size = world();
  comm.prefix = absl::StrCat("g", generation_, "/", id);
  comm.store = store_;
  comm.timeout = comm_timeout_;
  absl::StatusOr<std::unique_ptr<Communicator>> created = CreateCommunicator(comm);
  if (!created.ok()) return created.status();
  return std::make_unique<FaultInjectingCommunicator>(*std::move(created));
}

std::unique_ptr<Engine> RedundancyGroup::MakeEngine(int r) {
  EngineOptions options;
  options.device.num_threads = 1;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options.device);
  EXPECT_THAT(device.status(), IsOk());
  if (!device.ok()) return nullptr;
  ranks_[r].device = std::make_shared<FaultInjectingDevice>(*std::move(device));
  options.injected_device = ranks_[r].device;
  options.rank = r;
  options.world_size = world();
  options.state_redundancy = redundancy_;
  options.make_communicator =
      [this, r](const std::string& id) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    absl::StatusOr<std::unique_ptr<FaultInjectingCommunicator>> inner = Connect(r, id);
    if (!inner.ok()) return inner.status();
    auto comm = std::make_unique<SwappableCommunicator>(r, world(), *std::move(inner));
    ranks_[r].comm = comm.get();
    return std::unique_ptr<Communicator>(std::move(comm));
  };
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  EXPECT_THAT(engine.status(), IsOk());
  return engine.ok() ? *std::move(engine) : nullptr;
}

float RedundancyGroup::Gradient(uint64_t step, int p, int64_t i) {
  return 0.05f * static_cast<float>(std::sin(0.37 * static_cast<double>(i + 1) +
                                             1.3 * static_cast<double>(step) + 0.7 * p));
}

std::vector<absl::StatusOr<StepOutcome>> RedundancyGroup::Step(uint64_t step) {
  return StepThen(step, nullptr);
}

std::vector<absl::StatusOr<StepOutcome>> RedundancyGroup::StepThen(
    uint64_t step, const std::function<void(int rank)>& then) {
  std::vector<Outcome> outcomes(world());
  std::vector<absl::StatusOr<StepOutcome>> results(world(), absl::UnknownError("not committed"));
  std::vector<bool> committed(world(), false);
  for (int r = 0; r < world(); ++r) {
    Session& s = session(r);
    StepBegin begin;
    begin.step = step;
    begin.return_params = false;
    absl::StatusOr<StepHandle> c = s.Begin(begin);
    if (!c.ok()) {
      results[r] = c.status();
      continue;
    }
    for (int p = 0; p < static_cast<int>(config_.params.size()); ++p) {
      if (s.layout().owner[p] != r) continue;
      std::vector<float> grad(config_.params[p].numel());
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = Gradient(step, p, i);
      EXPECT_THAT(SendGradient(s, *c, p, 0, grad), IsOk());
    }
    StepCallback told = outcomes[r].Callback();
    if (then) {
      told = [told = std::move(told), then, r](absl::StatusOr<StepOutcome> outcome) {
        then(r);
        told(std::move(outcome));
      };
    }
    const absl::Status status = s.Commit(*c, 0, std::move(told));
    committed[r] = status.ok();
    if (!status.ok()) results[r] = status;
  }
  for (int r = 0; r < world(); ++r) {
    if (!committed[r]) continue;
    if (!outcomes[r].WaitFor(absl::Seconds(30))) {
      results[r] = absl::DeadlineExceededError("no outcome within 30 s");
    } else {
      results[r] = outcomes[r].result();
    }
  }
  return results;
}

void RedundancyGroup::StepAndLetGo(uint64_t step) {
  // Runs on rank r's coordinator, inside the resolution; the test's thread only waits.
  const auto let_go = [this](int r) {
    EXPECT_THAT(ranks_[r].engine->CloseSession(ranks_[r].session->id()), IsOk());
    ranks_[r].session.reset();
  };
  const std::vector<absl::StatusOr<StepOutcome>> results = StepThen(step, let_go);
  for (int r = 0; r < world(); ++r) EXPECT_THAT(results[r].status(), IsOk()) << "rank " << r;
}

void RedundancyGroup::StepOk(uint64_t step) {
  std::vector<absl::StatusOr<StepOutcome>> results = Step(step);
  for (int r = 0; r < world(); ++r) {
    ASSERT_THAT(results[r].status(), IsOk()) << "rank " << r << " step " << step;
    EXPECT_FALSE(results[r]->skipped) << "rank " << r << " step " << step;
  }
}

void RedundancyGroup::Regroup(int replaced) {
  ++generation_;
  if (replaced >= 0) {
    ranks_[replaced].session.reset();
    ranks_[replaced].engine.reset();  // closes its connections: a lost process
    ranks_[replaced].engine = MakeEngine(replaced);
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(world());
  for (int r = 0; r < world(); ++r) {
    threads.emplace_back([&, r] {
      if (r == replaced) {
        absl::StatusOr<std::shared_ptr<Session>> created =
            ranks_[r].engine->CreateReplica(kSessionId, config_);
        status[r] = created.status();
        if (created.ok()) ranks_[r].session = *created;
        return;
      }
      absl::StatusOr<std::unique_ptr<FaultInjectingCommunicator>> inner = Connect(r, kSessionId);
      status[r] = inner.status();
      if (inner.ok()) ranks_[r].comm->Replace(*std::move(inner));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world(); ++r) EXPECT_THAT(status[r], IsOk()) << "rank " << r;
}

StateDict RedundancyGroup::OwnedState(int r) {
  return AwaitState([&](Session::StateCallback done) { session(r).ExportOwnedState(done); });
}

StateDict RedundancyGroup::Shadow(int r) {
  return AwaitState([&](Session::StateCallback done) { session(r).ExportShadow(done); });
}

StateDict RedundancyGroup::Masters(int r) {
  return AwaitState([&](Session::StateCallback done) { session(r).ExportMasters(done); });
}

absl::Status RedundancyGroup::ImportOwnedState(int r, const StateDict& state) {
  return AwaitDone([&](Session::DoneCallback done) {
    session(r).ImportOwnedState(std::make_shared<const StateDict>(state), done);
  });
}

absl::Status RedundancyGroup::ImportShadow(int r, const StateDict& state) {
  return AwaitDone([&](Session::DoneCallback done) {
    session(r).ImportShadow(std::make_shared<const StateDict>(state), done);
  });
}

absl::Status RedundancyGroup::ImportMasters(int r, const StateDict& state) {
  return AwaitDone([&](Session::DoneCallback done) {
    session(r).ImportMasters(std::make_shared<const StateDict>(state), done);
  });
}

absl::Status RedundancyGroup::CatchUp(int r, const StateDict& masters) {
  return AwaitDone([&](Session::DoneCallback done) {
    session(r).CatchUp(std::make_shared<const StateDict>(masters), done);
  });
}

namespace {

// Holds rank `session` settled at the resolutions it started, runs `held`, releases.
absl::Status WithHold(Session& session, uint64_t token, const std::function<absl::Status()>& held) {
  absl::StatusOr<uint64_t> started = session.holds().Hold(token, absl::Seconds(30));
  if (!started.ok()) return started.status();
  absl::Status status =
      session.holds()
          .Settle(token, *started, absl::Now() + absl::Seconds(30), absl::Seconds(30))
          .status();
  if (status.ok()) status = held();
  const absl::Status released = session.holds().Release(token);
  return status.ok() ? released : status;
}

}  // namespace

StateDict RedundancyGroup::HeldExport(int r) {
  absl::StatusOr<StateDict> state = TryHeldExport(r);
  EXPECT_THAT(state.status(), IsOk());
  return state.ok() ? *std::move(state) : StateDict();
}

absl::StatusOr<StateDict> RedundancyGroup::TryHeldExport(int r) {
  StateDict state;
  OPTSTEP_RETURN_IF_ERROR(WithHold(session(r), 100 + r, [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<const StateDict>> dict =
        session(r).holds().ExportHeld(100 + r, StateSelection{});
    if (dict.ok()) state = **dict;
    return dict.status();
  }));
  return state;
}

absl::Status RedundancyGroup::HeldImport(int r, const StateDict& state, bool complete) {
  return WithHold(session(r), 200 + r, [&]() -> absl::Status {
    absl::Status staged =
        session(r).holds().StageState(200 + r, std::make_shared<const StateDict>(state), complete);
    if (!staged.ok()) return staged;
    return session(r).holds().ApplyStaged(200 + r);
  });
}

std::string Difference(const StateDict& a, const StateDict& b) {
  for (const auto& [key, tensor] : a) {
    auto it = b.find(key);
    if (it == b.end()) return absl::StrCat("'", key, "' only in the first");
    if (it->second.type != tensor.type || it->second.shape != tensor.shape) {
      return absl::StrCat("'", key, "' differs in type or shape");
    }
    if (it->second.bytes != tensor.bytes) return absl::StrCat("'", key, "' differs in its bits");
  }
  for (const auto& entry : b) {
    if (a.count(entry.first) == 0) return absl::StrCat("'", entry.first, "' only in the second");
  }
  return "";
}

namespace {

ParamInfo Param(const std::string& name, Shape shape) { return ParamInfo{name, std::move(shape)}; }

}  // namespace

SessionConfig ConfigOf(const std::string& kind) {
  SessionConfig config;
  config.name = "redundancy";
  config.params = {Param("fc1.weight", {24, 16}),  Param("fc1.bias", {24}),
                   Param("fc2.weight", {8, 24}),   Param("fc2.bias", {8}),
                   Param("head.weight", {12, 12}), Param("head.bias", {12})};
  SubOptimizerConfig main;
  main.name = "main";
  main.kind = kind;
  SubOptimizerConfig adam;
  adam.name = "adam";
  adam.kind = "adamw";
  config.chain = MatricesAndTheRest(main, adam);
  config.step_deadline = absl::Seconds(60);
  return config;
}

void ExpectSameState(RedundancyGroup& group, RedundancyGroup& reference) {
  for (int r = 0; r < group.world(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(Difference(group.Masters(r), reference.Masters(r)), "");
    EXPECT_EQ(Difference(group.OwnedState(r), reference.OwnedState(r)), "");
    EXPECT_EQ(Difference(group.Shadow(r), reference.Shadow(r)), "");
  }
}

void HealRankOne(RedundancyGroup& group) {
  group.Regroup(/*replaced=*/1);
  OPTSTEP_ASSERT_OK(group.ImportMasters(1, group.Masters(0)));
  OPTSTEP_ASSERT_OK(group.ImportOwnedState(1, group.Shadow(2)));
  OPTSTEP_ASSERT_OK(group.ImportShadow(1, group.OwnedState(0)));
  for (int r = 0; r < 3; ++r) group.session(r).ResumeAfterHeal(/*generation=*/1);
}

}  // namespace testutil
}  // namespace optstep
