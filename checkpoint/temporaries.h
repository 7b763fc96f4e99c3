#ifndef OPTSTEP_CHECKPOINT_TEMPORARIES_H_
#define OPTSTEP_CHECKPOINT_TEMPORARIES_H_

// The hidden temporary directories of checkpoint saves, `<root>/.<name>.<save>.tmp`
// (docs/checkpoints.md, "Names and crash safety"): removing the one of a failed save, and sweeping
// those left by saves that crashed. Stateless; safe to call from several processes that share the
// root (a directory removed by another process meanwhile is not an error).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace optstep {

// Removes the temporary of the save `save` of `name` and everything in it: that save failed and
// is given up. OK when there is none. INVALID_ARGUMENT for a bad name (ValidateCheckpointName).
absl::Status AbandonCheckpoint(absl::string_view root, absl::string_view name, uint64_t save);

// Removes the temporaries in `root` that no save can still be writing: hidden directories
// `.<name>.<save>.tmp` (`save` 16 hex digits; or `.<name>.tmp`, as releases before the save
// identifiers named them; `name` a valid checkpoint name) in which nothing changed for longer than
// `max_age` at `now`, i.e. the directory itself and every entry directly in it were last modified
// before `now - max_age`. A running save changes its temporary at least once per staging buffer
// it writes (and rank 0 creates it just before the shards are written), so a `max_age` far
// beyond the longest pause of a save (the default of the servers is one hour) never removes a
// save in progress, whichever rank or process runs it. Other hidden entries (no such name,
// or not a directory) and complete checkpoints are never touched. Answers the names of the
// checkpoints whose temporaries were removed, sorted; a temporary that cannot be removed is
// logged and left. NOT_FOUND when `root` is not a directory.
absl::StatusOr<std::vector<std::string>> SweepStaleCheckpointTemporaries(
    absl::string_view root, absl::Duration max_age, absl::Time now = absl::Now());

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_TEMPORARIES_H_
