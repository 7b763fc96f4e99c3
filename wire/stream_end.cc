#include "wire/stream_end.h"

#include <zlib.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace optstep {

void StreamTally::Add(absl::string_view data) {
  ++chunks_;
  bytes_ += data.size();
  // zlib's crc32 takes at most UINT_MAX bytes at a time.
  const auto* p = reinterpret_cast<const Bytef*>(data.data());
  for (size_t left = data.size(); left > 0;) {
    const size_t n = std::min<size_t>(left, size_t{1} << 30);
    crc32_ = static_cast<uint32_t>(crc32(crc32_, p, static_cast<uInt>(n)));
    p += n;
    left -= n;
  }
}

v1::StreamEnd StreamTally::End(uint64_t tensors) const {
  v1::StreamEnd end;
  end.set_chunks(chunks_);
  end.set_bytes(bytes_);
  end.set_crc32(crc32_);
  end.set_tensors(tensors);
  return end;
}

std::string StreamTally::Describe(uint64_t tensors) const {
  return absl::StrCat(tensors, " tensors (", chunks_, " chunks, ", bytes_, " bytes)");
}

absl::Status StreamTally::Check(const v1::StreamEnd& end, uint64_t tensors,
                                absl::string_view what) const {
  if (end.chunks() != chunks_ || end.bytes() != bytes_ || end.tensors() != tensors) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the final message declares ", end.tensors(), " tensors (",
                     end.chunks(), " chunks, ", end.bytes(), " bytes) but the stream carried ",
                     Describe(tensors), "; nothing was applied"));
  }
  if (end.crc32() != crc32_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the final message declares CRC-32 ", end.crc32(), " of the ", bytes_,
                     " payload bytes but they have CRC-32 ", crc32_, "; nothing was applied"));
  }
  return absl::OkStatus();
}

}  // namespace optstep
