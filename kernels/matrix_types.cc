#include "kernels/matrix_types.h"

#include "absl/strings/str_cat.h"

namespace optstep {

absl::string_view MatmulPrecisionName(MatmulPrecision precision) {
  switch (precision) {
    case MatmulPrecision::kHighest:
      return "highest";
    case MatmulPrecision::kHigh:
      return "high";
    case MatmulPrecision::kMedium:
      return "medium";
  }
  return "unknown";
}

absl::StatusOr<MatmulPrecision> ParseMatmulPrecision(absl::string_view owner,
                                                     absl::string_view name) {
  for (MatmulPrecision p :
       {MatmulPrecision::kHighest, MatmulPrecision::kHigh, MatmulPrecision::kMedium}) {
    if (name == MatmulPrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": matmul precision '", name, "' is not one of highest, high, medium"));
}

}  // namespace optstep
