#ifndef OPTSTEP_CLIENT_CPP_PARAM_ASSEMBLER_H_
#define OPTSTEP_CLIENT_CPP_PARAM_ASSEMBLER_H_

// Collects the parameter chunks of one reply (Step or PullParameters) into complete host
// buffers, and checks what the server sent: known param ids, the dtype that was asked for,
// ranges inside each parameter, no overlaps and, at Finish(), full coverage of every expected
// parameter. A check that fails is the server's fault: INTERNAL. Internal to client/.
// Thread-compatible.

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/cpp/client_types.h"
#include "client/cpp/session_layout.h"
#include "kernels/dtype.h"

namespace optstep {
namespace client_internal {

// NOT_FOUND for an id the session does not have; INVALID_ARGUMENT for a duplicate id.
absl::Status ValidateParamIds(const SessionLayout& layout, absl::Span<const uint32_t> ids);

class ParamAssembler final {
 public:
  // `expected`: the ids that must arrive, complete; empty means every parameter of `layout`.
  // `layout` must outlive the assembler.
  // REQUIRES: dtype is kF32 or kBF16; ValidateParamIds(layout, expected).ok().
  ParamAssembler(const SessionLayout& layout, DType dtype, absl::Span<const uint32_t> expected);

  ParamAssembler(const ParamAssembler&) = delete;
  ParamAssembler& operator=(const ParamAssembler&) = delete;

  // The chunks of `param_id` go straight into `bytes` (the caller's tensor: every element of
  // the parameter in the reply's dtype) instead of a buffer of the assembler; Finish then checks
  // its coverage but answers no HostParameter for it. INVALID_ARGUMENT for an id that is not
  // expected or a span of another size. REQUIRES: before the first Add; `bytes` outlives the
  // assembler.
  absl::Status SetDestination(uint32_t param_id, absl::Span<uint8_t> bytes);

  // `ready(param_id)` runs (on the thread that calls Add) once as many elements of a parameter
  // as it has have arrived: the parameter is complete unless chunks overlapped, which Finish
  // reports.
  void OnReady(std::function<void(uint32_t)> ready) { ready_ = std::move(ready); }

  // Copies `data` (raw little-endian elements of `dtype`) into the parameter's buffer at element
  // `offset`, allocating the buffer on the parameter's first chunk.
  absl::Status Add(uint32_t param_id, uint64_t offset, DType dtype, absl::string_view data);
  // The same for data in `pieces` (views of received slices, split anywhere), copied once.
  absl::Status Add(uint32_t param_id, uint64_t offset, DType dtype,
                   absl::Span<const absl::string_view> pieces);

  // Checks coverage and hands over the buffers. INTERNAL when an expected parameter is missing
  // or incomplete, or two chunks overlap. Call once.
  absl::StatusOr<HostParameterMap> Finish();

  uint64_t chunks_added() const { return chunks_added_; }
  // Parameters that went to their destinations and arrived whole.
  uint32_t destinations_filled() const { return destinations_filled_; }

 private:
  struct Pending {
    HostParameter value;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) in elements
    absl::Span<uint8_t> destination;                    // empty: `value`
    uint64_t received = 0;                              // elements
  };

  const SessionLayout& layout_;
  const DType dtype_;
  absl::flat_hash_set<uint32_t> expected_;  // empty: all
  std::map<uint32_t, Pending> pending_;
  absl::flat_hash_map<uint32_t, absl::Span<uint8_t>> destinations_;
  std::function<void(uint32_t)> ready_;
  uint64_t chunks_added_ = 0;
  uint32_t destinations_filled_ = 0;
};

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_PARAM_ASSEMBLER_H_
