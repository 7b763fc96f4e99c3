#include "checkpoint/state_dict.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace optstep {

namespace {
constexpr absl::string_view kParam = "param/", kState = "state/";
}  // namespace

bool IsGroupStepKey(const std::string& key) {
  absl::string_view rest = key;
  if (!absl::ConsumePrefix(&rest, kState) || !absl::ConsumeSuffix(&rest, "/step")) return false;
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) return false;
  absl::string_view group = rest.substr(slash + 1);
  return absl::ConsumePrefix(&group, "group") && !group.empty() &&
         std::all_of(group.begin(), group.end(), absl::ascii_isdigit);
}

std::optional<uint64_t> StateDictStep(const StateDict& state) {
  const auto it = state.find("meta/step");
  if (it == state.end() || it->second.type != StateTensor::Type::kI64 ||
      !it->second.shape.empty() || it->second.bytes.size() != sizeof(int64_t)) {
    return std::nullopt;
  }
  int64_t step = 0;
  std::memcpy(&step, it->second.bytes.data(), sizeof(step));
  if (step < 0) return std::nullopt;
  return static_cast<uint64_t>(step);
}

std::optional<std::string> ParamNameOfKey(const std::string& key) {
  if (absl::StartsWith(key, kParam)) return key.substr(kParam.size());
  if (!absl::StartsWith(key, kState) || IsGroupStepKey(key)) return std::nullopt;
  // "state/<sub>/<name>/<key>": the sub-optimizer and the leaf key contain no '/'.
  const size_t first = key.find('/', kState.size()), last = key.rfind('/');
  if (first == std::string::npos || last == first) return std::nullopt;
  return key.substr(first + 1, last - first - 1);
}

}  // namespace optstep
