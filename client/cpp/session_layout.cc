#include "client/cpp/session_layout.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace optstep {
namespace client_internal {

SessionLayout::SessionLayout(std::string session_id, uint32_t world_size, std::vector<Param> params,
                             bool owners_only, bool returns_owned)
    : session_id_(std::move(session_id)),
      world_size_(world_size),
      params_(std::move(params)),
      owners_only_(owners_only),
      returns_owned_(returns_owned) {}

std::vector<uint32_t> SessionLayout::OwnersOf(absl::Span<const uint32_t> param_ids) const {
  std::vector<bool> owns(world_size_, false);
  if (param_ids.empty()) {
    for (const Param& p : params_) owns[p.owner] = true;
  }
  for (uint32_t id : param_ids) owns[params_[id].owner] = true;
  std::vector<uint32_t> ranks;
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (owns[r]) ranks.push_back(r);
  }
  return ranks;
}

absl::Status SessionLayout::CheckParamId(uint32_t param_id) const {
  if (param_id >= params_.size()) {
    return absl::NotFoundError(absl::StrCat("param_id ", param_id, " not found: session '",
                                            session_id_, "' has ", params_.size(), " parameters"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionLayout> SessionLayout::FromSessionInfo(const v1::SessionInfo& info) {
  const auto& specs = info.spec().parameters();
  const auto& owners = info.layout().owner();
  uint32_t world_size = info.layout().world_size();
  if (world_size == 0 && owners.empty()) world_size = 1;
  if (world_size == 0) {
    return absl::InternalError(absl::StrCat("session '", info.session_id(),
                                            "': layout has world_size 0 but ", owners.size(),
                                            " owners"));
  }
  if (!owners.empty() && owners.size() != specs.size()) {
    return absl::InternalError(absl::StrCat("session '", info.session_id(), "': layout has ",
                                            owners.size(), " owners for ", specs.size(),
                                            " parameters"));
  }
  std::vector<Param> params;
  params.reserve(specs.size());
  for (int i = 0; i < specs.size(); ++i) {
    const v1::ParameterSpec& spec = specs[i];
    Param param;
    param.name = spec.name();
    param.num_elements = 1;
    for (uint64_t dim : spec.shape()) {
      if (dim == 0) {
        return absl::InternalError(absl::StrCat("session '", info.session_id(), "': param '",
                                                spec.name(), "' has a zero dimension"));
      }
      if (param.num_elements > std::numeric_limits<uint64_t>::max() / dim) {
        return absl::InternalError(absl::StrCat("session '", info.session_id(), "': param '",
                                                spec.name(), "' has too many elements"));
      }
      param.num_elements *= dim;
    }
    param.owner = owners.empty() ? 0 : owners[i];
    if (param.owner >= world_size) {
      return absl::InternalError(absl::StrCat("session '", info.session_id(), "': param '",
                                              spec.name(), "' is owned by rank ", param.owner,
                                              " of world size ", world_size));
    }
    params.push_back(std::move(param));
  }
  return SessionLayout(info.session_id(), world_size, std::move(params),
                       info.spec().parameter_storage() == v1::PARAMETER_STORAGE_OWNERS,
                       info.layout().returns_owned());
}

}  // namespace client_internal
}  // namespace optstep
