#ifndef OPTSTEP_SERVER_ENGINE_GRADIENT_PIECES_H_
#define OPTSTEP_SERVER_ENGINE_GRADIENT_PIECES_H_

// A gradient chunk as the Step stream hands it over: views of the received network slices, cut
// anywhere, even inside an element. These helpers copy it to the device once, straight from the
// pieces.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/device.h"

namespace optstep {

// The bytes of all pieces together.
size_t TotalBytes(absl::Span<const absl::string_view> pieces);

// The bytes [begin, end) of the concatenation of `pieces`, as views of them.
std::vector<absl::string_view> SliceBytes(absl::Span<const absl::string_view> pieces, size_t begin,
                                          size_t end);

// Writes `pieces` (raw elements of `dtype`, split anywhere) to dst[offset, ...), or with `add`
// adds them: the whole elements of each piece straight from it, an element split across pieces
// through a small staging copy. REQUIRES: the pieces hold whole elements together.
absl::Status CopyPiecesFromHost(Device& device, absl::Span<const absl::string_view> pieces,
                                DType dtype, bool add, Tensor& dst, int64_t offset);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_GRADIENT_PIECES_H_
