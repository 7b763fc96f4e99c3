#include "server/rpc/auth.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/caller_text.h"
#include "base/log_budget.h"
#include "glog/logging.h"

namespace optstep {
namespace {

constexpr absl::string_view kBearer = "Bearer ";
// The AuthContext property gRPC sets to the common name of a verified peer certificate.
constexpr char kCommonNameProperty[] = "x509_common_name";

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

// How a processor names what identifies a caller in its refusals.
struct Credential {
  const char* kind;    // "token", "certificate"
  std::string holder;  // "this token", "the certificate of 'trainer-7'"
};

// Why `role` may not call a method that needs `required`; "" when it may. Admins may make user
// calls; peers serve only the ranks' own services, and only they serve them.
std::string RoleRefusal(absl::string_view method, Role required, Role role,
                        const Credential& credential) {
  const bool allowed = role == required || (required == Role::kUser && role == Role::kAdmin);
  if (allowed) return "";
  const char* needed = required == Role::kUser    ? "a user or admin"
                       : required == Role::kAdmin ? "an admin"
                                                  : "a peer";
  return absl::StrCat(method, " needs ", needed, " ", credential.kind, "; ", credential.holder,
                      " has the ", RoleName(role), " role");
}

absl::string_view Value(const grpc::AuthMetadataProcessor::InputMetadata& metadata,
                        const char* key) {
  const auto it = metadata.find(key);
  if (it == metadata.end()) return "";
  return absl::string_view(it->second.data(), it->second.size());
}

// The check both processors make: the role the method needs (RequiredRole) against the caller's,
// whom a subclass identifies; an accepted caller's identity on the call's AuthContext; every
// refusal logged and reported. Immutable after construction: thread-safe.
class RoleProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit RoleProcessor(AuthRefusal on_refusal) : on_refusal_(std::move(on_refusal)) {}

  // Lookups are quick and never block: run on gRPC's own thread.
  bool IsBlocking() const final { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata* /*response*/) final {
    const absl::string_view method = Value(metadata, ":path");
    const std::optional<Role> required = RequiredRole(method);
    if (!required) return grpc::Status::OK;
    Credential credential;
    absl::StatusOr<Identity> identity = Identify(metadata, context, consumed, credential);
    if (!identity.ok()) {
      return Refuse(method, grpc::StatusCode::UNAUTHENTICATED,
                    std::string(identity.status().message()));
    }
    const std::string refusal = RoleRefusal(method, *required, identity->role, credential);
    if (!refusal.empty()) return Refuse(method, grpc::StatusCode::PERMISSION_DENIED, refusal);
    if (context != nullptr) {
      context->AddProperty(kIdentityProperty, identity->name);
      context->AddProperty(kRoleProperty, std::string(RoleName(identity->role)));
    }
    return grpc::Status::OK;
  }

 protected:
  // The caller of a call that needs a role, and `credential` for the refusal of its role; any
  // error: why there is none (UNAUTHENTICATED). May add to `consumed` what the services must not
  // see. `context` may be null.
  virtual absl::StatusOr<Identity> Identify(const InputMetadata& metadata,
                                            const grpc::AuthContext* context,
                                            OutputMetadata* consumed,
                                            Credential& credential) const = 0;

 private:
  grpc::Status Refuse(absl::string_view method, grpc::StatusCode code, const std::string& why) {
    // The path is the caller's text, and a caller may be refused call after call.
    int64_t dropped = 0;
    if (CallerLogBudget().Take(&dropped)) {
      LOG(WARNING) << "event=auth_refused method=" << CallerText(method)
                   << " code=" << CodeName(code) << " reason=\"" << LogValue(why) << "\""
                   << DroppedBefore(dropped);
    }
    if (on_refusal_) on_refusal_(method, CodeName(code));
    return grpc::Status(code, why);
  }

  const AuthRefusal on_refusal_;
};

// Identifies the caller by its bearer secret.
class TokenProcessor final : public RoleProcessor {
 public:
  TokenProcessor(TokenTable tokens, AuthRefusal on_refusal)
      : RoleProcessor(std::move(on_refusal)), tokens_(std::move(tokens)) {}

 private:
  absl::StatusOr<Identity> Identify(const InputMetadata& metadata,
                                    const grpc::AuthContext* /*context*/, OutputMetadata* consumed,
                                    Credential& credential) const override {
    const auto header = metadata.find("authorization");
    if (header == metadata.end()) {
      return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
    }
    const absl::string_view value(header->second.data(), header->second.size());
    if (!absl::StartsWith(value, kBearer)) {
      return absl::UnauthenticatedError("the 'authorization' metadata is not 'Bearer <token>'");
    }
    const std::optional<Identity> identity = tokens_.Find(value.substr(kBearer.size()));
    if (!identity) return absl::UnauthenticatedError("unknown token");
    credential = {"token", "this token"};
    // Services never see the token.
    consumed->insert({"authorization", std::string(value)});
    return *identity;
  }

  const TokenTable tokens_;
};

// Identifies the caller by the common name of its verified client certificate.
class SubjectProcessor final : public RoleProcessor {
 public:
  SubjectProcessor(SubjectRoles subjects, AuthRefusal on_refusal)
      : RoleProcessor(std::move(on_refusal)), subjects_(std::move(subjects)) {}

 private:
  absl::StatusOr<Identity> Identify(const InputMetadata& /*metadata*/,
                                    const grpc::AuthContext* context, OutputMetadata* /*consumed*/,
                                    Credential& credential) const override {
    std::vector<grpc::string_ref> names;
    if (context != nullptr && context->IsPeerAuthenticated()) {
      names = context->FindPropertyValues(kCommonNameProperty);
    }
    if (names.empty() || names.front().empty()) {
      return absl::UnauthenticatedError(
          "the client certificate has no common name (CN) to name the caller");
    }
    const std::string subject(names.front().data(), names.front().size());
    credential = {"certificate", absl::StrCat("the certificate of '", subject, "'")};
    return Identity{subject, subjects_.RoleOf(subject)};
  }

  const SubjectRoles subjects_;
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

absl::StatusOr<SubjectRoles> SubjectRoles::Make(std::vector<std::string> peers,
                                                std::vector<std::string> admins) {
  for (const std::vector<std::string>* names : {&peers, &admins}) {
    for (const std::string& name : *names) {
      if (name.empty()) return absl::InvalidArgumentError("a subject (common name) is empty");
    }
  }
  for (const std::string& admin : admins) {
    if (std::find(peers.begin(), peers.end(), admin) != peers.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "subject '", admin, "' is both a peer and an admin; a certificate has one role"));
    }
  }
  SubjectRoles roles;
  roles.peers_ = std::move(peers);
  roles.admins_ = std::move(admins);
  return roles;
}

Role SubjectRoles::RoleOf(absl::string_view subject) const {
  auto in = [subject](const std::vector<std::string>& names) {
    return std::find(names.begin(), names.end(), subject) != names.end();
  };
  if (in(peers_)) return Role::kPeer;
  if (in(admins_)) return Role::kAdmin;
  return Role::kUser;
}

std::vector<std::string> SplitSubjects(absl::string_view list) {
  std::vector<std::string> names;
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (!name.empty()) names.emplace_back(name);
  }
  return names;
}

std::shared_ptr<grpc::AuthMetadataProcessor> MakeSubjectProcessor(SubjectRoles subjects,
                                                                  AuthRefusal on_refusal) {
  return std::make_shared<SubjectProcessor>(std::move(subjects), std::move(on_refusal));
}

}  // namespace optstep
