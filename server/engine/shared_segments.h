#ifndef OPTSTEP_SERVER_ENGINE_SHARED_SEGMENTS_H_
#define OPTSTEP_SERVER_ENGINE_SHARED_SEGMENTS_H_

// The memory a rank shares with the trainers on its host (AttachSharedMemory; docs/api.md,
// "Shared memory"), so that a step moves no tensor bytes through its stream: one segment per
// session and trainer, laid out over the parameters the rank owns, each gradient and each value
// in fp32 at a 64-byte boundary. A segment's bytes are taken from the rank's memory budget and
// given back when the session closes or the trainer attaches again (a step still reading the
// old segment keeps it mapped until it ends). Thread-safe.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/shared_memory.h"
#include "checkpoint/layout.h"
#include "server/engine/memory_budget.h"
#include "server/optim/param_info.h"

namespace optstep {

// One trainer's segment of one session on this rank. Immutable but for the shared bytes.
struct SharedSegment {
  static constexpr size_t kTokenBytes = 16;
  static constexpr int64_t kAlignment = 64;

  uint64_t id = 0;  // random, never 0
  std::string session_id;
  int trainer = 0;
  std::vector<int> params;       // the parameters this rank owns, ascending
  std::vector<int64_t> numels;   // by entry of `params`
  std::vector<int64_t> offsets;  // S(p): from gradients_offset or parameters_offset, by entry
  int64_t gradients_offset = kAlignment;
  int64_t parameters_offset = 0;
  std::string token;  // kTokenBytes, also the segment's first bytes
  std::unique_ptr<SharedMemory> memory;
  MemoryBudget::Reservation reservation;

  const char* gradient(size_t entry) const {
    return memory->data() + gradients_offset + offsets[entry];
  }
  char* value(size_t entry) const { return memory->data() + parameters_offset + offsets[entry]; }
};

// Segments a rank shares at once by default (--max_shared_segments): each holds a descriptor, and
// a session of thousands of trainers would otherwise hold one per trainer.
inline constexpr int kDefaultMaxSharedSegments = 1024;

class SharedSegments {
 public:
  // `budget` must outlive this; `rank` names the rank in the segments' names.
  // At most `max_segments` held at once.
  SharedSegments(MemoryBudget* budget, int rank, int max_segments = kDefaultMaxSharedSegments)
      : budget_(budget), rank_(rank), max_segments_(max_segments) {}

  SharedSegments(const SharedSegments&) = delete;
  SharedSegments& operator=(const SharedSegments&) = delete;

  // A new segment for `trainer` of session `session_id` (`params` and `layout` its definition,
  // `rank` this rank), replacing the trainer's last one; its bytes are reserved as the session's
  // `owner`'s (MemoryBudget::HeldBy). RESOURCE_EXHAUSTED when it does not fit
  // the budget (naming the session and the bytes), or the rank holds `max_segments` already, or
  // as SharedMemory::Create.
  absl::StatusOr<std::shared_ptr<const SharedSegment>> Attach(
      const std::string& session_id, int trainer, const std::vector<ParamInfo>& params,
      const Layout& layout, std::optional<absl::string_view> owner = std::nullopt);
  // Segment `id` if it is the current one of `session_id`'s `trainer`; NOT_FOUND naming the id,
  // the session and the trainer otherwise (a replaced one, one of another session or trainer).
  absl::StatusOr<std::shared_ptr<const SharedSegment>> Find(const std::string& session_id,
                                                            int trainer, uint64_t id) const;
  // Drops the session's segments (closed): their budget is given back once no step maps them.
  void DropSession(const std::string& session_id);
  // Drops `trainer`'s segment of the session, if any, the same way.
  void Drop(const std::string& session_id, int trainer);

  // Bytes of the segments held now: all, or those of session `session_id` (of `trainer` alone
  // when >= 0).
  int64_t bytes() const;
  int64_t bytes(const std::string& session_id, int trainer = -1) const;
  // How many segments session `session_id` holds now (of `trainer` alone when >= 0): its current
  // ones, and those replaced or dropped that a step still maps (each holds its descriptor).
  int count(const std::string& session_id, int trainer = -1) const;
  // The current segment of `trainer` of the session: 0 or 1.
  int current(const std::string& session_id, int trainer) const;
  int max_segments() const { return max_segments_; }
  // Bytes a segment of a session of `params` laid out as `layout` takes on rank `rank`.
  static int64_t BytesFor(const std::vector<ParamInfo>& params, const Layout& layout, int rank);

 private:
  MemoryBudget* const budget_;
  const int rank_;
  const int max_segments_;
  using Key = std::pair<std::string, int>;  // (session id, trainer)
  // A segment replaced or dropped: it keeps its descriptor (and its bytes, in the budget) while
  // a step maps it, and counts against max_segments and its owner's share until then.
  struct Retired {
    Key key;
    std::weak_ptr<const SharedSegment> segment;
  };
  // Keeps `segment` of `key` counted while it lives (forgetting those that died).
  void RetireLocked(const Key& key, const std::shared_ptr<const SharedSegment>& segment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The retired segments still alive, of session `session_id` (all for "") and of `trainer`
  // (all for -1).
  int RetiredLocked(absl::string_view session_id, int trainer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<Key, std::shared_ptr<const SharedSegment>> segments_ ABSL_GUARDED_BY(mu_);
  std::vector<Retired> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SHARED_SEGMENTS_H_
