#include "server/engine/gradient_pieces.h"

#include <algorithm>
#include <cstring>

#include "base/status_macros.h"

namespace optstep {

size_t TotalBytes(absl::Span<const absl::string_view> pieces) {
  size_t bytes = 0;
  for (absl::string_view piece : pieces) bytes += piece.size();
  return bytes;
}

std::vector<absl::string_view> SliceBytes(absl::Span<const absl::string_view> pieces, size_t begin,
                                          size_t end) {
  std::vector<absl::string_view> slice;
  size_t at = 0;  // where the current piece starts
  for (absl::string_view piece : pieces) {
    const size_t from = std::max(begin, at), to = std::min(end, at + piece.size());
    if (from < to) slice.push_back(piece.substr(from - at, to - from));
    at += piece.size();
    if (at >= end) break;
  }
  return slice;
}

absl::Status CopyPiecesFromHost(Device& device, absl::Span<const absl::string_view> pieces,
                                DType dtype, bool add, Tensor& dst, int64_t offset) {
  auto transfer = [&](const void* src, int64_t count) {
    return add ? device.AddFromHost(src, dtype, count, dst, offset)
               : device.CopyFromHost(src, dtype, count, dst, offset);
  };
  const size_t size = DTypeSize(dtype);
  char partial[sizeof(double)];
  size_t have = 0;
  for (absl::string_view piece : pieces) {
    if (have > 0) {
      const size_t take = std::min(size - have, piece.size());
      std::memcpy(partial + have, piece.data(), take);
      have += take;
      piece.remove_prefix(take);
      if (have < size) continue;
      OPTSTEP_RETURN_IF_ERROR(transfer(partial, 1));
      ++offset;
      have = 0;
    }
    const int64_t whole = static_cast<int64_t>(piece.size() / size);
    if (whole > 0) {
      OPTSTEP_RETURN_IF_ERROR(transfer(piece.data(), whole));
      offset += whole;
    }
    piece.remove_prefix(whole * size);
    std::memcpy(partial, piece.data(), piece.size());
    have = piece.size();
  }
  return absl::OkStatus();
}

}  // namespace optstep
