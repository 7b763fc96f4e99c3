#ifndef OPTSTEP_SERVER_RPC_AUTH_H_
#define OPTSTEP_SERVER_RPC_AUTH_H_

// Bearer tokens and roles (docs/security.md).
//
// The tokens file has one token per line, optionally followed by its role:
// `user` (the default) or `admin`. Blank lines and lines starting with '#' are
// skipped. Every call but grpc.health.v1 carries `authorization: Bearer
// <token>`; admin calls (Save, Load, ImportStateDict, CloseSession, and the
// ranks' own PeerService / RendezvousService) need an admin token. A missing,
// malformed or unknown token answers UNAUTHENTICATED; a user token on an admin
// call PERMISSION_DENIED.
//
// The check runs in a grpc::AuthMetadataProcessor, which gRPC invokes only on
// secure (TLS) server credentials, so tokens require TLS (the server refuses to
// start otherwise).

#include <grpcpp/security/auth_metadata_processor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstep {

enum class Role { kUser, kAdmin };

class TokenTable {
 public:
  // INVALID_ARGUMENT naming `source` and the line for an unknown role, extra
  // fields, a token shorter than kMinTokenBytes or a table without tokens.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view source);
  // NOT_FOUND when the file cannot be read.
  static absl::StatusOr<TokenTable> Load(const std::string &path);

  // The token's role; nullopt when it is not in the table. Compares every entry
  // in constant time, so the answer's timing tells nothing about near misses.
  std::optional<Role> Find(absl::string_view token) const;
  // The first admin token of the file ("" when there is none): what this rank
  // presents when it calls the other ranks.
  std::string FirstAdminToken() const;
  size_t size() const { return entries_.size(); }

  static constexpr size_t kMinTokenBytes = 16;

 private:
  struct Entry {
    std::string token;
    Role role;
  };
  std::vector<Entry> entries_;
};

// The role a method ("/package.Service/Method") needs; nullopt when it is open
// to everyone (grpc.health.v1, for probes).
std::optional<Role> RequiredRole(absl::string_view method);

// Called for every refused call with its method and code (metrics, logs).
using AuthRefusal = std::function<void(absl::string_view method, absl::string_view code_name)>;

// Checks the bearer token of every call against `tokens` and removes the header
// before the call reaches a service.
std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokenProcessor(TokenTable tokens,
                                                                AuthRefusal on_refusal);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_AUTH_H_
