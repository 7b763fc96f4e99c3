#include "client/cpp/chunking.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/dtype.h"

namespace optstep {
namespace client_internal {

absl::Status ValidateSlice(const SessionLayout& layout, const GradientSlice& slice) {
  OPTSTEP_RETURN_IF_ERROR(layout.CheckParamId(slice.param_id));
  const SessionLayout::Param& param = layout.param(slice.param_id);
  const size_t size = DTypeSize(slice.dtype);
  if (slice.bytes.size() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "': ", slice.bytes.size(),
                                                   " bytes is not a multiple of the ",
                                                   DTypeName(slice.dtype), " element size ", size));
  }
  const uint64_t count = slice.bytes.size() / size;
  if (slice.offset > param.num_elements || count > param.num_elements - slice.offset) {
    return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "': gradient [",
                                                   slice.offset, ", ", slice.offset + count,
                                                   ") exceeds ", param.num_elements, " elements"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GradientSlice>> FullGradientsToSlices(
    const SessionLayout& layout, absl::Span<const FullGradient> gradients) {
  std::vector<GradientSlice> slices;
  slices.reserve(gradients.size());
  for (const FullGradient& g : gradients) {
    OPTSTEP_RETURN_IF_ERROR(layout.CheckParamId(g.param_id));
    const SessionLayout::Param& param = layout.param(g.param_id);
    if (g.values.size() != param.num_elements) {
      return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "': full gradient has ",
                                                     g.values.size(), " elements, expected ",
                                                     param.num_elements));
    }
    GradientSlice slice;
    slice.param_id = g.param_id;
    slice.offset = 0;
    slice.dtype = DType::kF32;
    slice.bytes = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(g.values.data()),
                                            g.values.size() * sizeof(float));
    slices.push_back(slice);
  }
  return slices;
}

std::vector<GradientSlice> SplitIntoChunks(absl::Span<const GradientSlice> slices,
                                           size_t max_chunk_bytes) {
  std::vector<GradientSlice> chunks;
  for (const GradientSlice& slice : slices) {
    const size_t size = DTypeSize(slice.dtype);
    const size_t max_elements = std::max<size_t>(1, max_chunk_bytes / size);
    const size_t count = slice.bytes.size() / size;
    for (size_t first = 0; first < count; first += max_elements) {
      const size_t n = std::min(max_elements, count - first);
      GradientSlice chunk;
      chunk.param_id = slice.param_id;
      chunk.offset = slice.offset + first;
      chunk.dtype = slice.dtype;
      chunk.bytes = slice.bytes.subspan(first * size, n * size);
      chunks.push_back(chunk);
    }
  }
  return chunks;
}

absl::StatusOr<std::vector<RankContribution>> PlanContributions(
    const SessionLayout& layout, absl::Span<const GradientSlice> slices, size_t max_chunk_bytes) {
  for (const GradientSlice& slice : slices) {
    OPTSTEP_RETURN_IF_ERROR(ValidateSlice(layout, slice));
  }
  std::vector<RankContribution> plan(layout.world_size());
  for (const GradientSlice& chunk : SplitIntoChunks(slices, max_chunk_bytes)) {
    RankContribution& rank = plan[layout.param(chunk.param_id).owner];
    rank.num_elements += chunk.bytes.size() / DTypeSize(chunk.dtype);
    rank.chunks.push_back(chunk);
  }
  return plan;
}

}  // namespace client_internal
}  // namespace optstep
