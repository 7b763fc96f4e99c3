#include "server/rpc/heal_calls.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "server/rpc/heal.h"
#include "server/rpc/stall_watch.h"

namespace optstep {

absl::Status RegroupOn(RankGroup* group, int r, v1::RegroupRequest request) {
  if (r == 0) return group->Regroup(request);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(group->options().timeout));
  v1::RegroupResponse response;
  return PeerStatus(r, group->Peer(r)->Regroup(&context, request, &response));
}

absl::Status CallWhileAnswering(RankGroup* group, int r, absl::string_view what,
                                const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  grpc::ClientContext context;
  StallWatch watch(&context, 2 * group->options().peer_timeout);
  ProgressWhileAnswering answering(
      &watch, [group, r] { return group->Answers(r); }, group->options().heartbeat_interval);
  return watch.Explain(PeerStatus(r, call(&context)), r, what);
}

absl::Status MoveStateOn(RankGroup* group, int r, const v1::RegroupRequest& request) {
  if (r == 0) return group->Regroup(request);
  v1::RegroupResponse response;
  return CallWhileAnswering(group, r,
                            absl::StrCat("waiting for its heal's phase ",
                                         v1::RegroupRequest::Phase_Name(request.phase())),
                            [&](grpc::ClientContext* context) {
                              return group->Peer(r)->Regroup(context, request, &response);
                            });
}

absl::Status EndHealOn(RankGroup* group, int r, const v1::RegroupRequest& end) {
  const absl::Time give_up = absl::Now() + group->options().timeout;
  absl::Duration delay = absl::Milliseconds(100);
  for (int attempt = 1;; ++attempt) {
    const std::function<bool(int)>& drop = group->options().drop_heal_end;
    absl::Status ended = drop && drop(r) ? absl::UnavailableError("dropped (--drop_heal_end_to)")
                                         : RegroupOn(group, r, end);
    if (ended.ok() || ended.code() == absl::StatusCode::kFailedPrecondition) return ended;
    if (r == 0 || absl::Now() + delay > give_up || !group->Answers(r)) return ended;
    LOG(WARNING) << "event=heal_end_retry rank=" << r << " healed=" << end.rank()
                 << " generation=" << end.generation() << " attempt=" << attempt << " error=\""
                 << ended.message() << "\"";
    absl::SleepFor(delay);
    delay = std::min(2 * delay, absl::Seconds(2));
  }
}

v1::RegroupRequest Phase(uint64_t generation, int rank, const std::string& address,
                         v1::RegroupRequest::Phase phase) {
  v1::RegroupRequest request;
  request.set_generation(generation);
  request.set_rank(rank);
  request.set_address(address);
  request.set_phase(phase);
  return request;
}

}  // namespace optstep
