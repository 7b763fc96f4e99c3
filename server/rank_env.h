#ifndef OPTSTEP_SERVER_RANK_ENV_H_
#define OPTSTEP_SERVER_RANK_ENV_H_

// Where a rank learns its place in the group when flags do not say (a StatefulSet pod).

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstep {

// The rank: `flag` when >= 0; else the ordinal at the end of `pod_name` (a StatefulSet pod
// "optstep-3" is rank 3); else (no pod name) 0. INVALID_ARGUMENT names a pod name without an
// ordinal, which must not fall back to rank 0 (two ranks 0 would both serve the rendezvous).
absl::StatusOr<int> ResolveRank(int flag, std::optional<absl::string_view> pod_name);

// The world size: `flag` when > 0; else `world_size_env` (OPTSTEP_WORLD_SIZE); else 1.
// INVALID_ARGUMENT names a OPTSTEP_WORLD_SIZE that is not a positive number.
absl::StatusOr<int> ResolveWorldSize(int flag, std::optional<absl::string_view> world_size_env);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RANK_ENV_H_
