#include "server/rpc/heal_calls.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/rpc/heal.h"

namespace optstep {

absl::Status RegroupOn(RankGroup* group, int r, v1::RegroupRequest request) {
  if (r == 0) return group->Regroup(request);
  // Testing only (--drop_first_peer_call=HealBegin:R): the heal's first call lost on the way.
  const auto& drop = group->options().drop_peer_call;
  if (request.phase() == v1::RegroupRequest::PHASE_BEGIN && drop && drop("HealBegin", r, 0)) {
    return absl::UnavailableError(
        absl::StrCat("rank ", r, ": the heal's begin was dropped (--drop_first_peer_call)"));
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(group->options().timeout));
  v1::RegroupResponse response;
  return PeerStatus(r, group->Peer(r)->Regroup(&context, request, &response));
}

absl::Status MoveStateOn(RankGroup* group, int r, const v1::RegroupRequest& request) {
  if (r == 0) return group->Regroup(request);
  v1::RegroupResponse response;
  return group->CallWhileAnswering(r,
                                   absl::StrCat("waiting for its heal's phase ",
                                                v1::RegroupRequest::Phase_Name(request.phase())),
                                   [&](grpc::ClientContext* context) {
                                     return group->Peer(r)->Regroup(context, request, &response);
                                   });
}

absl::Status EndHealOn(RankGroup* group, int r, const v1::RegroupRequest& end) {
  if (r == 0) return group->Regroup(end);
  return group->CallUntilTaken(r, "HealEnd", [&] { return RegroupOn(group, r, end); });
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
