#include "checkpoint/state_dict.h"

#include "absl/strings/match.h"

namespace optstep {

std::optional<std::string> ParamNameOfKey(const std::string& key) {
  constexpr absl::string_view kParam = "param/", kState = "state/";
  if (absl::StartsWith(key, kParam)) return key.substr(kParam.size());
  if (!absl::StartsWith(key, kState)) return std::nullopt;
  // "state/<sub>/<name>/<key>": the sub-optimizer and the leaf key contain no '/'.
  const size_t first = key.find('/', kState.size()), last = key.rfind('/');
  if (first == std::string::npos || last == first) return std::nullopt;
  return key.substr(first + 1, last - first - 1);
}

}  // namespace optstep
