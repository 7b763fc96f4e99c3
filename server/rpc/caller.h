#ifndef OPTSTEP_SERVER_RPC_CALLER_H_
#define OPTSTEP_SERVER_RPC_CALLER_H_

// Who calls, as the services see it, and which sessions the caller may see (docs/security.md,
// "Isolation").

#include <grpcpp/security/auth_context.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/engine.h"
#include "server/engine/session.h"
#include "server/rpc/peer_host.h"

namespace optstep {

// The identity of the caller of one RPC. A value; thread-compatible.
struct Caller {
  // The identity the server's processor recorded (auth.h): the tokens-file name (tokens on), else
  // the client certificate's common name (mutual TLS); else kAnonymous.
  std::string identity;
  // Admins (by token or by certificate), and every caller of a server without tokens or client
  // certificates, see every session.
  bool sees_all = false;

  static constexpr char kAnonymous[] = "anonymous";
};

// Another rank of the group: the ranks' own services act for every session.
inline Caller RankCaller() { return Caller{"rank", true}; }

// The caller of a call whose AuthContext is `auth` (null: no authentication at all).
Caller CallerOf(const grpc::AuthContext* auth);
Caller CallerOf(const grpc::ServerContextBase& context);

// Whom a bound per caller counts a call of `caller` from `peer` against, as messages name it:
// the identity on one host, "caller 'NAME' at ipv4:10.0.0.7" (a job's trainers often share one
// identity, on many hosts); without authentication, where every caller is the same anonymous
// one, the host alone, "peer ipv4:10.0.0.7".
std::string CallerKey(const Caller& caller, absl::string_view peer);

// Whether `caller` may see and use `session`: it owns it, or sees every session.
bool MaySee(const Caller& caller, const Session& session);

// The session `id` when `caller` may see it; otherwise the same NOT_FOUND as for an id that does
// not exist, so that nothing tells another tenant's session from none.
absl::StatusOr<std::shared_ptr<Session>> FindSession(const Engine& engine, const Caller& caller,
                                                     const std::string& id);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_CALLER_H_
