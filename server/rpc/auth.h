#ifndef OPTSTEP_SERVER_RPC_AUTH_H_
#define OPTSTEP_SERVER_RPC_AUTH_H_

// Named identities, roles and the check of every call (docs/security.md).
//
// Two sources of identity, one check: bearer tokens (below), or, under mutual TLS without tokens,
// the common name of the caller's verified client certificate (SubjectRoles).
//
// The tokens file has one identity per line: `NAME ROLE SECRET`, ROLE one of `user`, `admin`
// and `peer`. Blank lines and lines starting with '#' are skipped; names and secrets are unique.
// Every call but grpc.health.v1 carries `authorization: Bearer <secret>`:
// - user calls (sessions, steps, exports, closing a session; the services check its owner) need
//   a user or admin secret;
// - admin calls (Save, Load, ImportStateDict, Shutdown) an admin secret;
// - the ranks' own PeerService / RendezvousService a peer secret, which no other call accepts.
// A missing, malformed or unknown secret answers UNAUTHENTICATED; a secret of the wrong role
// PERMISSION_DENIED. An accepted call carries its identity on its AuthContext (kIdentityProperty,
// kRoleProperty), which the services read (caller.h).
//
// Under mutual TLS without tokens the same roles come from the client certificate's common name:
// --peer_subjects are peers, --admin_subjects admins, any other verified certificate a user.
//
// The check runs in a grpc::AuthMetadataProcessor, which gRPC invokes only on secure (TLS)
// server credentials, so tokens require TLS (the server refuses to start otherwise).

#include <grpcpp/security/auth_metadata_processor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstep {

enum class Role { kUser, kAdmin, kPeer };

// "user", "admin" or "peer".
absl::string_view RoleName(Role role);

// Who calls: the name of a tokens-file entry (or a certificate's common name) and its role.
struct Identity {
  std::string name;
  Role role = Role::kUser;
};

// AuthContext properties set on every call a processor accepts.
inline constexpr char kIdentityProperty[] = "optstep.identity";
inline constexpr char kRoleProperty[] = "optstep.role";

class TokenTable {
 public:
  // INVALID_ARGUMENT naming `source` and the line for a line that is not `NAME ROLE SECRET`
  // (today's format and the former `SECRET [ROLE]` alike), an unknown role, a secret shorter
  // than kMinTokenBytes, a name or secret given twice, or a table without entries.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view source);
  // NOT_FOUND when the file cannot be read.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The identity holding `secret`; nullopt when none does. Compares every entry in constant
  // time, so the answer's timing tells nothing about near misses.
  std::optional<Identity> Find(absl::string_view secret) const;
  // The secret of the first peer entry of the file ("" when there is none): what this rank
  // presents when it calls the other ranks.
  std::string FirstPeerSecret() const;
  size_t size() const { return entries_.size(); }

  static constexpr size_t kMinTokenBytes = 16;

 private:
  struct Entry {
    Identity identity;
    std::string secret;
  };
  std::vector<Entry> entries_;
};

// Under mutual TLS without tokens: the role of each client certificate by its common name (CN).
// A value; thread-compatible.
class SubjectRoles {
 public:
  // INVALID_ARGUMENT for an empty name or one given as both peer and admin.
  static absl::StatusOr<SubjectRoles> Make(std::vector<std::string> peers,
                                           std::vector<std::string> admins);

  // kPeer for a peer subject, kAdmin for an admin subject, kUser for any other.
  Role RoleOf(absl::string_view subject) const;
  const std::vector<std::string>& peers() const { return peers_; }
  const std::vector<std::string>& admins() const { return admins_; }

 private:
  std::vector<std::string> peers_;
  std::vector<std::string> admins_;
};

// The names of a comma-separated list ("a, b,c"), blanks trimmed and empty items skipped.
std::vector<std::string> SplitSubjects(absl::string_view list);

// The role a method ("/package.Service/Method") needs; nullopt when it is open to everyone
// (grpc.health.v1, for probes).
std::optional<Role> RequiredRole(absl::string_view method);

// Called for every refused call with its method and code (metrics, logs).
using AuthRefusal = std::function<void(absl::string_view method, absl::string_view code_name)>;

// Checks the bearer secret of every call against `tokens`, records the caller's identity on the
// call's AuthContext and removes the header before the call reaches a service.
std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokenProcessor(TokenTable tokens,
                                                                AuthRefusal on_refusal);

// Names every call by the common name of its verified client certificate (AuthContext property
// "x509_common_name"), gives it the role `subjects` says and checks that role as the token
// processor does: UNAUTHENTICATED without a common name, PERMISSION_DENIED naming the method, the
// role it needs and the common name for a certificate of another role. For servers that require
// and verify client certificates.
std::shared_ptr<grpc::AuthMetadataProcessor> MakeSubjectProcessor(SubjectRoles subjects,
                                                                  AuthRefusal on_refusal);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_AUTH_H_
