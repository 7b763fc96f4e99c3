#ifndef OPTSTEP_TESTS_SERVER_ENGINE_REDUNDANCY_GROUP_H_
#define OPTSTEP_TESTS_SERVER_ENGINE_REDUNDANCY_GROUP_H_

// A group of ranks in this process (engines joined by gloo, with state redundancy) whose
// communicators can be reconnected in a new generation and whose ranks can be replaced, as a
// heal does: what the state redundancy tests drive.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/state_dict.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/key_value_store.h"
#include "server/engine/engine.h"
#include "tests/testing/fault_injecting_communicator.h"
#include "tests/testing/fault_injecting_device.h"

namespace optstep {
namespace testutil {

// A communicator whose connection is replaced between collectives (a new generation).
// Thread-safe.
class SwappableCommunicator final : public Communicator {
 public:
  SwappableCommunicator(int rank, int world, std::unique_ptr<FaultInjectingCommunicator> inner);

  // The faults of the current connection.
  FaultInjector& faults();
  void Replace(std::unique_ptr<FaultInjectingCommunicator> inner);

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override;
  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override;
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override;
  absl::Status Barrier() override;

 private:
  const int rank_;
  const int world_;
  absl::Mutex mu_;
  std::unique_ptr<FaultInjectingCommunicator> inner_ ABSL_GUARDED_BY(mu_);
};

// A session's group of `world` ranks with state redundancy on (or off). Not thread-safe: the
// test's thread drives it.
class RedundancyGroup {
 public:
  // Creates the engines and the session `config` on every rank (fails the test on error).
  RedundancyGroup(int world, const SessionConfig& config, bool redundancy = true,
                  absl::Duration comm_timeout = absl::Seconds(2));
  ~RedundancyGroup();

  int world() const { return static_cast<int>(ranks_.size()); }
  Session& session(int r) { return *ranks_[r].session; }
  SwappableCommunicator& comm(int r) { return *ranks_[r].comm; }
  // The faults of rank r's device (a CPU device of one thread).
  FaultInjector& device_faults(int r) { return ranks_[r].device->faults(); }

  // Every rank takes step `step` (trainer 0 sends Gradient(step, p, i) of the parameters each
  // owns); answers each rank's outcome.
  std::vector<absl::StatusOr<StepOutcome>> Step(uint64_t step);
  // Step, failing the test unless every rank applied it.
  void StepOk(uint64_t step);
  // Step `step` on every rank, each rank's session let go from within its step's callback: closed
  // (its engine's reference dropped) and released by the group. The coordinator task that
  // resolved the step then holds the last reference and frees the session on its own thread as it
  // ends. Fails the test unless every rank applied the step. The group has no session afterwards.
  void StepAndLetGo(uint64_t step);

  // A new generation: every rank but `replaced` reconnects its communicator while rank
  // `replaced` (if >= 0) is dropped and created afresh (a restarted process, nothing imported).
  void Regroup(int replaced = -1);

  // The session's exports, waited for (fail the test on error).
  StateDict OwnedState(int r);
  StateDict Shadow(int r);
  StateDict Masters(int r);
  absl::Status ImportOwnedState(int r, const StateDict& state);
  absl::Status ImportShadow(int r, const StateDict& state);
  absl::Status ImportMasters(int r, const StateDict& state);
  absl::Status CatchUp(int r, const StateDict& masters);

  // Rank r's whole state (masters, owned state, counters) read, or written back (the step after
  // it is applied again), under a hold of rank r alone: the group must be idle.
  StateDict HeldExport(int r);
  absl::StatusOr<StateDict> TryHeldExport(int r);  // HeldExport, its error answered
  // StageState and ApplyStaged under a hold; `complete`: every key of the rank's is in `state`.
  absl::Status HeldImport(int r, const StateDict& state, bool complete = true);

  // The gradient element i of parameter p in step `step`.
  static float Gradient(uint64_t step, int p, int64_t i);

 private:
  struct Rank {
    std::shared_ptr<FaultInjectingDevice> device;
    std::unique_ptr<Engine> engine;
    std::shared_ptr<Session> session;
    SwappableCommunicator* comm = nullptr;
  };
  // Step, with then(r) run inside rank r's step callback (on its coordinator) before the
  // outcome is told.
  std::vector<absl::StatusOr<StepOutcome>> StepThen(uint64_t step,
                                                    const std::function<void(int rank)>& then);
  // A connected communicator of rank r in the current generation.
  absl::StatusOr<std::unique_ptr<FaultInjectingCommunicator>> Connect(int r, const std::string& id);
  std::unique_ptr<Engine> MakeEngine(int r);

  const SessionConfig config_;
  const bool redundancy_;
  const absl::Duration comm_timeout_;
  const std::shared_ptr<KeyValueStore> store_ = NewInMemoryKeyValueStore();
  uint64_t generation_ = 0;
  std::vector<Rank> ranks_;
};

// Whether two state dicts hold the same keys with the same bits; else a description of the
// first difference.
std::string Difference(const StateDict& a, const StateDict& b);

// A session of six parameters: the matrices stepped by `kind`, the rest by AdamW; clipping on
// (the chain's default of 1).
SessionConfig ConfigOf(const std::string& kind);
// Every rank's masters, own state and shadow of `group` equal `reference`'s (gtest
// expectations).
void ExpectSameState(RedundancyGroup& group, RedundancyGroup& reference);
// Rank 1 of 3 in `group`, lost, is restarted and healed in: the masters from rank 0, its own state
// from its buddy (rank 2), its shadow of rank 0 from rank 0; then every rank resumes (gtest
// assertions).
void HealRankOne(RedundancyGroup& group);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_SERVER_ENGINE_REDUNDANCY_GROUP_H_
