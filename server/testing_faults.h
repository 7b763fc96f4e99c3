#ifndef OPTSTEP_SERVER_TESTING_FAULTS_H_
#define OPTSTEP_SERVER_TESTING_FAULTS_H_

// Testing only: the faults a rank injects into itself on its testing flags (RankProcess::Options,
// --kill_before_allgather, --kill_after_allgather, --fail_allgather_after, --kill_during_restore,
// --kill_during_close, --kill_during_heal, --drop_first_peer_call, --hang_in_save_shard), so that
// the integration tests can lose a rank, or cut a collective, at a moment of their choosing.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/comm/communicator.h"
#include "server/engine/step_observer.h"

namespace optstep {

// Logs `event` (its "event=..." words) and the testing flag `flag` (its name without dashes,
// with its value), flushes the log and SIGKILLs this process.
[[noreturn]] void KillSelf(const std::string& event, const std::string& flag);
// As KillSelf, but stops this process (SIGSTOP): it hangs with its connections up, as a process
// stuck or a host lost, until SIGCONT.
void StopSelf(const std::string& event, const std::string& flag);

// The RankGroupOptions::drop_peer_call of --drop_first_peer_call's `spec`: "CALL:RANK" drops
// the first attempt of the first call CALL to rank RANK (it is made again); "CALL:RANK:every"
// every attempt of that call, which the rank then misses for good. Dies on another spec.
std::function<bool(absl::string_view call, int r, int attempt)> DropPeerCall(
    const std::string& spec);

// Reports every event to `inner`; the testing observers below act on one of them too.
class ForwardingStepObserver : public StepObserver {
 public:
  explicit ForwardingStepObserver(std::shared_ptr<StepObserver> inner) : inner_(std::move(inner)) {}

  void OnPhase(Phase phase, absl::Duration duration) override { inner_->OnPhase(phase, duration); }
  void OnBytesIn(int64_t bytes) override { inner_->OnBytesIn(bytes); }
  void OnBytesOut(int64_t bytes) override { inner_->OnBytesOut(bytes); }
  void OnStepEnd(const std::string& session, uint64_t step, int rank, StepEnd end,
                 absl::string_view error) override {
    inner_->OnStepEnd(session, step, rank, end, error);
  }
  void OnSessionCreated(const std::string& session, int rank, int64_t params) override {
    inner_->OnSessionCreated(session, rank, params);
  }
  void OnSessionClosed(const std::string& session, int rank) override {
    inner_->OnSessionClosed(session, rank);
  }

 private:
  const std::shared_ptr<StepObserver> inner_;
};

// Reports to `inner`, and SIGKILLs this process at the `kill_at`-th step phase `phase` it is told
// of: kStep ends after the rank stepped its own parameters and shipped their gradients to its
// buddy, before the all-gather; kAllGather ends once the all-gather completed here, before the
// trainers are answered.
class KillAtPhase final : public ForwardingStepObserver {
 public:
  KillAtPhase(std::shared_ptr<StepObserver> inner, Phase phase, int kill_at, std::string flag);

  void OnPhase(Phase phase, absl::Duration duration) override;

 private:
  const Phase phase_;
  const int kill_at_;
  const std::string flag_;
  std::atomic<int> seen_{0};
};

// Reports to `inner`, and SIGKILLs this process once the first session is made here (a replica
// rank 0 restores, with --kill_during_restore on another rank).
class KillAtSessionCreated final : public ForwardingStepObserver {
 public:
  KillAtSessionCreated(std::shared_ptr<StepObserver> inner, std::string flag)
      : ForwardingStepObserver(std::move(inner)), flag_(std::move(flag)) {}

  void OnSessionCreated(const std::string& session, int rank, int64_t params) override;

 private:
  const std::string flag_;
};

// Reports to `inner`, and SIGKILLs this process once a session is closed here (rank 0 closing
// it last, after every other rank dropped its replica: --kill_during_close).
class KillAtSessionClosed final : public ForwardingStepObserver {
 public:
  KillAtSessionClosed(std::shared_ptr<StepObserver> inner, std::string flag)
      : ForwardingStepObserver(std::move(inner)), flag_(std::move(flag)) {}

  void OnSessionClosed(const std::string& session, int rank) override;

 private:
  const std::string flag_;
};

// Forwards every collective to `base`; the `fail_at`-th AllGatherV counted on `count` (shared by
// the communicators of every session of the process) is forwarded and then answers UNAVAILABLE:
// the peers completed it, this rank alone sees it fail, as when its send to a rank that died
// broke after the data went out.
class FailAllGatherAfter final : public ForwardingCommunicator {
 public:
  FailAllGatherAfter(std::unique_ptr<Communicator> base, std::shared_ptr<std::atomic<int>> count,
                     int fail_at);

  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override;

 private:
  const std::shared_ptr<std::atomic<int>> count_;
  const int fail_at_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_TESTING_FAULTS_H_
