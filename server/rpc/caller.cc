#include "server/rpc/caller.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "server/rpc/auth.h"

namespace optstep {
namespace {

// The first value of `property`; "" when there is none.
std::string Property(const grpc::AuthContext& auth, const std::string& property) {
  const std::vector<grpc::string_ref> values = auth.FindPropertyValues(property);
  if (values.empty()) return "";
  return std::string(values.front().data(), values.front().size());
}

}  // namespace

Caller CallerOf(const grpc::AuthContext* auth) {
  if (auth != nullptr) {
    // Tokens or mutual TLS: the server's processor named the caller (auth.h).
    const std::string name = Property(*auth, kIdentityProperty);
    if (!name.empty()) {
      return Caller{name, Property(*auth, kRoleProperty) == RoleName(Role::kAdmin)};
    }
  }
  // No authentication: everyone is everyone.
  return Caller{Caller::kAnonymous, true};
}

Caller CallerOf(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return CallerOf(auth.get());
}

std::string CallerKey(const Caller& caller, absl::string_view peer) {
  const std::string host = CallerText(PeerHost(peer));
  if (caller.identity == Caller::kAnonymous) return absl::StrCat("peer ", host);
  return absl::StrCat("caller '", CallerText(caller.identity), "' at ", host);
}

bool MaySee(const Caller& caller, const Session& session) {
  return caller.sees_all || session.config().owner == caller.identity;
}

absl::StatusOr<std::shared_ptr<Session>> FindSession(const Engine& engine, const Caller& caller,
                                                     const std::string& id) {
  absl::StatusOr<std::shared_ptr<Session>> session = engine.GetSession(id);
  if (session.ok() && !MaySee(caller, **session)) return SessionNotFoundError(id);
  return session;
}

}  // namespace optstep
