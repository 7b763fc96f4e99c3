#ifndef OPTSTEP_SERVER_RPC_PEER_HOST_H_
#define OPTSTEP_SERVER_RPC_PEER_HOST_H_

#include <string>

#include "absl/strings/string_view.h"

namespace optstep {

// The host part of a gRPC peer ("ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7", "ipv6:[::1]:5" ->
// "ipv6:[::1]"): the connections of one client machine count together. Other peers ("unix:...")
// are kept whole.
std::string PeerHost(absl::string_view peer);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PEER_HOST_H_
