#include "server/testing_faults.h"

#include <signal.h>
#include <stdlib.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace optstep {

void KillSelf(const std::string& event, const std::string& flag) {
  LOG(ERROR) << event << " flag=" << flag << " this rank kills itself";
  google::FlushLogFiles(google::GLOG_INFO);
  raise(SIGKILL);
  abort();  // not reached: SIGKILL cannot be caught
}

void StopSelf(const std::string& event, const std::string& flag) {
  LOG(ERROR) << event << " flag=" << flag << " this rank stops itself";
  google::FlushLogFiles(google::GLOG_INFO);
  raise(SIGSTOP);
}

std::function<bool(absl::string_view call, int r, int attempt)> DropPeerCall(
    const std::string& spec) {
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  int to = -1;
  if (parts.size() < 2 || parts.size() > 3 || !absl::SimpleAtoi(parts[1], &to) ||
      (parts.size() == 3 && parts[2] != "every")) {
    LOG(FATAL) << "--drop_first_peer_call='" << spec << "' is not CALL:RANK or CALL:RANK:every";
  }
  // The calls are counted at their first attempts: the first call is the first counted.
  return
      [call = parts[0], to, every = parts.size() == 3,
       calls = std::make_shared<std::atomic<int>>(0)](absl::string_view name, int r, int attempt) {
        if (name != call || r != to) return false;
        const int seen = attempt == 0 ? ++*calls : calls->load();
        return seen == 1 && (every || attempt == 0);
      };
}

KillAtPhase::KillAtPhase(std::shared_ptr<StepObserver> inner, Phase phase, int kill_at,
                         std::string flag)
    : ForwardingStepObserver(std::move(inner)),
      phase_(phase),
      kill_at_(kill_at),
      flag_(std::move(flag)) {}

void KillAtPhase::OnPhase(Phase phase, absl::Duration duration) {
  ForwardingStepObserver::OnPhase(phase, duration);
  if (phase != phase_ || ++seen_ != kill_at_) return;
  KillSelf("event=killed_by_flag", absl::StrCat(flag_, "=", kill_at_));
}

void KillAtSessionCreated::OnSessionCreated(const std::string& session, int rank, int64_t params) {
  ForwardingStepObserver::OnSessionCreated(session, rank, params);
  KillSelf(absl::StrCat("event=killed_during_restore session=", session), flag_);
}

void KillAtSessionClosed::OnSessionClosed(const std::string& session, int rank) {
  ForwardingStepObserver::OnSessionClosed(session, rank);
  KillSelf(absl::StrCat("event=killed_during_close session=", session), flag_ + "=true");
}

FailAllGatherAfter::FailAllGatherAfter(std::unique_ptr<Communicator> base,
                                       std::shared_ptr<std::atomic<int>> count, int fail_at)
    : ForwardingCommunicator(std::move(base)), count_(std::move(count)), fail_at_(fail_at) {}

absl::Status FailAllGatherAfter::AllGatherV(const void* send, int64_t send_count, void* recv,
                                            const std::vector<int64_t>& recv_counts,
                                            CommDType dtype) {
  absl::Status gathered = base().AllGatherV(send, send_count, recv, recv_counts, dtype);
  if (!gathered.ok() || ++*count_ != fail_at_) return gathered;
  LOG(ERROR) << "event=allgather_failed_by_flag at=" << fail_at_
             << " --fail_allgather_after: this rank answers a completed all-gather as failed";
  return absl::UnavailableError(absl::StrCat("--fail_allgather_after=", fail_at_, ": all-gather ",
                                             fail_at_, " completed and is answered as failed"));
}

}  // namespace optstep
