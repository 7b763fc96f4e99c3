#include "wire/chunk.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "wire/proto_dtype.h"

namespace optstep {

absl::Status CheckChunkExtent(uint64_t offset, size_t bytes, absl::string_view what) {
  if (bytes > kMaxChunkBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", bytes, " bytes exceeds the ",
                                                     kMaxChunkBytes, "-byte chunk limit"));
  }
  if (offset > kMaxChunkOffset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": offset ", offset, " out of range"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChunkHeader> CheckChunkHeader(uint32_t param_id, uint64_t offset, v1::DType dtype,
                                             size_t bytes, absl::string_view what) {
  OPTSTEP_RETURN_IF_ERROR(CheckChunkExtent(offset, bytes, what));
  ChunkHeader header;
  OPTSTEP_ASSIGN_OR_RETURN(header.dtype, DTypeFromProto(dtype, what));
  header.param_id = static_cast<int>(std::min<uint32_t>(param_id, 1u << 30));
  header.offset = static_cast<int64_t>(offset);
  return header;
}

}  // namespace optstep
