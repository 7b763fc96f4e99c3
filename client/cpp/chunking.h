#ifndef OPTSTEP_CLIENT_CPP_CHUNKING_H_
#define OPTSTEP_CLIENT_CPP_CHUNKING_H_

// Turns a trainer's gradients into wire chunks: validation against the session's parameters,
// splitting into pieces of at most `max_chunk_bytes` (whole elements), and grouping by the rank
// that owns each parameter. Pure functions over borrowed spans; no gRPC, no copies of tensor
// data. Internal to client/.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/cpp/client_types.h"
#include "client/cpp/session_layout.h"

namespace optstep {
namespace client_internal {

// NOT_FOUND for a param id the session does not have; INVALID_ARGUMENT for a byte count that is
// not a whole number of elements or a range past the parameter's end. Messages name the
// parameter and the values.
absl::Status ValidateSlice(const SessionLayout& layout, const GradientSlice& slice);

// Views of whole fp32 tensors as slices. INVALID_ARGUMENT when a tensor's size differs from its
// parameter's element count; NOT_FOUND for an unknown param id.
absl::StatusOr<std::vector<GradientSlice>> FullGradientsToSlices(
    const SessionLayout& layout, absl::Span<const FullGradient> gradients);

// Splits each slice, in order, into consecutive pieces of at most `max_chunk_bytes` rounded
// down to whole elements; empty slices produce no piece. Pieces point into the input's bytes.
// REQUIRES: max_chunk_bytes >= 4 (one element of any dtype).
std::vector<GradientSlice> SplitIntoChunks(absl::Span<const GradientSlice> slices,
                                           size_t max_chunk_bytes);

// What one Step stream carries to one rank.
struct RankContribution {
  std::vector<GradientSlice> chunks;  // in input order
  uint64_t num_elements = 0;          // sum of the chunks' element counts (StepCommit)
};

// Validates every slice, splits it and groups the chunks by the owner rank of their parameter.
// The result has layout.world_size() entries; ranks that own none of the slices get an empty
// contribution (the trainer still commits to them).
absl::StatusOr<std::vector<RankContribution>> PlanContributions(
    const SessionLayout& layout, absl::Span<const GradientSlice> slices, size_t max_chunk_bytes);

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_CHUNKING_H_
