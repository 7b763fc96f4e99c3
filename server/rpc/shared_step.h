#ifndef OPTSTEP_SERVER_RPC_SHARED_STEP_H_
#define OPTSTEP_SERVER_RPC_SHARED_STEP_H_

// The shared memory side of one Step stream that names a segment (StepHeader.
// shared_memory_segment; server/engine/shared_segments.h): the gradients it adds from the segment,
// a chunk at a time as the stream's own chunks would be, and the parameters it writes back into
// the segment as the step makes them ready. Thread-compatible: the stream's reactor calls it
// under its lock.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/param_snapshot.h"
#include "server/engine/session.h"
#include "server/engine/shared_segments.h"

namespace optstep {

class SharedStepIo {
 public:
  explicit SharedStepIo(std::shared_ptr<const SharedSegment> segment)
      : segment_(std::move(segment)) {}

  uint64_t segment_id() const { return segment_->id; }
  // Bytes written into the segment so far (the session counts those it adds).
  int64_t bytes_written() const { return bytes_written_; }

  // Adds the segment's gradients to contribution `c` of `session`, from where the last call left
  // off. True once all are added; false when a chunk waits for its trainer's turn: `added` is
  // then called (Session::AddGradient), and the caller calls again. The segment stays mapped
  // while a chunk waits. `before_wait`, when set, is called before a chunk that is to wait is
  // added (Session::WouldWait); its error is answered, and the chunk not added.
  absl::StatusOr<bool> AddGradients(Session& session, const StepHandle& c,
                                    std::function<void(absl::Status)> added,
                                    const std::function<absl::Status()>& before_wait = nullptr);

  // Writes the values of `ids` (parameters of the segment) from `params` into the segment as they
  // become ready, from where the last call left off. True once all are written and the step
  // ended on this rank (ParamReadiness::End); false when the step still fills the snapshot or
  // has not ended: `wake` is then called once that may have changed, and the caller calls
  // again. The error of a failed step, or INTERNAL for a value that is not the
  // parameter's fp32 bytes.
  absl::StatusOr<bool> WriteParams(const ParamSnapshot& params, const std::vector<uint32_t>& ids,
                                   std::function<void()> wake);

 private:
  // Copies parameter `id`'s value, if it is one of `ids` not yet written.
  absl::Status WriteOne(const ParamSnapshot& params, int id);

  const std::shared_ptr<const SharedSegment> segment_;
  // The next gradient piece to add: entry of segment_->params, element offset.
  size_t next_entry_ = 0;
  int64_t next_offset_ = 0;
  int64_t bytes_written_ = 0;
  // The parameters to write back (entries of segment_->params), and how far the snapshot's
  // readiness has been followed.
  std::vector<bool> to_write_;
  size_t left_to_write_ = 0;
  bool writing_ = false;
  size_t next_ready_ = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_SHARED_STEP_H_
