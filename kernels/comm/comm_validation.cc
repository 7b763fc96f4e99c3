#include "kernels/comm/comm_validation.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace optstep {
namespace internal {
namespace {

bool IsKnownDType(CommDType dtype) {
  return dtype == CommDType::kFloat32 || dtype == CommDType::kFloat64 || dtype == CommDType::kUint8;
}

absl::Status ValidateBuffer(absl::string_view op, absl::string_view name, const void* data,
                            int64_t count, CommDType dtype) {
  if (!IsKnownDType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": unknown dtype ", CommDTypeName(dtype)));
  }
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " count ", count, " is negative"));
  }
  if (count > std::numeric_limits<int64_t>::max() / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " count ", count, " is too large"));
  }
  if (count > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null but its count is ",
                                                   count, " ", CommDTypeName(dtype), " elements"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CommDTypeName(CommDType dtype) {
  switch (dtype) {
    case CommDType::kFloat32:
      return "float32";
    case CommDType::kFloat64:
      return "float64";
    case CommDType::kUint8:
      return "uint8";
  }
  return absl::StrCat("CommDType(", static_cast<int>(dtype), ")");
}

absl::Status ValidateCommunicatorOptions(const CommunicatorOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("communicator '", options.kind, "': world_size ",
                                                   options.world_size, " must be at least 1"));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("communicator '", options.kind, "': rank ",
                                                   options.rank, " is outside [0, ",
                                                   options.world_size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("communicator '", options.kind, "': timeout ",
                                                   absl::FormatDuration(options.timeout),
                                                   " must be positive"));
  }
  if (options.world_size > 1 && options.store == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("communicator '", options.kind, "': world_size ",
                                                   options.world_size,
                                                   " needs a rendezvous store"));
  }
  return absl::OkStatus();
}

absl::Status ValidateAllReduce(const void* data, int64_t count, CommDType dtype, ReduceOp op) {
  if (absl::Status status = ValidateBuffer("all-reduce", "data", data, count, dtype);
      !status.ok()) {
    return status;
  }
  if (dtype != CommDType::kFloat32 && dtype != CommDType::kFloat64) {
    return absl::InvalidArgumentError(absl::StrCat("all-reduce: dtype ", CommDTypeName(dtype),
                                                   " is not supported (float32 or float64)"));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-reduce: unknown reduce op ", static_cast<int>(op)));
  }
  return absl::OkStatus();
}

absl::StatusOr<GatherLayout> ValidateAllGatherV(int rank, int world_size, const void* send,
                                                int64_t send_count, const void* recv,
                                                const std::vector<int64_t>& recv_counts,
                                                CommDType dtype) {
  if (recv_counts.size() != static_cast<size_t>(world_size)) {
    return absl::InvalidArgumentError(absl::StrCat("all-gather-v: recv_counts has ",
                                                   recv_counts.size(),
                                                   " entries; the world size is ", world_size));
  }
  GatherLayout layout;
  layout.offsets.assign(recv_counts.size(), 0);
  int64_t& total = layout.total;
  const int64_t max_total = IsKnownDType(dtype) ? std::numeric_limits<int64_t>::max() /
                                                      static_cast<int64_t>(CommDTypeSize(dtype))
                                                : std::numeric_limits<int64_t>::max();
  for (size_t r = 0; r < recv_counts.size(); ++r) {
    if (recv_counts[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-gather-v: recv_counts[", r, "] = ", recv_counts[r], " is negative"));
    }
    if (recv_counts[r] > max_total - total) {
      return absl::InvalidArgumentError(absl::StrCat("all-gather-v: recv_counts [",
                                                     absl::StrJoin(recv_counts, ", "),
                                                     "] add up to more bytes than int64 holds"));
    }
    layout.offsets[r] = total;
    total += recv_counts[r];
  }
  if (send_count != recv_counts[rank]) {
    return absl::InvalidArgumentError(absl::StrCat("all-gather-v: rank ", rank, " sends ",
                                                   send_count, " elements but recv_counts[", rank,
                                                   "] = ", recv_counts[rank]));
  }
  if (absl::Status status = ValidateBuffer("all-gather-v", "send", send, send_count, dtype);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateBuffer("all-gather-v", "recv", recv, total, dtype);
      !status.ok()) {
    return status;
  }
  return layout;
}

absl::Status ValidateRingShift(const void* send, int64_t send_count, const void* recv,
                               int64_t recv_count, CommDType dtype) {
  if (absl::Status status = ValidateBuffer("ring shift", "send", send, send_count, dtype);
      !status.ok()) {
    return status;
  }
  return ValidateBuffer("ring shift", "recv", recv, recv_count, dtype);
}

absl::Status ValidateBroadcast(const void* data, int64_t count, CommDType dtype, int root,
                               int world_size) {
  if (root < 0 || root >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast: root ", root, " is outside [0, ", world_size, ")"));
  }
  return ValidateBuffer("broadcast", "data", data, count, dtype);
}

}  // namespace internal
}  // namespace optstep
