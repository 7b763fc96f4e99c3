#include "server/rpc/auth.h"

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace optstep {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// Equal in time proportional to the candidate's length only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

const char* CodeName(grpc::StatusCode code) {
  return code == grpc::StatusCode::PERMISSION_DENIED ? "PERMISSION_DENIED" : "UNAUTHENTICATED";
}

// Why `role` may not call a method that needs `required`; "" when it may. Admins may make user
// calls; peer secrets serve only the ranks' own services, and only they serve them.
std::string RoleRefusal(absl::string_view method, Role required, Role role) {
  const bool allowed = role == required || (required == Role::kUser && role == Role::kAdmin);
  if (allowed) return "";
  const char* needed = required == Role::kUser    ? "a user or admin"
                       : required == Role::kAdmin ? "an admin"
                                                  : "a peer";
  return absl::StrCat(method, " needs ", needed, " token; this token has the ", RoleName(role),
                      " role");
}

class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  TokenProcessor(TokenTable tokens, AuthRefusal on_refusal)
      : tokens_(std::move(tokens)), on_refusal_(std::move(on_refusal)) {}

  // Lookups are quick and never block: run on gRPC's own thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* /*response*/) override {
    const absl::string_view method = Value(metadata, ":path");
    const std::optional<Role> required = RequiredRole(method);
    if (!required) return grpc::Status::OK;
    const auto header = metadata.find("authorization");
    if (header == metadata.end()) {
      return Refuse(method, grpc::StatusCode::UNAUTHENTICATED,
                    "missing 'authorization: Bearer <token>' metadata");
    }
    const absl::string_view value(header->second.data(), header->second.size());
    if (!absl::StartsWith(value, kBearer)) {
      return Refuse(method, grpc::StatusCode::UNAUTHENTICATED,
                    "the 'authorization' metadata is not 'Bearer <token>'");
    }
    const std::optional<Identity> identity = tokens_.Find(value.substr(kBearer.size()));
    if (!identity) return Refuse(method, grpc::StatusCode::UNAUTHENTICATED, "unknown token");
    const std::string refusal = RoleRefusal(method, *required, identity->role);
    if (!refusal.empty()) return Refuse(method, grpc::StatusCode::PERMISSION_DENIED, refusal);
    if (context != nullptr) {
      context->AddProperty(kIdentityProperty, identity->name);
      context->AddProperty(kRoleProperty, std::string(RoleName(identity->role)));
    }
    // Services never see the token.
    consumed->insert({"authorization", std::string(value)});
    return grpc::Status::OK;
  }

 private:
  static absl::string_view Value(const InputMetadata& metadata, const char* key) {
    const auto it = metadata.find(key);
    if (it == metadata.end()) return "";
    return absl::string_view(it->second.data(), it->second.size());
  }

  grpc::Status Refuse(absl::string_view method, grpc::StatusCode code, const std::string& why) {
    LOG(WARNING) << "event=auth_refused method=" << method << " code=" << CodeName(code)
                 << " reason=\"" << why << "\"";
    if (on_refusal_) on_refusal_(method, CodeName(code));
    return grpc::Status(code, why);
  }

  const TokenTable tokens_;
  const AuthRefusal on_refusal_;
};

std::optional<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kUser, Role::kAdmin, Role::kPeer}) {
    if (name == RoleName(role)) return role;
  }
  return std::nullopt;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kPeer:
      return "peer";
    case Role::kUser:
      break;
  }
  return "user";
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view source) {
  TokenTable table;
  std::set<std::string> names;
  std::set<std::string> secrets;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(source, ":", line_number);
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected 'NAME ROLE SECRET' (ROLE: user, admin or peer), got ", fields.size(),
          " field", fields.size() == 1 ? "" : "s",
          fields.size() < 3 ? "; lines of the former 'SECRET [ROLE]' format need a name" : ""));
    }
    const std::optional<Role> role = ParseRole(fields[1]);
    if (!role) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown role '", fields[1], "' (expected user, admin or peer)"));
    }
    if (fields[2].size() < kMinTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": secret of ", fields[2].size(),
                                                     " bytes; at least ", kMinTokenBytes,
                                                     " are required"));
    }
    if (!names.insert(std::string(fields[0])).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": name '", fields[0], "' is given twice; names are unique"));
    }
    if (!secrets.insert(std::string(fields[2])).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the secret of '", fields[0],
                                                     "' is given twice; secrets are unique"));
    }
    table.entries_.push_back({{std::string(fields[0]), *role}, std::string(fields[2])});
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the tokens file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

std::optional<Identity> TokenTable::Find(absl::string_view secret) const {
  std::optional<Identity> found;
  for (const Entry& entry : entries_) {
    if (ConstantTimeEquals(secret, entry.secret) && !found) found = entry.identity;
  }
  return found;
}

std::string TokenTable::FirstPeerSecret() const {
  for (const Entry& entry : entries_) {
    if (entry.identity.role == Role::kPeer) return entry.secret;
  }
  return "";
}

std::optional<Role> RequiredRole(absl::string_view method) {
  if (absl::StartsWith(method, "/grpc.health.v1.Health/")) return std::nullopt;
  static constexpr absl::string_view kAdminMethods[] = {
      "/optstep.v1.CheckpointService/Save",
      "/optstep.v1.CheckpointService/Load",
      "/optstep.v1.CheckpointService/ImportStateDict",
      "/optstep.v1.OptimizerService/CloseSession",
      "/optstep.v1.AdminService/Shutdown",
  };
  for (absl::string_view admin : kAdminMethods) {
    if (method == admin) return Role::kAdmin;
  }
  // The ranks' own services: only another rank (holding a peer secret) calls them.
  if (absl::StartsWith(method, "/optstep.v1.PeerService/") ||
      absl::StartsWith(method, "/optstep.v1.RendezvousService/")) {
    return Role::kPeer;
  }
  return Role::kUser;
}

std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokenProcessor(TokenTable tokens,
                                                                AuthRefusal on_refusal) {
  return std::make_shared<TokenProcessor>(std::move(tokens), std::move(on_refusal));
}

}  // namespace optstep
