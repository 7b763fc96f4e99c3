#include "server/rpc/peer_host.h"

#include "absl/strings/match.h"

namespace optstep {

std::string PeerHost(absl::string_view peer) {
  // The port follows the last ':' of an ipv4 or ipv6 peer; other peers (unix:) have none.
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    return std::string(peer);
  }
  const size_t colon = peer.rfind(':');
  return std::string(colon > 4 ? peer.substr(0, colon) : peer);
}

}  // namespace optstep
