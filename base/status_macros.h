#ifndef OPTSTEP_BASE_STATUS_MACROS_H_
#define OPTSTEP_BASE_STATUS_MACROS_H_

// OPTSTEP_RETURN_IF_ERROR and OPTSTEP_ASSIGN_OR_RETURN: the Abseil of Debian (20220623) has
// neither, so the project carries these two. Used by every layer.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define OPTSTEP_STATUS_CONCAT_INNER_(a, b) a##b
#define OPTSTEP_STATUS_CONCAT_(a, b) OPTSTEP_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not OK.
#define OPTSTEP_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status optstep_status_ = (expr);           \
    if (!optstep_status_.ok()) return optstep_status_; \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status if not OK.
//   OPTSTEP_ASSIGN_OR_RETURN(Tensor t, device.Allocate(...));
#define OPTSTEP_ASSIGN_OR_RETURN(lhs, rexpr) \
  OPTSTEP_ASSIGN_OR_RETURN_IMPL_(OPTSTEP_STATUS_CONCAT_(optstep_statusor_, __LINE__), lhs, rexpr)

#define OPTSTEP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#endif  // OPTSTEP_BASE_STATUS_MACROS_H_
