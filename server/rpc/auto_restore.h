#ifndef OPTSTEP_SERVER_RPC_AUTO_RESTORE_H_
#define OPTSTEP_SERVER_RPC_AUTO_RESTORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// A session recreated from its automatic checkpoints.
struct RestoredSession {
  std::string session_id;
  uint64_t step = 0;
  std::string from;  // the checkpoint's name, "auto/<session id>/step-<N>"
};

// How a restore reads the automatic checkpoints.
struct AutoRestoreOptions {
  std::string checkpoint_root;
  // The temporaries of interrupted automatic saves in which nothing changed for this long are
  // removed first (zero: none are).
  absl::Duration temp_max_age = absl::ZeroDuration();
  // A read, creation or load that fails for a passing reason (anything but the checkpoint's
  // absence or damage, or no room for the session: EIO, an NFS pause, a peer busy) is tried this
  // many times in all, the first retry this long after, each further one twice as long.
  int attempts = 4;
  absl::Duration first_retry = absl::Seconds(1);
  // Testing only (may be null): called with each session's id once it is recreated on every
  // rank, before its checkpoint loads.
  std::function<void(const std::string& session_id)> before_load;
  // Testing only (may be null): called with the error of each read or load that is tried again,
  // before the wait.
  std::function<void(const absl::Status& failed)> before_retry;
};

// Rank 0, once the group formed and before it serves (docs/checkpoints.md, "Automatic
// restore"): every session with automatic checkpoints under the root is recreated on every rank
// with its id, name, owner and definition, and loaded from its newest complete automatic
// checkpoint that loads (newest: of the highest step, "step-<N>", whatever the times of its
// files; an older one when the newer ones are damaged, which are set aside), also onto another
// number of ranks. A session that cannot be restored for good (no record, no complete
// checkpoint, none that loads, no room, a definition refused) is logged
// (event=session_restore_failed) and left out; its checkpoints stay. Each session restored is
// logged as event=session_restored. Blocks; answers the sessions restored.
//
// Ends with UNAVAILABLE, before older checkpoints are tried or sessions left out, when a rank is
// lost meanwhile, or when a read, creation or load still fails for a passing reason after every
// attempt:
// the group must restart and restore every session again (a rank healed into a group without
// them would never get them), and a checkpoint that could not be read is never passed over for
// an older one (the group would step the older timeline and remove the newer checkpoint).
absl::StatusOr<std::vector<RestoredSession>> RestoreAutoCheckpoints(
    const AutoRestoreOptions& options, RankGroup* group);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_AUTO_RESTORE_H_
