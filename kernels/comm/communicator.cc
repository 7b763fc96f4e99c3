#include "kernels/comm/communicator.h"

#include <cstddef>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"

namespace optstep {

size_t CommDTypeSize(CommDType dtype) {
  switch (dtype) {
    case CommDType::kFloat32:
      return 4;
    case CommDType::kFloat64:
      return 8;
    case CommDType::kUint8:
      return 1;
  }
  return 0;  // not a CommDType; the validation rejects it
}

absl::Status ResolveCommunicatorKind(absl::string_view requested, absl::string_view device_name,
                                     CommunicatorOptions* options) {
  const bool cuda = absl::StartsWith(device_name, "cuda");
  std::string kind(requested);
  if (kind == "auto") kind = cuda ? "nccl" : "gloo";
  if (kind == "gloo" && cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "communicator 'gloo' moves host memory but the device is ", device_name,
        "; use --comm=nccl (or auto)"));
  }
  if (kind == "nccl") {
    int ordinal = 0;
    absl::string_view rest = device_name;
    if (!cuda || (absl::ConsumePrefix(&rest, "cuda:") && !absl::SimpleAtoi(rest, &ordinal))) {
      return absl::InvalidArgumentError(absl::StrCat("communicator 'nccl' needs a CUDA device, not ",
                                                     device_name, "; use --comm=gloo (or auto)"));
    }
    options->device_ordinal = ordinal;
  }
  options->kind = kind;
  return absl::OkStatus();
}

}  // namespace optstep
