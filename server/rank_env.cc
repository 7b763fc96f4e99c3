#include "server/rank_env.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace optstep {

absl::StatusOr<int> ResolveRank(int flag, std::optional<absl::string_view> pod_name) {
  if (flag >= 0) return flag;
  if (!pod_name) return 0;
  const size_t dash = pod_name->rfind('-');
  int rank = -1;
  if (dash == absl::string_view::npos || !absl::SimpleAtoi(pod_name->substr(dash + 1), &rank) ||
      rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("POD_NAME '", *pod_name,
                     "' does not end in a StatefulSet ordinal ('<name>-<N>'); pass --rank"));
  }
  return rank;
}

absl::StatusOr<int> ResolveWorldSize(int flag, std::optional<absl::string_view> world_size_env) {
  if (flag > 0) return flag;
  if (!world_size_env) return 1;
  int world = 0;
  if (!absl::SimpleAtoi(*world_size_env, &world) || world <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OPTSTEP_WORLD_SIZE '", *world_size_env, "' is not a positive number; pass --world_size"));
  }
  return world;
}

}  // namespace optstep
