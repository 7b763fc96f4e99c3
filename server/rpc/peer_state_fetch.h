#ifndef OPTSTEP_SERVER_RPC_PEER_STATE_FETCH_H_
#define OPTSTEP_SERVER_RPC_PEER_STATE_FETCH_H_

// The healed rank's side of state redundancy (docs/design.md, "State redundancy"): a session's
// state dicts fetched from a peer through PeerService.FetchOwnedState / FetchShadow /
// FetchMasters (served in peer_state_fetch.cc), to import with Session::ImportOwnedState,
// ImportShadow and ImportMasters. For restarted rank r of N:
//   FetchMasters(any peer)             -> ImportMasters        (first)
//   FetchShadow(rank (r + 1) % N)      -> ImportOwnedState     (r's own state, as of its step)
//   FetchOwnedState(rank (r - 1) % N)  -> ImportShadow         (r's shadow duty)

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
#include "optstep/v1/internal.grpc.pb.h"

namespace optstep {

enum class PeerState { kOwned, kShadow, kMasters };

// Fetches `what` of session `session_id` from the peer behind `peer` (named `peer_rank` in errors),
// whole and checked (every element once). The peer's error as it answered, prefixed with its rank.
absl::StatusOr<std::shared_ptr<const StateDict>> FetchPeerState(v1::PeerService::Stub& peer,
                                                                int peer_rank,
                                                                const std::string& session_id,
                                                                PeerState what);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PEER_STATE_FETCH_H_
