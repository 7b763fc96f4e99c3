#ifndef OPTSTEP_SERVER_RPC_HEAL_CALLS_H_
#define OPTSTEP_SERVER_RPC_HEAL_CALLS_H_

// The calls a heal makes to a rank (heal.cc): each phase's Regroup, within the group's timeout,
// and the calls that move state, which last as long as the rank called answers its pings.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// `request` on rank `r` (rank 0: its own group), within the group's timeout.
absl::Status RegroupOn(RankGroup* group, int r, v1::RegroupRequest request);

// RegroupOn of a phase that moves state on rank `r` (kTransfer, kCatchUp), for as long as `r`
// answers its pings (RankGroup::CallWhileAnswering).
absl::Status MoveStateOn(RankGroup* group, int r, const v1::RegroupRequest& request);

// The heal's end (`end`, kEnd) on rank `r`, which a rank must not miss: until it comes the rank's
// sessions stay paused and it reports NOT_SERVING, for ever. Made until the rank takes it
// (RankGroup::CallUntilTaken); FAILED_PRECONDITION (the rank runs no such heal: it ended it
// already, or runs another) is as good as an end.
absl::Status EndHealOn(RankGroup* group, int r, const v1::RegroupRequest& end);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_HEAL_CALLS_H_
