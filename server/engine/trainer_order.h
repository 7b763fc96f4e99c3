#ifndef OPTSTEP_SERVER_ENGINE_TRAINER_ORDER_H_
#define OPTSTEP_SERVER_ENGINE_TRAINER_ORDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "server/engine/step_contributions.h"

namespace optstep {

// A gradient chunk that came before its trainer's turn, kept until then.
struct WaitingChunk {
  StepHandle handle;  // whose chunk (checked again when it is let in)
  int param = 0;
  int64_t offset = 0;
  DType dtype = DType::kF32;
  std::vector<absl::string_view> pieces;  // raw elements, split anywhere
  std::shared_ptr<const void> keep;       // owns the bytes `pieces` point into
  // Told exactly once: the status of adding the chunk, or ABORTED when it is dropped.
  std::function<void(absl::Status)> added;
};

// REPLICATED mode sums the trainers' gradients of a parameter into one fp32 buffer in trainer
// order, so that the mean is the same bits whatever order the trainers' chunks arrive in
// (docs/design.md §3): trainer 0 writes the buffer, trainer t adds to it once trainers 0..t-1 have
// added all of the parameter. TrainerOrder tracks, per parameter, whose turn it is, and keeps the
// chunks that come early. A chunk waits with its stream paused (the stream reads nothing more until
// the chunk is added), so what waits is bounded by one chunk per trainer stream; and since trainer
// 0 never waits and trainer t waits only for trainers before it, every wait ends once those
// trainers send. Thread-compatible (the Session guards it).
class TrainerOrder {
 public:
  TrainerOrder(int num_trainers, std::vector<int64_t> numels);

  // The trainer that adds to `param` now: the first that has not added all of it.
  int turn(int param) const { return turn_[param]; }

  void Wait(WaitingChunk chunk);
  // Counts `count` elements of `param` added by the trainer whose turn it is (resent elements that
  // were skipped do not count). When that completes the trainer's part, the turn passes on and the
  // chunks that wait for the next trainer on `param` are returned, to be added now.
  std::vector<WaitingChunk> Added(int param, int64_t count);
  // Takes out the chunks `trainer` has waiting (it begins the step again).
  std::vector<WaitingChunk> TakeWaiting(int trainer);
  // Forgets the step; returns every waiting chunk.
  std::vector<WaitingChunk> Reset();

  int num_waiting() const { return static_cast<int>(waiting_.size()); }

 private:
  const int num_trainers_;
  const std::vector<int64_t> numels_;
  std::vector<int> turn_;
  std::vector<int64_t> added_;  // per parameter: elements added by the trainer whose turn it is
  std::vector<WaitingChunk> waiting_;  // few: at most one per trainer stream
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_TRAINER_ORDER_H_
